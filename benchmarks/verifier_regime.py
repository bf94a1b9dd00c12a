"""benchmarks/results/verifier_regime.md from the verifier suite's comparison report.

    python benchmarks/compare_full.py --suite benchmarks/suites/verifier.yaml   # runs, then calls this
    python benchmarks/verifier_regime.py [--report-dir benchmarks/results/compare-verifier]

The table: each method's headline metric and mean latency per dataset; then each method against
its baselines (difference in points with its paired 95% interval, latency ratio, same answers).
The claim line, every value a mean over the datasets where both runs exist (latency ratios only
between runs timed on one processor):
``specrag_latency_ratio`` Speculative RAG / standard RAG with the 1.5B model (paper: 0.49);
``specrag_minus_standard`` the same pair's headline difference in points; ``sps_latency_ratio``
SPS / Speculative RAG; ``large_minus_small`` standard RAG 1.5B minus 135M in points;
``aed_minus_standard`` AED-RAG minus standard RAG (k=5, AED prompt) with the 1.5B reader.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import REPO, machine_line, markdown_table, publish, shown  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "verifier_regime.md"
SPEC, LARGE, SMALL = "Speculative RAG (Qwen-1.5B verifier)", "standard RAG (Qwen-1.5B)", "standard RAG (SmolLM2-135M)"
SPS, AED, AED_BASE = "SPS (Qwen-1.5B)", "AED-RAG (Qwen-1.5B)", "standard RAG (k=5; AED prompt; Qwen-1.5B)"
# claim key -> (method, baseline, what: the comparison's field)
CLAIMS = {"specrag_latency_ratio": (SPEC, LARGE, "latency_ratio"), "specrag_minus_standard": (SPEC, LARGE, "difference"),
          "sps_latency_ratio": (SPS, SPEC, "latency_ratio"), "large_minus_small": (LARGE, SMALL, "difference"),
          "aed_minus_standard": (AED, AED_BASE, "difference")}


def comparison(report: dict, method: str, baseline: str) -> list[dict]:
    """The (method, baseline) comparison on every dataset where both ran, computed here when the
    suite did not list that baseline for the method."""
    out = []
    for d in report["datasets"]:
        listed = [x for x in report["baselines"].get(d, []) if x["method"] == method and x["baseline"] == baseline]
        if listed:
            out.append(listed[0])
            continue
        a, b = report["rows"].get(d, {}).get(method), report["rows"].get(d, {}).get(baseline)
        if a and b and a.get("n") and b.get("n") and a.get("mean_latency_s") and b.get("mean_latency_s"):
            metric = a["headline_metric"]
            out.append({"method": method, "baseline": baseline, "n": min(a["n"], b["n"]),
                        "difference": round(a[metric] - b[metric], 2),
                        "latency_ratio": round(a["mean_latency_s"] / b["mean_latency_s"], 3), "unpaired": True})
    return out


def summarise(report_json: Path, report_dir: str, command: str | None = None) -> None:
    report = json.loads(Path(report_json).read_text())
    datasets, rows = report["datasets"], report["rows"]
    labels = list(dict.fromkeys(r["label"] for r in report["runs"]))
    table = []
    for label in labels:
        row = {"method": label}
        for d in datasets:
            r = rows.get(d, {}).get(label)
            row[d] = (f"{r[r['headline_metric']]:.1f} · {r['mean_latency_s']:.1f} s"
                      if r and r.get("n") else "—")
        table.append(row)
    against = []
    for label in labels:
        for d in datasets:
            for x in report["baselines"].get(d, []):
                if x["method"] == label:
                    ratio = x.get("latency_ratio")
                    if ratio is not None and x.get("same_machine") is False:  # not a claim: left out of it
                        ratio = f"{ratio} (different machines)"
                    against.append({"method": label, "baseline": x["baseline"], "dataset": d, "n": x["n"],
                                    "difference": f"{x['difference']:+.1f} [{x['ci95'][0]:+.1f}, {x['ci95'][1]:+.1f}]",
                                    "latency_ratio": ratio, "same": x.get("same_answers")})
    claims = {}
    for key, (method, baseline, what) in CLAIMS.items():
        xs = [x[what] for x in comparison(report, method, baseline)
              if x.get(what) is not None and x.get("same_machine") is not False]
        claims[key] = f"{statistics.mean(xs):.2f}" if xs else "none"
    metric = {d: next((r["headline_metric"] for r in rows.get(d, {}).values() if r.get("headline_metric")), "")
              for d in datasets}
    body = ["", f"## Quality · mean latency per query (headline metric: "
                f"{', '.join(f'{d} {metric[d]}' for d in datasets)})", "",
            *markdown_table(table, ["method", *datasets]), "",
            "## Against the baselines (difference in points [paired 95% interval], latency ratio, same answers)",
            "", *markdown_table(against, ["method", "baseline", "dataset", "n", "difference", "latency_ratio", "same"])]
    machines: dict[str, list[str]] = {}  # where each run was made: latencies compare only on one machine
    for d, by_label in report.get("manifests", {}).items():
        for label, manifest in by_label.items():
            m = (manifest or {}).get("machine") or {}
            key = f"{m.get('cpu', '?')} ({' '.join(m.get('isa') or []) or 'no flags recorded'}), {m.get('cores', '?')} cores"
            machines.setdefault(key, []).append(f"{d} × {label}")
    made_on = "; ".join(f"{k}: {', '.join(v)}" for k, v in machines.items())
    publish(str(RESULTS), "The verifier regime: Speculative RAG, SPS and AED-RAG with a 1.5B model (verifier.yaml)",
            f"{machine_line(1)} (this summary). Full report: `{shown(report_dir)}/compare.md`.\n\n"
            f"Runs made on: {made_on}. A latency ratio between runs of two machines is marked and left out "
            "of the claim line.\n",
            "\n".join(body), " ".join(f"{k}={v}" for k, v in claims.items()), command)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report-dir", default=str(REPO / "benchmarks" / "results" / "compare-verifier"))
    args = ap.parse_args()
    summarise(Path(args.report_dir) / "compare.json", args.report_dir)


if __name__ == "__main__":
    main()
