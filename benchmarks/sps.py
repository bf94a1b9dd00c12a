"""SPS vs standard RAG and Speculative RAG: accuracy and latency per query (paper Tables 1, 3; Fig. 2).

Usage (from the repository root, after `make install`):

    .venv/bin/python benchmarks/sps.py [--questions 200] [--dtype bfloat16]

For each of PopQA, ARC-Challenge, PubHealth and ASQA (first ``--questions`` each), serves the
questions one at a time (the paper's latency setting, batch size 1, retrieval included) with
``standard``, ``speculative-rag`` (training-free: SmolLM2 drafter, Gemma-3 verifier), ``sps``
(chunks of ``--chunk-tokens``, top-10, k=5, m=5; ASQA top-5, k=3, as the paper) and its three
ablations: static retrieval, random selection, random subsets. Every method uses the same
generator (SmolLM2-135M-Instruct) and BM25 over the pooled corpus; ASQA gets top-5 for every
method. Metrics: PopQA "gold answer contained", ARC-Challenge / PubHealth label accuracy,
ASQA str-EM (headline) and ROUGE-L. Measurements are kept per query under the work folder (shared
with benchmarks/speculative_rag.py), so a longer run measures only what is missing. Writes benchmarks/results/sps.md; the last line is
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
    ap.add_argument("--datasets", default=",".join(DATASETS))
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
    from workloads import cache_file, drafting_workload, machine_line, markdown_table, publish, serve_one_by_one

    work, data, services = drafting_workload(args.data_dir, args.dtype, args.threads)

    rows, by = [], {}
    datasets = args.datasets.split(",")
    for ds in datasets:
        queries = [validate_query(r) for r in pq.read_table(data / ds / "queries.parquet").to_pylist()][:args.questions]
        for label, name, settings in runs(ds, args.chunk_tokens):
            engine = Engine(services)
            method = create_method(name, **settings)
            latencies, states = serve_one_by_one(engine, method, queries,
                                                 cache_file(work, ds, method, args.dtype, args.threads))
            engine.close()
            scores = [score_row(s.query["task_type"], s.answer, s.raw_output, s.choice, s.query) for s in states]
            head = [sc[HEADLINE[s.query["task_type"]]] for sc, s in zip(scores, states)]
            by[(ds, label)] = (latencies, head)
            row = {"dataset": ds, "method": label, "accuracy": 100 * statistics.mean(head),
                   "rouge_l": 100 * statistics.mean(sc.get("rouge_l", 0.0) for sc in scores) if ds == "asqa" else "",
                   "mean_latency_s": statistics.mean(latencies), "median_latency_s": statistics.median(latencies),
                   "retrieval_calls": statistics.mean(s.trace.counts["retrieval_calls"] for s in states),
                   "generated_tokens": statistics.mean(s.trace.counts["generated_tokens"] for s in states),
                   "stages": statistics.mean(len(s.trace.details.get("stages", [])) for s in states) if name == "sps" else ""}
            rows.append(row)
            print(f"  {ds} {label}: acc {row['accuracy']:.1f} latency {row['mean_latency_s']:.2f}s", file=sys.stderr,
                  flush=True)
    labels = [label for label, _, _ in runs(datasets[0], args.chunk_tokens)]
    summary = [{"method": label,
                "mean_accuracy": statistics.mean(100 * statistics.mean(by[(ds, label)][1]) for ds in datasets),
                "mean_latency_s": statistics.mean(x for ds in datasets for x in by[(ds, label)][0])} for label in labels]
    get = {r["method"]: r for r in summary}
    for r in summary:
        r["latency_over_standard"] = r["mean_latency_s"] / get["standard"]["mean_latency_s"]
        r["acc_minus_standard"] = r["mean_accuracy"] - get["standard"]["mean_accuracy"]
    report = ["", *markdown_table(rows, ["dataset", "method", "accuracy", "rouge_l", "mean_latency_s", "median_latency_s",
                                         "retrieval_calls", "generated_tokens", "stages"]),
              "", "Averaged over the datasets (accuracy: each dataset's headline metric, %):", "",
              *markdown_table(summary, ["method", "mean_accuracy", "acc_minus_standard", "mean_latency_s",
                                        "latency_over_standard"])]
    setup = (f"{machine_line(args.threads)}, model dtype {args.dtype}; first {args.questions} questions of "
             f"{', '.join(datasets)}; one query at a time; BM25 over the pooled corpus; SPS chunks of "
             f"{args.chunk_tokens} tokens.")
    sps, std, spec = get["sps"], get["standard"], get["speculative-rag"]
    last = (f"sps_latency_over_standard={sps['mean_latency_s'] / std['mean_latency_s']:.2f} "
            f"sps_latency_over_specrag={sps['mean_latency_s'] / spec['mean_latency_s']:.2f} "
            f"sps_minus_standard_acc={sps['mean_accuracy'] - std['mean_accuracy']:.2f}")
    publish(args.results, "SPS benchmark", setup, "\n".join(report), last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
