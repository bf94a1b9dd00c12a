"""The job's Beam counters for elements on their way to the sinks (queries in, dead letters by
stage and error, the model and retrieval work of each answered query): one place for batch and
streaming answer jobs."""
from __future__ import annotations

from typing import Any, Callable

from apache_beam.metrics import Metrics

from specrag.transforms.records import result_row
from specrag.transforms.stages import NAMESPACE

WORK_COUNTS = ("model_calls", "prompt_tokens", "generated_tokens", "retrieval_calls", "embed_calls")


def count_element(metric: str) -> Callable[[Any], Any]:
    """An identity map that counts each element under ``metric``."""
    counter = Metrics.counter(NAMESPACE, metric)

    def inc(element):
        counter.inc()
        return element
    return inc


def count_dead_letter(row: dict) -> dict:
    Metrics.counter(NAMESPACE, f"dead_letters.{row['stage']}.{row['error_type']}").inc()
    return row


def counted_result_row(kv, name: str, fingerprint: str) -> dict:
    """The result row of a finished (id, QueryState), with its work added to the job's counters."""
    row = result_row(kv[1], name, fingerprint)
    counts = row["counts"]
    for key in WORK_COUNTS:
        if counts.get(key):
            Metrics.counter(NAMESPACE, key).inc(counts[key])
    Metrics.counter(NAMESPACE, "answered").inc()
    return row
