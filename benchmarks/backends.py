"""The local and vLLM backends on the full suite's standard RAG and Speculative RAG rows (backends.yaml).

Usage (from the repository root, after `make install-vllm`; nothing else running):

    python benchmarks/compare_full.py --suite benchmarks/suites/backends.yaml   # runs, then this summary
    python benchmarks/backends.py                                             # the summary again

Reads the suite's report (benchmarks/results/compare-backends/compare.json) and writes
benchmarks/results/backends.md: per method and backend the headline quality, throughput, job wall
time, a worker's engine start (model loads, vLLM servers; the manifest's ``engine_start_ms`` over
``engines_started``) and the job's time after it, mean latency, answers equal to the local
backend's, and the claim line
``vllm_speedup_standard=… same_standard=… vllm_speedup_speculative=… same_speculative=…``
(speed-up: the local job's wall time over the vLLM job's, start included; same: the share of
identical answers).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import REPO, machine_line, markdown_table, publish, shown  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "backends.md"
PAIRS = {"standard": ("standard RAG (vLLM)", "standard RAG"),
         "speculative": ("Speculative RAG (vLLM)", "Speculative RAG")}


def summarise(report_json: Path, report_dir: str, command: str | None = None) -> None:
    report = json.loads(Path(report_json).read_text())
    (dataset,) = report["datasets"]
    rows, baselines = report["rows"][dataset], report["baselines"].get(dataset, [])
    manifests = report.get("manifests", {}).get(dataset, {})
    table, claims = [], []
    for key, (served, local) in PAIRS.items():
        a, b = rows.get(served), rows.get(local)
        if not (a and b and a.get("n") and b.get("n")):
            claims.append(f"vllm_speedup_{key}=none same_{key}=none")
            continue
        pair = next(x for x in baselines if x["method"] == served and x["baseline"] == local)
        if pair.get("same_machine") is False:
            raise SystemExit(f"{served} and {local} ran on different machines: rerun both in one sitting")
        for label, row in ((local, b), (served, a)):
            start = engine_start_s((manifests.get(label) or {}).get("counters") or {})
            table.append({"method": label, "n": row["n"], "dead": row["dead_letters"],
                          row["headline_metric"]: row[row["headline_metric"]],
                          "queries_per_s": row["queries_per_s"], "job_wall_s": row["job_wall_s"],
                          "engine_start_s": "—" if start is None else start,
                          "after_start_s": "—" if start is None else row["job_wall_s"] - start,
                          "mean_latency_s": row["mean_latency_s"],
                          "same_as_local": f"{pair['same_answers']}/{pair['n']}" if row is a else "—"})
        claims.append(f"vllm_speedup_{key}={b['job_wall_s'] / a['job_wall_s']:.2f} "
                      f"same_{key}={pair['same_answers'] / pair['n']:.2f}")
    metric = next(iter(rows.values()))["headline_metric"]
    cols = ["method", "n", "dead", metric, "queries_per_s", "job_wall_s", "engine_start_s", "after_start_s",
            "mean_latency_s", "same_as_local"]
    publish(str(RESULTS), "The local and vLLM backends on the full suite's rows (backends.yaml)",
            f"{machine_line(1)} (this summary; every run of the suite on this machine, one sitting). "
            f"{dataset}; full report: `{shown(report_dir)}/compare.md`.\n",
            "\n".join(["", *markdown_table(table, cols)]), " ".join(claims), command)


def engine_start_s(counters: dict) -> float | None:
    """A worker's engine start in seconds (the workers start theirs at once); None for a run made
    before the counter was recorded."""
    if "engine_start_ms" not in counters or not counters.get("engines_started"):
        return None
    return counters["engine_start_ms"] / counters["engines_started"] / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report-dir", default=str(REPO / "benchmarks" / "results" / "compare-backends"))
    args = ap.parse_args()
    summarise(Path(args.report_dir) / "compare.json", args.report_dir)


if __name__ == "__main__":
    main()
