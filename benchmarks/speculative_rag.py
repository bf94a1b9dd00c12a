"""Speculative RAG vs standard RAG and no retrieval: accuracy and latency per query (paper Tables 1, 3).

Usage (from the repository root, after `make install`):

    .venv/bin/python benchmarks/speculative_rag.py [--questions 200] [--ablation-questions N] [--dtype bfloat16]

For each of PopQA, ARC-Challenge, PubHealth and HotpotQA (first ``--questions`` each), serves
the questions one at a time (the paper's latency setting: no cross-query batching; the m
drafts of a query are one batched call) with
- ``no-retrieval`` and ``standard`` (top-10 BM25 documents in the prompt; generator SmolLM2),
- ``speculative-rag`` (training-free: drafter SmolLM2-135M-Instruct, verifier Gemma-3-270M,
  top-10, m=5 drafts of k=2 documents),
- its ablations run for real: random subsets, all documents from one cluster, random
  selection without verification;
- and its score ablations (without ρ_draft, ρ_SC or ρ_SR; per-token means instead of sums),
  plus the oracle that takes the best of the five drafts: the drafts and the verifier's
  scores do not depend on which scores are summed, so these re-select among the very drafts
  and scores of the ``speculative-rag`` run (what the method does with ``scores=...``; the
  test suite checks that) and their latency is that run's: the same calls are made.
Accuracy: PopQA and HotpotQA "gold answer contained in the output" (the papers' accuracy;
HotpotQA EM also listed), ARC-Challenge and PubHealth label accuracy. Retrieval: BM25 over the
pooled corpus of the shared sets. Each query's measurement is kept under the work folder
($SPECRAG_BENCH_DIR, default /tmp/specrag-srag-bench), so a longer or interrupted run measures only
what is missing (run it alone on the machine: latencies are compared across runs then). Processes
sharing the work folder share the work (on 2 cores: this and benchmarks/sps.py side by side, one
thread each). The ablations run for real may be measured on fewer questions (``--ablation-questions``,
advanced in rounds of 10 over all datasets) and are then compared on those questions. Writes
benchmarks/results/speculative_rag.md; the last line
is `specrag_minus_standard_acc=<points averaged over datasets> latency_ratio=<specrag/standard>`.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
DATASETS = ("popqa", "arc_challenge", "pubhealth", "hotpotqa")
HEADLINE = {"short_form": "contains", "multiple_choice": "accuracy", "claim_verification": "accuracy"}
RUNS = [("no-retrieval", "no-retrieval", {}), ("standard", "standard", {}),
        ("speculative-rag", "speculative-rag", {}),
        ("specrag: random subsets", "speculative-rag", {"subset_mode": "random"}),
        ("specrag: same cluster", "speculative-rag", {"subset_mode": "same_cluster"}),
        ("specrag: random selection", "speculative-rag", {"selection": "random"})]
RESELECTED = [("specrag: w/o rho_draft", {"scores": ("sc", "sr")}), ("specrag: w/o rho_SC", {"scores": ("draft", "sr")}),
              ("specrag: w/o rho_SR", {"scores": ("draft", "sc")}),
              ("specrag: length-normalised scores", {"length_normalize": True}),
              ("specrag: best of its drafts (oracle)", None)]


def accuracy(state) -> tuple[float, float]:
    """(headline metric, exact match or the headline again) of one answered query."""
    from specrag.evaluation.metrics import score_row
    q = state.query
    scores = score_row(q["task_type"], state.answer, state.raw_output, state.choice, q)
    return scores[HEADLINE[q["task_type"]]], scores.get("em", scores[HEADLINE[q["task_type"]]])


def reselect(state, settings: dict | None, config):
    """The answers the method gives with other score settings, from the recorded drafts; with
    ``settings`` None, one state per draft (the oracle takes the best of them)."""
    import dataclasses
    from specrag.methods.common import finalise_answer
    from specrag.methods.speculative_rag import SpeculativeRAGTrace, choose_draft
    drafts = [dataclasses.replace(d) for d in state.trace.of(SpeculativeRAGTrace).drafts]
    if settings is None:
        return [finalise_answer(copy.deepcopy(state), d.answer) for d in drafts]
    chosen = choose_draft(drafts, dataclasses.replace(config, **settings), state.id)
    return [finalise_answer(copy.deepcopy(state), chosen.answer)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=200, help="per dataset")
    ap.add_argument("--ablation-questions", type=int, default=None,
                    help="per dataset for the ablations run for real (default: --questions)")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--reverse", action="store_true",
                    help="serve each series from its last question (a second process filling the same cache)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "speculative_rag.md"))
    args = ap.parse_args()

    import pyarrow.parquet as pq
    import torch
    torch.set_num_threads(args.threads)
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
    # The three compared methods on every dataset first, then the ablations in rounds over the datasets.
    plan = [(ds, run, args.questions) for ds in datasets for run in RUNS[:3]]
    plan += [(ds, run, n) for n in ablation_rounds(n_ablation) for ds in datasets for run in RUNS[3:]]
    measured = {}
    for ds, (label, name, settings), n in plan:
        method = create_method(name, **settings)
        engine = Engine(services)
        measured[(ds, label)] = (method, *serve_one_by_one(engine, method, queries[ds][:n],
                                                           cache_file(work, ds, method, args.dtype, args.threads),
                                                           reverse=args.reverse))
        engine.close()
        print(f"  {ds} {label}: {n} questions measured", file=sys.stderr, flush=True)

    rows, by = [], {}
    for ds in datasets:
        for label, name, _ in RUNS:
            if (ds, label) not in measured:
                continue
            method, latencies, states = measured[(ds, label)]
            acc = [accuracy(s) for s in states]
            by[(ds, label)] = (latencies, [a for a, _ in acc])
            row = {"dataset": ds, "method": label, "questions": len(states),
                   "accuracy": 100 * statistics.mean(a for a, _ in acc),
                   "em": 100 * statistics.mean(e for _, e in acc), "mean_latency_s": statistics.mean(latencies),
                   "median_latency_s": statistics.median(latencies),
                   "prompt_tokens": statistics.mean(s.trace.counts["prompt_tokens"] for s in states),
                   "generated_tokens": statistics.mean(s.trace.counts["generated_tokens"] for s in states)}
            if name == "speculative-rag":
                drafts = [d for s in states for d in s.trace.method.drafts]
                row["drafts_with_rationale"] = f"{sum(d.parsed == 'ok' for d in drafts)}/{len(drafts)}"
            rows.append(row)
            if label == "speculative-rag":
                for re_label, settings in RESELECTED:
                    re_acc = [max(accuracy(x) for x in reselect(s, settings, method.config)) for s in states]
                    by[(ds, re_label)] = (latencies, [a for a, _ in re_acc])
                    rows.append({**row, "method": re_label, "accuracy": 100 * statistics.mean(a for a, _ in re_acc),
                                 "em": 100 * statistics.mean(e for _, e in re_acc)})
    labels = [label for label, _, _ in RUNS[:3]] + [label for label, _ in RESELECTED]
    labels += [label for label, _, _ in RUNS[3:]] if n_ablation else []
    summary = [summarise(by, datasets, label, "standard", "speculative-rag") for label in labels]
    spec, std = by_label(summary, "speculative-rag"), by_label(summary, "standard")
    cols = ["dataset", "method", "questions", "accuracy", "em", "mean_latency_s", "median_latency_s", "prompt_tokens",
            "generated_tokens"]
    for r in rows:
        r.setdefault("drafts_with_rationale", "")
    report = ["", *markdown_table(rows, cols + ["drafts_with_rationale"]), "", "Averaged over the datasets:", "",
              *markdown_table(summary, ["method", "questions", "mean_accuracy", "acc_minus_standard",
                                        "ci95_vs_standard", "acc_minus_method", "mean_latency_s", "latency_over_standard"]),
              "", "acc_minus_standard and acc_minus_method (speculative-rag) compare on the same questions: an "
              "ablation run on fewer questions is compared with the first that many of the others; "
              "ci95_vs_standard: paired bootstrap over those questions (2000 draws, seed 0), in points."]
    setup = (f"{machine_line(args.threads)}, model dtype {args.dtype}; first {args.questions} questions of "
             f"{', '.join(datasets)} (ablations run for real: first {n_ablation}); one query at a time; BM25 "
             f"top-10 over the pooled corpus; accuracy in %.")
    last = (f"specrag_minus_standard_acc={spec['acc_minus_standard']:.2f} "
            f"latency_ratio={spec['mean_latency_s'] / std['mean_latency_s']:.2f}")
    publish(args.results, "Speculative RAG benchmark", setup, "\n".join(report), last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
