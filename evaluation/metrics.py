"""Answer-quality metrics, each as the papers compute it.

EM/F1 use SQuAD normalisation (HotpotQA, NQ); contains-accuracy is the Self-RAG
convention (PopQA, TriviaQA: a gold alias occurs in the answer), taken over the answer the method
gives, not its raw output: a method that reasons before its answer (SARDI's steps, which copy
retrieved sentences, then ``### answer``) would otherwise be credited for a gold alias it only
quoted (PopQA: 85% in SARDI's raw output, 19% in its answers); choice/label accuracy for
ARC and PubHealth; str-EM (ALCE: share of sub-questions whose short answer occurs) and
ROUGE-L against the reference long answers for ASQA.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence


def normalize(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    p = normalize(prediction)
    return float(any(p == normalize(a) for a in answers))


def f1(prediction: str, answers: Sequence[str]) -> float:
    pred = normalize(prediction).split()
    best = 0.0
    for a in answers:
        gold = normalize(a).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred), common / len(gold)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def contains(output: str, answers: Sequence[str]) -> float:
    out = normalize(output)
    return float(any(normalize(a) and normalize(a) in out for a in answers))


def choice_accuracy(choice: str | None, answers: Sequence[str]) -> float:
    return float(choice is not None and any(choice.strip().lower() == a.strip().lower() for a in answers))


def str_em(output: str, groups: Sequence[Sequence[str]]) -> float:
    if not groups:
        return 0.0
    return sum(contains(output, g) for g in groups) / len(groups)


def rouge_l(output: str, references: Sequence[str]) -> float:
    from rouge_score import rouge_scorer
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return max((scorer.score(r, output)["rougeL"].fmeasure for r in references if r), default=0.0)


# metrics computed per task type (the first is the headline metric of the task)
TASK_METRICS = {
    "short_form": ("contains", "em", "f1"),
    "multiple_choice": ("accuracy",),
    "claim_verification": ("accuracy",),
    "long_form": ("str_em", "rouge_l"),
}


def score_row(task_type: str, answer: str, raw_output: str, choice: str | None, gold: dict) -> dict[str, float]:
    answers = gold.get("answers") or []
    if task_type == "short_form":
        return {"contains": contains(answer, answers), "em": exact_match(answer, answers),
                "f1": f1(answer, answers)}
    if task_type in ("multiple_choice", "claim_verification"):
        return {"accuracy": choice_accuracy(choice, answers)}
    return {"str_em": str_em(raw_output or answer, gold.get("answer_groups") or []),
            "rouge_l": rouge_l(raw_output or answer, answers)}


RECALL_AT = (1, 5, 10)


def recall_at(retrieved: Sequence[str], gold: Sequence[str], k: int) -> float:
    """Share of the gold passages among the first k retrieved (HotpotQA: 2 supporting paragraphs)."""
    gold = set(gold)
    return len(gold & set(retrieved[:k])) / len(gold) if gold else 0.0
