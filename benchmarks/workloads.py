"""Workloads and reporting shared by the benchmarks (run as scripts from the repository root)."""
from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_SETS = ["hotpotqa", "popqa", "nq", "webquestions", "arc_challenge", "arc_challenge_selfrag", "pubhealth",
               "asqa"]


def popqa_bm25(data_dir: str, n: int, prefix: str):
    """(workdir, BM25 retriever over the pooled corpus, first n PopQA queries)."""
    import pyarrow.parquet as pq
    from specrag.importers import import_datasets
    from specrag.pipelines.build_index import run_build_index
    from specrag.retrieval import open_retriever
    from specrag.schemas import validate_query
    work = Path(tempfile.mkdtemp(prefix=prefix))
    import_datasets(Path(data_dir), SHARED_SETS, work / "data", pool=True)
    run_build_index(str(work / "data" / "pooled_corpus.parquet"), str(work / "index"), ["bm25"])
    retriever = open_retriever(work / "index", "bm25")
    queries = [validate_query(r) for r in pq.read_table(work / "data" / "popqa" / "queries.parquet").to_pylist()]
    return work, retriever, queries[:n]


def drafting_workload(data_dir: str, dtype: str, threads: int):
    """(work folder, imported data folder, Services) shared by the Speculative RAG and SPS
    benchmarks: BM25 over the pooled corpus; SmolLM2 as generator and drafter, Gemma-3 as
    verifier, MiniLM as embedder; loaded once."""
    from specrag.importers import import_datasets
    from specrag.inference import Services
    from specrag.inference.local import LocalBackend, LocalModelConfig
    from specrag.pipelines.build_index import run_build_index
    from specrag.retrieval import open_retriever
    work = Path(os.environ.get("SPECRAG_BENCH_DIR", "/tmp/specrag-srag-bench"))
    data = work / "data"
    if not (data / "pooled_corpus.parquet").exists():
        import_datasets(Path(data_dir), SHARED_SETS, data, pool=True)
    if not (work / "index" / "manifest.json").exists():
        run_build_index(str(data / "pooled_corpus.parquet"), str(work / "index"), ["bm25"])

    def load(name: str, model_dtype: str = dtype):
        return LocalBackend(LocalModelConfig(name, num_threads=threads, dtype=model_dtype))
    small = load("smollm2-135m-instruct")
    services = Services(models={"generator": small, "drafter": small, "verifier": load("gemma3-270m"),
                                "embedder": load("all-minilm-l6-v2", "float32")},
                        retriever=open_retriever(work / "index", "bm25"))
    return work, data, services


def serve_one_by_one(engine, method, queries: list[dict], cache: Path | None = None) -> tuple[list[float], list]:
    """Serve queries one at a time (the papers' latency setting): per-query seconds and states.

    With ``cache`` (a file per method fingerprint), each finished query is kept there, so an
    interrupted or longer run (more questions) serves only the queries it has not measured yet.
    """
    import pickle
    from specrag.methods.local_run import run_method
    done: dict[str, tuple[float, object]] = {}
    if cache is not None and cache.exists():
        done = pickle.loads(cache.read_bytes())
    for q in queries:
        if q["id"] in done:
            continue
        start = time.perf_counter()
        states, failures = run_method(engine, method, [q])
        elapsed = time.perf_counter() - start
        if failures:
            raise SystemExit(f"{method.name}: {failures}")
        done[q["id"]] = (elapsed, states[0])
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(".tmp")
            tmp.write_bytes(pickle.dumps(done))
            tmp.replace(cache)
    return [done[q["id"]][0] for q in queries], [done[q["id"]][1] for q in queries]


def cache_file(work: Path, dataset: str, method, dtype: str, threads: int) -> Path:
    """Where one (dataset, method settings, model dtype, threads) series of measurements is kept."""
    return work / "measured" / dataset / f"{method.name}-{method.fingerprint()}-{dtype}-t{threads}.pkl"


def markdown_table(rows: list[dict], cols: list[str]) -> list[str]:
    fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
    return (["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            + ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows])


def machine_line(threads: int) -> str:
    import torch
    return (f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{threads} torch thread(s)")


def recorded() -> str:
    return f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."


def publish(results: str, title: str, setup: str, report: str, last_line: str) -> None:
    """Print the report and its last line; record both with the command that made them."""
    print(report)
    command = " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    Path(results).parent.mkdir(parents=True, exist_ok=True)
    Path(results).write_text(f"# {title}\n\nCommand: `{command}`\n\n{setup}\n{recorded()}\n{report}\n\n{last_line}\n")
    print(last_line)
