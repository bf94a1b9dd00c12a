"""`specrag synthesize-rationales` and `specrag train-drafter`: Speculative RAG's tuned drafter.

synthesize-rationales is a Beam job: the ``rationale-synthesis`` method through the same
runtime as ``answer`` (engine per worker, micro-batched teacher calls, dead letters, resume,
progress), then its typed traces (ids and generated text) joined with the questions and the
passages into ``rationales.parquet`` (the kept examples, the training table) and
``synthesis.json`` (kept and filtered counts by reason). train-drafter tunes the
drafter on them (training/drafter.py) and saves a model folder any run names with
``--model drafter=FOLDER``.
"""
from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa

from specrag.jobio.files import exists, join, match_files, read_parquet, read_text, write_parquet, write_text
from specrag.jobio.tables import read_table

RATIONALES = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("dataset", pa.string()),
    pa.field("task_type", pa.string(), nullable=False),
    pa.field("question", pa.string(), nullable=False),
    pa.field("choices", pa.list_(pa.string())),
    pa.field("choice_labels", pa.list_(pa.string())),
    pa.field("answer", pa.string(), nullable=False),  # what the drafter writes first
    pa.field("doc_ids", pa.list_(pa.string())),
    pa.field("doc_titles", pa.list_(pa.string())),
    pa.field("doc_texts", pa.list_(pa.string())),
    pa.field("rationale", pa.string(), nullable=False),
    pa.field("support_yes", pa.float64()),
    pa.field("support_no", pa.float64()),
])
RATIONALES_FILE = "rationales.parquet"
SUMMARY_FILE = "synthesis.json"


def write_rationales(run_dir: str, queries: str, index: str) -> dict:
    """The synthesis run's results, joined with their questions (``queries``) and the subsets'
    passages (the ``index``'s store) → ``rationales.parquet`` (kept rows, by id) and the summary."""
    from specrag.jobio.inputs import expand_inputs
    seen, kept, reasons, by_dataset = set(), [], Counter(), Counter()
    rows = [r for f in sorted(match_files(join(run_dir, "results-*.parquet")))
            for r in read_parquet(f, columns=["id", "dataset", "trace"]).to_pylist()]
    wanted = {r["id"] for r in rows if r["trace"]["kept"]}
    questions = {q["id"]: q for f in expand_inputs(queries) for q in read_table(f).to_pylist() if q.get("id") in wanted}
    import pyarrow.compute as pc
    doc_ids = sorted({d for r in rows if r["trace"]["kept"] for d in r["trace"]["doc_ids"]})
    table = read_parquet(join(index, "passages.parquet"), columns=["id", "title", "text"])
    # only the kept subsets' passages become Python rows (an index may hold millions)
    passage = {p["id"]: p for p in table.filter(pc.is_in(table.column("id"), pa.array(doc_ids, pa.string())))
               .to_pylist()}
    for r in sorted(rows, key=lambda r: r["id"]):
        if r["id"] in seen:  # a retried shard may repeat a query
            continue
        seen.add(r["id"])
        t = r["trace"]
        reasons[t["reason"]] += 1
        if t["kept"]:
            q, docs = questions.get(r["id"]), [passage.get(d) for d in t["doc_ids"]]
            if q is None or None in docs:
                raise ValueError(f"synthesis row {r['id']}: its question is not in {queries!r} or a passage of its "
                                 f"subset is not in {index!r}: pass the --queries and --index it was made from")
            by_dataset[r["dataset"] or ""] += 1
            kept.append({"id": r["id"], "dataset": r["dataset"], "task_type": t["task_type"],
                         "question": q["question"], "choices": q.get("choices") or [],
                         "choice_labels": q.get("choice_labels") or [], "answer": t["answer"], "doc_ids": t["doc_ids"],
                         "doc_titles": [d["title"] or "" for d in docs], "doc_texts": [d["text"] for d in docs],
                         "rationale": t["rationale"], "support_yes": t["support_yes"], "support_no": t["support_no"]})
    write_parquet(join(run_dir, RATIONALES_FILE), pa.Table.from_pylist(kept, schema=RATIONALES))
    summary = {"questions": len(seen), "kept": len(kept), "filtered": len(seen) - len(kept),
               "by_reason": dict(sorted(reasons.items())), "kept_by_dataset": dict(sorted(by_dataset.items())),
               "rationale_words": sum(len(k["rationale"].split()) for k in kept),
               "rationales": join(run_dir, RATIONALES_FILE)}
    write_text(join(run_dir, SUMMARY_FILE), json.dumps(summary, indent=2))
    return summary


def validate_rationale(row: dict, evaluation: frozenset[str], option_orders: int = 0) -> list:
    """A kept rationale row as DrafterExamples (the Draft prompt rebuilt from its subset): one, or
    a multiple-choice row in ``option_orders`` orders of its options (training/drafter.py)."""
    from specrag.training import drafter
    from specrag.training.drafter import DrafterExample
    from specrag.methods.prompts import build_prompt
    from specrag.retrieval.base import Hit
    from specrag.schemas.validation import RowError
    if row.get("id") in evaluation:
        raise RowError("id", "belongs to an evaluation split: never used for training")
    for name in ("id", "question", "answer", "rationale", "task_type"):
        if not isinstance(row.get(name), str) or not row[name].strip():
            raise RowError(name, "missing or empty")
    texts = row.get("doc_texts") or []
    if not texts:
        raise RowError("doc_texts", "no documents")
    docs = [Hit(i, 0.0, t or "", x) for i, t, x in zip(row.get("doc_ids") or [""] * len(texts),
                                                       row.get("doc_titles") or [""] * len(texts), texts)]
    choices, labels = row.get("choices") or [], row.get("choice_labels") or []
    rationale = " ".join(row["rationale"].split())
    variants = [(choices, row["answer"].strip(), rationale)]
    if row["task_type"] == "multiple_choice" and option_orders:
        variants = drafter.option_orders(choices, labels, row["answer"].strip(), rationale, option_orders, row["id"])
    examples = []
    for options, answer, text in variants:
        query = {"question": row["question"], "task_type": row["task_type"], "choices": options,
                 "choice_labels": labels}
        try:
            prompt = build_prompt(query, docs)
        except KeyError as e:
            raise RowError("task_type", f"unknown task type {row['task_type']!r}") from e
        examples.append(DrafterExample(row["id"], prompt, answer, text))  # one id: held out together
    return examples


def run_train_drafter(rationales: str, out_dir: str, config, *, base: str, overwrite: bool = False,
                      resume: bool = False, max_failure_fraction: float = 0.5, progress=None) -> dict:
    """Train from rationale tables; a folder already trained from the same content is reused.
    Rows that cannot be used (or hold an evaluation id) are dead letters beside the model."""
    from specrag.evaluation.splits import evaluation_ids
    from specrag.training.drafter import cached_report, content_key, train_drafter
    from specrag.inference.models import model_identity
    from specrag.pipelines.training_inputs import check_failures, split_rows, training_run, training_tables
    from specrag.jobio.inputs import dataset_fingerprint
    files = training_tables(rationales, RATIONALES_FILE, "synthesize-rationales")
    rows = sorted((r for f in files for r in read_parquet(f).to_pylist()), key=lambda r: str(r.get("id")))
    evaluation = evaluation_ids()
    valid, dead = split_rows(rows, lambda r: validate_rationale(r, evaluation, config.option_orders), "train-drafter")
    examples = [e for per_row in valid for e in per_row]
    key = content_key(config, model_identity(base), examples)
    cached = cached_report(out_dir, key)
    if cached is not None:
        return {**cached["report"], "cached": True, "dead_letters": len(dead)}
    with training_run(out_dir, resume=resume, overwrite=overwrite) as model_dir:
        check_failures(model_dir, dead, len(rows), max_failure_fraction, "rationale rows", shown_in=out_dir)
        if not examples:
            raise ValueError(f"no usable rationale in {rationales!r}")
        report = train_drafter(examples, config, model_dir, base=base, progress=progress, provenance={
            "rationales": dataset_fingerprint(files), "synthesis": _beside(files, SUMMARY_FILE),
            "teacher": sorted({m.get("identity", {}).get("models", {}).get("teacher", "?")
                               for m in _beside(files, "manifest.json")}),
            "dead_letters": len(dead)})
        from dataclasses import asdict
        return {**asdict(report), "cached": False, "dead_letters": len(dead)}


def _beside(files: list[str], name: str) -> list[dict]:
    """The JSON file ``name`` of each rationale file's synthesis run, where it has one."""
    folders = sorted({f.rsplit("/", 1)[0] for f in files})
    return [json.loads(read_text(join(d, name))) for d in folders if exists(join(d, name))]
