"""The suites' tables in speculative_rag_pays.md (#79, Deliver 5) and the claim line's values.

Quality (benchmarks/suites/speculative_rag_pays.yaml, 100 questions a set): each method's headline
metric per set, PubHealth's majority label beside them, Speculative RAG minus standard RAG with the
verifier-sized model with its paired bootstrap interval per set. Latency
(speculative_rag_pays_latency.yaml, 30 questions a set, one query at a time, one sitting): each
method's mean served latency pooled over the sets, its ratio to standard RAG with the 1.5B model
from the same sitting, its quality on those questions and its prompt-token floor
(benchmarks/prompt_floor.py): the frontier a user picks a point on.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from prompt_floor import floor
from workloads import REPO, markdown_table

RESULTS = REPO / "benchmarks" / "results"
QUALITY = RESULTS / "compare-speculative_rag_pays"
LATENCY = RESULTS / "compare-speculative_rag_pays_latency"
SPECRAG = "Speculative RAG (tuned 0.5B drafter)"
STANDARD = "standard RAG (Qwen-1.5B)"


def load(folder: Path) -> dict | None:
    """A suite's compare.json, once it has run."""
    path = folder / "compare.json"
    return json.loads(path.read_text()) if path.is_file() else None


def headline(row: dict) -> float | None:
    return row.get(row.get("headline_metric") or "")


def _comparison(report: dict, dataset: str, method: str, baseline: str) -> dict | None:
    return next((c for c in report["baselines"].get(dataset, [])
                 if c["method"] == method and c["baseline"] == baseline), None)


def _output(run: dict) -> Path:
    """A run's folder: compare.json names it from the repository root."""
    path = Path(run["output"])
    return path if path.is_absolute() else REPO / path


def _labels(report: dict) -> list[str]:
    """The suite's methods in its order."""
    return list(dict.fromkeys(r["label"] for r in report["runs"]))


def majority_share(report: dict, dataset: str, gold: dict[str, dict]) -> float | None:
    """The share (%) of the set's evaluated questions whose gold label is the most common one: what
    always answering that label scores (PubHealth's "true")."""
    import pyarrow.parquet as pq
    folders = [_output(r) for r in report["runs"] if r["dataset"] == dataset and r["label"] == STANDARD]
    if not folders:
        return None
    folder = folders[0]
    ids = {i for f in sorted(folder.glob("results-*.parquet"))
           for i in pq.read_table(f, columns=["id"])["id"].to_pylist()}
    labels = [gold[i]["answers"][0].strip().lower() for i in ids if i in gold]
    return 100 * max(map(labels.count, set(labels))) / len(labels) if labels else None


def quality_lines(report: dict, majority: dict[str, float | None] | None = None) -> tuple[list[str], dict]:
    """The quality table and specrag_minus_standard (mean over the sets, points) and sets_better
    (sets whose interval against standard RAG with the 1.5B lies above zero)."""
    sets = report["datasets"]
    rows = []
    for label in _labels(report):
        cells = [headline(report["rows"][s].get(label, {})) for s in sets]
        known = [c for c in cells if c is not None]
        rows.append({"method": label, **{s: "—" if c is None else f"{c:.1f}" for s, c in zip(sets, cells)},
                     "mean": f"{statistics.fmean(known):.1f}" if len(known) == len(sets) else "—"})
    for s, share in (majority or {}).items():
        if share is not None:
            rows.append({"method": f"{s}'s majority label", **{x: f"{share:.1f}" if x == s else "" for x in sets},
                         "mean": ""})
    diffs = {s: _comparison(report, s, SPECRAG, STANDARD) for s in sets}
    interval = [{"set": s, "difference": f"{c['difference']:+.1f}", "95% interval": f"[{c['ci95'][0]:+.1f}, "
                 f"{c['ci95'][1]:+.1f}]", "questions": c["n"]} for s, c in diffs.items() if c]
    values = {}
    if len(interval) == len(sets):
        values = {"specrag_minus_standard": round(statistics.fmean(c["difference"] for c in diffs.values()), 2),
                  "sets_better": sum(c["ci95"][0] > 0 for c in diffs.values())}
    metrics = ", ".join(f"{s} {next(iter(report['rows'][s].values()))['headline_metric']}" for s in sets)
    lines = ["## Quality (100 drafter_eval questions a set; HotpotQA: aed_eval)", "",
             f"Headline metric per set ({metrics}), %.", "",
             *markdown_table(rows, ["method", *sets, "mean"]), "",
             f"{SPECRAG} minus {STANDARD}, paired bootstrap:", "",
             *markdown_table(interval, ["set", "difference", "95% interval", "questions"])]
    return lines, values


def _models(row: dict) -> dict[str, str]:
    """A row's roles -> models ("drafter=…, verifier=…"), a suite's relative folder read from the
    repository root, where the suites' runs/ lies."""
    out = {}
    for part in (row.get("models") or "").split(", "):
        role, _, name = part.partition("=")
        out[role] = name.removeprefix("../../")
    return out


def pooled_floor(report: dict, label: str, baseline: str, sets: list[str]) -> float | None:
    """The prompt-token floor of ``label`` against ``baseline`` over all the sets' questions."""
    runs = {(r["dataset"], r["label"]): _output(r) for r in report["runs"]}
    num = den = 0.0
    for s in sets:
        row = report["rows"][s].get(label)
        if (s, label) not in runs or (s, baseline) not in runs or not row:
            return None
        spec, std = runs[(s, label)], runs[(s, baseline)]
        models = _models(row)
        f = floor(spec.parent.parent, spec.parent.name, spec.name, std.name, models["drafter"], models["verifier"])
        num += f["questions"] * (f["drafter_params"] * f["drafter_tokens"]
                                 + f["verifier_params"] * f["verifier_tokens"])
        den += f["verifier_params"] * f["standard_tokens"] * f["questions"]
    return num / den if den else None


def latency_lines(report: dict, floors: bool = True) -> tuple[list[str], dict]:
    """The latency table (the frontier) and latency_ratio: the headline Speculative RAG's mean
    served latency over standard RAG's with the 1.5B, pooled over the sets' questions."""
    sets = report["datasets"]

    def pooled(label: str) -> float | None:
        rows = [report["rows"][s].get(label) for s in sets]
        if not all(rows):
            return None
        return sum(r["mean_latency_s"] * r["n"] for r in rows) / sum(r["n"] for r in rows)
    base = pooled(STANDARD)
    table = []
    for label in _labels(report):
        mean = pooled(label)
        if mean is None:
            continue
        quality = [headline(report["rows"][s][label]) for s in sets]
        spec = label != STANDARD and all("drafter=" in (report["rows"][s][label].get("models") or "") for s in sets)
        try:
            f = pooled_floor(report, label, STANDARD, sets) if floors and spec else None
        except (ValueError, ImportError) as e:  # a drafter folder another machine trained: the cell says so
            f = f"— ({str(e).splitlines()[0][:80]})"
        table.append({"method": label, "mean quality": f"{statistics.fmean(quality):.1f}",
                      "mean served latency s": f"{mean:.2f}",
                      f"ratio to {STANDARD}": f"{mean / base:.2f}" if base else "—",
                      "prompt-token floor": f"{f:.2f}" if isinstance(f, float) else f or "—",
                      "questions": sum(report["rows"][s][label]["n"] for s in sets)})
    values = {}
    if base and pooled(SPECRAG):
        values["latency_ratio"] = round(pooled(SPECRAG) / base, 3)
    lines = ["## Latency and the frontier (30 questions a set, one query at a time, one sitting)", "",
             "Mean quality: the mean over the sets of each set's headline metric on these questions (30 a set: "
             "about ±15 points a set). The floor: the ratio if a forward pass cost its model's non-embedding "
             "parameters times the prompt tokens it reads (benchmarks/prompt_floor.py); decoding comes on top.", "",
             *markdown_table(table, ["method", "mean quality", "mean served latency s", f"ratio to {STANDARD}",
                                     "prompt-token floor", "questions"])]
    return lines, values


def chosen_over_oracle(report: dict, gold: dict[str, dict[str, dict]], label: str = SPECRAG,
                       f1_right: float = 0.5) -> tuple[float | None, int, int]:
    """(share of the questions whose drafts hold a right and a wrong answer where the method's own
    choice is right, those questions, all answered questions), pooled over the sets: the draft each
    row's trace says the method chose, judged by the suite's rule (verifier_selection.judge)."""
    import pyarrow.parquet as pq
    from verifier_selection import SETS, judge
    mixed = right_picks = answered = 0
    for run in report["runs"]:
        if run["label"] != label:
            continue
        slug = Path(run["output"]).parent.name
        rule = (report["rows"][run["dataset"]][label].get("headline_metric") or "contains")
        for f in sorted(_output(run).glob("results-*.parquet")):
            for r in pq.read_table(f, columns=["id", "task_type", "trace"]).to_pylist():
                drafts = [d for d in (r["trace"] or {}).get("drafts") or [] if d.get("answer")]
                if not drafts:
                    continue
                answered += 1
                right = {d["index"]: judge(r["task_type"], d["answer"], gold[SETS[slug]][r["id"]], f1_right, rule)
                         for d in drafts}
                if any(right.values()) and not all(right.values()):
                    mixed += 1
                    right_picks += right.get(r["trace"]["chosen_draft"], False)
    return (right_picks / mixed if mixed else None), mixed, answered
