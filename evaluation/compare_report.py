"""The comparison report: quality and cost of every method per dataset, paired intervals against
each method's baselines, accuracy-versus-latency with the Pareto front, examples with their
evidence and traces, and the run manifests.

Everything is computed from the runs' Parquet (scores per query against the gold, costs from
the typed ``counts`` and ``timings`` columns), so a report can be rebuilt from finished runs.
"""
from __future__ import annotations

import html
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from specrag.evaluation.metrics import TASK_METRICS, score_row
from specrag.evaluation.report import markdown_table, read_gold
from specrag.evaluation.stats import paired_bootstrap_ci, pareto_front
from specrag.redaction import redact

NOT_RUN = ("not applicable", "not run")  # statuses of suite entries without a run to report

COST_FIELDS = ("model_calls", "prompt_tokens", "generated_tokens", "retrieval_calls", "cache_hits")
EXAMPLE_PASSAGES = 3  # passages shown per retrieval step of an example
EXAMPLE_STEPS = 4  # retrieval steps shown per example
TRACE_CHARS = 4000  # of an example's trace JSON


def _read_runs(pattern: str) -> list[dict]:
    from specrag.jobio.files import match_files, read_parquet
    rows = []
    for f in match_files(pattern):
        table = read_parquet(f)
        cols = [c for c in ("id", "answer", "raw_output", "choice", "counts", "timings", "retrieved", "trace")
                if c in table.column_names]
        rows.extend(table.select(cols).to_pylist())
    return rows


def _nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def summarise_run(record, gold: dict[str, dict], headline: dict[str, str]) -> dict:
    """One run's quality and cost over its answered questions, with the per-query scores."""
    from specrag.jobio.files import join
    results = _read_runs(join(record.output, "results-*.parquet"))
    dead = _read_runs(join(record.output, "dead_letters-*.parquet"))
    per_query: dict[str, dict] = {}
    tasks: Counter = Counter()
    for r in results:
        g = gold.get(r["id"])
        if g is None:
            raise ValueError(f"{record.output}: result id {r['id']!r} is not in the gold queries {record.queries}")
        task = g["task_type"]
        tasks[task] += 1
        scores = score_row(task, r.get("answer") or "", r.get("raw_output") or "", r.get("choice"), g)
        per_query[r["id"]] = {"scores": scores, "headline": scores.get(headline.get(task) or TASK_METRICS[task][0]),
                              "latency": r["timings"]["served_s"], "row": r}
    n = len(per_query)
    row: dict[str, Any] = {"method": record.label, "n": n, "dead_letters": len({d.get("id") for d in dead}),
                           "missing": len(set(gold) - set(per_query) - {d.get("id") for d in dead})}
    # a dataset may mix task types (the demo does): each metric over the questions it applies to,
    # and with mixed types the headline is "score", each question scored by its own task's headline
    names = {headline.get(t) or TASK_METRICS[t][0] for t in tasks}
    row["task_type"] = "/".join(sorted(tasks)) if tasks else None
    row["headline_metric"] = (names.pop() if len(names) == 1 else "score") if tasks else None
    if n:
        for m in dict.fromkeys(m for t in sorted(tasks) for m in TASK_METRICS[t]):
            values = [q["scores"][m] for q in per_query.values() if m in q["scores"]]
            row[m] = round(100 * sum(values) / len(values), 2)
        if row["headline_metric"] == "score":
            row["score"] = round(100 * sum(q["headline"] for q in per_query.values()) / n, 2)
        lat = sorted(q["latency"] for q in per_query.values())
        row.update(mean_latency_s=round(sum(lat) / n, 3), p50_latency_s=round(_nearest_rank(lat, 0.5), 3),
                   p95_latency_s=round(_nearest_rank(lat, 0.95), 3))
        counts = [q["row"]["counts"] or {} for q in per_query.values()]
        for f in COST_FIELDS:
            row[f"{f}_per_q"] = round(sum(c.get(f) or 0 for c in counts) / n, 2)
        accepted = sum(c.get("speculation_accepted") or 0 for c in counts)
        rejected = sum(c.get("speculation_rejected") or 0 for c in counts)
        row["acceptance"] = round(100 * accepted / (accepted + rejected), 1) if accepted + rejected else None
        row.update(job_throughput(record.manifest or {}, n))
    runtime = (record.manifest or {}).get("runtime") or {}
    # what the latencies mean: queries in flight at once per worker (1: one at a time, the papers' setting)
    row["in_flight"] = (runtime.get("engine") or {}).get("max_in_flight")
    row["models"] = ", ".join(f"{role}={name}" for role, name in runtime.get("models") or [])
    return {"row": row, "per_query": per_query}


def job_throughput(manifest: dict, n: int) -> dict:
    """Queries per second of the job, and over how many answers it was measured. A resumed job's
    wall time covers its last attempt alone (an attempt ended with its sitting leaves no
    manifest), so its throughput is that attempt's answers over that attempt's time:
    ``queries_per_s_over`` says how many (None when one attempt answered every query)."""
    wall = manifest.get("wall_s")
    out = {"queries_per_s": None, "queries_per_s_over": None, "job_wall_s": wall}
    if not wall:
        return out
    if not (manifest.get("resumed") or {}).get("skipped_finished"):
        out["queries_per_s"] = round(n / wall, 3)
        return out
    last = (manifest.get("attempts") or [{}])[-1]
    answered = (last.get("counters") or {}).get("answered") or 0
    if answered and last.get("wall_s") == wall:  # the attempt the wall time belongs to
        out["queries_per_s"], out["queries_per_s_over"] = round(answered / wall, 3), answered
    return out


def throughput_cell(row: dict) -> str:
    """The q/s column: a resumed job's figure names the answers it was measured over."""
    over = row.get("queries_per_s_over")
    return _fmt(row.get("queries_per_s")) + (f" ({over}/{row['n']})" if over else "")


def _passages(index: str | None, ids: set[str]) -> dict[str, dict]:
    """Titles and texts of the passages the examples show (read from the index folder)."""
    if not index or not ids:
        return {}
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    from specrag.jobio.files import exists, join
    path = join(index, "passages.parquet")
    if not exists(path):
        return {}
    table = ds.dataset(path).to_table(columns=["id", "title", "text"], filter=pc.field("id").isin(sorted(ids)))
    return {r["id"]: r for r in table.to_pylist()}


def _example(qid: str, q: dict, gold: dict, passages: dict[str, dict]) -> dict:
    r = q["row"]
    steps = []
    for step in (r.get("retrieved") or [])[:EXAMPLE_STEPS]:
        docs = [{"id": d, "title": (passages.get(d) or {}).get("title") or "",
                 "text": (passages.get(d) or {}).get("text") or ""} for d in (step.get("doc_ids") or [])[:EXAMPLE_PASSAGES]]
        steps.append({"stage": step.get("stage"), "query": step.get("query"), "passages": docs})
    trace = r.get("trace")
    trace_text = json.dumps(trace, default=str, indent=1) if trace else ""
    if len(trace_text) > TRACE_CHARS:
        trace_text = trace_text[:TRACE_CHARS] + f"\n… ({len(trace_text) - TRACE_CHARS} more characters)"
    return {"id": qid, "question": gold.get("question") or "", "gold": list(gold.get("answers") or []),
            "answer": r.get("answer") or "", "raw_output": (r.get("raw_output") or "")[:600],
            "choice": r.get("choice"), "scores": q["scores"], "retrieval": steps,
            "retrieval_steps": len(r.get("retrieved") or []), "trace": trace_text}


def build_report(suite, records) -> dict:
    """The report's content (all numbers; rendering is separate)."""
    report: dict[str, Any] = {"suite": {"name": suite.name, "description": suite.description,
                                        "path": str(suite.path)},
                              "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "datasets": [d.name for d in suite.datasets], "rows": {}, "baselines": {},
                              "pareto": {}, "examples": {}, "manifests": {}, "not_applicable": {},
                              "runs": [{k: getattr(r, k) for k in ("dataset", "label", "method", "output", "status",
                                                                     "error", "wall_s")} for r in records]}
    notes = {m.label: m.note for m in suite.methods}
    for dataset in suite.datasets:
        report["not_applicable"][dataset.name] = [{"method": r.label, "reason": r.error} for r in records
                                                  if r.dataset == dataset.name and r.status in NOT_RUN]
        recs = [r for r in records if r.dataset == dataset.name and r.status not in NOT_RUN]
        if not recs:
            continue
        gold = read_gold(recs[0].queries)
        headline = suite.headline_for(dataset)
        summaries = {r.label: summarise_run(r, gold, headline) for r in recs if r.status != "failed"}
        rows = {}
        for r in recs:
            if r.label in summaries:
                rows[r.label] = {**summaries[r.label]["row"], "status": r.status, "note": notes.get(r.label, "")}
            else:
                rows[r.label] = {"method": r.label, "status": "failed", "error": r.error, "note": notes.get(r.label, "")}
        report["rows"][dataset.name] = rows
        # manifests of runs written before secrets were redacted may still hold them
        report["manifests"][dataset.name] = {r.label: redact(r.manifest) for r in recs}
        # paired intervals against each baseline, on the questions both answered
        comparisons = []
        for m in suite.methods:
            for b in m.baselines:
                if m.label not in summaries or b not in summaries:
                    continue
                a, ref = summaries[m.label]["per_query"], summaries[b]["per_query"]
                common = [i for i in gold if i in a and i in ref and a[i]["headline"] is not None
                          and ref[i]["headline"] is not None]
                if not common:
                    continue
                x, y = [a[i]["headline"] for i in common], [ref[i]["headline"] for i in common]
                lo, hi = paired_bootstrap_ci([x], [y])
                la = sum(a[i]["latency"] for i in common) / len(common)
                lb = sum(ref[i]["latency"] for i in common) / len(common)
                # identical answers: an exact method (RaLMSpec) must equal its sequential baseline
                same = sum((a[i]["row"].get("answer") or "") == (ref[i]["row"].get("answer") or "") for i in common)
                # a latency ratio means something only between runs on the same processor
                machines = [(report["manifests"][dataset.name].get(x) or {}).get("machine") for x in (m.label, b)]
                same_machine = machines[0] == machines[1] if None not in machines else None
                retrieval = sum((ref[i]["row"].get("timings") or {}).get("retrieval_s") or 0.0 for i in common)
                comparisons.append({"method": m.label, "baseline": b, "metric": rows[m.label]["headline_metric"],
                                    "n": len(common), "difference": round(100 * (sum(x) - sum(y)) / len(common), 2),
                                    "ci95": [round(lo, 2), round(hi, 2)], "same_answers": same,
                                    "latency_ratio": round(la / lb, 3) if lb > 0 else None,
                                    "speedup": round(lb / la, 3) if la > 0 else None, "same_machine": same_machine,
                                    **retrieval_ceiling(same == len(common), retrieval / len(common), lb, la)})
        report["baselines"][dataset.name] = comparisons
        # the Pareto front: mean latency (lower is better) against the headline metric
        plotted = [(label, rows[label]["mean_latency_s"], rows[label].get(rows[label]["headline_metric"]))
                   for label in summaries if rows[label].get("n")]
        plotted = [p for p in plotted if p[2] is not None]
        front = pareto_front([(x, y) for _, x, y in plotted])
        report["pareto"][dataset.name] = {"metric": plotted and rows[plotted[0][0]]["headline_metric"],
                                          "points": [{"method": lbl, "latency_s": x, "quality": y}
                                                     for lbl, x, y in plotted],
                                          "front": [plotted[i][0] for i in front]}
        # one right and one wrong example per method, first in the dataset's order
        examples, wanted = {}, {}
        for label, s in summaries.items():
            pq_ = s["per_query"]
            right = next((i for i in gold if i in pq_ and (pq_[i]["headline"] or 0) >= 0.5), None)
            wrong = next((i for i in gold if i in pq_ and (pq_[i]["headline"] or 0) < 0.5), None)
            wanted[label] = {"right": right, "wrong": wrong}
        ids = {d for label, w in wanted.items() for i in w.values() if i
               for step in (summaries[label]["per_query"][i]["row"].get("retrieved") or [])[:EXAMPLE_STEPS]
               for d in (step.get("doc_ids") or [])[:EXAMPLE_PASSAGES]}
        passages = _passages(recs[0].index, ids)
        for label, w in wanted.items():
            examples[label] = {k: _example(i, summaries[label]["per_query"][i], gold[i], passages) if i else None
                               for k, i in w.items()}
        report["examples"][dataset.name] = examples
    return report


def retrieval_ceiling(same_answers: bool, baseline_retrieval_s: float, baseline_s: float, method_s: float) -> dict:
    """Where a method gives its baseline's answers (RaLMSpec against RaLMSeq), it can only have
    saved retrieval time: at best all of it, so its speed-up is capped by Amdahl's law at
    1 / (1 - the baseline's retrieval share). The report shows that ceiling beside the speed-up
    and the share of the possible gain reached, (speed-up - 1) / (ceiling - 1): a 1.03x over BM25
    on a small corpus is then read as most of what 3% of retrieval allowed, not as a failure."""
    none = {"retrieval_share": None, "ceiling": None, "share_of_gain": None}
    if not same_answers or baseline_s <= 0 or method_s <= 0:
        return none
    share = min(baseline_retrieval_s / baseline_s, 0.999)
    ceiling = 1 / (1 - share)
    gain = (baseline_s / method_s - 1) / (ceiling - 1) if ceiling > 1.001 else None
    return {"retrieval_share": round(share, 3), "ceiling": round(ceiling, 3),
            "share_of_gain": None if gain is None else round(gain, 2)}


CEILING_NOTE = ("ceiling: where the answers are the baseline's, only retrieval time can be saved, so the speed-up "
                "is at most 1 / (1 - the baseline's retrieval share); share of gain = (speed-up - 1) / (ceiling - 1).")


def _comparison_cells(c: dict, ceilings: bool) -> dict:
    cells = {"method": c["method"], "baseline": c["baseline"], "metric": c["metric"], "n": c["n"],
             "difference": f"{c['difference']:+.2f}", "95% interval": f"[{c['ci95'][0]:+.2f}, {c['ci95'][1]:+.2f}]",
             "same answers": f"{c.get('same_answers', '—')}/{c['n']}", "latency ratio": _fmt(c["latency_ratio"]),
             "speed-up": _speedup(c)}
    if ceilings:
        share = c.get("retrieval_share")
        cells.update({"baseline retrieval": "—" if share is None else f"{100 * share:.1f}%",
                      "ceiling": _fmt(c.get("ceiling")), "share of gain": _fmt(c.get("share_of_gain"))})
    return cells


# --- rendering -------------------------------------------------------------------------------

QUALITY_COST_COLUMNS = ("mean_latency_s", "p50_latency_s", "p95_latency_s", "queries_per_s", "model_calls_per_q",
                        "prompt_tokens_per_q", "generated_tokens_per_q", "retrieval_calls_per_q",
                        "cache_hits_per_q", "acceptance")
HEADERS = {"mean_latency_s": "mean s", "p50_latency_s": "p50 s", "p95_latency_s": "p95 s",
           "queries_per_s": "q/s", "model_calls_per_q": "model calls/q", "prompt_tokens_per_q": "prompt tok/q",
           "generated_tokens_per_q": "gen tok/q", "retrieval_calls_per_q": "retrievals/q",
           "cache_hits_per_q": "cache hits/q", "acceptance": "accepted %", "dead_letters": "dead",
           "in_flight": "in flight"}


def table_columns(rows: dict[str, dict]) -> list[str]:
    every = dict.fromkeys(["score", *(m for ms in TASK_METRICS.values() for m in ms)])
    metrics = [m for m in every if any(m in x for x in rows.values())]
    cost = [c for c in QUALITY_COST_COLUMNS if any(x.get(c) is not None for x in rows.values())]
    return ["method", "n", "dead_letters", *metrics, *cost, "in_flight"]


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def _cell(row: dict, column: str) -> str:
    if column == "method":
        return row["method"]
    return throughput_cell(row) if column == "queries_per_s" else _fmt(row.get(column))


def methods_overview(report: dict) -> list[dict]:
    """Per method label: the method, its models and why it is in the suite (from the first dataset it ran on)."""
    seen: dict[str, dict] = {}
    for dataset in report["datasets"]:
        for label, r in (report["rows"].get(dataset) or {}).items():
            if label not in seen or not seen[label].get("models"):
                seen[label] = {"label": label, "method": (report["manifests"].get(dataset, {}).get(label) or {})
                               .get("method", ""), "models": r.get("models") or "", "note": r.get("note") or ""}
    return list(seen.values())


def render_markdown(report: dict) -> str:
    lines = [f"# specrag compare: {report['suite']['name']}", "",
             report["suite"]["description"].strip(), "", f"Generated {report['generated']} from "
             f"`{report['suite']['path']}`. Quality in %, latency in seconds per query (served: admission to "
             "answer), costs per query; intervals are paired bootstrap 95% intervals over the questions both "
             "methods answered. With mixed task types the headline is `score`: each question scored by its "
             "own task's headline metric.", ""]
    lines += markdown_table(methods_overview(report), ["label", "method", "models", "note"]) + [""]
    for dataset in report["datasets"]:
        rows = report["rows"].get(dataset)
        not_run = [f"- {x['method']}: not run ({x['reason']})" for x in report.get("not_applicable", {}).get(dataset, [])]
        if not rows:
            lines += [f"## {dataset}", "", *not_run, ""] if not_run else []
            continue
        cols = table_columns(rows)
        lines += [f"## {dataset}", ""]
        view = [{HEADERS.get(c, c): _cell(r, c) for c in cols} for r in rows.values()]
        lines += markdown_table(view, [HEADERS.get(c, c) for c in cols])
        if any(r.get("queries_per_s_over") for r in rows.values()):
            lines += ["", "q/s (k/n): a job resumed across sittings, timed over its last attempt's k answers."]
        failed = [r for r in rows.values() if r.get("status") == "failed"]
        lines += [""] + [f"- **{r['method']} failed**: {r['error']}" for r in failed]
        lines += not_run
        comps = report["baselines"].get(dataset) or []
        if comps:
            lines += ["", "Against each method's baselines:", ""]
            ceilings = any(c.get("ceiling") is not None for c in comps)
            cells = [_comparison_cells(c, ceilings) for c in comps]
            lines += markdown_table(cells, list(cells[0]))
            lines += ["", CEILING_NOTE] if ceilings else []
        pareto = report["pareto"].get(dataset) or {}
        if pareto.get("front"):
            lines += ["", f"Pareto front ({pareto['metric']} against mean latency): " + " → ".join(pareto["front"]),
                      "", f"![{dataset}: {pareto['metric']} against latency](compare-{_file_slug(dataset)}.svg)"]
        lines.append("")
    if report.get("expectations"):
        lines += ["## Expectations", ""]
        lines += markdown_table([{**e, "measured": _fmt(e["measured"]), "ok": "yes" if e["ok"] else "**NO**"}
                                 for e in report["expectations"]],
                                ["dataset", "method", "metric", "expected", "tolerance", "measured", "ok"])
        lines.append("")
    return "\n".join(lines)


def _speedup(comparison: dict) -> str:
    """The speed-up, marked where the two runs were timed on different processors."""
    text = _fmt(comparison.get("speedup"))
    return f"{text} (different machines)" if comparison.get("same_machine") is False else text


def _file_slug(name: str) -> str:
    from specrag.jobio.run_folder import slug
    return slug(name)


def pareto_svg(points: list[dict], front: list[str], metric: str, width: int = 640, height: int = 400) -> str:
    """Quality against mean latency, the front joined by a line: inline SVG, no dependencies."""
    import math
    if not points:
        return ""
    left, right, top, bottom = 64, 24, 20, 52
    xs = [max(p["latency_s"], 1e-4) for p in points]
    ys = [p["quality"] for p in points]
    log_x = max(xs) / min(xs) > 20
    tx = (lambda v: math.log10(max(v, 1e-4))) if log_x else (lambda v: v)
    x0, x1 = min(tx(x) for x in xs), max(tx(x) for x in xs)
    pad = (x1 - x0) * 0.08 or (abs(x0) * 0.5 or 1.0)
    x0, x1 = x0 - pad, x1 + pad
    y0, y1 = 0.0, 100.0 if max(ys) > 50 else max(10.0, 10 * math.ceil(max(ys) * 1.25 / 10))
    sx = lambda v: left + (tx(v) - x0) / (x1 - x0) * (width - left - right)  # noqa: E731
    sy = lambda v: height - bottom - (v - y0) / (y1 - y0) * (height - top - bottom)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'role="img" aria-label="{html.escape(metric)} against mean latency" font-family="sans-serif" font-size="12">',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
           f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#333"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#333"/>']
    for k in range(5):  # y grid
        v = y0 + (y1 - y0) * k / 4
        out.append(f'<line x1="{left}" y1="{sy(v):.1f}" x2="{width - right}" y2="{sy(v):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
    ticks = sorted({10 ** e for e in range(math.floor(x0), math.ceil(x1) + 1)}) if log_x else \
        [x0 + (x1 - x0) * k / 4 for k in range(5)]
    for v in ticks:
        xv = sx(v)
        if left <= xv <= width - right:
            out.append(f'<text x="{xv:.1f}" y="{height - bottom + 16}" text-anchor="middle">{v:.3g}</text>')
    out.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 12}" text-anchor="middle">mean latency per '
               f'query, s{" (log scale)" if log_x else ""}</text>')
    out.append(f'<text x="16" y="{(top + height - bottom) / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(top + height - bottom) / 2:.0f})">{html.escape(metric)} %</text>')
    by = {p["method"]: p for p in points}
    path = [f"{sx(by[m]['latency_s']):.1f},{sy(by[m]['quality']):.1f}" for m in front if m in by]
    if len(path) > 1:
        out.append(f'<polyline points="{" ".join(path)}" fill="none" stroke="#d62728" stroke-width="2" '
                   'stroke-dasharray="6 3" class="pareto-front"/>')
    for p in points:
        on = p["method"] in front
        cx, cy = sx(p["latency_s"]), sy(p["quality"])
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="6" fill="{"#d62728" if on else "#1f77b4"}" '
                   f'class="{"on-front" if on else "point"}"><title>{html.escape(p["method"])}: {p["quality"]:.1f} at '
                   f'{p["latency_s"]:.3f} s</title></circle>'
                   + (f'<text x="{cx - 9:.1f}" y="{cy - 9:.1f}" text-anchor="end">' if cx > 0.7 * width
                      else f'<text x="{cx + 9:.1f}" y="{cy - 9:.1f}">') + f'{html.escape(p["method"])}</text>')
    out.append(f'<text x="{width - right}" y="{top + 4}" text-anchor="end" fill="#d62728">— Pareto front</text>')
    out.append("</svg>")
    return "\n".join(out)


CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;
text-align:right}th{background:#f3f3f3}td:first-child,th:first-child,table.methods td,table.methods th{text-align:left}.failed{color:#b00}
.front{font-weight:bold}details{margin:.4em 0}pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:12px;
white-space:pre-wrap}.ok{color:#080}.bad{color:#b00;font-weight:bold}.example{border-left:4px solid #ccc;
padding-left:.8em;margin:.8em 0}.right{border-color:#2ca02c}.wrong{border-color:#d62728}figure{margin:0}"""


def render_html(report: dict) -> str:
    e = html.escape
    parts = ["<!doctype html><html lang=en><head><meta charset=utf-8>",
             f"<title>specrag compare: {e(report['suite']['name'])}</title><style>{CSS}</style></head><body>",
             f"<h1>specrag compare: {e(report['suite']['name'])}</h1>",
             f"<p>{e(report['suite']['description'])}</p>",
             f"<p>Generated {e(report['generated'])} from <code>{e(report['suite']['path'])}</code>. Quality in %, "
             "latency in seconds per query (served: admission to answer), costs per query; intervals are paired "
             "bootstrap 95% intervals over the questions both methods answered. With mixed task types the headline "
             "is <i>score</i>: each question scored by its own task's headline metric.</p>",
             "<table class=methods><tr><th>label</th><th>method</th><th>models</th><th>note</th></tr>"
             + "".join(f"<tr><td>{e(m['label'])}</td><td>{e(m['method'])}</td><td>{e(m['models'])}</td>"
                       f"<td>{e(m['note'])}</td></tr>" for m in methods_overview(report)) + "</table>"]
    for dataset in report["datasets"]:
        rows = report["rows"].get(dataset)
        not_run = [f"<p>{e(x['method'])}: not run ({e(x['reason'])})</p>"
                   for x in report.get("not_applicable", {}).get(dataset, [])]
        if not rows:
            parts += [f'<section class="dataset"><h2>{e(dataset)}</h2>', *not_run, "</section>"] if not_run else []
            continue
        pareto = report["pareto"].get(dataset) or {}
        front = set(pareto.get("front") or [])
        cols = table_columns(rows)
        parts.append(f'<section class="dataset"><h2>{e(dataset)}</h2><table class="summary"><tr>'
                     + "".join(f"<th>{e(HEADERS.get(c, c))}</th>" for c in cols) + "</tr>")
        for r in rows.values():
            cls = "failed" if r.get("status") == "failed" else ("front" if r["method"] in front else "")
            cells = "".join(f"<td>{e(_cell(r, c))}</td>" for c in cols)
            note = f' title="{e(r["note"])}"' if r.get("note") else ""
            parts.append(f'<tr class="{cls}"{note}>{cells}</tr>')
        parts.append("</table>")
        for r in rows.values():
            if r.get("status") == "failed":
                parts.append(f'<p class="failed">{e(r["method"])} failed: {e(r.get("error") or "")}</p>')
        parts += not_run
        comps = report["baselines"].get(dataset) or []
        if comps:
            ceilings = any(c.get("ceiling") is not None for c in comps)
            cells = [_comparison_cells(c, ceilings) for c in comps]
            parts.append('<h3>Against each method\'s baselines</h3><table class="baselines"><tr>'
                         + "".join(f"<th>{e(h)}</th>" for h in cells[0]) + "</tr>")
            for row in cells:
                parts.append("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in row.values()) + "</tr>")
            parts.append("</table>")
            if ceilings:
                parts.append(f"<p>{e(CEILING_NOTE)}</p>")
        if pareto.get("points"):
            parts.append(f"<h3>{e(pareto['metric'])} against latency</h3><figure>"
                         f"{pareto_svg(pareto['points'], pareto['front'], pareto['metric'])}<figcaption>Pareto "
                         f"front: {e(' → '.join(pareto['front']))}</figcaption></figure>")
        parts.append("<h3>Examples</h3>")
        for label, ex in (report["examples"].get(dataset) or {}).items():
            parts.append(f"<details><summary>{e(label)}</summary>")
            for kind in ("right", "wrong"):
                x = ex.get(kind)
                if x is None:
                    parts.append(f"<p>No {kind} answer in this run.</p>")
                    continue
                parts.append(f'<div class="example {kind}"><p><b>{kind}</b> ({e(x["id"])}): {e(x["question"])}<br>'
                             f'gold: {e(" | ".join(x["gold"]))}<br>answer: <b>{e(x["answer"])}</b>'
                             + (f' (choice {e(str(x["choice"]))})' if x.get("choice") else "")
                             + f'<br>scores: {e(json.dumps(x["scores"]))}</p>')
                if x["raw_output"] and x["raw_output"] != x["answer"]:
                    parts.append(f"<p>output: {e(x['raw_output'])}</p>")
                for step in x["retrieval"]:
                    parts.append(f"<p>retrieval <i>{e(step['stage'] or '')}</i>: {e(step['query'] or '')}</p><ol>"
                                 + "".join(f"<li><b>{e(p['title'])}</b> <small>{e(p['id'])}</small> "
                                           f"{e(p['text'][:300])}</li>" for p in step["passages"]) + "</ol>")
                if x["retrieval_steps"] > len(x["retrieval"]):
                    parts.append(f"<p>… {x['retrieval_steps'] - len(x['retrieval'])} more retrieval steps</p>")
                if x["trace"]:
                    parts.append(f"<details><summary>trace</summary><pre>{e(x['trace'])}</pre></details>")
                parts.append("</div>")
            parts.append("</details>")
        parts.append("<h3>Run manifests</h3>")
        for label, manifest in (report["manifests"].get(dataset) or {}).items():
            parts.append(f"<details><summary>{e(label)}</summary><pre>"
                         f"{e(json.dumps(manifest, indent=1, default=str))}</pre></details>")
        parts.append("</section>")
    if report.get("expectations"):
        parts.append("<h2>Expectations</h2><table class=expectations><tr><th>dataset</th><th>method</th><th>metric</th>"
                     "<th>expected</th><th>tolerance</th><th>measured</th><th>ok</th></tr>")
        for x in report["expectations"]:
            parts.append(f"<tr><td>{e(x['dataset'])}</td><td>{e(x['method'])}</td><td>{e(x['metric'])}</td>"
                         f"<td>{x['expected']}</td><td>{x['tolerance']}</td><td>{e(_fmt(x['measured']))}</td>"
                         f"<td class={'ok' if x['ok'] else 'bad'}>{'yes' if x['ok'] else 'NO'}</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(report: dict, folder: Path) -> dict[str, str]:
    """compare.md (with an SVG per dataset beside it), compare.html (self-contained), compare.json."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"markdown": folder / "compare.md", "html": folder / "compare.html", "json": folder / "compare.json"}
    files["markdown"].write_text(render_markdown(report))
    files["html"].write_text(render_html(report))
    files["json"].write_text(json.dumps(report, indent=1, default=str))
    for dataset, pareto in report["pareto"].items():
        if pareto.get("points"):
            path = folder / f"compare-{_file_slug(dataset)}.svg"
            path.write_text(pareto_svg(pareto["points"], pareto["front"], pareto["metric"]))
            files[f"svg:{dataset}"] = path
    return {k: str(v) for k, v in files.items()}
