"""Every method on five benchmark sets: prepare what `benchmarks/suites/full.yaml` needs, then run it.

Preparation (each step a real specrag job, skipped when its output exists under ``--work``, and
only for the methods being run): import ../shared/data with a pooled corpus and BM25 over it; for
KNN-LM the datastore (the first ``--datastore-entries`` teacher-forced states of the corpus); for
AED-RAG the triplets of every passage and the utility predictor (CPPL labels of the first 300
aed_train questions, top-5 passages each, then distillation: the recipe and the folder names of
`benchmarks/aed.py --train 300 --label-top-k 5`); for SARDI the denoiser (the recipe of
`benchmarks/sardi.py`). Then

    specrag compare --suite benchmarks/suites/full.yaml --workdir WORK/compare \
        --runs-dir benchmarks/results/compare-full/runs --report-dir benchmarks/results/compare-full

which answers 200 questions per set with every method as a `specrag answer` job and writes the
report. The suite takes longer than one sitting on 2 cores, so its runs live in the repository
(``--runs-dir``: results, dead letters and manifests, a few hundred KB a run; no data copies): a
finished job is reused and an interrupted or partly committed one resumed, on this machine or the
next. The suite's paths name the folders made here, so ``--work`` must stay ``runs/full`` for it.

    python benchmarks/compare_full.py                                  # everything (hours on 2 cores)
    python benchmarks/compare_full.py --methods "RaLMSpec,SPS"         # these and their baselines
    python benchmarks/compare_full.py --methods SARDI --prepare-only
    python benchmarks/compare_full.py --report-only                    # report the runs made so far
    python benchmarks/compare_full.py --suite benchmarks/suites/verifier.yaml   # the 1.5B verifier regime
    python benchmarks/compare_full.py --suite benchmarks/suites/drafter.yaml    # untuned vs tuned drafter
    python benchmarks/compare_full.py --suite benchmarks/suites/backends.yaml   # local and vLLM backends
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import aed  # noqa: E402
import backends  # noqa: E402
import drafter  # noqa: E402
import sardi  # noqa: E402
import verifier_regime  # noqa: E402
from workloads import REPO, imported_data, machine_line, markdown_table, pooled_index, publish  # noqa: E402
from workloads import specrag_cli as specrag  # noqa: E402

from specrag.evaluation.compare_report import throughput_cell  # noqa: E402
from specrag.pipelines.suite import load_suite  # noqa: E402

SUITE = REPO / "benchmarks" / "suites" / "full.yaml"
UTILITY_TRAIN, UTILITY_TOP_K = 300, 5  # benchmarks/aed.py's recorded run (results/aed.md)
RESULTS = "benchmarks/results/compare_full.md"
# suites that share questions and settings with another's finished runs: those are copied, not run again
REUSE_FROM = {"drafter": ["benchmarks/results/compare-verifier/runs"]}
# claim-line keys: (method, baseline) pairs whose answers must be identical, and paper comparisons
EXACT = {"ralmspec_same": ("RaLMSpec", "RaLMSeq"), "knnlm_spec_same": ("KNN-LM (RaLMSpec)", "KNN-LM")}
SPEEDUPS = {"ralmspec_speedup": ("RaLMSpec", "RaLMSeq"), "knnlm_spec_speedup": ("KNN-LM (RaLMSpec)", "KNN-LM"),
            "specrag_speedup_vs_gemma_standard": ("Speculative RAG", "standard RAG (Gemma-3-270M)"),
            "sps_speedup_vs_specrag": ("SPS", "Speculative RAG")}


def needs(methods) -> set[str]:
    """The trained or built resources these suite methods name in their flags."""
    out = set()
    for m in methods:
        models = m.flags.get("model") or []
        out |= {"datastore"} if m.flags.get("datastore") else set()
        out |= {"aed"} if m.flags.get("triplets") or any(str(x).startswith("utility=") for x in models) else set()
        out |= {"sardi"} if any(str(x).startswith("denoiser=") for x in models) else set()
        # the SmolLM2 drafter benchmarks/drafter.py trains (the 0.5B one is speculative_rag_pays.py's)
        out |= {"drafter"} if any(str(x).startswith("drafter=") and "/drafter/drafter-" in str(x)
                                  for x in models) else set()
    return out


def prepare(data_dir: str, work: Path, datastore_entries: int, wanted: set[str], suite_file: Path = SUITE) -> dict:
    started = time.time()
    data = imported_data(work, data_dir)
    out = {"index": pooled_index(work, data)}
    if "aed" in wanted:
        paths = aed.prepare(data_dir, UTILITY_TRAIN, per_dataset=1, work=work)  # + triplets
        out["triplets"], out["predictor"] = paths["triplets"], aed.train_predictor(paths, UTILITY_TRAIN, UTILITY_TOP_K)
    if "sardi" in wanted:
        out["denoiser"] = sardi.prepare(data_dir, 1, work=work)["denoiser"]
    if "drafter" in wanted:
        out["drafter"] = drafter.prepare(data, out["index"], work)
    if "datastore" in wanted:
        datastore = out["datastore"] = work / "datastore"
        if not (datastore / "manifest.json").exists():  # keys from the model in the dtype the suite runs it in
            dtype = load_suite(suite_file).flags.get("dtype", "float32")
            specrag("build-datastore", "--corpus", str(data / "pooled_corpus.parquet"),
                    "--datastore", str(datastore), "--max-entries", str(datastore_entries), "--dtype", dtype,
                    "--overwrite")
    print(f"prepared in {time.time() - started:.0f} s: " + ", ".join(f"{k} {v}" for k, v in out.items()), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(SUITE.relative_to(REPO)),
                    help="a suite over runs/full's resources: full.yaml, or verifier.yaml (summarised by "
                         "benchmarks/verifier_regime.py)")
    ap.add_argument("--data-dir", default=os.environ.get("SPECRAG_DATA", "../shared/data"))
    ap.add_argument("--work", default="runs/full", help="where the suite's resources live")
    ap.add_argument("--runs-dir", default=None, help="where the answer jobs write (versioned: resumable anywhere; "
                                                     "default benchmarks/results/compare-<suite>/runs)")
    ap.add_argument("--datastore-entries", type=int, default=200_000)
    ap.add_argument("--report-dir", default=None, help="default benchmarks/results/compare-<suite>")
    ap.add_argument("--methods", default="", help="comma-separated method labels (their baselines too)")
    ap.add_argument("--datasets", default="", help="comma-separated dataset names")
    ap.add_argument("--prepare-only", action="store_true")
    ap.add_argument("--report-only", action="store_true", help="no preparation, no job: the report and the "
                    "results file from the runs already in --runs-dir")
    ap.add_argument("--summarise-only", action="store_true", help="rewrite the results file from the report")
    args = ap.parse_args()
    suite_file = (REPO / args.suite).resolve()
    name = load_suite(suite_file).name
    args.report_dir = args.report_dir or f"benchmarks/results/compare-{name}"
    args.runs_dir = args.runs_dir or f"{args.report_dir}/runs"
    summary = {"full": summarise, "verifier": verifier_regime.summarise, "drafter": drafter.summarise,
               "backends": backends.summarise}.get(name)
    reuse = [x for r in REUSE_FROM.get(name, ()) for x in ("--reuse-from", r)]
    # what made the runs, whichever slice or report-only call re-records the table
    command = f"python benchmarks/compare_full.py --suite {args.suite}"
    if args.summarise_only:
        return summary(Path(args.report_dir) / "compare.json", args.report_dir, command)
    work = Path(args.work)
    if work.resolve() != (REPO / "runs" / "full").resolve():
        raise SystemExit("the suite's paths name runs/full: run from the repository root with --work runs/full")
    split = lambda v: tuple(x.strip() for x in v.split(",") if x.strip())  # noqa: E731
    suite = load_suite(suite_file).narrowed(0, split(args.methods), split(args.datasets))  # fails early on a typo
    if not args.report_only:
        prepare(args.data_dir, work, args.datastore_entries, needs(suite.methods), suite_file)
    if args.prepare_only:
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "specrag.pipelines.cli", "compare", "--suite", str(suite_file),
           "--workdir", str(work / "compare"), "--runs-dir", args.runs_dir, "--report-dir", args.report_dir, *reuse]
    narrowed = [*(["--methods", args.methods] if args.methods else []),
                *(["--datasets", args.datasets] if args.datasets else [])]
    run = cmd + narrowed + (["--report-only"] if args.report_only else [])
    print(" ".join(run), flush=True)
    code = subprocess.run(run, env=env).returncode
    if narrowed:  # the report of a slice would replace the suite's: report every run of the suite again
        print("the whole suite's report:", flush=True)
        subprocess.run(cmd + ["--report-only"], env=env, check=True)
    if summary:
        summary(Path(args.report_dir) / "compare.json", args.report_dir, command)
    raise SystemExit(code)


def summarise(report_json: Path, report_dir: str, command: str | None = None) -> None:
    """benchmarks/results/compare_full.md: the headline metric of every method on every dataset,
    throughput, each method against its paper's baseline, and the claim line."""
    import json
    import statistics
    report = json.loads(report_json.read_text())
    datasets, rows, comps = report["datasets"], report["rows"], report["baselines"]
    labels = list(dict.fromkeys(r["label"] for r in report["runs"]))
    status = {(r["dataset"], r["label"]): r["status"] for r in report["runs"]}
    quality, speed = [], []
    for label in labels:
        q, s = {"method": label}, {"method": label}
        for d in datasets:
            r = rows.get(d, {}).get(label)
            if r is None or r.get("status") == "failed" or not r.get("n"):
                q[d] = s[d] = {"failed": "failed", "not run": "not yet"}.get(status.get((d, label)), "—")
                continue
            q[d] = f"{r[r['headline_metric']]:.1f}" + (f" ({r['dead_letters']} dead)" if r.get("dead_letters") else "")
            s[d] = throughput_cell(r)
        quality.append(q)
        speed.append(s)
    metric = {d: next((r["headline_metric"] for r in rows.get(d, {}).values() if r.get("headline_metric")), "")
              for d in datasets}
    against = []
    for label in labels:
        firsts = {d: next((x for x in comps.get(d, []) if x["method"] == label), None) for d in datasets}
        baseline = next((x["baseline"] for x in firsts.values() if x), None)
        if baseline is None:
            continue
        row = {"method": label, "baseline": baseline}
        for d in datasets:
            x = firsts[d]
            row[d] = (f"{x['difference']:+.1f} [{x['ci95'][0]:+.1f}, {x['ci95'][1]:+.1f}], {x['speedup']:.2f}x"
                      f"{' (different machines)' if x.get('same_machine') is False else ''}, "
                      f"same {x['same_answers']}/{x['n']}") if x else "—"
        against.append(row)

    def pair(method: str, baseline: str) -> list[dict]:
        return [x for d in datasets for x in comps.get(d, []) if x["method"] == method and x["baseline"] == baseline]
    jobs = [r for r in report["runs"] if r["status"] != "not applicable"]
    claims = {"jobs": len(jobs), "finished": sum(1 for r in jobs if r["status"] not in ("failed", "not run")),
              "failed": sum(1 for r in jobs if r["status"] == "failed")}
    for key, (m, b) in EXACT.items():
        xs = pair(m, b)
        claims[key] = f"{sum(x['same_answers'] for x in xs)}/{sum(x['n'] for x in xs)}" if xs else "none"
    for key, (m, b) in SPEEDUPS.items():  # timed on one processor only
        xs = [x for x in pair(m, b) if x.get("same_machine") is not False]
        claims[key] = f"{statistics.median(x['speedup'] for x in xs):.2f}" if xs else "none"
    for key, d in (("arc_standard_acc", "ARC-Challenge"), ("pubhealth_standard_acc", "PubHealth")):
        r = rows.get(d, {}).get("standard RAG") or {}
        claims[key] = r.get("accuracy", "none")
    # the suite runs in pieces, possibly on more than one machine: say which processors timed how many runs
    machines = Counter(" ".join([str(m["machine"].get("cpu")), *m["machine"].get("isa", [])])
                       if (m or {}).get("machine") else "not recorded"
                       for by_label in report["manifests"].values() for m in by_label.values())
    timed_on = "; ".join(f"{n} run(s) on {cpu}" for cpu, n in machines.most_common()) or "no run yet"
    setup = (f"{machine_line(1)} (this summary); runs timed on: {timed_on}. Two Beam worker processes "
             f"(FnApiRunner, multi_processing), one torch thread "
             f"each, bfloat16 weights, up to 64 queries in flight per worker. The full report (tables with every "
             f"cost column, paired intervals, Pareto plots, examples with passages and traces, manifests): "
             f"`{report_dir}/compare.md`, `{report_dir}/compare.html`.\n")
    body = ["", f"## Quality (headline metric per dataset, %: {', '.join(f'{d} {metric[d]}' for d in datasets)})", "",
            *markdown_table(quality, ["method", *datasets]), "",
            "## Throughput (queries per second of the job, two workers)", "",
            *markdown_table(speed, ["method", *datasets]), "",
            "(k/n): a job resumed across sittings, timed over its last attempt's k of n answers.", "",
            "## Each method against its paper's baseline (difference [95% interval], speed-up, same answers)", "",
            *markdown_table(against, ["method", "baseline", *datasets])]
    publish(RESULTS, "Every method on five benchmark sets (benchmarks/suites/full.yaml)", setup, "\n".join(body),
            " ".join(f"{k}={v}" for k, v in claims.items()), command)


if __name__ == "__main__":
    main()
