"""SPS vs standard RAG and Speculative RAG: accuracy and latency per query (paper Tables 1, 3; Fig. 2).

Usage (from the repository root, after `make install`):

    .venv/bin/python benchmarks/sps.py [--questions 200] [--ablation-questions N] [--dtype bfloat16]
        [--budget paper|equal] [--backend local|vllm] [--vllm-block-size 32] [--generator NAME]

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
`sps_latency_over_standard=<r> sps_latency_over_specrag=<r> sps_minus_standard_acc=<points> budget=<b>`.
``--budget equal`` gives SPS as many documents as standard RAG (m x k = top-k) and ``--backend vllm``
serves the generator on vLLM, whose prefix cache computes the shared start of a stage's m
candidate prompts once (SPS writes them question first, shared documents first): the
``cached_share`` column says how much of their prompts it supplied.
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


BUDGETS = ("paper", "equal")


def runs(dataset: str, chunk_tokens: int, budget: str = "paper") -> list[tuple[str, str, dict]]:
    """The compared methods and SPS's ablations. ``paper``: SPS's m = 5 candidates of k = 5
    documents from the top 10 (ASQA: k = 3 of the top 5), 2.5x standard RAG's documents;
    ``equal``: m x k = standard RAG's top-k (5 x 2 of the top 10; ASQA 5 x 1 of the top 5)."""
    top = {"top_k": 5} if dataset == "asqa" else {}
    groups = {"paper": 3 if dataset == "asqa" else 5, "equal": 1 if dataset == "asqa" else 2}[budget]
    sps = {"chunk_tokens": chunk_tokens, "groups": groups, "candidates": 5, **top}
    return [("standard", "standard", top), ("speculative-rag", "speculative-rag", top), ("sps", "sps", sps),
            ("sps: static retrieval", "sps", {**sps, "staged_retrieval": False}),
            ("sps: random selection", "sps", {**sps, "selection": "random"}),
            ("sps: random subsets", "sps", {**sps, "subset_mode": "random"})]


def cached_share(states) -> float | str:
    """Of SPS's candidate prompts, the share of tokens the engine's prefix cache supplied."""
    pairs = [(p, c) for s in states for st in s.trace.method.stages for p, c in zip(st.prompt_tokens, st.cached_tokens)]
    if not pairs or any(c is None for _, c in pairs):
        return ""
    return sum(c for _, c in pairs) / max(1, sum(p for p, _ in pairs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=200, help="per dataset")
    ap.add_argument("--ablation-questions", type=int, default=None, help="per dataset for the ablations "
                    "(default: --questions)")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--reverse", action="store_true",
                    help="serve each series from its last question (a second process filling the same cache)")
    ap.add_argument("--chunk-tokens", type=int, default=50)
    ap.add_argument("--budget", default="paper", choices=BUDGETS,
                    help="SPS's documents: the paper's 5 x 5, or m x k equal to standard RAG's top-k")
    ap.add_argument("--backend", default="local", choices=["local", "vllm"])
    ap.add_argument("--vllm-block-size", type=int, default=None,
                    help="tokens per KV block of the vLLM server (CPU: a multiple of 32; vLLM's own: 128)")
    ap.add_argument("--generator", default="smollm2-135m-instruct",
                    help="every method's generator (Speculative RAG: the drafter; its verifier: Gemma-3-270M "
                         "for the default, the generator itself otherwise)")
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

    configs = ()
    if args.backend == "vllm":
        from specrag.inference.vllm import VllmConfig
        configs = (VllmConfig(block_size=args.vllm_block_size),)
    elif args.vllm_block_size:
        raise SystemExit("--vllm-block-size needs --backend vllm")
    work, data, services = drafting_workload(args.data_dir, args.dtype, args.threads, args.generator, args.backend,
                                             configs)
    # a series of measurements belongs to its backend and models; the defaults keep the names they had
    serving = "-".join(x for x in (args.backend if args.backend != "local" else "",
                                   f"b{args.vllm_block_size}" if args.vllm_block_size else "",
                                   args.generator if args.generator != "smollm2-135m-instruct" else "") if x)

    datasets = args.datasets.split(",")
    n_ablation = args.questions if args.ablation_questions is None else min(args.ablation_questions, args.questions)
    queries = {ds: [validate_query(r) for r in pq.read_table(data / ds / "queries.parquet").to_pylist()][:args.questions]
               for ds in datasets}
    # The compared methods on every dataset first (SPS before the others, which the Speculative RAG
    # benchmark shares), then the ablations: an interrupted run has the headline.
    plan = [(ds, runs(ds, args.chunk_tokens, args.budget)[i], args.questions)
            for i in (2, 0, 1) for ds in datasets]
    plan += [(ds, run, n) for n in ablation_rounds(n_ablation) for ds in datasets
             for run in runs(ds, args.chunk_tokens, args.budget)[3:]]
    measured = {}
    for ds, (label, name, settings), n in plan:
        engine = Engine(services)
        method = create_method(name, **settings)
        measured[(ds, label)] = serve_one_by_one(engine, method, queries[ds][:n],
                                                 cache_file(work, ds, method, args.dtype, args.threads, serving),
                                                 reverse=args.reverse)
        engine.close()
        print(f"  {ds} {label}: {n} questions measured", file=sys.stderr, flush=True)

    rows, by = [], {}
    for ds in datasets:
        for label, name, _ in runs(ds, args.chunk_tokens, args.budget):
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
                   "prompt_tokens": statistics.mean(s.trace.counts["prompt_tokens"] for s in states),
                   "cached_share": cached_share(states) if name == "sps" else "",
                   "generated_tokens": statistics.mean(s.trace.counts["generated_tokens"] for s in states),
                   "stages": statistics.mean(len(s.trace.method.stages) for s in states) if name == "sps" else ""}
            rows.append(row)
    labels = [label for label, _, _ in runs(datasets[0], args.chunk_tokens, args.budget)]
    labels = labels[:None if n_ablation else 3]
    summary = [summarise(by, datasets, label, "standard", "sps") for label in labels]
    report = ["", *markdown_table(rows, ["dataset", "method", "questions", "accuracy", "rouge_l", "mean_latency_s",
                                         "median_latency_s", "retrieval_calls", "prompt_tokens", "cached_share",
                                         "generated_tokens", "stages"]),
              "", "Averaged over the datasets (accuracy: each dataset's headline metric, %):", "",
              *markdown_table(summary, ["method", "questions", "mean_accuracy", "acc_minus_standard",
                                        "ci95_vs_standard", "acc_minus_method", "mean_latency_s", "latency_over_standard"]),
              "", "acc_minus_standard and acc_minus_method (sps) compare on the same questions: an ablation run on "
              "fewer questions is compared with the first that many of the others; ci95_vs_standard: paired "
              "bootstrap over those questions (2000 draws, seed 0), in points."]
    from specrag.inference.vllm import CPU_BLOCK_SIZE
    engine_line = ("the embedded engine" if args.backend == "local" else
                   f"vLLM (KV blocks of {args.vllm_block_size or CPU_BLOCK_SIZE} tokens)")
    setup = (f"{machine_line(args.threads)}, model dtype {args.dtype}; generator {args.generator} on {engine_line}; "
             f"first {args.questions} questions of {', '.join(datasets)} (ablations: first {n_ablation}); one query at "
             f"a time; BM25 over the pooled corpus; SPS chunks of {args.chunk_tokens} tokens, budget {args.budget} "
             f"({'m x k = standard RAG top-k' if args.budget == 'equal' else 'the paper: 5 x 5 of the top 10'}); "
             "prompt_tokens: per query, every model call's; cached_share: of SPS's candidate prompts, the "
             "tokens the engine's prefix cache supplied (blank: the engine does not say).")
    sps, std, spec = (by_label(summary, name) for name in ("sps", "standard", "speculative-rag"))
    last = (f"sps_latency_over_standard={sps['mean_latency_s'] / std['mean_latency_s']:.2f} "
            f"sps_latency_over_specrag={sps['mean_latency_s'] / spec['mean_latency_s']:.2f} "
            f"sps_minus_standard_acc={sps['acc_minus_standard']:.2f} budget={args.budget}")
    publish(args.results, "SPS benchmark", setup, "\n".join(report), last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
