"""`specrag label-utility` and `specrag train-utility`: AED-RAG's utility predictor, end to end.

label-utility is a Beam job: the ``aed-label`` method through the same runtime as ``answer``
(engine per worker, micro-batched ``score`` calls, dead letters, resume), then its typed
traces flattened into one labels table: a row per (training question, unit) with the unit's
text and its contrastive perplexity. train-utility distils those labels into the predictor
(training/utility_predictor.py) and saves it as a model folder any run can name with
``--model utility=FOLDER``.
"""
from __future__ import annotations

import pyarrow as pa

from specrag.jobio.files import join, match_files, read_parquet, write_parquet

LABELS = pa.schema([
    pa.field("query_id", pa.string(), nullable=False),
    pa.field("dataset", pa.string()),
    pa.field("question", pa.string(), nullable=False),
    pa.field("answer", pa.string(), nullable=False),
    pa.field("answer_tokens", pa.int32()),
    pa.field("unit", pa.int32(), nullable=False),  # position in the question's U_mix
    pa.field("kind", pa.string(), nullable=False),  # passage | triplets | self
    pa.field("unit_id", pa.string()),  # passage id (a triplet set's passage); "" for the self passage
    pa.field("text", pa.string(), nullable=False),
    pa.field("cppl", pa.float64(), nullable=False),
])

LABELS_FILE = "labels.parquet"


def write_labels(run_dir: str) -> dict:
    """The label run's results → ``labels.parquet`` beside them (one row per unit, by query id)."""
    rows = []
    for f in sorted(match_files(join(run_dir, "results-*.parquet"))):
        for r in read_parquet(f, columns=["id", "dataset", "trace"]).to_pylist():
            t = r["trace"]
            for i, u in enumerate(t["units"]):
                rows.append({"query_id": r["id"], "dataset": r["dataset"], "question": t["question"],
                             "answer": t["answer"], "answer_tokens": t["answer_tokens"], "unit": i,
                             "kind": u["kind"], "unit_id": u["unit_id"], "text": u["text"], "cppl": u["cppl"]})
    seen, unique = set(), []
    for row in sorted(rows, key=lambda r: (r["query_id"], r["unit"])):  # a retried shard may repeat a query
        if (row["query_id"], row["unit"]) not in seen:
            seen.add((row["query_id"], row["unit"]))
            unique.append(row)
    write_parquet(join(run_dir, LABELS_FILE), pa.Table.from_pylist(unique, schema=LABELS))
    return {"labels": join(run_dir, LABELS_FILE), "questions": len({r["query_id"] for r in unique}),
            "units": len(unique)}


def label_files(pattern: str) -> list[str]:
    """The labels Parquet files of a label-utility output folder, a file, or a glob."""
    from specrag.pipelines.training_inputs import training_tables
    return training_tables(pattern, LABELS_FILE, "label-utility")


def read_labels(pattern: str) -> list[pa.Table]:
    """Label tables from a label-utility output folder, a file, or a glob."""
    return [read_parquet(f) for f in label_files(pattern)]


def run_train_utility(labels: str, out_dir: str, config, threads: int = 1, *, overwrite: bool = False,
                      resume: bool = False, max_failure_fraction: float = 0.5, base: str | None = None) -> dict:
    """Train from label tables; the untrained baseline for the ranking check is MiniLM similarity.
    Label rows that cannot be used are dead letters beside the model (pipelines/training_inputs.py)."""
    from specrag.pipelines.training_inputs import check_failures, split_rows, training_run, validate_label
    from specrag.training.utility_predictor import load_labels, similarity_scorer, train_utility_predictor
    from specrag.transforms.runtime import load_backend
    from specrag.jobio.inputs import dataset_fingerprint
    with training_run(out_dir, resume=resume, overwrite=overwrite) as model_dir:
        files = label_files(labels)
        rows = [r for f in files for r in read_parquet(f).to_pylist()]
        good, dead = split_rows(rows, validate_label, "train-utility")
        check_failures(model_dir, dead, len(rows), max_failure_fraction, "label rows", shown_in=out_dir)
        queries = load_labels([pa.Table.from_pylist(good)])
        embedder = load_backend("local", "all-minilm-l6-v2", threads)
        report = train_utility_predictor(queries, config, model_dir, untrained=similarity_scorer(embedder.embed),
                                         **({"base": base} if base else {}),
                                         provenance={"labels": dataset_fingerprint(files), "dead_letters": len(dead)})
        from dataclasses import asdict
        return {**asdict(report), "dead_letters": len(dead)}
