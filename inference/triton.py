"""Triton backend: the inference operations served by a Triton Inference Server.

The engine hands a backend one micro-batch per call from a worker thread. This backend
sends the batch as one gRPC (or HTTP) request per row, all at once, on a process-wide
asyncio loop with one reused connection per server; Triton's dynamic batcher regroups the
rows (and those of other workers) into one batched model call. Rows fail alone: a bad
prompt becomes that query's error, not its batch's. Unavailable or overloaded servers are
retried with exponential backoff; a request that exceeds its timeout is not retried (it may
still be running). Which Triton model serves an operation for given weights is read from the
models' ``config.pbtxt`` parameters, so ``--model generator=...`` is checked against the server.

Example usage::

    backend = TritonBackend("smollm2-135m-instruct", TritonConfig("grpc://127.0.0.1:8001"))
    backend.check(["generate"])
    [g] = backend.generate([GenerateRequest("Who wrote Hamlet?")])
"""
from __future__ import annotations

import asyncio
import atexit
import functools
import threading
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import urlparse

import numpy as np

from specrag.inference.capabilities import DENOISE, EMBED, FUSED_DECODE, GENERATE, RERANK, SCORE
from specrag.inference.client_loop import ClientLoop
from specrag.inference.engine import BackendSettings, ModelBackend
from specrag.inference.triton_protocol import (OPS, PARAM_MODEL, PARAM_OP, decode_results, encode_requests)
from specrag.inference.types import (Denoised, DenoiseRequest, FusedDecodeRequest, GenerateRequest, Generation,
                                     RerankRequest, ScoreRequest, Scored)

PROTOCOLS = ("grpc", "http")


class TritonError(RuntimeError):
    """A request Triton refused or failed (the model's own message is included)."""


class TritonUnavailable(TritonError):
    """The server could not be reached, or stayed overloaded, through every retry."""


class TritonTimeout(TritonError, TimeoutError):
    """A request ran past its timeout."""


@dataclass(frozen=True)
class TritonConfig:
    """Where the server is and how patient to be with it."""

    url: str = "grpc://127.0.0.1:8001"
    timeout_s: float = 300.0  # per request: a CPU batch of long prompts takes a while
    retries: int = 3  # on unavailable / overloaded, with backoff backoff_s * 2**attempt
    backoff_s: float = 0.5
    max_inflight_batches: int = 4  # engine batches of one model in flight at once

    def __post_init__(self):
        self.endpoint()  # validates the URL
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0 or self.max_inflight_batches < 1:
            raise ValueError("triton: timeout_s > 0, retries >= 0, backoff_s >= 0, max_inflight_batches >= 1")

    def endpoint(self) -> tuple[str, str]:
        """(protocol, host:port); a URL without scheme means gRPC."""
        url = self.url if "://" in self.url else f"grpc://{self.url}"
        parsed = urlparse(url)
        if parsed.scheme not in PROTOCOLS or not parsed.hostname or not parsed.port:
            raise ValueError(f"triton url must look like grpc://host:port or http://host:port, got {self.url!r}")
        return parsed.scheme, f"{parsed.hostname}:{parsed.port}"


class _Connection:
    """One client per server and process, on a private event loop thread (reused by all models)."""

    _lock = threading.Lock()
    _open: dict[tuple[str, str], "_Connection"] = {}

    @classmethod
    def get(cls, protocol: str, address: str) -> "_Connection":
        with cls._lock:
            conn = cls._open.get((protocol, address))
            if conn is None:
                conn = cls._open[(protocol, address)] = cls(protocol, address)
            return conn

    def __init__(self, protocol: str, address: str):
        self.protocol, self.address = protocol, address
        self.loop = ClientLoop(f"triton-{address}")
        self.client = self.loop.run(self._make_client())
        self.served: dict[str, dict] | None = None

    async def _make_client(self):
        if self.protocol == "grpc":
            import tritonclient.grpc.aio as grpcclient
            return grpcclient.InferenceServerClient(self.address)
        import tritonclient.http.aio as httpclient
        return httpclient.InferenceServerClient(self.address)

    def close(self) -> None:
        self.loop.stop(self.client.close())

    @classmethod
    def close_all(cls) -> None:
        with cls._lock:
            conns, cls._open = list(cls._open.values()), {}
        for conn in conns:
            conn.close()

    def input_class(self):
        if self.protocol == "grpc":
            from tritonclient.grpc import InferInput
        else:
            from tritonclient.http import InferInput
        return InferInput


atexit.register(_Connection.close_all)


def _status(e: BaseException) -> str:
    status = getattr(e, "status", None)
    return str(status() if callable(status) else status or "")


def _retryable(e: BaseException) -> bool:
    status = _status(e)
    if any(s in status for s in ("UNAVAILABLE", "RESOURCE_EXHAUSTED")) or status in ("503", "429"):
        return True
    if isinstance(e, (ConnectionError, OSError)) and not isinstance(e, TimeoutError):
        return True
    return type(e).__module__.startswith("aiohttp") and "Connect" in type(e).__name__


def _timed_out(e: BaseException) -> bool:
    return "DEADLINE_EXCEEDED" in _status(e) or isinstance(e, (asyncio.TimeoutError, TimeoutError))


def _message(e: BaseException) -> str:
    msg = getattr(e, "message", None)
    return str(msg() if callable(msg) else msg or e)


def _config(settings: BackendSettings) -> TritonConfig:
    config = settings.config_of(TritonConfig)
    if config is None:
        raise ValueError("backend 'triton' needs a server: pass --triton-url grpc://host:port")
    return config


class TritonBackend(ModelBackend):
    """ModelBackend for one set of weights (e.g. gemma3-270m) served by a Triton server."""

    supports_row_errors = True  # the engine may take per-row exceptions in a result list
    # model_repo/ serves generate, score and fused_decode for causal LMs, embed for encoders,
    # rerank for a trained cross-encoder (launch.py --utility-model), denoise for a trained
    # denoiser (--denoiser-model); no next_token: KNN-LM needs hidden states per step, which
    # the served models do not return
    SERVES = {"causal-lm": frozenset({GENERATE, SCORE, FUSED_DECODE}), "encoder": frozenset({EMBED}),
              "cross-encoder": frozenset({RERANK}), "masked-diffusion": frozenset({DENOISE})}
    takes_dtype = False  # each served model's dtype is in its config.pbtxt

    @classmethod
    def add_options(cls, flag) -> None:
        flag("url", help="grpc://host:port (default grpc://127.0.0.1:8001) or http://host:port")
        flag("timeout", type=float, default=300.0, help="seconds per Triton request")
        flag("retries", type=int, default=3, help="retries (exponential backoff) while the server is unavailable "
                                                  "or overloaded")

    @classmethod
    def config_from_options(cls, value, chosen: bool) -> TritonConfig | None:
        if not (chosen or value("url")):
            return None
        return TritonConfig(url=value("url") or TritonConfig().url, timeout_s=value("timeout"),
                            retries=value("retries"))

    @classmethod
    def check_run(cls, settings: BackendSettings, needs: dict[str, tuple[str, tuple[str, ...]]]) -> None:
        """Fail at start, not per query, when the server is down or lacks a model."""
        config = _config(settings)
        if settings.dtype != "float32":
            raise ValueError("with --backend triton the dtype is set in the model's config.pbtxt, not --dtype")
        for role, (name, ops) in sorted(needs.items()):
            backend = cls(name, config)
            backend.served_models()  # reachable, whatever it is asked for
            backend.check(ops)

    @classmethod
    def model_identity(cls, model: str) -> str:
        return f"triton:{model}"  # the weights are the server's: a run names what it asked for

    @classmethod
    def open(cls, model: str, settings: BackendSettings) -> "TritonBackend":
        return cls(model, _config(settings))

    @classmethod
    def serves(cls, model: str, settings: BackendSettings | None = None) -> frozenset[str]:
        from specrag.inference.models import model_spec
        return cls.SERVES.get(model_spec(model).kind, frozenset())

    def __init__(self, model: str, config: TritonConfig = TritonConfig()):
        self.name = model
        self.capabilities = self.serves(model)
        self.config = config
        self.protocol, self.address = config.endpoint()
        self.max_inflight_batches = config.max_inflight_batches
        self._conn = _Connection.get(self.protocol, self.address)

    # -- discovery ----------------------------------------------------------------------
    def served_models(self, refresh: bool = False) -> dict[str, dict]:
        """Triton model name -> {op, model, state, reason} for every model in the repository."""
        if self._conn.served is None or refresh:
            self._conn.served = self._conn.loop.run(self._discover(), self.config.timeout_s)
        return self._conn.served

    async def _discover(self) -> dict[str, dict]:
        client = self._conn.client
        try:
            if not await client.is_server_live():
                raise TritonUnavailable(f"Triton at {self.config.url} is not live")
            index = await client.get_model_repository_index()
        except TritonError:
            raise
        except Exception as e:
            raise TritonUnavailable(f"cannot reach Triton at {self.config.url}: {_message(e)} — start one with "
                                    "`python deploy/triton/launch.py serve`") from e
        entries = index.models if hasattr(index, "models") else index
        served = {}
        for m in entries:
            get = (lambda k: getattr(m, k, "")) if hasattr(m, "name") else m.get
            name, state, reason = get("name"), get("state") or "", get("reason") or ""
            info = {"op": "", "model": "", "state": state, "reason": reason}
            if state == "READY":
                cfg = await client.get_model_config(name)
                cfg = cfg.config if hasattr(cfg, "config") else cfg
                info.update(_parameters(cfg))
            served[name] = info
        return served

    def triton_model(self, op: str) -> str:
        """The Triton model that serves ``op`` with this backend's weights, or a clear error."""
        for attempt in (0, 1):
            served = self.served_models(refresh=attempt == 1)
            for name, info in sorted(served.items()):
                if info["op"] == op and _same_model(info["model"], self.name) and info["state"] == "READY":
                    return name
        listing = "; ".join(f"{n} ({i['op'] or '?'}, {i['model'] or '?'}, {i['state']}"
                            f"{': ' + i['reason'] if i['reason'] else ''})" for n, i in sorted(served.items()))
        raise TritonError(f"Triton at {self.config.url} has no READY model serving {op}() with weights "
                          f"{self.name!r}; it has: {listing or 'no models'}")

    def check(self, ops: Sequence[str]) -> None:
        """Fail fast (at pipeline start) if the server is down or lacks a model for an op."""
        for op in ops:
            self.triton_model(op)

    # -- operations ---------------------------------------------------------------------
    def generate(self, requests: list[GenerateRequest], return_exceptions: bool = False) -> list[Generation]:
        return self._call("generate", requests, return_exceptions)

    def score(self, requests: list[ScoreRequest], return_exceptions: bool = False) -> list[Scored]:
        return self._call("score", requests, return_exceptions)

    def fused_decode(self, requests: list[FusedDecodeRequest], return_exceptions: bool = False) -> list[Generation]:
        return self._call("fused_decode", requests, return_exceptions)

    def rerank(self, requests: list[RerankRequest], return_exceptions: bool = False) -> list[float]:
        return self._call("rerank", requests, return_exceptions)

    def denoise(self, requests: list[DenoiseRequest], return_exceptions: bool = False) -> list[Denoised]:
        return self._call("denoise", requests, return_exceptions)

    @property
    def mask_id(self) -> int:
        """A masked-diffusion model's mask token (from its tokenizer, on the client)."""
        mask = self._tokenizer().mask_token_id
        if mask is None:
            raise TypeError(f"model {self.name!r} has no mask token")
        return mask

    @property
    def eos_ids(self) -> list[int]:
        """End-of-text ids: a denoiser's end fill ([SEP] for the encoder family; an adapted AR
        model fills with its EOS), else the tokenizer's EOS."""
        from specrag.inference.models import model_spec
        tok = self._tokenizer()
        encoder_fill = model_spec(self.name).kind == "masked-diffusion" and tok.sep_token_id is not None
        end = tok.sep_token_id if encoder_fill else tok.eos_token_id
        return [end] if end is not None else []

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [self._tokenizer()(t, add_special_tokens=False)["input_ids"] for t in texts]

    def detokenize(self, ids: list[list[int]]) -> list[str]:
        return [self._tokenizer().decode(list(i), skip_special_tokens=True) for i in ids]

    def _tokenizer(self):
        """The served model's tokenizer, loaded on the client (files only, no weights)."""
        if getattr(self, "_tok", None) is None:
            from transformers import AutoTokenizer
            from specrag.inference.models import materialise
            self._tok = AutoTokenizer.from_pretrained(materialise(self.name))
        return self._tok

    def embed(self, texts: list[str], return_exceptions: bool = False):
        rows = self._call("embed", list(texts), return_exceptions)
        if return_exceptions:
            return rows
        return np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)

    def _call(self, op: str, rows: list, return_exceptions: bool) -> list:
        if not rows:
            return []
        name = self.triton_model(op)
        return self._conn.loop.run_rows(rows, functools.partial(self._row, name, op), return_exceptions)

    def cancel(self, requests: list) -> None:
        """Close the requests of rows nobody waits for (Triton can drop a cancelled request
        it has not started; one a model instance runs goes to its end)."""
        self._conn.loop.abandon(requests)

    async def _row(self, name: str, op: str, row: Any) -> Any:
        tensors = encode_requests(op, [row])
        InferInput = self._conn.input_class()
        inputs = []
        for tensor_name, dtype in OPS[op].inputs:
            arr = tensors[tensor_name]
            inp = InferInput(tensor_name, list(arr.shape), dtype)
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        cfg = self.config
        for attempt in range(cfg.retries + 1):
            try:
                if self.protocol == "grpc":
                    result = await self._conn.client.infer(name, inputs, client_timeout=cfg.timeout_s)
                else:
                    result = await asyncio.wait_for(self._conn.client.infer(name, inputs), cfg.timeout_s)
                return decode_results(op, {n: result.as_numpy(n) for n, _ in OPS[op].outputs})[0]
            except Exception as e:
                if _timed_out(e):
                    raise TritonTimeout(f"Triton {name}.{op}: no answer within {cfg.timeout_s:g}s "
                                        f"({self.config.url})") from e
                if not _retryable(e):
                    raise TritonError(f"Triton {name}.{op} failed: {_message(e)}") from e
                if attempt == cfg.retries:
                    raise TritonUnavailable(f"Triton {name}.{op}: server at {self.config.url} unavailable after "
                                            f"{cfg.retries + 1} attempts: {_message(e)}") from e
                await asyncio.sleep(cfg.backoff_s * 2 ** attempt)
        raise AssertionError("unreachable")


def _same_model(served: str, asked: str) -> bool:
    """The same spec, or the same file or folder however each side wrote its path."""
    if served == asked:
        return True
    from pathlib import Path
    return bool(served) and Path(asked).exists() and Path(served).exists() \
        and Path(asked).resolve() == Path(served).resolve()


def _parameters(cfg: Any) -> dict[str, str]:
    """specrag_op / specrag_model from a model config (gRPC protobuf or HTTP JSON)."""
    params = cfg.get("parameters", {}) if isinstance(cfg, dict) else cfg.parameters
    def value(key):
        if key not in params:
            return ""
        v = params[key]
        return v.get("string_value", "") if isinstance(v, dict) else v.string_value
    return {"op": value(PARAM_OP), "model": value(PARAM_MODEL)}
