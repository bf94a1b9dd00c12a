"""Arrow schemas of every table specrag reads or writes.

One place defines the columns so readers, writers, validators and tests agree. A results
table is the core columns every method shares (so runs of different methods join by id and
report alike) plus, for a method that declares one, a ``trace`` struct typed from the
method's trace dataclass (``results_schema``). Nothing is stored as JSON text but the
replayable input of a dead letter.
"""
from __future__ import annotations

import pyarrow as pa

TASK_TYPES = ("short_form", "multiple_choice", "claim_verification", "long_form")

QUERIES = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("question", pa.string(), nullable=False),
    # Gold answers: aliases (short form), the choice label (multiple choice), the label
    # (claim verification) or reference long answers (long form).
    pa.field("answers", pa.list_(pa.string())),
    # Long form only: one alias list per sub-question, for str-EM (ASQA's qa_pairs).
    pa.field("answer_groups", pa.list_(pa.list_(pa.string()))),
    pa.field("choices", pa.list_(pa.string())),
    pa.field("choice_labels", pa.list_(pa.string())),
    pa.field("task_type", pa.string()),
    pa.field("dataset", pa.string()),
    pa.field("gold_passage_ids", pa.list_(pa.string())),
    pa.field("metadata", pa.string()),  # JSON object
])

# the columns a user's table must have (the others are optional): checked at start, naming the file
QUERY_COLUMNS = ("id", "question")
PASSAGE_COLUMNS = ("id", "text")

PASSAGES = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("title", pa.string()),
    pa.field("text", pa.string(), nullable=False),
])

COUNTS = pa.struct([
    pa.field("model_calls", pa.int64()),
    pa.field("prompt_tokens", pa.int64()),
    pa.field("generated_tokens", pa.int64()),
    pa.field("retrieval_calls", pa.int64()),
    pa.field("embed_calls", pa.int64()),
    pa.field("score_calls", pa.int64()),
    pa.field("cache_hits", pa.int64()),
    pa.field("speculation_accepted", pa.int64()),
    pa.field("speculation_rejected", pa.int64()),
    pa.field("rollbacks", pa.int64()),
])

# Wall-clock seconds. total_s = queue_s (waiting for admission: backpressure) + served_s.
# A service's time is the wall time with at least one call of that kind outstanding (its
# micro-batch wait included), parts of a fanned-out query together; they overlap where a
# method overlaps work (SPS fetches while it writes), so their sum can exceed served_s.
# other_s: served time with no call outstanding (the method's own code).
TIMINGS = pa.struct([
    pa.field("total_s", pa.float64()),
    pa.field("queue_s", pa.float64()),
    pa.field("served_s", pa.float64()),
    pa.field("retrieval_s", pa.float64()),
    pa.field("generation_s", pa.float64()),
    pa.field("verification_s", pa.float64()),
    pa.field("embedding_s", pa.float64()),
    pa.field("other_s", pa.float64()),
])

# Wall time per stage (parts of a fanned-out stage together), in the order they ran.
STAGE_TIME = pa.struct([
    pa.field("stage", pa.string()),
    pa.field("seconds", pa.float64()),
])

RETRIEVAL_STEP = pa.struct([
    pa.field("stage", pa.string()),
    pa.field("query", pa.string()),
    pa.field("doc_ids", pa.list_(pa.string())),
    pa.field("scores", pa.list_(pa.float64())),
])

RESULT_CORE = [
    pa.field("id", pa.string(), nullable=False),
    pa.field("method", pa.string()),
    pa.field("run_fingerprint", pa.string()),  # the run identity's hash: resumes never mix runs
    pa.field("dataset", pa.string()),
    pa.field("task_type", pa.string()),
    pa.field("answer", pa.string()),
    pa.field("raw_output", pa.string()),
    pa.field("choice", pa.string()),
    pa.field("error", pa.string()),  # null for an answered query (failures are dead letters)
    pa.field("counts", COUNTS),
    pa.field("timings", TIMINGS),
    pa.field("stages", pa.list_(STAGE_TIME)),
    pa.field("retrieved", pa.list_(RETRIEVAL_STEP)),
]

RESULTS = pa.schema(RESULT_CORE)  # the core alone: methods with no trace of their own


def results_schema(trace_class: type | None = None) -> pa.Schema:
    """The results table of a method: the core columns, then its typed ``trace`` struct."""
    if trace_class is None:
        return RESULTS
    from specrag.schemas.typed import arrow_struct
    return pa.schema(RESULT_CORE + [pa.field("trace", arrow_struct(trace_class))])


DEAD_LETTERS = pa.schema([
    pa.field("id", pa.string()),
    pa.field("stage", pa.string()),
    pa.field("error_type", pa.string()),
    pa.field("message", pa.string()),
    pa.field("raw", pa.string()),  # JSON of the input row or state, for replay
])

COUNT_FIELDS = tuple(f.name for f in COUNTS)
TIMING_FIELDS = tuple(f.name for f in TIMINGS)
