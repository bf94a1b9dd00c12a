"""Arrow schemas of every table specrag reads or writes.

One place defines the columns so readers, writers, validators and tests agree. Nested
trace fields are structs (queryable in any Parquet engine); method-specific extras that
have no fixed shape go to ``trace.details`` as JSON text.
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

TIMINGS = pa.struct([
    pa.field("total_s", pa.float64()),
    pa.field("retrieval_s", pa.float64()),
    pa.field("generation_s", pa.float64()),
    pa.field("verification_s", pa.float64()),
    pa.field("embedding_s", pa.float64()),
    pa.field("waiting_s", pa.float64()),
])

RETRIEVAL_STEP = pa.struct([
    pa.field("stage", pa.string()),
    pa.field("query", pa.string()),
    pa.field("doc_ids", pa.list_(pa.string())),
    pa.field("scores", pa.list_(pa.float64())),
])

DRAFT = pa.struct([
    pa.field("text", pa.string()),
    pa.field("score", pa.float64()),
    pa.field("doc_ids", pa.list_(pa.string())),
    pa.field("answer", pa.string()),
    pa.field("rationale", pa.string()),
    pa.field("parsed", pa.string()),  # ok | no_rationale | empty
    pa.field("rho_draft", pa.float64()),  # log-scores of Speculative RAG's verification
    pa.field("rho_sc", pa.float64()),
    pa.field("rho_sr", pa.float64()),
])

TRACE = pa.struct([
    pa.field("retrieved", pa.list_(RETRIEVAL_STEP)),
    pa.field("drafts", pa.list_(DRAFT)),
    pa.field("chosen_draft", pa.int32()),
    pa.field("counts", COUNTS),
    pa.field("timings", TIMINGS),
    pa.field("details", pa.string()),  # JSON object
])

RESULTS = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("method", pa.string()),
    pa.field("config_fingerprint", pa.string()),
    pa.field("dataset", pa.string()),
    pa.field("task_type", pa.string()),
    pa.field("answer", pa.string()),
    pa.field("raw_output", pa.string()),
    pa.field("choice", pa.string()),
    pa.field("trace", TRACE),
])

DEAD_LETTERS = pa.schema([
    pa.field("id", pa.string()),
    pa.field("stage", pa.string()),
    pa.field("error_type", pa.string()),
    pa.field("message", pa.string()),
    pa.field("raw", pa.string()),  # JSON of the input row or state, for replay
])

COUNT_FIELDS = tuple(f.name for f in COUNTS)
TIMING_FIELDS = tuple(f.name for f in TIMINGS)
