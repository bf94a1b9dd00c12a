"""Where the whole answer job's time over its engine alone goes, on vLLM: the same 32 PopQA
questions (BM25 top-10, standard RAG, bf16, one thread) answered alternately by the engine alone
(``run_method``) and by the whole Beam job (``run_answer`` on the FnApiRunner), each from an empty
prefix cache. Each run is split at the first query's admission into the engine and the last
query's completion: before (pipeline start, Parquet read, the index opened), serving, after (the
results and manifest written). The first round is a warm-up and is not counted.

    .venv/bin/python benchmarks/job_overhead.py [--rounds 4]

Prints each run and the medians (``peers.py`` records the comparison with the peers).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import REPO, popqa_bm25  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4, help="engine and job alternately; the first is a warm-up")
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    args = ap.parse_args()
    from specrag.inference import Engine, EngineConfig, Services
    from specrag.inference.vllm import VllmConfig
    from specrag.methods import create_method
    from specrag.methods.local_run import run_method
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.transforms.runtime import RuntimeConfig, load_backend

    marks: list[tuple[str, float]] = []
    submit = Engine.submit

    def timed_submit(self, stages, state):  # the admission and completion times of every query
        marks.append(("submit", time.perf_counter()))
        future = submit(self, stages, state)
        future.add_done_callback(lambda _f: marks.append(("done", time.perf_counter())))
        return future
    Engine.submit = timed_submit

    work, retriever, queries = popqa_bm25(args.data_dir, 32, "job-overhead-")
    model, vllm, engine_config = "smollm2-135m-instruct", (VllmConfig(),), EngineConfig(max_batch=16, max_wait_s=0.005)
    served = load_backend("vllm", model, 1, "bfloat16", configs=vllm)  # the job finds it loaded
    runtime = RuntimeConfig(backend="vllm", models=(("generator", model),), index_dir=str(work / "index"),
                            retriever="bm25", num_threads=1, dtype="bfloat16", backend_configs=vllm,
                            engine=engine_config)
    rows: dict[str, list[tuple[float, ...]]] = {"engine": [], "job": []}
    for round_ in range(args.rounds):
        for kind in rows:
            served.clear_prefix_cache()
            marks.clear()
            start = time.perf_counter()
            if kind == "engine":
                engine = Engine(Services(models={"generator": served}, retriever=retriever), engine_config)
                run_method(engine, create_method("standard", top_k=10), queries)
                engine.close()
            else:
                run_answer(AnswerJob(str(work / "data" / "popqa" / "queries.parquet"), str(work / f"job-{round_}"),
                                     create_method("standard", top_k=10), runtime, limit=len(queries)))
            end = time.perf_counter()
            first = min(t for k, t in marks if k == "submit")
            last = max(t for k, t in marks if k == "done")
            row = (end - start, first - start, last - first, end - last)
            print(f"{kind} round {round_}: wall {row[0]:.2f} s, before {row[1]:.2f}, serving {row[2]:.2f}, "
                  f"after {row[3]:.2f}", flush=True)
            if round_:
                rows[kind].append(row)
    for kind, runs in rows.items():
        print(f"{kind} medians: " + ", ".join(f"{name} {statistics.median(c):.2f} s" for name, c in
                                               zip(("wall", "before", "serving", "after"), zip(*runs))))
    served.server.stop()


if __name__ == "__main__":
    main()
