"""Engine batching: the same RAG workload with the engine's batch size 1 and 16, in one run.

Usage (from the repository root, after `make install`):

    .venv/bin/python benchmarks/engine_batching.py [--queries 64] [--top-k 10] [--data-dir ../shared/data]

Runs `standard` RAG (and, for contrast, `no-retrieval`) over the first N PopQA questions
against a BM25 index of the pooled corpus of the shared sets, once with micro-batches of 1
and once of 16, with the same process, models and threads. Prints a table, writes it to
benchmarks/results/engine_batching.md and ends with `batching_speedup=<ratio>` (standard RAG
wall time at batch 1 over batch 16). The table splits model time into prefill (prompt
encoding, compute-bound on CPU) and decode (token steps, memory-bound): batching speeds up
the second only.
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

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=10, help="documents in the prompt (papers: 10)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--skip-no-retrieval", action="store_true")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "engine_batching.md"))
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    from specrag.evaluation.metrics import contains
    from specrag.inference import Engine, EngineConfig, Services
    from specrag.inference.local import LocalBackend, LocalModelConfig
    from specrag.methods import create_method
    from specrag.methods.local_run import run_method
    from workloads import machine_line, markdown_table, popqa_bm25, publish

    _, retriever, queries = popqa_bm25(args.data_dir, args.queries, "engine_batching-")
    generator = LocalBackend(LocalModelConfig("smollm2-135m-instruct", num_threads=args.threads, dtype=args.dtype))

    methods = [("standard", {"top_k": args.top_k})] + ([] if args.skip_no_retrieval else [("no-retrieval", {})])
    rows, answers = [], {}
    for name, cfg in methods:
        method = create_method(name, **cfg)
        for batch in (1, args.batch):
            engine = Engine(Services(models={"generator": generator}, retriever=retriever),
                            EngineConfig(max_batch=batch, max_wait_s=0.005))
            before = dict(generator.stats)
            start = time.perf_counter()
            states, failures = run_method(engine, method, queries)
            wall = time.perf_counter() - start
            engine.close()
            if failures:
                raise SystemExit(f"{name} batch {batch}: {len(failures)} queries failed: {failures[:2]}")
            stats = {k: generator.stats[k] - before[k] for k in before}
            answers[(name, batch)] = [s.raw_output for s in states]
            rows.append({
                "method": name, "engine_batch": batch, "queries": len(states), "wall_s": wall,
                "queries_per_s": len(states) / wall,
                "median_latency_s": statistics.median(s.trace.timings["total_s"] for s in states),
                "model_calls": stats["calls"], "mean_rows_per_call": len(states) / max(stats["calls"], 1),
                "prompt_tokens": stats["prefill_tokens"],
                "generated_tokens": sum(s.trace.counts["generated_tokens"] for s in states),
                "prefill_s": stats["prefill_s"], "decode_s": stats["decode_s"],
                "contains_acc": 100 * sum(contains(s.raw_output, s.query["answers"]) for s in states) / len(states),
            })
            print(f"  {name} batch={batch}: {wall:.1f}s", file=sys.stderr, flush=True)

    def speedup(name):
        walls = {r["engine_batch"]: r["wall_s"] for r in rows if r["method"] == name}
        return walls[1] / walls[args.batch]

    cols = ["method", "engine_batch", "queries", "wall_s", "queries_per_s", "median_latency_s", "model_calls",
            "mean_rows_per_call", "prompt_tokens", "generated_tokens", "prefill_s", "decode_s", "contains_acc"]
    table = markdown_table(rows, cols)
    lines = ["", *table, ""]
    for name, _ in methods:
        same = sum(a == b for a, b in zip(answers[(name, 1)], answers[(name, args.batch)]))
        decode = {r["engine_batch"]: r["decode_s"] for r in rows if r["method"] == name}
        prefill_share = next(r["prefill_s"] / (r["prefill_s"] + r["decode_s"]) for r in rows
                             if r["method"] == name and r["engine_batch"] == 1)
        lines.append(f"{name}: wall speedup {speedup(name):.2f}x, decode speedup {decode[1] / decode[args.batch]:.2f}x, "
                     f"prefill share of model time at batch 1 {100 * prefill_share:.0f}%, "
                     f"identical outputs {same}/{len(queries)}")
    publish(args.results, "Engine batching benchmark",
            f"{machine_line(args.threads)}, dtype {args.dtype}; data: first {len(queries)} PopQA questions, "
            f"BM25 over the pooled corpus of the shared sets, top-{args.top_k} documents.",
            "\n".join(lines), f"batching_speedup={speedup('standard'):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
