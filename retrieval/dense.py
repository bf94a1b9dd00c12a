"""Exact dense retrieval: FAISS inner product over L2-normalised MiniLM embeddings."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from specrag.retrieval.base import DocStore, Hit


def build_flat(embeddings: np.ndarray, out_dir: Path) -> dict:
    import faiss
    index = faiss.IndexFlatIP(embeddings.shape[1])
    index.add(np.ascontiguousarray(embeddings, dtype=np.float32))
    faiss.write_index(index, str(out_dir / "index.faiss"))
    np.save(out_dir / "embeddings.npy", embeddings.astype(np.float32))
    return {"faiss": "IndexFlatIP", "dim": int(embeddings.shape[1]), "count": int(embeddings.shape[0])}


class DenseRetriever:
    """FAISS search; ``score`` is the dot product with the stored vectors, as the index uses."""

    kind = "dense"

    def __init__(self, index_dir: Path, store: DocStore, embed: Callable[[list[str]], np.ndarray]):
        import faiss
        self.store = store
        self.index = faiss.read_index(str(index_dir / "index.faiss"))
        self.vectors = np.load(index_dir / "embeddings.npy", mmap_mode="r")
        if self.index.ntotal != len(store):
            raise ValueError(f"dense index has {self.index.ntotal} vectors for {len(store)} passages")
        self.embed = embed

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        k = min(k, len(self.store))
        q = np.ascontiguousarray(self.embed(list(queries)), dtype=np.float32)
        scores, rows = self.index.search(q, k)
        return [[self.store.hit(int(r), s) for r, s in zip(rr, ss) if r >= 0]
                for rr, ss in zip(rows, scores)]

    def score(self, query: str, doc_ids: Sequence[str]) -> list[float]:
        q = np.asarray(self.embed([query]), dtype=np.float32)[0]
        rows = self.store.rows(doc_ids)
        return [float(np.dot(self.vectors[r], q)) for r in rows]

    def fetch(self, doc_ids: Sequence[str]) -> list[Hit]:
        return [self.store.hit(r, 0.0) for r in self.store.rows(doc_ids)]
