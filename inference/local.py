"""Local backend: transformers on CPU, batched, with models loaded offline from PyPI packages.

``LocalBackend`` serves one model through the class of its kind (``registry.LOCAL_KINDS``: one
module per kind, imported when a model of that kind loads). The operations a kind serves are its
class's ``SERVES``, known before any weight loads.

Example usage::

    backend = LocalBackend(LocalModelConfig("smollm2-135m-instruct"))
    [answer] = backend.generate([GenerateRequest("What is the capital of France?", max_new_tokens=8)])
"""
from __future__ import annotations

import numpy as np

from specrag import registry
from specrag.inference.capabilities import DENOISE, EMBED, FUSED_DECODE, GENERATE, NEXT_TOKEN, RERANK, SCORE
from specrag.inference.engine import BackendSettings, ModelBackend
from specrag.inference.local_base import LocalModelConfig
from specrag.inference.models import KIND_NAMES, model_spec
from specrag.inference.types import (Denoised, DenoiseRequest, FusedDecodeRequest, GenerateRequest, Generation,
                                     NextToken, NextTokenRequest, RerankRequest, ScoreRequest, Scored)


class LocalBackend(ModelBackend):
    """The operations of one model, as the engine's ModelBackend protocol expects."""

    in_process = phase_dtypes = worker_prefix_cache = True
    # RaLMSeq on 2Wiki ran 1.65x faster with prefix KV reuse (#68): the CLI's default
    default_prefix_cache_mb = 256

    SERVES = {"causal-lm": frozenset({GENERATE, SCORE, NEXT_TOKEN, FUSED_DECODE}), "encoder": frozenset({EMBED}),
              "cross-encoder": frozenset({RERANK}), "masked-diffusion": frozenset({DENOISE}),
              "masked-lm": frozenset()}  # a base for `specrag train-denoiser`

    @classmethod
    def open(cls, model: str, settings: BackendSettings) -> "LocalBackend":
        return cls(LocalModelConfig(model, num_threads=settings.num_threads, dtype=settings.dtype,
                                    prefix_cache_mb=settings.prefix_cache_mb))

    @classmethod
    def serves(cls, model: str, settings: BackendSettings | None = None) -> frozenset[str]:
        """The operations this backend serves for a model (known before any weight loads; the
        settings matter to a backend whose options add operations, as ``--vllm-embed`` does)."""
        return cls.SERVES[model_spec(model).kind]

    def __init__(self, config: LocalModelConfig):
        spec = model_spec(config.model)
        self.name = config.model
        self.capabilities = self.serves(config.model)
        if spec.kind not in registry.LOCAL_KINDS:
            raise ValueError(f"{config.model} is {KIND_NAMES[spec.kind]}, which the local backend serves nothing for")
        self._impl = registry.LOCAL_KINDS[spec.kind](config)

    def generate(self, requests: list[GenerateRequest]) -> list[Generation]:
        return self._require("generate")(requests)

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self._require("tokenize")(texts)

    def next_token(self, requests: list[NextTokenRequest]) -> list[NextToken]:
        return self._require("next_token")(requests)

    def token_states(self, texts: list[str], max_tokens: int):
        return self._require("token_states")(texts, max_tokens)

    @property
    def eos_ids(self) -> list[int]:
        return list(getattr(self._impl, "eos_ids", []))

    def detokenize(self, ids: list[list[int]]) -> list[str]:
        return self._require("detokenize")(ids)

    def score(self, requests: list[ScoreRequest]) -> list[Scored]:
        return self._require("score")(requests)

    def fused_decode(self, requests: list[FusedDecodeRequest]) -> list[Generation]:
        return self._require("fused_decode")(requests)

    def rerank(self, requests: list[RerankRequest]) -> list[float]:
        return self._require("rerank")(requests)

    def denoise(self, requests: list[DenoiseRequest]) -> list[Denoised]:
        return self._require("denoise")(requests)

    @property
    def mask_id(self) -> int:
        mask = getattr(self._impl, "mask_id", None)
        if mask is None:
            raise TypeError(f"model {self.name!r} is not a masked-diffusion model (no mask token)")
        return mask

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._require("embed")(texts)

    def clear_prefix_cache(self) -> None:
        """Start from an empty prefix cache, as a new worker would (benchmarks compare variants)."""
        if getattr(self._impl, "prefix_cache", None) is not None:
            self._impl.prefix_cache.clear()

    @property
    def stats(self) -> dict:
        stats = dict(getattr(self._impl, "stats", {}))
        prefix = getattr(self._impl, "prefix_cache", None)
        if prefix is not None:
            stats.update({f"prefix_{k}": v for k, v in prefix.stats.items()}, prefix_bytes=prefix.bytes)
        return stats

    def _require(self, op: str):
        fn = getattr(self._impl, op, None)
        if fn is None:
            raise TypeError(f"model {self.name!r} does not support {op}()")
        return fn
