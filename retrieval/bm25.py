"""BM25 with bm25s (Lucene's BM25 variant), English stopwords and the Snowball stemmer."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from specrag.retrieval.base import DocStore, Hit, Retriever, passage_text

K1, B = 0.9, 0.4  # Anserini/pyserini defaults, so bm25s and Lucene rank alike


def _bm25s():
    """bm25s, imported on first use; it sets its own logger to DEBUG on import, which would print
    "Building index from tokens" into every build's console: back to the level the command chose."""
    import logging

    import bm25s
    logging.getLogger("bm25s").setLevel(logging.NOTSET)
    return bm25s


def _tokenize(texts: Sequence[str]) -> list[list[str]]:
    import Stemmer
    bm25s = _bm25s()
    stemmer = Stemmer.Stemmer("english")
    return bm25s.tokenize(list(texts), stopwords="en", stemmer=stemmer, return_ids=False,
                          show_progress=False)


def build_bm25(store: DocStore, out_dir: Path, k1: float = K1, b: float = B) -> dict:
    """Index every passage of the store (row order = bm25s document index)."""
    bm25s = _bm25s()
    tokens = _tokenize([passage_text(t, x) for t, x in zip(store.titles, store.texts)])
    # the vocabulary in sorted order: bm25s numbers tokens in set order, which follows Python's
    # per-process string hashing, so the same corpus gave different index files in each process
    vocab = {token: i for i, token in enumerate(sorted({t for doc in tokens for t in doc}))}
    index = bm25s.BM25(k1=k1, b=b, method="lucene")
    index.index(bm25s.tokenization.Tokenized(ids=[[vocab[t] for t in doc] for doc in tokens], vocab=vocab),
                show_progress=False)
    index.save(str(out_dir), show_progress=False)
    params = {"k1": k1, "b": b, "method": "lucene", "stemmer": "english", "stopwords": "en"}
    (out_dir / "specrag_bm25.json").write_text(json.dumps(params))
    return params


def top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Rows of the k best scores, best first, ties broken by row number (deterministic).

    A partition finds the k-th score in O(N); only rows at or above it are sorted, so a query
    over a million documents does not sort a million scores.
    """
    if k >= len(scores):
        candidates = np.arange(len(scores))
    else:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        above = np.flatnonzero(scores > kth)
        candidates = np.concatenate([above, np.flatnonzero(scores == kth)[: k - len(above)]])
    return candidates[np.lexsort((candidates, -scores[candidates]))][:k]


class BM25Retriever(Retriever):
    """bm25s search; ``score`` uses the same index statistics as search."""

    kind = "bm25"

    def __init__(self, index_dir: Path, store: DocStore):
        bm25s = _bm25s()
        self.store = store
        self.index = bm25s.BM25.load(str(index_dir), show_progress=False, verbosity=0)
        self.vocab = self.index.vocab_dict

    def _query_ids(self, query: str) -> list[int]:
        return [self.vocab[t] for t in _tokenize([query])[0] if t in self.vocab]

    def _scores(self, query: str) -> np.ndarray:
        ids = self._query_ids(query)
        if not ids:  # no indexed term: every document scores 0
            return np.zeros(len(self.store), dtype=np.float32)
        return self.index.get_scores_from_ids(ids)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        k = min(k, len(self.store))
        out = []
        for q in queries:
            scores = self._scores(q)
            top = top_k_rows(scores, k)
            # like Lucene, only documents that match a query term are hits
            out.append([self.store.hit(int(r), scores[r]) for r in top if scores[r] > 0])
        return out

    def score(self, query: str, doc_ids: Sequence[str]) -> list[float]:
        """Search's scores for a few documents, from the postings of the query's terms only
        (a speculation cache asks this every step: it must not cost a search)."""
        rows = np.asarray(self.store.rows(doc_ids), dtype=np.int64)
        out = np.zeros(len(rows), dtype=np.float32)
        sc = self.index.scores
        data, indices, indptr = sc["data"], sc["indices"], sc["indptr"]
        for t in self._query_ids(query):  # query term order and repeats, as search sums them
            lo, hi = int(indptr[t]), int(indptr[t + 1])
            if hi == lo or not len(rows):
                continue
            pos = np.minimum(np.searchsorted(indices[lo:hi], rows), hi - lo - 1)
            found = indices[lo + pos] == rows
            out[found] += data[lo + pos[found]]
        return [float(x) for x in out]

    def fetch(self, doc_ids: Sequence[str]) -> list[Hit]:
        return [self.store.hit(r, 0.0) for r in self.store.rows(doc_ids)]
