"""Join results with gold queries and aggregate metrics per dataset and method."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from specrag.evaluation.metrics import RECALL_AT, TASK_METRICS, recall_at, score_row
from specrag.evaluation.trajectory import METRICS as TRAJECTORY_METRICS
from specrag.evaluation.trajectory import trace_steps, trajectory_metrics
from specrag.jobio.files import exists, join, match_files, read_parquet, write_text
from specrag.jobio.run_folder import ANSWER, RunFolder


RESULT_COLUMNS = ["id", "method", "answer", "raw_output", "choice", "timings", "retrieved"]


def _read(pattern: str, columns: list[str] | None = None) -> list[dict]:
    rows = []
    for f in match_files(pattern):
        rows.extend(read_parquet(f, columns=columns).to_pylist())
    return rows


def read_gold(queries: str) -> dict[str, dict]:
    """The gold queries by id, read as ``answer`` reads queries: Parquet, JSON lines or CSV (a
    file, a folder or a glob), each row normalised by the query schema, so the optional columns
    (dataset, task type, answers, ...) are optional here too. A row the schema refuses (a blank
    question: ``answer`` made it a dead letter) is still gold for its id, its optional columns
    filled the same way; a row without an id is a one-line error naming its file and row
    (numbered from 1, as an editor shows them)."""
    from specrag.jobio.inputs import expand_inputs
    from specrag.jobio.tables import read_table
    from specrag.schemas import RowError, validate_query
    defaults = validate_query({"id": "-", "question": "-"})
    gold = {}
    for f in expand_inputs(queries):
        for number, row in enumerate(read_table(f).to_pylist(), 1):
            try:
                q = validate_query(row)
            except RowError as e:
                if row.get("id") in (None, ""):
                    raise ValueError(f"{f} row {number}: {e}") from None
                q = {**defaults, **{k: v for k, v in row.items() if v not in (None, "")}, "id": str(row["id"])}
            gold[q["id"]] = q
    return gold


def _trajectories(pattern: str) -> dict[str, list[list[str]]]:
    """Per query id, the evidence trajectory of methods whose trace records one (SARDI's steps)."""
    out = {}
    for f in match_files(pattern):
        table = read_parquet(f)
        if "trace" not in table.column_names:
            continue
        for r in table.select(["id", "trace"]).to_pylist():
            steps = trace_steps(r["trace"])
            if steps:
                out[r["id"]] = steps
    return out


def evaluate_run(results_dir: Path | str, queries: str) -> dict:
    """Metrics per (dataset, method) for one run folder (any FileSystems path), one result per id
    (duplicates are counted in ``coverage`` and left out of the metrics); a folder that holds no
    run and missing gold are errors."""
    RunFolder(str(results_dir), ANSWER).check_readable()  # a stopped --overwrite is named, not half read
    results = _read(join(str(results_dir), "results-*.parquet"), RESULT_COLUMNS)  # core columns: any method
    dead = _read(join(str(results_dir), "dead_letters-*.parquet"))
    if not results and not dead and not exists(join(str(results_dir), "identity.json")):
        raise FileNotFoundError(f"{results_dir} is not a run of `specrag answer` (no results, dead letters "
                                "or identity.json there)")
    all_results, results = results, _first_per_id(results)
    trajectories = _trajectories(join(str(results_dir), "results-*.parquet"))
    gold = read_gold(queries)
    if not gold:
        raise FileNotFoundError(f"no gold queries found at {queries}")
    sums: dict[tuple, dict] = defaultdict(lambda: defaultdict(float))
    counts: dict[tuple, int] = defaultdict(int)
    latency: dict[tuple, list] = defaultdict(list)  # per query: served (admission to answer)
    queued: dict[tuple, float] = defaultdict(float)  # per query: waiting for admission
    unknown = [r["id"] for r in results if r["id"] not in gold]
    if unknown:
        raise ValueError(f"{len(unknown)} result ids are not in the gold queries, e.g. {unknown[:3]}")
    for r in results:
        g = gold[r["id"]]
        key = (g["dataset"] or "-", r["method"], g["task_type"])
        if r["method"] != "retrieve-only":
            for name, value in score_row(g["task_type"], r["answer"] or "", r["raw_output"] or "",
                                         r["choice"], g).items():
                sums[key][name] += value
        retrieved = (r["retrieved"] or [{}])[0].get("doc_ids") or []
        if g.get("gold_passage_ids") and r["retrieved"]:
            for k in RECALL_AT:
                sums[key][f"recall@{k}"] += recall_at(retrieved, g["gold_passage_ids"], k)
            sums[key]["_with_gold"] += 1
        if g.get("gold_passage_ids") and r["id"] in trajectories:
            for name, value in trajectory_metrics(trajectories[r["id"]], g["gold_passage_ids"]).items():
                sums[key][name] += value
                sums[key][f"_n_{name}"] += 1
        counts[key] += 1
        latency[key].append(r["timings"]["served_s"])
        queued[key] += r["timings"]["queue_s"]
    dead_by_dataset: dict[str, int] = defaultdict(int)
    for d in dead:
        ds = gold.get(d["id"] or "", {}).get("dataset") or "-"
        dead_by_dataset[ds] += 1
    rows = []
    for key in sorted(counts):
        dataset, method, task = key
        n = counts[key]
        lat = sorted(latency[key])
        metrics = {} if method == "retrieve-only" else {m: round(100 * sums[key][m] / n, 2) for m in TASK_METRICS[task]}
        with_gold = sums[key].get("_with_gold", 0)
        if with_gold:
            metrics.update({f"recall@{k}": round(100 * sums[key][f"recall@{k}"] / with_gold, 2) for k in RECALL_AT})
        metrics.update({m: round(100 * sums[key][m] / sums[key][f"_n_{m}"], 2) for m in TRAJECTORY_METRICS
                        if sums[key].get(f"_n_{m}")})
        rows.append({"run": str(results_dir).rstrip("/").rsplit("/", 1)[-1], "dataset": dataset, "method": method, "task_type": task, "n": n,
                     "dead_letters": dead_by_dataset.get(dataset, 0), **metrics,
                     "mean_latency_s": round(sum(lat) / n, 3), "median_latency_s": round(lat[n // 2], 3),
                     "p95_latency_s": round(lat[min(n - 1, int(0.95 * n))], 3),
                     "mean_queue_s": round(queued[key] / n, 3)})
    return {"results_dir": str(results_dir), "rows": rows, "dead_letters": len(dead),
            "coverage": coverage(all_results, dead, gold)}


def _first_per_id(results: list[dict]) -> list[dict]:
    """One result per query id, the first in file order (attempts in order): a folder that two
    runs wrote into must not count a question twice in n or in the metrics."""
    seen: set[str] = set()
    return [r for r in results if not (r["id"] in seen or seen.add(r["id"]))]


def coverage(results: list[dict], dead: list[dict], gold: dict[str, dict]) -> dict:
    """Is every input id in exactly one of results or dead letters?"""
    result_ids = [r["id"] for r in results]
    dead_ids = {d["id"] for d in dead if d["id"] is not None}
    answered = set(result_ids)
    return {"queries": len(gold), "answered": len(answered), "dead_letter_ids": len(dead_ids - answered),
            "missing": len(set(gold) - answered - dead_ids),
            "duplicate_results": len(result_ids) - len(answered),
            "in_results_and_dead_letters": len(answered & dead_ids)}


def format_table(rows: list[dict]) -> str:
    """A plain-text table (metrics in %, latency in seconds)."""
    metric_cols = [c for c in ("contains", "em", "f1", "accuracy", "str_em", "rouge_l",
                               *(f"recall@{k}" for k in RECALL_AT), *TRAJECTORY_METRICS) if any(c in r for r in rows)]
    cols = ["run", "dataset", "task_type", "method", "n", "dead_letters", *metric_cols, "mean_latency_s"]
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.ljust(w) for x, w in zip(xs, widths))
    return "\n".join([line(cols), line(["-" * w for w in widths]), *(line(x) for x in cells)])


def markdown_table(rows: list[dict], cols: list[str]) -> list[str]:
    """A Markdown table's lines (floats with two decimals; a missing cell is empty)."""
    fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    return (["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            + ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows])


def save_report(report: dict, path: Path | str) -> None:
    write_text(str(path), json.dumps(report, indent=2))
