"""Dense retrieval with FAISS over L2-normalised MiniLM embeddings: exact (flat) and approximate.

``flat`` is exact inner product; ``hnsw`` (HNSW graph) and ``ivf`` (inverted lists over
seeded k-means cells) are approximate. All keep the full vectors, so a hit's score is the
exact dot product, and ``score`` computes the same for any document. On CPU a flat search
scans a low-precision copy (retrieval/exact_batch.py: int8 by default, a batch of queries
for about the cost of one) and re-scores its proven candidates exactly. On a machine where
``faiss-gpu`` is installed and sees a GPU, flat and IVF indexes are searched on it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from specrag.retrieval.base import DocStore, Hit, Retriever
from specrag.retrieval.exact_batch import LazyScan, LowPrecisionScan


VECTORS = "vectors.npy"  # the embedding matrix in document-store row order, shared by the kinds
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 200, 128
IVF_NPROBE = 16


def build_faiss(embeddings: np.ndarray, out_dir: Path, kind: str = "flat", *, shards: int = 1,
                **params) -> dict:
    """Build one FAISS index kind in ``shards`` contiguous row ranges (shard-000.faiss, ...).

    Shards bound the memory of one build and spread search over processes; search merges
    their top-k. Rows are document-store rows, offset by the shard's first row.
    """
    if shards < 1:
        raise ValueError("shards must be >= 1")
    out_dir.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(embeddings), shards + 1).astype(int)
    info = []
    for s, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        shard_params = _build_one(embeddings[lo:hi], out_dir / f"shard-{s:03d}.faiss", kind, **params)
        info.append({"first_row": int(lo), "rows": int(hi - lo)})
    return {**shard_params, "count": int(len(embeddings)), "shards": info}


def _build_one(embeddings: np.ndarray, path: Path, kind: str, *, hnsw_m: int = HNSW_M,
               ef_construction: int = HNSW_EF_CONSTRUCTION, ef_search: int = HNSW_EF_SEARCH,
               nlist: int | None = None, nprobe: int = IVF_NPROBE, seed: int = 1234) -> dict:
    import faiss
    x = np.ascontiguousarray(embeddings, dtype=np.float32)
    n, dim = x.shape
    params: dict = {"dim": int(dim), "count": int(n)}
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
        params["faiss"] = "IndexFlatIP"
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        index.hnsw.efSearch = ef_search
        params.update(faiss="IndexHNSWFlat", M=hnsw_m, efConstruction=ef_construction, efSearch=ef_search)
    elif kind == "ivf":
        nlist = nlist or max(1, min(int(4 * np.sqrt(n)), n // 39 or 1))  # >= 39 points per cell to train
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed  # seeded k-means: the same cells every build
        index.train(x)
        index.nprobe = nprobe
        params.update(faiss="IndexIVFFlat", nlist=nlist, nprobe=nprobe, seed=seed)
    else:
        raise ValueError(f"unknown FAISS index kind {kind!r} (flat, hnsw, ivf)")
    index.add(x)
    faiss.write_index(index, str(path))
    return params


def _maybe_gpu(index):
    """Move flat/IVF indexes to a GPU when faiss-gpu is installed and sees one (HNSW stays on CPU)."""
    import faiss
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        return index
    if isinstance(index, faiss.IndexHNSW):
        return index
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)


RECENT_QUERIES = 4096  # query vectors kept (LRU)
CANDIDATE_MARGIN = 8  # FAISS paths: candidates beyond k, re-scored canonically


def pair_scores(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """The canonical inner products of stored vectors with one query (float32, as FAISS).

    einsum reduces each row alone in its own loop (no BLAS), so a row's score does not depend
    on which other rows are asked with it: search re-scoring, ``score`` and a speculation cache
    get the same bits for the same document, and hundreds of candidates cost one call."""
    vectors = np.asarray(vectors, dtype=np.float32)
    return np.einsum("ij,ij->i", vectors, np.broadcast_to(np.asarray(query, dtype=np.float32), vectors.shape))


class DenseRetriever(Retriever):
    """FAISS search; ``score`` is the dot product with the stored vectors, as the index uses."""

    kind = "dense"
    embeds_queries = True

    def __init__(self, index_dir: Path, store: DocStore, embed: Callable[[list[str]], np.ndarray],
                 vectors: Path | None = None, scan_precision: str | None = "int8"):
        """``scan_precision``: the exact flat search's candidate pass on CPU (int8, bf16, fp32),
        or None for FAISS's own fp32 search."""
        import faiss
        self.store = store
        files = sorted(index_dir.glob("shard-*.faiss"))
        if not files:
            raise FileNotFoundError(f"no FAISS shards in {index_dir}")
        self.shards, offset = [], 0
        for f in files:  # shards cover consecutive row ranges, in file order
            # memory-mapped: a 5M-vector flat shard is 7.7 GB, and the scan path never reads it
            index = _maybe_gpu(faiss.read_index(str(f), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY))
            self.shards.append((offset, index))
            offset += index.ntotal
        if offset != len(store):
            raise ValueError(f"dense index has {offset} vectors for {len(store)} passages")
        self.vectors = np.load(vectors or index_dir.parent / VECTORS, mmap_mode="r")
        self.embed = embed
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()
        self._recent_lock = threading.Lock()
        self.exact = all(isinstance(faiss.downcast_index(i), faiss.IndexFlat) for _, i in self.shards)
        self.on_gpu = any("Gpu" in type(i).__name__ for _, i in self.shards)
        self._scan = LazyScan(self.vectors, scan_precision if self.exact and not self.on_gpu else None)
        self.scan_precision = self._scan.precision

    def scan(self) -> LowPrecisionScan:
        return self._scan.get()

    def _embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Each query alone: a padded batch would change a query's vector in the last bits,
        and with it near-tie rankings (RaLMSpec must rank exactly as its baseline). Recent
        vectors are kept: a speculation cache scores a query that its verification then
        searches, and the second embedding would cost more than an HNSW search."""
        out = []
        for q in queries:
            with self._recent_lock:
                vec = self._recent.get(q)
                if vec is not None:
                    self._recent.move_to_end(q)
            if vec is None:
                vec = np.asarray(self.embed([q]), dtype=np.float32)[0]
                with self._recent_lock:
                    self._recent[q] = vec
                    if len(self._recent) > RECENT_QUERIES:
                        self._recent.popitem(last=False)
            out.append(vec)
        return np.ascontiguousarray(np.stack(out), dtype=np.float32)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """The candidates (a proven superset from the low-precision scan, or FAISS's top-k plus
        a margin) are re-scored pair by pair (``score``'s function), so a result does not depend
        on the search path, the batch or the precision."""
        k = min(k, len(self.store))
        if not queries:
            return []
        q = self._embed_queries(queries)
        if self.scan_precision is not None:
            rows = self.scan().candidates(q, k, "ip")
        else:
            wanted = min(k + CANDIDATE_MARGIN, len(self.store))
            parts = []
            for offset, index in self.shards:
                _, found = index.search(q, min(wanted, index.ntotal))
                parts.append(np.where(found >= 0, found + offset, -1))
            rows = list(np.concatenate(parts, axis=1))
        out = []
        for qv, rr in zip(q, rows):
            rr = np.asarray(rr, dtype=np.int64)
            rr = np.sort(rr[rr >= 0])  # sorted gathers read the memory-mapped vectors in order
            ss = pair_scores(self.vectors[rr], qv).astype(np.float64)
            order = np.lexsort((rr, -ss))[:k]  # best score first, ties by row: shard-independent
            out.append([self.store.hit(int(rr[i]), ss[i]) for i in order])
        return out

    def score(self, query: str, doc_ids: Sequence[str]) -> list[float]:
        q = self._embed_queries([query])[0]
        rows = np.asarray(self.store.rows(doc_ids), dtype=np.int64)
        order = np.argsort(rows, kind="stable")  # sorted gathers read the memory-mapped vectors in order
        out = np.empty(len(rows), dtype=np.float32)
        out[order] = pair_scores(self.vectors[rows[order]], q)
        return [float(x) for x in out]

    def fetch(self, doc_ids: Sequence[str]) -> list[Hit]:
        return [self.store.hit(r, 0.0) for r in self.store.rows(doc_ids)]
