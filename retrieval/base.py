"""The retriever interface every index kind implements, and the document store behind it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import pyarrow.parquet as pq


@dataclass(frozen=True)
class Hit:
    doc_id: str
    score: float
    title: str
    text: str


class Retriever(Protocol):
    """Batched top-k search; ``score`` rates given documents with the index's own function."""

    kind: str
    embeds_queries: bool = False  # a dense index embeds each query (counted as embed calls)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]: ...
    def score(self, query: str, doc_ids: Sequence[str]) -> list[float]: ...
    def fetch(self, doc_ids: Sequence[str]) -> list[Hit]: ...

    def score_many(self, pairs: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]:
        """``score`` for several (query, doc ids) pairs: one batched call of the engine."""
        return [self.score(query, ids) for query, ids in pairs]


class DocStore:
    """Passages by row number and by id, loaded once from the index folder's Parquet."""

    def __init__(self, path: Path):
        table = pq.read_table(path, columns=["id", "title", "text"])
        self.ids: list[str] = table.column("id").to_pylist()
        self.titles: list[str] = table.column("title").to_pylist()
        self.texts: list[str] = table.column("text").to_pylist()
        self.row_of = {pid: i for i, pid in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)

    def hit(self, row: int, score: float) -> Hit:
        return Hit(self.ids[row], float(score), self.titles[row] or "", self.texts[row])

    def rows(self, doc_ids: Sequence[str]) -> list[int]:
        missing = [d for d in doc_ids if d not in self.row_of]
        if missing:
            raise KeyError(f"unknown document ids: {missing[:5]}")
        return [self.row_of[d] for d in doc_ids]


def passage_text(title: str, text: str) -> str:
    """What gets indexed and embedded: the title sharpens short Wikipedia paragraphs."""
    return f"{title}\n{text}" if title else text
