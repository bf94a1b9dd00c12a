"""A run's identity: everything that decides a query's result, and its fingerprint in every
result row. A resume is allowed only over a folder whose identity is this one
(``RunFolder.check_resumable``); batch and streaming answer runs share it."""
from __future__ import annotations

import hashlib
import inspect
import json
from typing import Any


def run_identity(job) -> dict[str, Any]:
    """Of an AnswerJob (batch or streaming): everything that decides a query's result: method and settings, models (weight hashes),
    backend, dtype, retriever and index, datastore, prompt templates."""
    from specrag.methods import prompts
    return {"method": job.method.name, "method_config": job.method.config.to_dict(), **job.runtime.identity(),
            "prompts": hashlib.sha256(inspect.getsource(prompts).encode()).hexdigest()[:16]}


def keep_earlier_prefill(runtime, output: str):
    """The runtime with the prefill of the run already in ``output`` (resumed, or reused by
    ``specrag compare``) when ``--prefix-cache-mb`` is not given: prefix reuse is on by default
    since 2026-12-05, and a run made before resumes as it was made, not refused as another run."""
    from dataclasses import replace

    from specrag.jobio.run_folder import ANSWER, RunFolder
    from specrag.transforms.runtime import PREFILL_KEY
    earlier = RunFolder(output, ANSWER).recorded_identity() if runtime.prefix_cache_mb else None
    if earlier is not None and PREFILL_KEY not in earlier:
        return replace(runtime, prefix_cache_mb=0)
    return runtime


def run_fingerprint(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
