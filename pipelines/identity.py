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


def run_fingerprint(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
