"""Triton overhead: the same standard-RAG workload through the local backend and through Triton.

Usage (from the repository root, after `make install-triton`):

    .venv/bin/python benchmarks/triton_overhead.py [--queries 64] [--top-k 10] [--repeats 2]

Runs `standard` RAG (top-10 BM25 documents over the pooled corpus of the shared sets) on the
first N PopQA questions with the engine's micro-batches of 16, in one process: once with the
generator in-process (local backend) and once served by a real Triton server (the bundled
tritonserver on this CPU, started here by deploy/triton/launch.py, same weights, same torch
threads), alternating the two `--repeats` times so drift hits both. `no-retrieval` (short
prompts, where per-request overhead weighs most) runs as a contrast. Prints a table with
Triton's own statistics (rows per model execution: did the dynamic batcher regroup the
engine's batches?), writes benchmarks/results/triton_overhead.md and ends with
`triton_over_local=<ratio>` (median standard-RAG wall time, Triton over local).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]


def _launcher():
    spec = importlib.util.spec_from_file_location("specrag_triton_launch", REPO / "deploy" / "triton" / "launch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _server_stats(server) -> dict:
    """Triton's cumulative counters for the generator: rows, executions, queue and compute time."""
    with urllib.request.urlopen(f"{server.http_url}/v2/models/generator/stats") as r:
        stats = json.loads(r.read())["model_stats"][0]
    infer = stats["inference_stats"]
    return {"rows": int(stats["inference_count"]), "executions": int(stats["execution_count"]),
            "queue_s": int(infer["queue"]["ns"]) / 1e9, "compute_s": int(infer["compute_infer"]["ns"]) / 1e9}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "triton_overhead.md"))
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    from specrag.evaluation.metrics import contains
    from specrag.inference import Engine, EngineConfig, Services
    from specrag.inference.local import LocalBackend, LocalModelConfig
    from specrag.inference.triton import TritonBackend, TritonConfig
    from specrag.methods import create_method
    from specrag.methods.local_run import run_method
    from workloads import machine_line, markdown_table, popqa_bm25, publish

    work, retriever, queries = popqa_bm25(args.data_dir, args.queries, "triton_overhead-")
    launch = _launcher()
    server = launch.TritonServer(venv=launch.install(), threads=args.threads,
                                 log_path=work / "tritonserver.log").start()
    try:
        backends = {"local": LocalBackend(LocalModelConfig("smollm2-135m-instruct", num_threads=args.threads)),
                    "triton": TritonBackend("smollm2-135m-instruct", TritonConfig(server.grpc_url))}
        backends["triton"].check(["generate"])
        warm = create_method("no-retrieval", max_new_tokens=4)
        for backend in backends.values():  # first calls pay one-off costs (allocations, channel setup)
            engine = Engine(Services(models={"generator": backend}), EngineConfig(max_batch=args.batch))
            run_method(engine, warm, queries[:2])
            engine.close()
        methods = [("standard", {"top_k": args.top_k}), ("no-retrieval", {})]
        runs, answers = [], {}
        for name, cfg in methods:
            method = create_method(name, **cfg)
            for rep in range(args.repeats):
                for kind in (("local", "triton") if rep % 2 == 0 else ("triton", "local")):
                    engine = Engine(Services(models={"generator": backends[kind]}, retriever=retriever),
                                    EngineConfig(max_batch=args.batch, max_wait_s=0.005))
                    before = _server_stats(server)
                    start = time.perf_counter()
                    states, failures = run_method(engine, method, queries)
                    wall = time.perf_counter() - start
                    engine.close()
                    if failures:
                        raise SystemExit(f"{name} via {kind}: {len(failures)} queries failed: {failures[:2]}")
                    after = _server_stats(server)
                    delta = {k: after[k] - before[k] for k in after}
                    answers.setdefault((name, kind), [s.raw_output for s in states])
                    runs.append({"method": name, "backend": kind, "repeat": rep, "wall_s": wall,
                                 "median_latency_s": statistics.median(s.trace.timings["total_s"] for s in states),
                                 "server_rows_per_execution": (delta["rows"] / delta["executions"]
                                                               if delta["executions"] else "-"),
                                 # Triton adds a batch's compute time to each of its rows: undo that
                                 "server_model_s": (delta["compute_s"] * delta["executions"] / delta["rows"]
                                                    if kind == "triton" else "-"),
                                 "server_queue_ms_per_row": (1e3 * delta["queue_s"] / delta["rows"]
                                                             if kind == "triton" else "-"),
                                 "contains_acc": 100 * sum(contains(s.raw_output, s.query["answers"])
                                                           for s in states) / len(states)})
                    print(f"  {name} via {kind} (repeat {rep}): {wall:.1f}s", file=sys.stderr, flush=True)
    finally:
        server.stop()

    def median_wall(name, kind):
        return statistics.median(r["wall_s"] for r in runs if r["method"] == name and r["backend"] == kind)

    cols = ["method", "backend", "repeat", "wall_s", "median_latency_s", "server_rows_per_execution",
            "server_model_s", "server_queue_ms_per_row", "contains_acc"]
    lines = ["", *markdown_table(runs, cols), ""]
    for name, _ in methods:
        same = sum(a == b for a, b in zip(answers[(name, "local")], answers[(name, "triton")]))
        lines.append(f"{name}: median wall local {median_wall(name, 'local'):.1f}s, triton "
                     f"{median_wall(name, 'triton'):.1f}s, ratio {median_wall(name, 'triton') / median_wall(name, 'local'):.3f}; "
                     f"identical answers {same}/{len(queries)}")
    ratio = median_wall("standard", "triton") / median_wall("standard", "local")
    publish(args.results, "Triton overhead benchmark",
            f"{machine_line(args.threads)} (in-process for local; per model instance in the server for Triton); "
            f"tritonserver 2.51 from nvidia-pytriton 0.7.0, gRPC on 127.0.0.1; data: first {len(queries)} PopQA "
            f"questions, BM25 over the pooled corpus, top-{args.top_k} documents; engine batch {args.batch}.",
            "\n".join(lines), f"triton_over_local={ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
