"""Converters from the native benchmark formats to specrag's queries and passages tables.

Each converter reads one dataset folder and yields ``(query_row, passages)``. Only gold
fields are read; model outputs stored beside them (ARC's ``response``, PubHealth's
``generated_result``, ASQA's ``answers``) are ignored on purpose. Passage ids are content
hashes of (title, text), so the same paragraph from two datasets pools into one passage.
"""
from __future__ import annotations

import csv
import gzip
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

Row = tuple[dict, list[dict]]


def passage(title: str, text: str) -> dict:
    title, text = (title or "").strip(), re.sub(r"\s+", " ", text or "").strip()
    pid = "p" + hashlib.sha1(f"{title}\n{text}".encode("utf-8")).hexdigest()[:16]
    return {"id": pid, "title": title, "text": text}


def query(qid: str, question: str, dataset: str, task_type: str, answers: list[str], *,
          passages: list[dict] = (), gold: list[dict] = (), choices: list[str] = (),
          labels: list[str] = (), groups: list[list[str]] = (), metadata: dict | None = None) -> Row:
    passages = [p for p in passages if p["text"]]
    gold = [p for p in gold if p["text"]]
    row = {"id": f"{dataset}:{qid}", "question": question.strip(), "answers": list(answers),
           "answer_groups": [list(g) for g in groups], "choices": list(choices),
           "choice_labels": list(labels), "task_type": task_type, "dataset": dataset,
           "gold_passage_ids": [p["id"] for p in gold],
           "metadata": json.dumps(metadata or {}, sort_keys=True)}
    return row, passages


def _jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def hotpotqa(folder: Path) -> Iterator[Row]:
    for r in _jsonl(folder / "dev_subsampled.jsonl"):
        ps = [passage(c["title"], c["paragraph_text"]) for c in r["contexts"]]
        gold = [p for p, c in zip(ps, r["contexts"]) if c.get("is_supporting")]
        answers = [s for a in r["answers_objects"] for s in a.get("spans", []) if s]
        yield query(r["question_id"], r["question_text"], "hotpotqa", "short_form", answers,
                    passages=ps, gold=gold)


def popqa(folder: Path) -> Iterator[Row]:
    for r in json.loads((folder / "popqa.json").read_text(encoding="utf-8")):
        ps = [passage(p["title"], p["text"]) for p in r["paragraphs"]]
        gold = [p for p, src in zip(ps, r["paragraphs"]) if src.get("is_supporting")]
        yield query(str(r["id"]), r["question"], "popqa", "short_form", json.loads(r["possible_answers"]),
                    passages=ps, gold=gold, metadata={"s_pop": r.get("s_pop"), "prop": r.get("prop")})


def nq(folder: Path) -> Iterator[Row]:
    for i, r in enumerate(_jsonl(folder / "nq-open-oracle.jsonl.gz")):
        ps = [passage(c.get("title", ""), c["text"]) for c in r.get("ctxs", [])[:1]]
        yield query(str(i), r["question"], "nq", "short_form", r["answers"], passages=ps, gold=ps)


def webquestions(folder: Path) -> Iterator[Row]:
    for r in json.loads((folder / "test.json").read_text(encoding="utf-8")):
        yield query(r["qId"], r["qText"], "webquestions", "short_form", r["answers"])


def _arc_rows(records: Iterator[dict], dataset: str, strips: dict[str, dict] | None = None) -> Iterator[Row]:
    for r in records:
        ps = [passage(c.get("title", ""), c["text"]) for c in r.get("ctxs", [])]
        if strips and r["question"].strip() in strips:
            ps.append(strips[r["question"].strip()])
        yield query(r["id"], r["question"], dataset, "multiple_choice", [r["answerKey"]], passages=ps,
                    choices=r["choices"]["text"], labels=r["choices"]["label"])


def _crag_strips(folder: Path, prefix: str) -> dict[str, dict]:
    """CRAG's refined evidence, one strip-set per question, aligned by line number."""
    crag = folder.parent / "crag_refined_knowledge"
    sources = (crag / f"{prefix}_sources.txt").read_text(encoding="utf-8").split("\n")
    refs = (crag / f"{prefix}_ref_correct.txt").read_text(encoding="utf-8").split("\n")
    out = {}
    for src, ref in zip(sources, refs):
        m = re.match(r"\s*#(.+?) // (.*)", ref, flags=re.S)
        title, text = (m.group(1), m.group(2)) if m else ("", ref)
        if src.strip() and text.strip():
            out.setdefault(src.strip(), passage(title, text))
    return out


def arc_challenge(folder: Path) -> Iterator[Row]:
    yield from _arc_rows(_jsonl(folder / "test.jsonl"), "arc_challenge", _crag_strips(folder, "arc_challenge"))


def arc_challenge_selfrag(folder: Path) -> Iterator[Row]:
    yield from _arc_rows(_jsonl(folder / "arc_challenge_processed_example.jsonl"), "arc_challenge_selfrag")


def pubhealth(folder: Path) -> Iterator[Row]:
    """The true/false claims (the Self-RAG / CRAG setting), with CRAG's evidence strips."""
    strips = _crag_strips(folder, "pubqa")
    path = next(folder.glob("*.csv"))
    with open(path, newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["label"] not in ("true", "false"):
                continue  # mixture/unproven are outside the papers' binary setting
            claim = r["claim"].strip()
            ps = [strips[claim]] if claim in strips else []
            yield query(r[""], claim, "pubhealth", "claim_verification", [r["label"]], passages=ps,
                        choices=["true", "false"], labels=["true", "false"])


def asqa(folder: Path) -> Iterator[Row]:
    for r in _jsonl(folder / "dataset.jsonl"):
        ps = []
        for a in r.get("annotations", []):
            ps += [passage(k.get("wikipage") or "", k.get("content", "")) for k in a.get("knowledge", [])]
        for qa in r.get("qa_pairs", []):
            if qa.get("context") and qa["context"] != "No context provided":
                ps.append(passage(qa.get("wikipage") or "", qa["context"]))
        longs = [a["long_answer"] for a in r.get("annotations", []) if a.get("long_answer")]
        groups = [qa["short_answers"] for qa in r.get("qa_pairs", []) if qa.get("short_answers")]
        yield query(str(r["sample_id"]), r["ambiguous_question"], "asqa", "long_form", longs,
                    passages=ps, gold=ps, groups=groups)


@dataclass(frozen=True)
class Format:
    folder: str
    convert: Callable[[Path], Iterator[Row]]


HOTPOTQA = Format("hotpotqa_ircot_500", hotpotqa)
POPQA = Format("popqa_hipporag2_1000", popqa)
NQ = Format("nq_open_oracle_2655", nq)
WEBQUESTIONS = Format("webquestions_test_2032", webquestions)
ARC_CHALLENGE = Format("arc_challenge_test_1172", arc_challenge)
ARC_CHALLENGE_SELFRAG = Format("selfrag_arc_challenge_100", arc_challenge_selfrag)
PUBHEALTH = Format("pubhealth_test_1232", pubhealth)
ASQA = Format("asqa_dev_500", asqa)

from specrag.registry import FORMATS  # noqa: E402,F401  (name -> Format, the registry's entries above)
