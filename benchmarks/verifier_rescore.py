"""Verifier scores the recorded runs did not compute, over the drafts they recorded.

`verifier_selection.py` found that none of the recorded scores (the drafter's ρ_draft, the
verifier's ρ_SC and ρ_SR) picks the right draft on more than about half of the questions where a
right and a wrong draft compete. This script asks the verifier other questions about the same
drafts — no new drafts, so any difference is the score's — on those questions only (the others
cannot change a selection):

- ``sc chat``: the method's verification (question, draft, reflection statement, "Yes") inside
  the verifier's chat template, ρ_SC summed over the draft;
- ``answer | rationale``: log P(answer | question, rationale) — the answer scored after the
  evidence the drafter wrote for it, not the rationale after the answer (summed and per token);
- ``P(yes) correct``: log P(" Yes") − log(P(" Yes") + P(" No")) after "Is the answer correct?"
  (a normalised judgement, where ρ_SR is the unnormalised log P(" Yes") of another statement).

Each question's scores are appended to ``--out`` as one JSON line when all its drafts are done,
so a killed run resumes where it stopped (commit the file as it grows). ``--report`` reads it and
writes the table: the within-question AUC and the share of the questions whose argmax draft is
right, per score and with ρ_draft added.

    python benchmarks/verifier_rescore.py --set popqa --threads 2        # resumable; hours
    python benchmarks/verifier_rescore.py --report --results benchmarks/results/verifier_rescore.md
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verifier_selection as vs  # noqa: E402
from workloads import REPO, machine_line, markdown_table, publish_or_print  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "verifier_rescore"
VERIFIER = "qwen2.5-coder-1.5b-instruct"
TUNED_RUNS = REPO / "benchmarks" / "results" / "compare-drafter" / "runs"
TUNED_FOLDER = "speculative-rag-tuned-drafter"
CORRECT = "Is the answer correct? Answer yes or no."


def requests(query: dict, draft: dict) -> dict:
    """Per score, the verifier requests it needs for one draft (one forward pass each)."""
    from specrag.inference.types import ScoreRequest
    from specrag.methods.prompts import task_input
    from specrag.methods.speculative_rag import REFLECTION, draft_text
    question = task_input(query) + "\n"
    text = draft_text(draft["answer"], draft["rationale"])
    return {
        "sc chat": [ScoreRequest(question, f"Answer:{text}\n{REFLECTION}\nAnswer: Yes",
                                 (f"Answer:{text}", f"\n{REFLECTION}\nAnswer:", " Yes"), chat=True)],
        "answer | rationale": [ScoreRequest(f"{question}Rationale: {draft['rationale']}\nAnswer:",
                                            f" {draft['answer']}")],
        "P(yes) correct": [ScoreRequest(f"{question}Answer:{text}\n{CORRECT}\nAnswer:", " Yes"),
                           ScoreRequest(f"{question}Answer:{text}\n{CORRECT}\nAnswer:", " No")],
    }


def reduce(name: str, scored: list) -> dict:
    """A score's values from its requests' results."""
    if name == "sc chat":
        return {"sc chat": scored[0].segment_totals()[0]}
    if name == "answer | rationale":
        total = scored[0].total
        return {"answer | rationale": total, "answer | rationale per token": total / max(len(scored[0].token_logprobs), 1)}
    yes, no = scored[0].total, scored[1].total
    return {"P(yes) correct": yes - max(yes, no) - math.log1p(math.exp(-abs(yes - no)))}


def mixed_questions(slug: str, gold: dict, f1_right: float) -> list[tuple[dict, list[dict], list[bool]]]:
    """The tuned pair's questions of one set whose recorded drafts hold a right and a wrong
    answer, in id order: (query, drafts, right per draft)."""
    import pyarrow.parquet as pq
    headline = "f1" if slug == "hotpotqa" else "contains"
    out = []
    run = TUNED_RUNS / slug / TUNED_FOLDER
    for f in sorted(run.glob("results-*.parquet")):
        for r in pq.read_table(f, columns=["id", "task_type", "trace"]).to_pylist():
            drafts = [d for d in (r["trace"] or {}).get("drafts") or [] if d.get("answer")]
            right = [vs.judge(r["task_type"], d["answer"], gold[r["id"]], f1_right, headline) for d in drafts]
            if any(right) and not all(right):
                out.append((gold[r["id"]], drafts, right))
    return sorted(out, key=lambda x: x[0]["id"])


def rescore(args) -> None:
    from specrag.inference.local import LocalBackend
    from specrag.inference.local_base import LocalModelConfig
    gold = vs.gold_answers(args.data_dir, args.work)[vs.SETS[args.set]]
    questions = mixed_questions(args.set, gold, args.f1_right)
    out = args.out / f"{args.set}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["id"] for line in out.read_text().splitlines()} if out.exists() else set()
    todo = [q for q in questions if q[0]["id"] not in done][: args.limit or None]
    print(f"{args.set}: {len(questions)} mixed questions, {len(done)} done, {len(todo)} to score", flush=True)
    if not todo:
        return
    (args.out / "machine.json").write_text(json.dumps({"line": machine_line(args.threads), "dtype": args.dtype}))
    verifier = LocalBackend(LocalModelConfig(args.verifier, num_threads=args.threads, dtype=args.dtype))
    start = time.time()
    for n, (query, drafts, right) in enumerate(todo, 1):
        scores = []
        for d in drafts:
            values = {"rho_draft": d["rho_draft"], "rho_sc": d["rho_sc"], "rho_sr": d["rho_sr"]}
            for name, reqs in requests(query, d).items():
                values.update(reduce(name, verifier.score(reqs)))
            scores.append(values)
        with out.open("a") as f:
            f.write(json.dumps({"id": query["id"], "right": right, "scores": scores}) + "\n")
        left = (time.time() - start) / n * (len(todo) - n)
        print(f"{args.set}: {len(done) + n}/{len(questions)} questions, {left / 60:.0f} min left", flush=True)


def _label(name: str) -> str:
    """A score's name as a table column ("|" would split a Markdown cell)."""
    return name.replace(" | ", " given ")


def _machine(out: Path) -> str:
    """The machine line the scoring run recorded (its verifier dtype too)."""
    meta = json.loads((out / "machine.json").read_text()) if (out / "machine.json").exists() else {}
    return f"{meta.get('line', 'Machine: not recorded')}; verifier dtype {meta.get('dtype', '?')}"


def report(args) -> None:
    rows, pooled = [], {}
    files = sorted(args.out.glob("*.jsonl"))
    for path in files:
        records = [json.loads(line) for line in path.read_text().splitlines()]
        if not records:
            continue
        names = list(records[0]["scores"][0])
        combos = {_label(n): (lambda s, n=n: s[n]) for n in names}
        combos["sum (default)"] = lambda s: s["rho_draft"] + s["rho_sc"] + s["rho_sr"]
        combos.update({f"rho_draft + {_label(n)}": (lambda s, n=n: s["rho_draft"] + s[n])
                       for n in names if n not in ("rho_draft", "rho_sc", "rho_sr")})
        row = {"set": path.stem, "questions": len(records)}
        for name, fn in combos.items():
            scored = [[(fn(s), ok) for s, ok in zip(r["scores"], r["right"])] for r in records]
            chosen = sum(map(vs.argmax_right, scored))
            pooled.setdefault(name, [0, 0])
            pooled[name][0] += chosen
            pooled[name][1] += len(scored)
            row[name] = f"{100 * chosen / len(scored):.1f} ({vs.pairwise_auc(scored):.2f})"
        rows.append(row)
    if not rows:
        raise SystemExit(f"nothing scored yet under {args.out}")
    columns = [c for c in rows[0] if c not in ("set", "questions")]
    setup = (f"{_machine(args.out)}\n\nDrafts: the tuned SmolLM2-135M drafter's, as "
             f"`{TUNED_RUNS.relative_to(REPO)}/<set>/{TUNED_FOLDER}` recorded them, on the questions whose drafts "
             f"hold a right and a wrong answer; verifier {VERIFIER}. Cells: chosen over oracle (%) and, in brackets, "
             "the within-question AUC of right against wrong drafts.")
    report = "\n".join(markdown_table(rows, ["set", "questions", *columns]))
    best = max(pooled, key=lambda n: pooled[n][0] / pooled[n][1])
    total = {n: pooled[n][0] / pooled[n][1] for n in pooled}
    claim = (f"questions={pooled[best][1]} default_chosen_over_oracle={total['sum (default)']:.3f} "
             f"best_score={best.replace(' ', '_')} best_chosen_over_oracle={total[best]:.3f}")
    publish_or_print(args.results, "Speculative RAG: verifier scores over the recorded drafts", setup, report, claim,
                     command="python benchmarks/verifier_rescore.py --set SET --threads 2, then python "
                             "benchmarks/verifier_rescore.py --report --results benchmarks/results/verifier_rescore.md")

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=sorted(vs.SETS), default="popqa")
    parser.add_argument("--verifier", default=VERIFIER)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--limit", type=int, default=0, help="score at most this many more questions")
    parser.add_argument("--f1-right", type=float, default=0.5)
    parser.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--work", type=Path, default=Path("/tmp/specrag-verifier-selection"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    report(args) if args.report else rescore(args)


if __name__ == "__main__":
    main()
