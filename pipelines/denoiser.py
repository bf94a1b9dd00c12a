"""`specrag train-denoiser`: SARDI's masked-diffusion denoiser, trained on our own data.

Training data come only from a training split (default ``aed_train``: most of NQ-open and a
part of HotpotQA, disjoint by id from ``aed_eval``, which holds the HotpotQA questions SARDI
is evaluated on). Per question, the evidence is what SARDI sees at run time — the BM25 top-K
for the question over the pooled corpus, cut to ``passage_words`` — with the gold passages
put in where BM25 missed them, as the paper trains with its gold documents in context. The
trace names the bridge and then the answer, built from the gold passages' own sentences (the
paper's traces are gpt-4o-mini's; no such model runs here)::

    Step 1: <the bridge passage's sentence that names the answer passage's title>
    Step 2: <the answer passage's sentence that holds the answer>
    ### <answer>

(one step for single-passage questions). Stage 1 trains on the corpus passages themselves.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

from specrag.training.denoiser import BASE_MODEL

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text.strip()) if s.strip()]


def _find(sents: list[str], needle: str) -> str | None:
    low = needle.lower().strip()
    return next((s for s in sents if low and low in s.lower()), None)


def trace_steps(golds: Sequence[tuple[str, str]], answer: str) -> list[str]:
    """Reasoning steps from the gold passages (title, text): a bridge passage's sentence that
    names another gold's title first, then the answer passage's sentence with the answer."""
    if not golds:
        return []
    holds = [i for i, (_, text) in enumerate(golds) if answer.lower() in text.lower()]
    last = holds[0] if holds else len(golds) - 1
    order = [i for i in range(len(golds)) if i != last] + [last]
    steps = []
    for i in order:
        title, text = golds[i]
        sents = sentences(text) or [text]
        if i == last:
            steps.append(_find(sents, answer) or sents[0])
        else:
            others = [golds[j][0] for j in range(len(golds)) if j != i and golds[j][0]]
            steps.append(next((s for t in others if (s := _find(sents, t))), None) or sents[0])
    return steps


def fit_trace(steps: Sequence[str], answer: str, n_tokens: Callable[[str], int], limit: int,
              step_words: int = 0) -> str:
    """``Step i: ...`` lines and ``### answer`` within ``limit`` tokens: the steps are
    shortened word by word (longest first), the answer never. ``step_words`` > 0 caps each
    step first: a short trace leaves the window's tail to the end fill, so a denoiser that
    has to choose the length itself learns to close with the answer well inside the window."""
    words = [s.split()[:step_words] if step_words else s.split() for s in steps]

    def render() -> str:
        lines = [f"Step {i + 1}: {' '.join(w)}" for i, w in enumerate(words) if w]
        return "\n".join([*lines, f"### {answer}"])

    while n_tokens(render()) > limit and any(words):
        longest = max(range(len(words)), key=lambda i: (len(words[i]), -i))
        words[longest] = words[longest][:-1]
    return render()


def evidence_for(hits: Sequence, golds: Sequence, k: int, seed: str) -> list:
    """BM25's top-k with every gold passage in it: a missing gold replaces the lowest-ranked
    non-gold (positions by rank; the order of inserted golds seeded by the question)."""
    gold_ids = {g.doc_id for g in golds}
    chosen = list(hits[:k])
    missing = [g for g in golds if g.doc_id not in {h.doc_id for h in chosen}]
    for g in missing:
        replace = [i for i, h in enumerate(chosen) if h.doc_id not in gold_ids]
        if replace and len(chosen) >= k:
            chosen[replace[-1]] = g
        else:
            chosen.append(g)
    # golds a replacement put last would always sit last: move each to a seeded position
    for g in missing:
        i = next(j for j, h in enumerate(chosen) if h.doc_id == g.doc_id)
        chosen.pop(i)
        pos = int(hashlib.sha256(f"{seed}:{g.doc_id}".encode()).hexdigest(), 16) % (len(chosen) + 1)
        chosen.insert(pos, g)
    return chosen[:max(k, len(golds))]


def build_traces(queries: Sequence[dict], retriever, config, *, top_k: int = 7, passage_words: int = 40,
                 grounded_only: bool = True, base: str = BASE_MODEL, step_words: int = 0):
    """TraceExamples of the questions that have gold passages and an answer; with
    ``grounded_only``, only those whose answer (other than yes/no) occurs in the evidence as cut
    to ``passage_words``: the denoiser learns to copy from its facts, not to guess."""
    from transformers import AutoTokenizer
    from specrag.training.denoiser import TraceExample
    from specrag.inference.models import materialise
    from specrag.methods.prompts import sardi_prompt
    from specrag.methods.sardi import evidence
    tokenizer = AutoTokenizer.from_pretrained(materialise(base))  # the denoiser's own tokens fill the window
    n_tokens = lambda s: len(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    usable = [q for q in queries if q.get("gold_passage_ids") and any(a.strip() for a in q.get("answers") or [])]
    hits = retriever.search([q["question"] for q in usable], top_k) if usable else []
    out = []
    for q, found in zip(usable, hits):
        golds = retriever.fetch(list(q["gold_passage_ids"]))
        answer = next(a.strip() for a in q["answers"] if a.strip())
        steps = trace_steps([(g.title, g.text) for g in golds], answer)
        response = fit_trace(steps, answer, n_tokens, config.response_tokens - 1, step_words)  # room for the end token
        docs = evidence_for(found, golds, top_k, q["id"])
        context = sardi_prompt(q["question"], evidence(docs, passage_words))
        if grounded_only and answer.lower() not in ("yes", "no") and answer.lower() not in context.lower():
            continue
        out.append(TraceExample(q["id"], context, response))
    return out


def answer_probe(questions: Sequence[dict], retriever, config, *, top_k: int, passage_words: int,
                 examples: int = 3, end_after_text: bool = True) -> Callable:
    """A checkpoint's answers to held-out questions: DLM static retrieval (the question's top-K
    as evidence at every step, SARDI's prompt and commit rule, tau_c 0.9, with the end fill
    growing from the text: ``end_after_text``) through the served ``denoise`` operation. Masked-word accuracy on gold traces does not show whether the
    denoiser, choosing every token itself, reaches an answer; this does."""
    from specrag.evaluation.metrics import contains, exact_match, f1

    def probe(folder) -> dict:
        from specrag.inference import Engine, EngineConfig, Services
        from specrag.inference.local import LocalBackend, LocalModelConfig
        from specrag.methods import create_method
        from specrag.methods.local_run import run_method
        started = time.time()
        backend = LocalBackend(LocalModelConfig(str(folder), num_threads=config.threads))
        # the stage timeout bounds each denoising step (SARDI marks them), not the whole loop
        engine = Engine(Services(models={"denoiser": backend}, retriever=retriever),
                        EngineConfig(max_batch=max(1, len(questions))))
        method = create_method("sardi", query="question", max_new_tokens=config.response_tokens,
                               steps=config.response_tokens, top_k=top_k, passage_words=passage_words,
                               end_after_text=end_after_text)
        try:
            states, failures = run_method(engine, method, [dict(q) for q in questions])
        finally:
            engine.close()
        if failures:
            raise RuntimeError(f"the answer probe failed on {len(failures)} question(s): {failures[0]}")
        gold = [q["answers"] for q in questions]
        mean = lambda xs: round(100 * sum(xs) / max(1, len(xs)), 2)  # noqa: E731
        return {"n": len(states), "em": mean([exact_match(s.answer or "", g) for s, g in zip(states, gold)]),
                "f1": mean([f1(s.answer or "", g) for s, g in zip(states, gold)]),
                "contains": mean([contains(s.raw_output or "", g) for s, g in zip(states, gold)]),
                "answered": sum(bool(s.answer) for s in states), "wall_s": round(time.time() - started, 1),
                "examples": [{"question": q["question"], "gold": list(g), "response": s.raw_output, "answer": s.answer}
                             for q, g, s in list(zip(questions, gold, states))[:examples]]}

    return probe


def run_train_denoiser(queries: str, index: str, out_dir: str, config, *, split: str = "aed_train",
                       top_k: int = 7, passage_words: int = 40, max_passages: int = 0, overwrite: bool = False,
                       resume: bool = False, max_failure_fraction: float = 0.5, base: str = BASE_MODEL, progress=None,
                       step_words: int = 0, probe_questions: int = 0) -> dict:
    """Traces of the split's questions among ``queries`` (a Parquet glob), corpus passages of
    the index, then training; returns the report. Query rows that fail validation are dead
    letters beside the model (pipelines/training_inputs.py). ``probe_questions`` > 0: at each
    checkpoint that many held-out questions (those of the held-back traces) are answered
    (``answer_probe``), and the best checkpoint by their F1 is kept."""
    from specrag.pipelines.training_inputs import check_failures, split_rows, training_run
    from specrag.schemas.validation import validate_query
    with training_run(out_dir, resume=resume, overwrite=overwrite) as model_dir:
        from specrag.evaluation.splits import load_split, split_fingerprint
        from specrag.training.denoiser import train_denoiser
        from specrag.retrieval.index import open_retriever
        from specrag.jobio.tables import read_table
        from specrag.jobio.inputs import dataset_fingerprint, expand_inputs
        from specrag.retrieval.base import passage_text
        allowed = set(load_split(split))
        files = expand_inputs(queries)
        rows = [r for f in files for r in read_table(f).to_pylist() if r.get("id") in allowed]
        rows, dead = split_rows(rows, lambda r: (validate_query(r), r)[1], "train-denoiser")
        check_failures(model_dir, dead, len(rows) + len(dead), max_failure_fraction, f"questions of split {split!r}",
                       shown_in=out_dir)
        rows.sort(key=lambda r: r["id"])
        if not rows:
            raise ValueError(f"no question of split {split!r} in {queries!r}")
        retriever = open_retriever(index, "bm25")
        traces = build_traces(rows, retriever, config, top_k=top_k, passage_words=passage_words, base=base,
                              step_words=step_words)
        if not traces:
            raise ValueError(f"no trace: none of the {len(rows)} questions of {split!r} has gold passages holding its "
                             "answer within the evidence cut")
        store = retriever.store
        passages = [passage_text(t, x) for t, x in zip(store.titles, store.texts)]
        if max_passages:
            passages = passages[:max_passages]
        probe = None
        if probe_questions and not config.stop_at_step:  # a replay keeps its recorded step: nothing to choose
            from specrag.training.denoiser import split_held_out
            held = {t.id for t in split_held_out(traces, config.held_out, config.seed)[1]}
            probed = [r for r in rows if r["id"] in held][:probe_questions]
            probe = answer_probe(probed, retriever, config, top_k=top_k, passage_words=passage_words) if probed else None
        report = train_denoiser(passages, traces, config, model_dir, base=base, progress=progress, probe=probe, provenance={
            "split": split_fingerprint(split), "queries": dataset_fingerprint(files),
            "index": json.loads((Path(index) / "manifest.json").read_text()).get("corpus"),
            "evidence": {"retriever": "bm25", "top_k": top_k, "passage_words": passage_words,
                         "golds": "forced into the top-k"},
            "questions": len(rows), "traces_kept": len(traces), "dead_letters": len(dead), "step_words": step_words,
            "probe": {"questions": probe_questions, "method": "sardi, query=question (DLM static), tau_c=0.9, end_after_text",
                      "from": "the held-back traces' questions"} if probe else None,
            "kept": "traces whose answer (other than yes/no) occurs in the evidence as cut"})
        return {**asdict(report), "dead_letters": len(dead)}
