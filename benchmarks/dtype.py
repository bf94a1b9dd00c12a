"""The local backend's dtypes on this CPU: float32 against int8, bfloat16 and bfloat16-prefill.

Usage (from the repository root, after `make install`; the Qwen models need `make install-verifier`):

    .venv/bin/python benchmarks/dtype.py [--models smollm2-135m-instruct,qwen2.5-coder-1.5b-instruct]
        [--dtypes float32,int8] [--queries 16] [--top-k 3] [--threads 1]

Each model answers the same first N PopQA questions with standard RAG (the same BM25 documents,
greedy) through specrag's engine once per dtype, in one process; reported per (model, dtype):
wall time a query, prefill and decode seconds, answers identical to float32's, and the contains
accuracy. bfloat16 and bfloat16-prefill are listed only where asked (on a CPU without
AMX/AVX512-BF16 bfloat16 is emulated); with bfloat16 in the run, the others are compared with it too
(``same_as_bfloat16``, and ``<dtype>_vs_bfloat16_<model>=…``: bfloat16's wall time over its).
Writes benchmarks/results/dtype.md, ending ``<dtype>_speedup_<model>=… <dtype>_same_<model>=…``
for every non-float32 dtype (speed-up: float32's wall time over its; same: share of identical answers).
The dtype per phase (#68):

    .venv/bin/python benchmarks/dtype.py --models smollm2-135m-instruct \
        --dtypes float32,bfloat16,bfloat16-prefill --queries 32 --top-k 10 --batch 16 \
        --results benchmarks/results/phase_dtype.md
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--dtypes", default="float32,int8")
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="rows per engine model call")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "dtype.md"))
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    if dtypes[0] != "float32":
        raise SystemExit("--dtypes starts with float32: the others are compared with it")

    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from specrag.evaluation.metrics import contains
    from specrag.inference import Engine, EngineConfig, Services
    from specrag.inference.local import LocalBackend, LocalModelConfig
    from specrag.methods import create_method
    from specrag.methods.local_run import run_method
    from workloads import machine_line, markdown_table, popqa_bm25, publish

    _, retriever, queries = popqa_bm25(args.data_dir, args.queries, "dtype-")
    method = create_method("standard", top_k=args.top_k)
    rows, claims = [], []
    for model in args.models.split(","):
        answers: dict[str, list[str]] = {}
        walls: dict[str, float] = {}
        for dtype in dtypes:
            backend = LocalBackend(LocalModelConfig(model, num_threads=args.threads, dtype=dtype))
            lm = backend._impl
            engine = Engine(Services(models={"generator": backend}, retriever=retriever),
                            EngineConfig(max_batch=args.batch, max_wait_s=0.005))
            run_method(engine, method, queries[:1])  # first-call set-up out of the timing
            before = dict(lm.stats)
            start = time.perf_counter()
            states, failures = run_method(engine, method, queries)
            wall = time.perf_counter() - start
            engine.close()
            if failures:
                raise SystemExit(f"{model} {dtype}: {len(failures)} queries failed: {failures[:2]}")
            answers[dtype] = [s.answer for s in states]
            walls[dtype] = wall
            same = sum(a == b for a, b in zip(answers[dtype], answers["float32"]))
            same_bf16 = (f"{sum(a == b for a, b in zip(answers[dtype], answers['bfloat16']))}/{len(states)}"
                         if "bfloat16" in answers else "-")
            rows.append({"model": model, "dtype": dtype, "queries": len(states), "s_per_query": wall / len(states),
                         "prefill_s": lm.stats["prefill_s"] - before["prefill_s"],
                         "decode_s": lm.stats["decode_s"] - before["decode_s"],
                         "prompt_tokens": lm.stats["prefill_tokens"] - before["prefill_tokens"],
                         "speedup": walls["float32"] / wall, "same_as_float32": f"{same}/{len(states)}",
                         "same_as_bfloat16": same_bf16,
                         "contains_acc": 100 * sum(contains(a, q["answers"]) for a, q in zip(answers[dtype], queries))
                         / len(queries)})
            print(f"  {model} {dtype}: {wall:.1f}s", file=sys.stderr, flush=True)
            del backend, lm, engine
            if dtype != "float32":
                short = model.split("-instruct")[0]
                claims.append(f"{dtype}_speedup_{short}={walls['float32'] / wall:.2f} "
                              f"{dtype}_same_{short}={same / len(states):.2f}")
                if dtype != "bfloat16" and "bfloat16" in walls:
                    claims.append(f"{dtype}_vs_bfloat16_{short}={walls['bfloat16'] / wall:.2f}")
    cols = ["model", "dtype", "queries", "s_per_query", "prefill_s", "decode_s", "prompt_tokens", "speedup",
            "same_as_float32", "same_as_bfloat16", "contains_acc"]
    publish(args.results, f"{', '.join(dtypes)} on this CPU",
            f"{machine_line(args.threads)}; data: first {len(queries)} PopQA questions, standard RAG, BM25 "
            f"top-{args.top_k} over the pooled corpus, greedy, engine batches of {args.batch}.",
            "\n".join(["", *markdown_table(rows, cols)]), " ".join(claims))
    return 0


if __name__ == "__main__":
    sys.exit(main())
