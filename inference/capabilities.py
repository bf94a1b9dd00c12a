"""The operations model backends serve, and the check that a run gets the ones it needs.

A backend class declares, per model kind, the operations it serves (``capabilities``); a
method declares, per model role, the operations it calls (``Method.needs``). A run that asks
a backend for an operation it lacks fails at start, naming the operation, the role, the
model and the backend, instead of failing every query at run time.
"""
from __future__ import annotations

from typing import Callable, Mapping

GENERATE = "generate"  # text (with token ids and log-probabilities) for a prompt
SCORE = "score"  # teacher-forced log-probabilities of a continuation
EMBED = "embed"  # one vector per text
NEXT_TOKEN = "next_token"  # hidden state and next-token distribution after a prefix (KNN-LM)
DENOISE = "denoise"  # per-position argmax and confidence of partially masked sequences (SARDI)
RERANK = "rerank"  # a relevance/utility score per (query, unit) pair (AED-RAG's predictor)
FUSED_DECODE = "fused_decode"  # one greedy decode over weighted context streams (AED-RAG)

OPERATIONS = (GENERATE, SCORE, EMBED, NEXT_TOKEN, DENOISE, RERANK, FUSED_DECODE)


class MissingCapability(ValueError):
    """A run needs an operation its backend does not serve for that model."""


def check_capabilities(who: str, needs: Mapping[str, tuple[str, ...]],
                       offered: Mapping[str, tuple[str, str, frozenset[str]]],
                       elsewhere: Callable[[str, str], list[str]] | None = None) -> None:
    """``who`` (e.g. "method 'knnlm'") needs, per role, operations; ``offered``: role ->
    (backend, model, operations); ``elsewhere(role, op)``: the other backends that serve it.
    Raises MissingCapability naming everything that is missing, and where it is served."""
    problems = []
    for role, ops in sorted(needs.items()):
        backend, model, has = offered[role]
        for op in ops:
            if op not in OPERATIONS:
                raise ValueError(f"{who} needs unknown operation {op!r}; known: {', '.join(OPERATIONS)}")
            if op not in has:
                others = elsewhere(role, op) if elsewhere else []
                where = f"; the {' and the '.join(others)} backend{'s' if len(others) > 1 else ''} serve" \
                        f"{'' if len(others) > 1 else 's'} it" if others else ""
                problems.append(f"{op} from its {role} ({model} on the {backend} backend, which serves "
                                f"{', '.join(sorted(has)) or 'nothing'} for it{where})")
    if problems:
        raise MissingCapability(f"{who} needs " + "; and ".join(problems))
