"""SPS vs standard RAG and Speculative RAG: accuracy and latency per query (paper Tables 1, 3; Fig. 2).

Usage (from the repository root, after `make install`):

    .venv/bin/python benchmarks/sps.py [--questions 200] [--ablation-questions N] [--dtype bfloat16]

For each of PopQA, ARC-Challenge, PubHealth and ASQA (first ``--questions`` each), serves the
questions one at a time (the paper's latency setting, batch size 1, retrieval included) with
``standard``, ``speculative-rag`` (training-free: SmolLM2 drafter, Gemma-3 verifier), ``sps``
(chunks of ``--chunk-tokens``, top-10, k=5, m=5; ASQA top-5, k=3, as the paper) and its three
ablations: static retrieval, random selection, random subsets. Every method uses the same
generator (SmolLM2-135M-Instruct) and BM25 over the pooled corpus; ASQA gets top-5 for every
method. Metrics: PopQA "gold answer contained", ARC-Challenge / PubHealth label accuracy,
ASQA str-EM (headline) and ROUGE-L. Measurements are kept per query under the work folder (shared
with benchmarks/speculative_rag.py, and processes sharing it share the work), so a longer run
measures only what is missing; ``--ablation-questions`` measures the ablations on fewer questions
(compared on those). Writes benchmarks/results/sps.md; the last line is
`sps_latency_over_standard=<r> sps_latency_over_specrag=<r> sps_minus_standard_acc=<points>`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
DATASETS = ("popqa", "arc_challenge", "pubhealth", "asqa")
HEADLINE = {"short_form": "contains", "multiple_choice": "accuracy", "claim_verification": "accuracy",
            "long_form": "str_em"}


def runs(dataset: str, chunk_tokens: int) -> list[tuple[str, str, dict]]:
    top = {"top_k": 5} if dataset == "asqa" else {}
    sps = {"chunk_tokens": chunk_tokens, **({"top_k": 5, "groups": 3} if dataset == "asqa" else {})}
    return [("standard", "standard", top), ("speculative-rag", "speculative-rag", top), ("sps", "sps", sps),
            ("sps: static retrieval", "sps", {**sps, "staged_retrieval": False}),
            ("sps: random selection", "sps", {**sps, "selection": "random"}),
            ("sps: random subsets", "sps", {**sps, "subset_mode": "random"})]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=200, help="per dataset")
    ap.add_argument("--ablation-questions", type=int, default=None, help="per dataset for the ablations "
                    "(default: --questions)")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--reverse", action="store_true",
                    help="serve each series from its last question (a second process filling the same cache)")
    ap.add_argument("--chunk-tokens", type=int, default=50)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "sps.md"))
    args = ap.parse_args()

    import pyarrow.parquet as pq
    import torch
    torch.set_num_threads(args.threads)
    from specrag.evaluation.metrics import score_row
    from specrag.inference import Engine
    from specrag.methods import create_method
    from specrag.schemas import validate_query
    from workloads import (ablation_rounds, by_label, cache_file, drafting_workload, machine_line, markdown_table,
                           publish, serve_one_by_one, summarise)

    work, data, services = drafting_workload(args.data_dir, args.dtype, args.threads)

    datasets = args.datasets.split(",")
    n_ablation = args.questions if args.ablation_questions is None else min(args.ablation_questions, args.questions)
    queries = {ds: [validate_query(r) for r in pq.read_table(data / ds / "queries.parquet").to_pylist()][:args.questions]
               for ds in datasets}
    # The compared methods on every dataset first (SPS before the others, which the Speculative RAG
    # benchmark shares), then the ablations: an interrupted run has the headline.
    plan = [(ds, runs(ds, args.chunk_tokens)[i], args.questions) for i in (2, 0, 1) for ds in datasets]
    plan += [(ds, run, n) for n in ablation_rounds(n_ablation) for ds in datasets
             for run in runs(ds, args.chunk_tokens)[3:]]
    measured = {}
    for ds, (label, name, settings), n in plan:
        engine = Engine(services)
        method = create_method(name, **settings)
        measured[(ds, label)] = serve_one_by_one(engine, method, queries[ds][:n],
                                                 cache_file(work, ds, method, args.dtype, args.threads),
                                                 reverse=args.reverse)
        engine.close()
        print(f"  {ds} {label}: {n} questions measured", file=sys.stderr, flush=True)

    rows, by = [], {}
    for ds in datasets:
        for label, name, _ in runs(ds, args.chunk_tokens):
            if (ds, label) not in measured:
                continue
            latencies, states = measured[(ds, label)]
            scores = [score_row(s.query["task_type"], s.answer, s.raw_output, s.choice, s.query) for s in states]
            head = [sc[HEADLINE[s.query["task_type"]]] for sc, s in zip(scores, states)]
            by[(ds, label)] = (latencies, head)
            row = {"dataset": ds, "method": label, "questions": len(states), "accuracy": 100 * statistics.mean(head),
                   "rouge_l": 100 * statistics.mean(sc.get("rouge_l", 0.0) for sc in scores) if ds == "asqa" else "",
                   "mean_latency_s": statistics.mean(latencies), "median_latency_s": statistics.median(latencies),
                   "retrieval_calls": statistics.mean(s.trace.counts["retrieval_calls"] for s in states),
                   "generated_tokens": statistics.mean(s.trace.counts["generated_tokens"] for s in states),
                   "stages": statistics.mean(len(s.trace.method.stages) for s in states) if name == "sps" else ""}
            rows.append(row)
    labels = [label for label, _, _ in runs(datasets[0], args.chunk_tokens)][:None if n_ablation else 3]
    summary = [summarise(by, datasets, label, "standard", "sps") for label in labels]
    report = ["", *markdown_table(rows, ["dataset", "method", "questions", "accuracy", "rouge_l", "mean_latency_s", "median_latency_s",
                                         "retrieval_calls", "generated_tokens", "stages"]),
              "", "Averaged over the datasets (accuracy: each dataset's headline metric, %):", "",
              *markdown_table(summary, ["method", "questions", "mean_accuracy", "acc_minus_standard",
                                        "ci95_vs_standard", "acc_minus_method", "mean_latency_s", "latency_over_standard"]),
              "", "acc_minus_standard and acc_minus_method (sps) compare on the same questions: an ablation run on "
              "fewer questions is compared with the first that many of the others; ci95_vs_standard: paired "
              "bootstrap over those questions (2000 draws, seed 0), in points."]
    setup = (f"{machine_line(args.threads)}, model dtype {args.dtype}; first {args.questions} questions of "
             f"{', '.join(datasets)} (ablations: first {n_ablation}); one query at a time; BM25 over the pooled "
             f"corpus; SPS chunks of "
             f"{args.chunk_tokens} tokens.")
    sps, std, spec = (by_label(summary, name) for name in ("sps", "standard", "speculative-rag"))
    last = (f"sps_latency_over_standard={sps['mean_latency_s'] / std['mean_latency_s']:.2f} "
            f"sps_latency_over_specrag={sps['mean_latency_s'] / spec['mean_latency_s']:.2f} "
            f"sps_minus_standard_acc={sps['acc_minus_standard']:.2f}")
    publish(args.results, "SPS benchmark", setup, "\n".join(report), last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
