"""Beam engines: the same specrag jobs on the FnApiRunner, Prism and a local Flink cluster.

Usage (from the repository root, after `make install-prism install-flink`):

    .venv/bin/python benchmarks/engines.py [--queries 64] [--max-new-tokens 16]

In one run: `specrag answer` (standard RAG, top-3 BM25 passages of the pooled corpus of the
shared sets, batch-invariant decoding) on the first N PopQA questions, and `build-index` (BM25)
over that pooled corpus, each on
- the FnApiRunner with two worker processes (`--direct_num_workers=2`, multi_processing), and with
  one (a reference for Prism, which runs one SDK worker process),
- Prism (Beam's portable reference runner, built by `make install-prism`; its LOOPBACK workers),
- Flink 1.19 (deploy/flink: a JobManager and two TaskManagers of one slot, parallelism 2, each
  TaskManager's SDK worker started by specrag-worker).
Every job runs as a fresh `specrag` process; each set-up gets the machine's cores, as torch
threads per worker process (cores / worker processes: Prism's one process gets them all, and is
also run with one thread, as before 2026-12-04). Reports wall time,
queries (passages) per second, each runner's throughput over the FnApiRunner's, and whether the
answers and the index files equal the FnApiRunner's. Writes benchmarks/results/engines.md, ending
`flink_vs_fnapi=… prism_vs_fnapi=… identical=…` (the answer job's throughput ratios).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]


def _flink_launcher():
    spec = importlib.util.spec_from_file_location("specrag_flink_launch", REPO / "deploy" / "flink" / "launch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _answers(out: Path) -> dict:
    import pyarrow.parquet as pq
    rows = pq.read_table(sorted(out.glob("results-*.parquet"))).to_pylist()
    return {r["id"]: (r["answer"], r["raw_output"]) for r in rows}


def _index_files(index: Path) -> dict:
    return {str(p.relative_to(index)): p.read_bytes() for p in sorted(index.rglob("*"))
            if p.is_file() and (p.parent.name == "bm25" or p.name == "passages.parquet")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=3)
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "engines.md"))
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "benchmarks"))
    from workloads import imported_data, machine_line, markdown_table, publish, specrag_cli

    prism = REPO / ".engines" / "bin" / "prism"
    if not prism.is_file():
        raise SystemExit("no Prism binary: run `make install-prism`")
    launch = _flink_launcher()
    launch.install()
    work = Path(tempfile.mkdtemp(prefix="specrag-engines-"))
    data = imported_data(work, args.data_dir)
    corpus = data / "pooled_corpus.parquet"
    queries = work / "queries.parquet"
    import pyarrow.parquet as pq
    pq.write_table(pq.read_table(data / "popqa" / "queries.parquet").slice(0, args.queries), queries, row_group_size=8)

    cluster = launch.Cluster(work / "flink", taskmanagers=2, slots=1, env=dict(os.environ)).start()
    cores = os.cpu_count() or 1
    # each set-up gets the machine's cores: torch threads per worker process = cores / processes.
    # Prism runs one SDK worker process per environment (it ignores --sdk_worker_parallelism), so
    # its one process gets every core, as the FnApiRunner with one process does
    runners = {"fnapi (2 processes)": (["--runner=FnApiRunner", "--direct_num_workers=2",
                                        "--direct_running_mode=multi_processing"], max(1, cores // 2)),
               "fnapi-1 (1 process)": (["--runner=FnApiRunner"], cores),
               "prism": (["--runner=PrismRunner", f"--prism_location={prism}"], cores),
               "prism-1t (1 thread)": (["--runner=PrismRunner", f"--prism_location={prism}"], 1),
               "flink (2 TaskManagers)": (cluster.flags(), max(1, cores // 2))}
    measured: dict[str, dict] = {}
    try:
        for name, (flags, threads) in runners.items():
            slug = name.split()[0]
            index = work / f"index-{slug}"
            started = time.perf_counter()
            specrag_cli("build-index", "--corpus", str(corpus), "--index", str(index), "--kinds", "bm25", *flags)
            index_s = time.perf_counter() - started
            out = work / f"answer-{slug}"
            started = time.perf_counter()
            specrag_cli("answer", "--queries", str(queries), "--index", str(work / "index-fnapi"), "--method",
                        "standard", "--set", f"top_k={args.top_k}", "--set", f"max_new_tokens={args.max_new_tokens}",
                        "--set", "batch_invariant=true", "--threads", str(threads), "--output", str(out), *flags)
            answer_s = time.perf_counter() - started
            measured[name] = {"index_s": index_s, "answer_s": answer_s, "answers": _answers(out), "threads": threads,
                              "index": _index_files(index),
                              "engines": json.loads((out / "manifest.json").read_text())["counters"]["engines_started"]}
    finally:
        cluster.stop()

    base = measured["fnapi (2 processes)"]
    passages = pq.read_metadata(corpus).num_rows
    rows, identical = [], True
    for name, m in measured.items():
        same_answers = m["answers"] == base["answers"] and len(m["answers"]) == args.queries
        same_index = m["index"] == base["index"]
        identical &= same_answers and same_index
        rows.append({"runner": name, "torch_threads_per_worker": m["threads"], "answer_s": round(m["answer_s"], 1),
                     "queries_per_s": round(args.queries / m["answer_s"], 3),
                     "answer_vs_fnapi": round(base["answer_s"] / m["answer_s"], 2),
                     "build_index_s": round(m["index_s"], 1),
                     "passages_per_s": round(passages / m["index_s"], 1),
                     "index_vs_fnapi": round(base["index_s"] / m["index_s"], 2),
                     "engines_started": m["engines"], "same_answers": same_answers, "same_index_files": same_index})
    ratio = {name.split()[0]: r["answer_vs_fnapi"] for name, r in zip(measured, rows)}
    one = measured["fnapi-1 (1 process)"]["answer_s"]
    per_worker = (f"prism_vs_fnapi_1_process={round(one / measured['prism']['answer_s'], 2)} "
                  f"prism_1_thread_vs_fnapi={round(base['answer_s'] / measured['prism-1t (1 thread)']['answer_s'], 2)}")
    setup = (f"standard RAG (top-{args.top_k} BM25, {args.max_new_tokens} new tokens, batch-invariant, SmolLM2-135M) "
             f"on the first {args.queries} PopQA questions, and build-index (BM25) over the pooled corpus "
             f"({passages} passages); each a fresh `specrag` process, the machine's {cores} cores shared out as torch "
             f"threads per worker process (`--threads`). "
             f"Times include each job's start-up (Flink: submission, the TaskManagers' SDK workers, model loads).\n"
             f"{machine_line(cores).replace(' torch thread(s)', ' torch threads per set-up')}")
    last = f"flink_vs_fnapi={ratio['flink']} prism_vs_fnapi={ratio['prism']} identical={str(identical).lower()}"
    report = "\n".join(markdown_table(rows, list(rows[0]))) + f"\n\nPer worker process: {per_worker}"
    publish(args.results, "Beam engines: FnApiRunner, Prism, Flink", setup, report, last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
