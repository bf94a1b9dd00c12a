"""Dense retrieval with FAISS over L2-normalised MiniLM embeddings: exact (flat) and approximate.

``flat`` is exact inner product; ``hnsw`` (HNSW graph) and ``ivf`` (inverted lists over
seeded k-means cells) are approximate. All keep the full vectors, so a hit's score is the
exact dot product, and ``score`` computes the same for any document. On a machine where
``faiss-gpu`` is installed and sees a GPU, flat and IVF indexes are searched on it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from specrag.retrieval.base import DocStore, Hit


VECTORS = "vectors.npy"  # the embedding matrix in document-store row order, shared by the kinds
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 200, 128
IVF_NPROBE = 16


def build_faiss(embeddings: np.ndarray, out_dir: Path, kind: str = "flat", *, hnsw_m: int = HNSW_M,
                ef_construction: int = HNSW_EF_CONSTRUCTION, ef_search: int = HNSW_EF_SEARCH,
                nlist: int | None = None, nprobe: int = IVF_NPROBE, seed: int = 1234) -> dict:
    """Build one FAISS index kind over the matrix (rows = document-store rows) into out_dir."""
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
    out_dir.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(out_dir / "index.faiss"))
    return params


def _maybe_gpu(index):
    """Move flat/IVF indexes to a GPU when faiss-gpu is installed and sees one (HNSW stays on CPU)."""
    import faiss
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        return index
    if isinstance(index, faiss.IndexHNSW):
        return index
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)


class DenseRetriever:
    """FAISS search; ``score`` is the dot product with the stored vectors, as the index uses."""

    kind = "dense"

    def __init__(self, index_dir: Path, store: DocStore, embed: Callable[[list[str]], np.ndarray],
                 vectors: Path | None = None):
        import faiss
        self.store = store
        self.index = _maybe_gpu(faiss.read_index(str(index_dir / "index.faiss")))
        self.vectors = np.load(vectors or index_dir.parent / VECTORS, mmap_mode="r")
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
