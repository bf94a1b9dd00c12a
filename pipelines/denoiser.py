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
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

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


def fit_trace(steps: Sequence[str], answer: str, n_tokens: Callable[[str], int], limit: int) -> str:
    """``Step i: ...`` lines and ``### answer`` within ``limit`` tokens: the steps are
    shortened word by word (longest first), the answer never."""
    words = [s.split() for s in steps]

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
                 grounded_only: bool = True, base: str = "all-minilm-l6-v2"):
    """TraceExamples of the questions that have gold passages and an answer; with
    ``grounded_only``, only those whose answer (other than yes/no) occurs in the evidence as cut
    to ``passage_words``: the denoiser learns to copy from its facts, not to guess."""
    from transformers import AutoTokenizer
    from specrag.inference.denoiser_training import TraceExample
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
        response = fit_trace(steps, answer, n_tokens, config.response_tokens - 1)  # room for the end token
        docs = evidence_for(found, golds, top_k, q["id"])
        context = sardi_prompt(q["question"], evidence(docs, passage_words))
        if grounded_only and answer.lower() not in ("yes", "no") and answer.lower() not in context.lower():
            continue
        out.append(TraceExample(q["id"], context, response))
    return out


def run_train_denoiser(queries: str, index: str, out_dir: str, config, *, split: str = "aed_train",
                       top_k: int = 7, passage_words: int = 40, max_passages: int = 0, overwrite: bool = False,
                       max_failure_fraction: float = 0.5, base: str = "all-minilm-l6-v2", progress=None) -> dict:
    """Traces of the split's questions among ``queries`` (a Parquet glob), corpus passages of
    the index, then training; returns the report. Query rows that fail validation are dead
    letters beside the model (pipelines/training_inputs.py)."""
    from specrag.pipelines.training_inputs import check_failures, refuse_existing_model, split_rows
    from specrag.schemas.validation import validate_query
    refuse_existing_model(out_dir, overwrite)
    from specrag.evaluation.splits import load_split, split_fingerprint
    from specrag.inference.denoiser_training import train_denoiser
    from specrag.retrieval.index import open_retriever
    from specrag.transforms.files import read_parquet
    from specrag.transforms.parquet_io import dataset_fingerprint, expand_inputs
    from specrag.retrieval.base import passage_text
    allowed = set(load_split(split))
    files = expand_inputs(queries)
    rows = [r for f in files for r in read_parquet(f).to_pylist() if r.get("id") in allowed]
    rows, dead = split_rows(rows, lambda r: (validate_query(r), r)[1], "train-denoiser")
    check_failures(out_dir, dead, len(rows) + len(dead), max_failure_fraction, f"questions of split {split!r}")
    rows.sort(key=lambda r: r["id"])
    if not rows:
        raise ValueError(f"no question of split {split!r} in {queries!r}")
    retriever = open_retriever(index, "bm25")
    traces = build_traces(rows, retriever, config, top_k=top_k, passage_words=passage_words, base=base)
    if not traces:
        raise ValueError(f"no trace: none of the {len(rows)} questions of {split!r} has gold passages holding its "
                         "answer within the evidence cut")
    store = retriever.store
    passages = [passage_text(t, x) for t, x in zip(store.titles, store.texts)]
    if max_passages:
        passages = passages[:max_passages]
    report = train_denoiser(passages, traces, config, out_dir, base=base, progress=progress, provenance={
        "split": split_fingerprint(split), "queries": dataset_fingerprint(files),
        "index": json.loads((Path(index) / "manifest.json").read_text()).get("corpus"),
        "evidence": {"retriever": "bm25", "top_k": top_k, "passage_words": passage_words,
                     "golds": "forced into the top-k"},
        "questions": len(rows), "traces_kept": len(traces), "dead_letters": len(dead),
        "kept": "traces whose answer (other than yes/no) occurs in the evidence as cut"})
    return {**asdict(report), "dead_letters": len(dead)}
