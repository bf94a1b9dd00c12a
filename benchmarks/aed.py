"""AED-RAG against standard RAG on the evaluation splits, with the paper's ablations.

Pipeline (every step a real specrag job, cached under WORK so a rerun only does what is
missing): import ../shared/data, BM25 over the pooled corpus, triplets of every passage
(`extract-triplets`), CPPL labels of ``--train`` aed_train questions (`label-utility`, top-10
passages, their triplet sets and d_gen), the utility predictor (`train-utility`), then per
evaluation dataset the first ``--per-dataset`` aed_eval questions answered by:

  standard (k=5)      standard RAG, the paper's baseline, with AED-RAG's prompt
  rerank-only (m=2)   AED-RAG without fusion: the predictor's top-2 passages in one prompt
  aed (m=1), aed (m=2)
  aed w/o triplets, aed w/o d_ss, aed untrained (MiniLM similarity as S_phi)
  cross-encoder rerank (m=2)   the paper's reranker baseline: the installed reranker's
                               (ms-marco-MiniLM-L-12-v2) top-2 passages in one prompt

Metrics: relaxed EM (the gold answer contained in the output), token F1, their average;
served latency per query. Paired bootstrap intervals of each method's average minus
standard RAG's over the same questions.

    python benchmarks/aed.py --train 1000 --per-dataset 100

Each configuration answers the evaluation questions of all four datasets in one job (one model
load per worker, not four); the tables split them by dataset again. ``--label-top-k`` labels
fewer retrieved passages per training question (CPPL costs one reader forward pass per unit).

Claim line: aed_minus_standard_avg (points, AED m=2 over standard RAG, all datasets pooled)
and latency_ratio (mean served latency AED m=2 / standard RAG).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import imported_data, pooled_index, specrag_cli as specrag, machine_line, markdown_table, paired_bootstrap_ci, publish  # noqa: E402

RESULTS = "benchmarks/results/aed.md"
WORK = Path(os.environ.get("SPECRAG_BENCH_DIR", "/tmp/specrag-srag-bench"))
DATASETS = ("hotpotqa", "nq", "webquestions", "popqa")
TWO_WORKERS = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")

CONFIGS = {
    "standard (k=5)": ("standard", ["top_k=5", "prompt=aed"]),
    "rerank-only (m=2)": ("aed-rag", ["fusion=false"]),
    "aed (m=1)": ("aed-rag", ["m=1"]),
    "aed (m=2)": ("aed-rag", []),
    "aed w/o triplets": ("aed-rag", ["triplets=false"]),
    "aed w/o d_ss": ("aed-rag", ["self_sufficiency=false"]),
    "aed untrained": ("aed-rag", ["predictor=similarity"]),
    # the paper's reranker baseline: the installed cross-encoder (not the trained predictor) picks the top 2
    "cross-encoder rerank (m=2)": ("aed-rag", ["fusion=false"], "ms-marco-minilm-l12-v2"),
}


def prepare(data_dir: str, n_train: int, per_dataset: int, work: Path = WORK) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from specrag.evaluation.splits import load_split
    data = imported_data(work, data_dir)
    index = pooled_index(work, data)
    triplets = work / "aed" / "triplets"
    if not (triplets / "manifest.json").exists():
        specrag("extract-triplets", "--corpus", str(data / "pooled_corpus.parquet"), "--output", str(triplets),
                "--overwrite", *TWO_WORKERS)
    train_ids, eval_ids = load_split("aed_train"), set(load_split("aed_eval"))
    # training questions: NQ and HotpotQA in the proportions of the split, first by split order
    rows = {r["id"]: r for d in ("nq", "hotpotqa") for r in pq.read_table(data / d / "queries.parquet").to_pylist()}
    train = [rows[i] for i in train_ids if i in rows][:n_train]
    train_path = work / "aed" / f"train-{n_train}.parquet"
    train_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(train), train_path)
    evals, dataset_of = [], {}
    for d in DATASETS:
        table = [r for r in pq.read_table(data / d / "queries.parquet").to_pylist() if r["id"] in eval_ids]
        evals += table[:per_dataset]
        dataset_of.update((r["id"], d) for r in table[:per_dataset])
    eval_path = work / "aed" / f"eval-{per_dataset}.parquet"
    pq.write_table(pa.Table.from_pylist(evals), eval_path)
    return {"index": index, "triplets": triplets, "train": train_path, "eval": eval_path, "dataset_of": dataset_of,
            "per_dataset": per_dataset, "work": work, "data": data}


def train_predictor(paths: dict, n_train: int, label_top_k: int) -> Path:
    labels = paths["work"] / "aed" / f"labels-{n_train}-k{label_top_k}"
    if not (labels / "labels.parquet").exists():
        specrag("label-utility", "--queries", str(paths["train"]), "--index", str(paths["index"]),
                "--triplets", str(paths["triplets"]), "--output", str(labels), "--set", f"top_k={label_top_k}",
                "--resume", *TWO_WORKERS)
    predictor = paths["work"] / "aed" / f"predictor-{n_train}-k{label_top_k}"
    if not (predictor / "specrag_model.json").exists():
        specrag("train-utility", "--labels", str(labels), "--output", str(predictor), "--threads", "2")
    return predictor


def answer(paths: dict, predictor: Path, label: str) -> Path:
    method, settings, *model = CONFIGS[label]  # a third entry: another utility model than the trained one
    utility = model[0] if model else str(predictor)
    slug = label.replace(' ', '_').replace('(', '').replace(')', '').replace('/', '')
    out = paths["work"] / "aed" / "runs" / f"{paths['per_dataset']}-{Path(utility).name}-{slug}"
    if not (out / "manifest.json").exists():
        args = ["answer", "--queries", str(paths["eval"]), "--index", str(paths["index"]),
                "--triplets", str(paths["triplets"]), "--model", f"utility={utility}", "--method", method,
                "--output", str(out), "--resume", *TWO_WORKERS]
        for s in settings:
            args += ["--set", s]
        specrag(*args)
    return out


def per_query(run: Path, queries: Path, dataset_of: dict[str, str]) -> dict[str, dict[str, dict]]:
    """{dataset: {id: em, f1, avg, latency}} of one run."""
    import pyarrow.parquet as pq
    from specrag.evaluation.metrics import contains, f1
    gold = {r["id"]: r for r in pq.read_table(queries).to_pylist()}
    out = {d: {} for d in DATASETS}
    for f in sorted(run.glob("results-*.parquet")):
        for r in pq.read_table(f, columns=["id", "answer", "raw_output", "timings"]).to_pylist():
            answers = gold[r["id"]]["answers"] or []
            em, f = contains(r["raw_output"] or r["answer"] or "", answers), f1(r["answer"] or "", answers)
            out[dataset_of[r["id"]]][r["id"]] = {"em": em, "f1": f, "avg": (em + f) / 2, "latency": r["timings"]["served_s"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.environ.get("SPECRAG_DATA", "../shared/data"))
    ap.add_argument("--train", type=int, default=1000, help="aed_train questions to label and train on")
    ap.add_argument("--per-dataset", type=int, default=100, help="aed_eval questions per dataset")
    ap.add_argument("--label-top-k", type=int, default=10, help="retrieved passages labelled per training question")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of the configurations")
    args = ap.parse_args()
    labels = [c.strip() for c in args.configs.split(",") if c.strip()]
    paths = prepare(args.data_dir, args.train, args.per_dataset)
    predictor = train_predictor(paths, args.train, args.label_top_k)
    training = json.loads((predictor / "training_manifest.json").read_text())["report"]
    runs = {label: answer(paths, predictor, label) for label in labels}
    scores = {label: per_query(run, paths["eval"], paths["dataset_of"]) for label, run in runs.items()}
    # the job's wall time per question: throughput, where served latency counts batching waits
    job_s = {label: json.loads((run / "manifest.json").read_text())["wall_s"] / max(1, len(paths["dataset_of"]))
             for label, run in runs.items()}
    rows = []
    base = "standard (k=5)"
    for label in labels:
        for dataset in (*DATASETS, "all"):
            per = (scores[label][dataset] if dataset != "all"
                   else {f"{d}/{k}": v for d in DATASETS for k, v in scores[label][d].items()})
            ids = sorted(per)
            mean = lambda key: 100 * sum(per[i][key] for i in ids) / max(1, len(ids))  # noqa: E731
            row = {"method": label, "dataset": dataset, "n": len(ids), "relaxed_em": mean("em"), "f1": mean("f1"),
                   "avg": mean("avg"), "latency_s": sum(per[i]["latency"] for i in ids) / max(1, len(ids)),
                   "job_s_per_q": job_s[label] if dataset == "all" else "-"}
            if label != base and base in scores:
                ref = (scores[base][dataset] if dataset != "all"
                       else {f"{d}/{k}": v for d in DATASETS for k, v in scores[base][d].items()})
                common = sorted(set(ids) & set(ref))
                lo, hi = paired_bootstrap_ci([[per[i]["avg"] for i in common]], [[ref[i]["avg"] for i in common]])
                row["avg_minus_standard_95ci"] = f"[{lo:+.1f}, {hi:+.1f}]"
            else:
                row["avg_minus_standard_95ci"] = "-"
            rows.append(row)
    by = {(r["method"], r["dataset"]): r for r in rows}
    aed, std = by[("aed (m=2)", "all")], by[(base, "all")]
    setup = (f"{machine_line(1)}; two worker processes, one torch thread each; reader SmolLM2-135M-Instruct fp32 "
             "(the paper: Qwen3-8B); BM25 over the pooled corpus (the paper: Contriever); triplets by spaCy "
             "dependency rules (the paper: TRACE with an 8B model); utility predictor: a one-logit cross-encoder "
             f"from all-MiniLM-L6-v2 trained on CPPL labels of {args.train} aed_train questions, top-{args.label_top_k} "
             "passages, their triplet sets and d_gen per question (the paper: "
             "BGE-reranker-base, 19,291 HotpotQA questions). Training: "
             f"{training['train_questions']} questions, epoch KL {[round(x, 4) for x in training['epoch_loss']]}, "
             f"held-out Spearman with the teacher {training['spearman_trained']:.3f} (before training "
             f"{training['spearman_initial']:.3f}, untrained MiniLM similarity {training['spearman_untrained']:.3f}; "
             f"{training['held_out_questions']} questions). Evaluation: the first {args.per_dataset} aed_eval questions "
             "of each dataset, each configuration one job over all of them (latency_s: mean served latency per query, "
             "admission to answer, batching waits included; job_s_per_q: the job's wall time / questions); top-10 "
             "retrieved for AED-RAG, top-5 for standard RAG; 32 new tokens; d_ss 128.\n")
    report = "\n".join(["", "## Quality and latency", "",
                        *markdown_table(rows, ["method", "dataset", "n", "relaxed_em", "f1", "avg", "latency_s",
                                               "job_s_per_q", "avg_minus_standard_95ci"])])
    publish(RESULTS, "AED-RAG vs standard RAG, with ablations", setup, report,
            f"aed_minus_standard_avg={aed['avg'] - std['avg']:.2f} latency_ratio={aed['latency_s'] / std['latency_s']:.2f}")


if __name__ == "__main__":
    main()
