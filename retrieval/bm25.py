"""BM25 with bm25s (Lucene's BM25 variant), English stopwords and the Snowball stemmer."""
from __future__ import annotations

import json
import math
from collections import Counter
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

    Only rows at or above the k-th score are sorted. A strided sample's k-th best score is at
    most the whole's, so every row of the top k scores at least that bound: one scan of the
    scores finds a pool of about ``step * k`` rows holding them, and only the pool is
    partitioned (10^6 int64 scores: ~10 ms to partition, ~0.3 ms to scan). Where the bound
    leaves too large a pool (few matching documents, many ties) all rows are partitioned.
    """
    n = len(scores)
    if k >= n:
        rows = np.arange(n)
    else:
        pool = None
        step = int(np.sqrt(n / k)) // 4
        if step >= 2:
            sample = scores[::step]
            bound = np.partition(sample, len(sample) - k)[len(sample) - k]
            pool = np.flatnonzero(scores >= bound)
            if len(pool) > 64 * step * k:
                pool = None
        rows = _best_rows(np.arange(n), scores, k) if pool is None else _best_rows(pool, scores[pool], k)
    return rows[np.lexsort((rows, -scores[rows]))][:k]


def _best_rows(rows: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """The k rows of the best values (``rows`` ascending); at a tie for the k-th, the first rows."""
    if len(rows) <= k:
        return rows
    kth = np.partition(values, len(values) - k)[len(values) - k]
    above = rows[values > kth]
    return np.concatenate([above, rows[values == kth][: k - len(above)]])


class BM25Retriever(Retriever):
    """bm25s's index, scored by specrag: a batch of overlapping queries costs about one search.

    A document's score is the sum of its query terms' BM25 weights from bm25s's index (float32),
    added in float64. Where the weights of the terms involved span few enough binary orders that
    no float64 sum of them rounds (checked per query from each term's largest and smallest
    weight: in practice always), the sum does not depend on its order, so a query's scores can
    be derived from the query before by adding the terms it has and subtracting those it lacks,
    and are bit for bit those of a search of it alone. That is what a RaLMSpec verification
    asks: its s queries are windows of one text a few tokens apart, which bm25s scores one by
    one (a search of 2 cost 2.91 single ones, `benchmarks/results/search_cost.md`). Where a sum
    could round, the query is summed from nothing in term order, by search and ``score`` alike,
    so a speculation cache still ranks its documents exactly as the index does.
    ``postings_read`` counts the posting entries added up: the cost a batch shares.
    """

    kind = "bm25"

    def __init__(self, index_dir: Path, store: DocStore):
        bm25s = _bm25s()
        self.store = store
        self.index = bm25s.BM25.load(str(index_dir), show_progress=False, verbosity=0)
        self.vocab = self.index.vocab_dict
        sc = self.index.scores
        self._data, self._indices, self._indptr = sc["data"], sc["indices"], sc["indptr"]
        self._range: dict[int, tuple[float, int]] = {}  # term -> (largest weight, exponent of its smallest bit)
        self.postings_read = 0

    def _query_ids(self, queries: Sequence[str]) -> list[list[int]]:
        return [[self.vocab[t] for t in tokens if t in self.vocab] for tokens in _tokenize(queries)]

    def _posting(self, term: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = int(self._indptr[term]), int(self._indptr[term + 1])
        return self._indices[lo:hi], self._data[lo:hi]

    def _exact(self, counts: dict[int, int]) -> bool:
        """Whether every float64 sum of these terms' weights (each up to its count, with either
        sign) is exact: they are all multiples of 2**low and at most 2**53 of them in size."""
        total, low = 0.0, None
        for term, count in counts.items():
            if term not in self._range:
                values = self._posting(term)[1]
                smallest = float(values.min()) if len(values) else 1.0
                # a float32's lowest bit is 23 places below its leading one
                self._range[term] = (float(values.max()) if len(values) else 0.0, math.frexp(smallest)[1] - 24)
            largest, bit = self._range[term]
            total += abs(count) * largest
            low = bit if low is None else min(low, bit)
        return low is None or total < math.ldexp(1.0, low + 52)  # one bit of margin for the bound's own rounding

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        k = min(k, len(self.store))
        acc = np.zeros(len(self.store), dtype=np.float64)  # the scores of the query before
        held: Counter = Counter()  # the terms (with repeats) that acc holds

        def add(term: int, times: int) -> None:
            rows, values = self._posting(term)
            np.add.at(acc, rows, values.astype(np.float64) * times)
            self.postings_read += len(rows)

        def length(term: int) -> int:
            return int(self._indptr[term + 1] - self._indptr[term])

        out = []
        for ids in self._query_ids(queries):
            if not ids:  # no indexed term: no document matches
                out.append([])
                continue
            want = Counter(ids)
            change = {t: want[t] - held[t] for t in want.keys() | held.keys() if want[t] != held[t]}
            both = {t: max(want[t], held[t]) for t in want.keys() | held.keys()}
            if sum(map(length, want)) <= sum(map(length, change)) or not self._exact(both):
                acc[:] = 0  # from nothing, in term order: cheaper, or the only order ``score`` repeats
                change = dict(want)
            for term in sorted(change):
                add(term, change[term])
            held = want
            top = top_k_rows(acc, k)
            # like Lucene, only documents that match a query term are hits
            out.append([self.store.hit(int(r), acc[r]) for r in top if acc[r] > 0])
        return out

    def score(self, query: str, doc_ids: Sequence[str]) -> list[float]:
        """Search's scores for a few documents, from the postings of the query's terms only
        (a speculation cache asks this every step: it must not cost a search)."""
        rows = np.asarray(self.store.rows(doc_ids), dtype=np.int64)
        out = np.zeros(len(rows), dtype=np.float64)
        for term, times in sorted(Counter(self._query_ids([query])[0]).items()):  # search's order
            indices, values = self._posting(term)
            if not len(indices) or not len(rows):
                continue
            pos = np.minimum(np.searchsorted(indices, rows), len(indices) - 1)
            found = indices[pos] == rows
            out[found] += values[pos[found]].astype(np.float64) * times
        return [float(x) for x in out]

    def fetch(self, doc_ids: Sequence[str]) -> list[Hit]:
        return [self.store.hit(r, 0.0) for r in self.store.rows(doc_ids)]
