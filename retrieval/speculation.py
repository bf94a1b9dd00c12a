"""A request's local speculation cache (RaLMSpec): documents seen so far, ranked like the index.

Speculative retrieval asks the cache instead of the index. The cache ranks its documents
with the index's own scoring function (``Retriever.score``: BM25 over the index statistics,
Lucene's quantised BM25, the dense dot product), so if the index's top-1 is in the cache it
also ranks first there. A wrong guess costs a rollback, never a wrong output: every guess is
verified against the index.
"""
from __future__ import annotations

from typing import Iterable, Sequence


class SpeculationCache:
    """Document ids in insertion order; ties in score go to the earlier insertion."""

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._seen: set[str] = set()

    def add(self, doc_ids: Iterable[str]) -> None:
        for d in doc_ids:
            if d not in self._seen:
                self._seen.add(d)
                self._ids.append(d)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._seen

    def best(self, scores: Sequence[float], ids: Sequence[str] | None = None) -> str:
        """The document with the highest score; ``ids`` is the snapshot the scores were computed
        for (the cache may have grown meanwhile, e.g. during an asynchronous verification)."""
        ids = self._ids if ids is None else ids
        if not ids:
            raise ValueError("speculation cache is empty: fill it from the index first")
        if len(scores) != len(ids):
            raise ValueError(f"{len(scores)} scores for {len(ids)} cached documents")
        top = max(range(len(scores)), key=lambda i: (scores[i], -i))
        return ids[top]
