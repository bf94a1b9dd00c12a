"""`specrag demo`: the quick start on the project's own demo data (no ../shared needed).

Writes the demo corpus and questions as Parquet, builds a BM25 index with the Beam job,
answers the questions with `no-retrieval` and `standard` RAG, and prints the metrics table.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from specrag.schemas.tables import PASSAGES, QUERIES


def write_demo_tables(workdir: Path) -> tuple[Path, Path]:
    """The bundled demo JSONL → queries.parquet and corpus.parquet in ``workdir``."""
    data = resources.files("specrag.pipelines") / "demo_data"
    workdir.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, schema in (("queries", QUERIES), ("corpus", PASSAGES)):
        rows = [json.loads(line) for line in (data / f"{name}.jsonl").read_text().splitlines() if line]
        for r in rows:
            if name == "queries":
                r.setdefault("metadata", "{}")
        path = workdir / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        out[name] = path
    return out["queries"], out["corpus"]


def run_demo(workdir: Path, threads: int = 1, beam_args: tuple[str, ...] = ("--runner=FnApiRunner",)) -> int:
    from specrag.evaluation.report import evaluate_run, format_table, save_report
    from specrag.methods import create_method
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.pipelines.build_index import run_build_index
    from specrag.transforms.runtime import RuntimeConfig

    queries, corpus = write_demo_tables(workdir)
    index = workdir / "index"
    run_build_index(str(corpus), str(index), ["bm25"], num_threads=threads, beam_args=beam_args)
    rows = []
    for name in ("no-retrieval", "standard"):
        method = create_method(name, **({"top_k": 3} if name == "standard" else {}))
        runtime = RuntimeConfig(index_dir=str(index), num_threads=threads).with_roles(method.model_roles)
        out = workdir / name
        run_answer(AnswerJob(str(queries), str(out), method, runtime, beam_args=beam_args,
                             overwrite=True))  # the demo starts afresh every time
        report = evaluate_run(out, str(queries))
        save_report(report, out / "evaluation.json")
        rows.extend(report["rows"])
    print(format_table(rows))
    print(f"\noutputs: {workdir}/<method>/results-*.parquet, dead_letters-*.parquet, manifest.json")
    return 0
