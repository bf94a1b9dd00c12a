"""Speculative RAG with the untuned and the tuned drafter: prepare the tuned drafter, summarise the suite.

    python benchmarks/compare_full.py --suite benchmarks/suites/drafter.yaml   # prepare, run, summarise
    python benchmarks/compare_full.py --suite benchmarks/suites/drafter.yaml --summarise-only

Preparation (each step skipped when its output exists): the first ``TRAIN_PER_DATASET``
drafter_train questions of NQ, HotpotQA, PubHealth and ARC-Challenge; `specrag
synthesize-rationales` with the 1.5B teacher (its run under benchmarks/results/drafter/synthesis:
ids and generated text only, committed, so a stopped synthesis resumes on the next machine);
`specrag train-drafter` on the kept rationales into runs/full/drafter/drafter-<N>.

benchmarks/results/drafter.md: the data (questions, kept and filtered by reason, tokens), the
training cost and losses, each method's headline metric and mean latency per dataset, the
oracle "a right draft exists" rate of each Speculative RAG run (any of its drafts' answers right:
contains for open questions, the gold label for closed-set ones), and the claim line
``tuned_minus_untuned`` (points, mean over the sets), ``tuned_minus_standard`` (tuned Speculative
RAG minus standard RAG with the 1.5B model), ``oracle_draft_gain`` (points of the oracle rate).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import REPO, machine_line, made_before, markdown_table, publish, specrag_cli as specrag  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "drafter.md"
SYNTHESIS = "benchmarks/results/drafter/synthesis"
TRAIN_PER_DATASET = 150  # the suite names runs/full/drafter/drafter-150
TRAIN_SETS = ("nq", "hotpotqa", "pubhealth", "arc_challenge")
TEACHER = "qwen2.5-coder-1.5b-instruct"
UNTUNED, TUNED, ALONE = "Speculative RAG (untuned drafter)", "Speculative RAG (tuned drafter)", "tuned drafter alone"
STANDARD_LARGE, STANDARD_SMALL = "standard RAG (Qwen-1.5B)", "standard RAG (SmolLM2-135M)"
TWO_WORKERS = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")
# the engine change after which requests that reach a busy model share its next batch: the verifier
# suite's runs (reused here) were made before it, and their latencies are marked so
BATCHER_CHANGE = "689be71"


def training_questions(data: Path, out: Path, per_dataset: int = TRAIN_PER_DATASET) -> Path:
    """The first ``per_dataset`` drafter_train questions of each training set (file order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from specrag.evaluation.splits import load_split
    if out.exists():
        return out
    train = set(load_split("drafter_train"))
    rows = [r for d in TRAIN_SETS for r in
            [q for q in pq.read_table(data / d / "queries.parquet").to_pylist() if q["id"] in train][:per_dataset]]
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out


def prepare(data: Path, index: Path, work: Path, per_dataset: int = TRAIN_PER_DATASET) -> Path:
    """The tuned drafter's folder, synthesized and trained where missing."""
    folder = work / "drafter" / f"drafter-{per_dataset}"
    if (folder / "training_manifest.json").exists():
        warn_other_drafter_weights(folder)
        return folder
    queries = training_questions(data, work / "drafter" / f"train-{per_dataset}.parquet", per_dataset)
    synthesis = REPO / SYNTHESIS
    if not (synthesis / "rationales.parquet").exists():
        resume = ["--resume"] if (synthesis / "identity.json").exists() else []
        specrag("synthesize-rationales", "--queries", str(queries), "--index", str(index), "--output", str(synthesis),
                "--model", f"teacher={TEACHER}", "--threads", "1", "--dtype", "float32", "--stage_timeout", "3600",
                "--shard_rows", "1", "--max_in_flight", "16", *TWO_WORKERS, *resume)
        # each verdict is committed as it comes; 16 questions in flight a worker (one engine batch, not the
        # default 64) make them come steadily, so a session's stop loses at most 32 questions' work
    from specrag.training.state import partial_dir
    specrag("train-drafter", "--rationales", str(synthesis), "--output", str(folder), "--checkpoint-every", "20",
            "--threads", "2", *(["--resume"] if partial_dir(folder).is_dir() else []))  # a killed run's checkpoint
    warn_other_drafter_weights(folder)
    return folder


def warn_other_drafter_weights(folder: Path) -> list[str]:
    """The committed suite runs whose identity names other tuned-drafter weights than ``folder``
    holds, said aloud: trained again on another processor (AVX2 against AVX-512 kernels) the same
    recipe gives other float weights, and those runs can then be neither resumed nor grown here."""
    from specrag.inference.models import model_identity
    from specrag.pipelines.manifest import machine
    weights = model_identity(str(folder)).rsplit("@", 1)[1]
    other = []
    for f in sorted((REPO / "benchmarks" / "results" / "compare-drafter" / "runs").glob("*/*/identity.json")):
        name, _, made_with = json.loads(f.read_text()).get("models", {}).get("drafter", "").rpartition("@")
        if "drafter-" in name and made_with != weights:
            other.append(f"{f.parent.relative_to(REPO)} ({made_with})")
    if other:
        print(f"{folder} holds drafter weights {weights} (trained here, on {' '.join(machine()['isa'])}); "
              f"{len(other)} committed runs were made with other weights and cannot be grown with it: "
              f"{', '.join(other)}. Re-make them with this drafter (git rm -r the folders) or run them where "
              "the recipe gives their weights.", flush=True)
    return other


def oracle_hits(run: Path, queries: Path) -> dict[str, bool]:
    """Per question id: whether some draft's answer is right."""
    import pyarrow.parquet as pq
    from specrag.evaluation.metrics import contains
    from specrag.jobio.inputs import expand_inputs
    gold = {q["id"]: q for f in expand_inputs(str(queries)) for q in pq.read_table(f).to_pylist()}
    hits = {}
    for f in sorted(run.glob("results-*.parquet")):
        for r in pq.read_table(f, columns=["id", "trace"]).to_pylist():
            q = gold[r["id"]]
            answers = [d["answer"] for d in r["trace"]["drafts"] if d["answer"]]
            if q["task_type"] in ("multiple_choice", "claim_verification"):
                right = any(a.strip().lower() == q["answers"][0].strip().lower() for a in answers)
            else:
                right = any(contains(a, q["answers"]) for a in answers)
            hits[r["id"]] = right
    return hits


def rate(hits: dict[str, bool], only=None) -> float | None:
    """Share (%) of right questions, of ``only`` those ids when given."""
    kept = [h for i, h in hits.items() if only is None or i in only]
    return round(100 * sum(kept) / len(kept), 1) if kept else None


def synthesis_line(data: dict) -> str:
    """synthesis.json in words (its ``rationales`` path names the machine that wrote it, not the data)."""
    if not data:
        return "Synthesis: not run."
    kept = ", ".join(f"{d} {n}" for d, n in sorted(data["kept_by_dataset"].items()))
    filtered = ", ".join(f"{r} {n}" for r, n in sorted(data["by_reason"].items()) if r != "kept")
    return (f"Synthesis (teacher {TEACHER}): {data['questions']} drafter_train questions, {data['kept']} rationales "
            f"kept ({kept}), {data['filtered']} filtered ({filtered or 'none'}); {data['rationale_words']} words of "
            "rationale.")


def summarise(report_json: Path, report_dir: str, command: str | None = None) -> None:
    from specrag.pipelines.suite import load_suite
    report = json.loads(Path(report_json).read_text())
    suite = load_suite(REPO / "benchmarks" / "suites" / "drafter.yaml")
    queries = {d.name: d.queries for d in suite.datasets}
    limit = {d.name: d.limit for d in suite.datasets}
    datasets, rows = report["datasets"], report["rows"]
    labels = list(dict.fromkeys(r["label"] for r in report["runs"]))
    run_dir = {(r["dataset"], r["label"]): r.get("output") for r in report["runs"]}
    table, oracle = [], {}
    for label in labels:
        row = {"method": label}
        for d in datasets:
            r = rows.get(d, {}).get(label)
            older = bool(r and r.get("n") and run_dir.get((d, label))
                         and made_before(REPO / run_dir[(d, label)], BATCHER_CHANGE, earliest=True))
            short = f" (n={r['n']})" if r and r.get("n") and limit.get(d) and r["n"] < limit[d] else ""
            row[d] = (f"{r[r['headline_metric']]:.1f} · {r['mean_latency_s']:.1f} s{' †' if older else ''}{short}"
                      if r and r.get("n") else "—")
            if label in (UNTUNED, TUNED, ALONE) and r and r.get("n") and run_dir.get((d, label)):
                oracle[(d, label)] = oracle_hits(REPO / run_dir[(d, label)], Path(queries[d]))
        table.append(row)
    oracle_rows = [{"method": label, **{d: rate(oracle[(d, label)]) if (d, label) in oracle else "—" for d in datasets}}
                   for label in (UNTUNED, TUNED)]
    # every comparison over the questions both runs answered (a set may be part grown): the report's pairs
    pair = lambda d, a, b: next((x for x in report["baselines"].get(d, [])  # noqa: E731
                                 if x["method"] == a and x["baseline"] == b), None)
    paired = [{"method": a, "baseline": b, **{d: (lambda x: f"{x['difference']:+.1f} [{x['ci95'][0]:+.1f}, "
                                                   f"{x['ci95'][1]:+.1f}] (n={x['n']})" if x else "—")(pair(d, a, b))
                                               for d in datasets}}
              for a, b in ((TUNED, UNTUNED), (TUNED, STANDARD_LARGE), (TUNED, STANDARD_SMALL), (ALONE, TUNED))]

    def paired_mean(a: str, b: str) -> str:
        xs = [x["difference"] for d in datasets if (x := pair(d, a, b))]
        return f"{statistics.mean(xs):.2f}" if xs else "none"

    gains = [rate(oracle[(d, TUNED)], both) - rate(oracle[(d, UNTUNED)], both) for d in datasets
             if (d, TUNED) in oracle and (d, UNTUNED) in oracle
             and (both := oracle[(d, TUNED)].keys() & oracle[(d, UNTUNED)].keys())]
    claim = (f"tuned_minus_untuned={paired_mean(TUNED, UNTUNED)} "
             f"tuned_minus_standard={paired_mean(TUNED, STANDARD_LARGE)} "
             f"oracle_draft_gain={f'{statistics.mean(gains):.2f}' if gains else 'none'}")
    synthesis = REPO / SYNTHESIS / "synthesis.json"
    data = json.loads(synthesis.read_text()) if synthesis.exists() else {}
    lines = ["## Data", "", synthesis_line(data), ""]
    manifests = sorted((REPO / "runs" / "full" / "drafter").glob("drafter-*/training_manifest.json"))
    if manifests:
        m = json.loads(manifests[-1].read_text())["report"]
        lines += [f"Training: {m['examples']} examples ({m['prompt_tokens']} prompt and {m['response_tokens']} response "
                  f"tokens), {m['held_out_examples']} held out; epoch loss {m['epoch_loss']}; held-out response loss "
                  f"{m['held_out_loss_untrained']} → {m['held_out_loss_trained']} (step {m['best_step']}); "
                  f"{m['wall_s']:.0f} s.", ""]
    lines += ["## Results (headline metric · mean latency per query)", "", *markdown_table(table, ["method", *datasets]), "",
              f"† first made before commit {BATCHER_CHANGE} (requests that reach a busy model wait for its next batch "
              "instead of leaving as batches of one): its latency, or that of the answers it was grown from, is not "
              "comparable with the unmarked runs'. (n=k): k of the set's questions answered so far.", "",
              "Paired differences of the headline metric (points, 95% bootstrap interval, questions both answered)",
              "", *markdown_table(paired, ["method", "baseline", *datasets]), "",
              "Oracle: questions with a right draft among the drafts (%)", "", *markdown_table(oracle_rows, ["method", *datasets])]
    publish(str(RESULTS), "Speculative RAG's drafter, untuned and tuned on synthesized rationales",
            machine_line(1), "\n".join(lines), claim, command)
