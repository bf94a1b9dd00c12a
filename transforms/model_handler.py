"""specrag's backends under Beam's ModelHandler contract, for single-call stages.

A stage that is one batched model call per element (the embedding step of ``build-index``,
and any user's own) needs no engine: ``RunInference(BackendModelHandler(...))`` loads the
backend once per worker, batches elements with Beam's ``BatchElements`` and reports Beam's
inference metrics, exactly as for any RunInference model. Multi-stage methods keep the
engine (transforms/stages.py), which micro-batches across queries and stages.

Example usage::

    handler = BackendModelHandler("local", "all-minilm-l6-v2", "embed")
    vectors = texts | RunInference(handler)                         # PredictionResult(text, vector)
    keyed = pairs | RunInference(KeyedModelHandler(handler))        # (id, PredictionResult)
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from specrag import registry
from specrag.inference.capabilities import MissingCapability
from specrag.inference.engine import BackendSettings
from specrag.transforms.runtime import load_backend

# operations that map one input to one output (the engine serves the rest)
SINGLE_CALL = ("generate", "score", "embed")


class BackendModelHandler(ModelHandler[Any, PredictionResult, Any]):
    """One operation of one model on one backend (local, Triton or vLLM), as a ModelHandler."""

    def __init__(self, backend: str, model: str, operation: str, *, num_threads: int = 1,
                 dtype: str = "float32", configs: tuple[Any, ...] = (), min_batch_size: int = 1,
                 max_batch_size: int = 64, share_across_processes: bool = False):
        super().__init__()
        if operation not in SINGLE_CALL:
            raise ValueError(f"operation must be one of {SINGLE_CALL}, got {operation!r}")
        served = registry.BACKENDS[backend].serves(model, BackendSettings(num_threads, dtype, configs=configs))
        if operation not in served:
            raise MissingCapability(f"{model} on the {backend} backend does not serve {operation} "
                                    f"(it serves {', '.join(sorted(served))})")
        if not 1 <= min_batch_size <= max_batch_size:
            raise ValueError("need 1 <= min_batch_size <= max_batch_size")
        self.backend, self.model, self.operation = backend, model, operation
        self.num_threads, self.dtype, self.configs = num_threads, dtype, configs
        self._batching = {"min_batch_size": min_batch_size, "max_batch_size": max_batch_size}
        self._share = share_across_processes

    def load_model(self) -> Any:
        from specrag.transforms.runtime import RuntimeConfig, worker_setup
        worker_setup(RuntimeConfig(backend=self.backend, models=(("model", self.model),),
                                   num_threads=self.num_threads))
        return load_backend(self.backend, self.model, self.num_threads, self.dtype, configs=self.configs)

    def run_inference(self, batch: Sequence[Any], model: Any,
                      inference_args: dict[str, Any] | None = None) -> Iterable[PredictionResult]:
        outputs = getattr(model, self.operation)(list(batch))
        model_id = f"{self.backend}:{self.model}"
        return [PredictionResult(x, y, model_id) for x, y in zip(batch, outputs)]

    def batch_elements_kwargs(self) -> dict[str, int]:
        return dict(self._batching)

    def share_model_across_processes(self) -> bool:
        return self._share

    def get_metrics_namespace(self) -> str:
        return f"specrag.{self.operation}"


class BlockHandler(ModelHandler[Any, PredictionResult, Any]):
    """A ``BackendModelHandler`` over blocks: each element is a list of ``(key, input)`` pairs,
    served as calls of at most ``rows`` inputs in the block's order, whatever the bundles.

    Why not RunInference's own batching: a batch follows the runner's bundles, and a float
    kernel's last bits depend on its batch's shape (padding, GEMM blocking), so the same corpus
    embedded on Prism and on the FnApiRunner gave other vectors. Blocks fixed by the data give
    byte-identical outputs on every runner (build-index's "indexes byte-identical").

    Example usage::

        blocks | RunInference(BlockHandler(BackendModelHandler("local", "all-minilm-l6-v2", "embed")))
    """

    def __init__(self, inner: BackendModelHandler, rows: int = 64):
        super().__init__()
        self.inner, self.rows = inner, rows

    def load_model(self) -> Any:
        return self.inner.load_model()

    def run_inference(self, batch: Sequence[Any], model: Any,
                      inference_args: dict[str, Any] | None = None) -> Iterable[PredictionResult]:
        out = []
        for block in batch:
            results = []
            for start in range(0, len(block), self.rows):
                chunk = block[start:start + self.rows]
                results.extend(self.inner.run_inference([x for _, x in chunk], model, inference_args))
            out.append(PredictionResult(block, list(zip((k for k, _ in block), results)), results[0].model_id
                                        if results else None))
        return out

    def batch_elements_kwargs(self) -> dict[str, int]:
        return {"min_batch_size": 1, "max_batch_size": 1}

    def share_model_across_processes(self) -> bool:
        return self.inner.share_model_across_processes()

    def get_metrics_namespace(self) -> str:
        return self.inner.get_metrics_namespace()
