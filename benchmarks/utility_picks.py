"""Do AED-RAG's utility picks hold the answer? Its passage selection measured on recorded traces.

AED-RAG reads only the m passages (and m triplet sets) its utility predictor scores best among the
retrieved ones, where standard RAG reads the retriever's top k. Each AED-RAG result row keeps the
retrieved passages in the retriever's order (``trace.passage_ids``), the predictor's score of each
(``trace.passage_scores``) and the m it read (``trace.chosen_passages``). A passage holds the answer
when its text, as the reader sees it (title and text), contains a gold answer string (the suite's
``contains`` rule). Per set and run:

- gold hit: the share of questions where the predictor's m picks hold the answer, against the
  retriever's own top m, its top 5 and its top 1, and a random m of the retrieved (its exact
  expectation, hypergeometric) — the number that shows whether the predictor ranks for its reader;
- rank agreement: the mean Spearman correlation of the predictor's scores with the retriever's
  order (1: it only repeats the retriever; about 0: it ignores it);
- where the picks hold no answer but the top 5 does, the question is one the predictor lost.

No model runs: the traces are read as recorded. By default the AED-RAG runs of the verifier
regime (Qwen2.5-Coder-1.5B reader) and of the full suite (SmolLM2-135M); ``--run LABEL=FOLDER``
(repeatable) reads others, e.g. a run with a retrained predictor.

    python benchmarks/utility_picks.py --results benchmarks/results/utility_picks.md
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import REPO, imported_data, markdown_table, publish_or_print, shown  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
# (label, a run folder per set under it): the recorded AED-RAG runs
RUNS = [("AED-RAG, Qwen2.5-Coder-1.5B reader", RESULTS / "compare-verifier" / "runs", "aed-rag-qwen-1-5b"),
        ("AED-RAG, SmolLM2-135M reader", RESULTS / "compare-full" / "runs", "aed-rag")]
SETS = {"popqa": "popqa", "hotpotqa": "hotpotqa"}  # the run's set folder -> the imported set with its answers


def random_hit(n: int, holding: int, m: int) -> float:
    """The chance that m of n passages drawn at random include one of the ``holding`` ones."""
    if m >= n:
        return float(holding > 0)
    return 1.0 - math.comb(n - holding, m) / math.comb(n, m)


def question_picks(trace: dict, holds: dict[str, bool]) -> dict:
    """One question's picks judged: ``holds`` says per retrieved passage id whether it holds the answer."""
    from specrag.training.utility_predictor import spearman
    ids, chosen = trace["passage_ids"], trace["chosen_passages"]
    hold = [holds[i] for i in ids]
    m = len(chosen)
    rho = spearman(trace["passage_scores"], [-r for r in range(len(ids))]) if len(ids) > 1 else math.nan
    return {"m": m, "picks": any(holds[c] for c in chosen), "top_m": any(hold[:m]), "top_5": any(hold[:5]),
            "top_1": any(hold[:1]), "random_m": random_hit(len(ids), sum(hold), m), "rho_retriever": rho,
            "ranks": [ids.index(c) + 1 for c in chosen]}


def analyse(run: Path, gold: dict[str, dict], texts: dict[str, str]) -> dict:
    """The run's questions judged, then averaged (rank agreement over questions where it is defined)."""
    import pyarrow.parquet as pq
    from specrag.evaluation.metrics import contains
    rows = [r for f in sorted(run.glob("results-*.parquet"))
            for r in pq.read_table(f, columns=["id", "trace"]).to_pylist()]
    judged = []
    for r in sorted(rows, key=lambda r: r["id"]):
        t = r["trace"]
        if not t or not t["passage_ids"]:
            continue
        answers = gold[r["id"]]["answers"] or []
        judged.append(question_picks(t, {i: bool(contains(texts[i], answers)) for i in t["passage_ids"]}))
    n = len(judged)
    out = {"questions": n, "m": sorted({j["m"] for j in judged})}
    for key in ("picks", "top_m", "top_5", "top_1", "random_m"):
        out[key] = sum(j[key] for j in judged) / n if n else math.nan
    rhos = [j["rho_retriever"] for j in judged if not math.isnan(j["rho_retriever"])]
    out["rho_retriever"] = sum(rhos) / len(rhos) if rhos else math.nan
    out["lost"] = sum(j["top_5"] and not j["picks"] for j in judged)
    ranks = [r for j in judged for r in j["ranks"]]
    out["pick_rank_mean"] = sum(ranks) / len(ranks) if ranks else math.nan
    return out


def passages(data: Path) -> dict[str, str]:
    """Pooled corpus id -> the passage as the reader sees it (title and text)."""
    import pyarrow.parquet as pq
    from specrag.retrieval.base import passage_text
    table = pq.read_table(data / "pooled_corpus.parquet", columns=["id", "title", "text"]).to_pylist()
    return {p["id"]: passage_text(p["title"], p["text"]) for p in table}


def _pct(x: float) -> str:
    return "—" if isinstance(x, float) and math.isnan(x) else f"{100 * x:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "specrag-utility-picks",
                        help="where ../shared/data is imported once (queries and the pooled corpus)")
    parser.add_argument("--run", action="append", default=[], metavar="LABEL=FOLDER",
                        help="a runs folder holding <set>/<run> of AED-RAG (its run folder's name after a colon: "
                             "LABEL=RUNS:NAME); default: the recorded ones")
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    runs = RUNS
    if args.run:
        runs = []
        for spec in args.run:
            label, _, where = spec.partition("=")
            folder, _, name = where.rpartition(":")
            runs.append((label, Path(folder), name))
    data = imported_data(args.work, args.data_dir)
    import pyarrow.parquet as pq
    gold = {name: {q["id"]: q for q in pq.read_table(data / name / "queries.parquet").to_pylist()}
            for name in sorted(set(SETS.values()))}
    texts = passages(data)
    table = []
    for label, folder, name in runs:
        for slug, dataset in SETS.items():
            run = folder / slug / name
            if not run.is_dir():
                continue
            a = analyse(run, gold[dataset], texts)
            table.append({"run": label, "set": slug, "questions": a["questions"], "m": ",".join(map(str, a["m"])),
                          "picks %": _pct(a["picks"]), "retriever top m %": _pct(a["top_m"]),
                          "top 5 %": _pct(a["top_5"]), "top 1 %": _pct(a["top_1"]),
                          "random m %": _pct(a["random_m"]), "lost": a["lost"],
                          "mean pick rank": f"{a['pick_rank_mean']:.1f}",
                          "rho vs retriever": f"{a['rho_retriever']:.2f}"})
    if not table:
        raise SystemExit("no AED-RAG run found: " + ", ".join(f"{f}/<set>/{n}" for _, f, n in runs))
    setup = ("Traces: " + ", ".join(f"{label}: `{shown(str(folder))}/<set>/{name}`" for label, folder, name in runs)
             + " (no model runs). A passage holds the answer when the reader's view of it (title and text) contains "
             "a gold answer string. Cells: the share (%) of questions whose m picks / the retriever's top m, top 5, "
             "top 1 / a random m of the retrieved (expected) hold the answer; `lost`: questions whose top 5 holds it "
             "and the picks do not; the picks' mean rank in the retriever's order; the mean Spearman correlation of "
             "the predictor's scores with that order.")
    first = table[0]
    share = lambda column: f"{float(first[column]) / 100:.3f}"  # noqa: E731
    claim = (f"picks_gold_hit={share('picks %')} top_m_gold_hit={share('retriever top m %')} "
             f"top5_gold_hit={share('top 5 %')}")
    report = "\n".join(markdown_table(table, list(table[0])))
    publish_or_print(args.results, "AED-RAG: do the utility predictor's picks hold the answer?", setup, report, claim)


if __name__ == "__main__":
    main()
