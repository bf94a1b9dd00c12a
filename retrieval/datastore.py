"""KNN-LM datastore: (hidden state of a corpus context → the token that followed) with FAISS L2.

Entries are in corpus order (passage by passage, position by position), so an entry's
successors are the next contexts of the same text: RaLMSpec's KNN-LM cache is filled with
the ``n`` entries that follow each retrieved one (spatial locality, paper §5.3).

Layout::

    datastore_dir/
      manifest.json   entries, dimension, model, kinds, parameters
      keys.npy        float32 [entries, hidden]     values.npy  int64 [entries]
      flat.faiss      exact L2                      hnsw.faiss  approximate L2 (M=32)

A flat search scans a low-precision copy of the keys (retrieval/exact_batch.py: int8 by
default; a batch of queries costs about one) for a proven superset of the exact top-k; HNSW
fetches k+8 candidates. Either is re-ranked by the canonical per-pair squared L2
(``distances``): results do not depend on the search path, the batch or the precision, and
a cache ranks exactly alike.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from specrag.retrieval.exact_batch import LazyScan, LowPrecisionScan

KINDS = ("flat", "hnsw")
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 200, 128
CANDIDATE_MARGIN = 8


def write_datastore(keys: np.ndarray, values: np.ndarray, out: Path, model: str, kinds: Sequence[str] = KINDS,
                    extra: dict | None = None) -> dict:
    import faiss
    bad = set(kinds) - set(KINDS)
    if bad or not kinds:
        raise ValueError(f"datastore kinds must be some of {KINDS}, got {list(kinds)}")
    if len(keys) != len(values) or not len(keys):
        raise ValueError(f"datastore needs as many keys as values, and some: {len(keys)} keys, {len(values)} values")
    out.mkdir(parents=True, exist_ok=True)
    keys = np.ascontiguousarray(keys, dtype=np.float32)
    np.save(out / "keys.npy", keys)
    np.save(out / "values.npy", np.asarray(values, dtype=np.int64))
    params = {}
    for kind in kinds:
        start = time.time()
        if kind == "flat":
            index = faiss.IndexFlatL2(keys.shape[1])
        else:
            index = faiss.IndexHNSWFlat(keys.shape[1], HNSW_M)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.add(keys)
        faiss.write_index(index, str(out / f"{kind}.faiss"))
        params[kind] = {"build_s": round(time.time() - start, 2)}
    manifest = {"entries": int(len(keys)), "dim": int(keys.shape[1]), "model": model, "kinds": params,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **(extra or {})}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


class Datastore:
    """k-nearest contexts of a hidden state, their next tokens, and their successors."""

    def __init__(self, path: Path | str, kind: str = "flat", scan_precision: str | None = "int8"):
        """``scan_precision``: the flat search's candidate pass (int8, bf16, fp32), or None for
        FAISS's own fp32 search."""
        path = Path(path)
        manifest_file = path / "manifest.json"
        if not manifest_file.exists():
            raise FileNotFoundError(f"{path} is not a datastore (no manifest.json); build one with "
                                    "`specrag build-datastore`")
        self.manifest = json.loads(manifest_file.read_text())
        if kind not in self.manifest["kinds"]:
            raise ValueError(f"datastore {path} has no {kind!r} index (has: {sorted(self.manifest['kinds'])})")
        self.kind = kind
        self.path = path
        self.keys = np.load(path / "keys.npy", mmap_mode="r")
        self.values = np.load(path / "values.npy")
        self._index = None  # FAISS's: read when first searched (a flat scan in low precision never reads it)
        if scan_precision is None and self.manifest["kinds"][kind].get("faiss", True) is False:
            raise ValueError(f"datastore {path} is scan-only (no FAISS file): open it with a scan precision "
                             "(--exact-scan int8|bf16|fp32)")
        self._scan = LazyScan(self.keys, scan_precision if kind == "flat" else None)
        self.scan_precision = self._scan.precision

    @property
    def index(self):
        import faiss
        if self._index is None:
            self._index = faiss.read_index(str(self.path / f"{self.kind}.faiss"),
                                           faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)  # pages as searched
            if self.kind == "hnsw":
                self._index.hnsw.efSearch = HNSW_EF_SEARCH
        return self._index

    def scan(self) -> LowPrecisionScan:
        return self._scan.get()

    def __len__(self) -> int:
        return len(self.values)

    def distances(self, vector: np.ndarray, ids: Sequence[int]) -> np.ndarray:
        """Canonical squared L2 between one query and given entries (float32).

        Every path (index search re-ranking, speculation cache) uses this one function, and
        a row's value does not depend on the other rows (einsum reduces each row alone;
        test_knnlm checks it), so the same entry gets the same distance everywhere."""
        ids = np.asarray(ids, dtype=np.int64)
        if not len(ids):
            return np.zeros(0, dtype=np.float32)
        order = np.argsort(ids, kind="stable")  # sorted gathers read the memory-mapped keys in order
        diff = np.asarray(self.keys[ids[order]], dtype=np.float32) - np.asarray(vector, dtype=np.float32)
        out = np.empty(len(ids), dtype=np.float32)
        out[order] = np.einsum("ij,ij->i", diff, diff)
        return out

    def search(self, vectors: Sequence[np.ndarray], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query: (entry ids, squared distances), nearest first, ties by entry id."""
        if not len(vectors):
            return []
        q = np.ascontiguousarray(np.stack([np.asarray(v, dtype=np.float32) for v in vectors]))
        k = min(k, len(self))
        if self.scan_precision is not None:
            ids = self.scan().candidates(q, k, "l2")
        else:
            _, ids = self.index.search(q, min(k + CANDIDATE_MARGIN, len(self)))  # spare candidates
        out = []
        for qv, row in zip(q, ids):
            row = np.asarray(row, dtype=np.int64)
            row = row[row >= 0]
            dist = self.distances(qv, row)
            order = np.lexsort((row, dist))[:k]
            out.append((row[order].astype(np.int64), dist[order]))
        return out

    def nearest_among(self, vector: np.ndarray, ids: Sequence[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest of the given entries (a speculation cache), ranked as ``search`` ranks."""
        ids = np.asarray(list(ids), dtype=np.int64)
        dist = self.distances(vector, ids)
        order = np.lexsort((ids, dist))[:k]
        return ids[order], dist[order]

    def following(self, ids: Sequence[int], n: int) -> list[int]:
        """The n entries after each given one (the next contexts of the same corpus text)."""
        out: list[int] = []
        for e in ids:
            out.extend(range(int(e) + 1, min(int(e) + 1 + n, len(self))))
        return out


class DatastoreResource:
    """KNN-LM's datastore as a method resource (``registry.RESOURCES["datastore"]``): the run's
    ``--datastore`` folder, searched with its ``--datastore-kind`` index."""

    folder_field = "datastore_dir"
    missing = "retrieves per token: pass --datastore (built by `specrag build-datastore`)"

    @classmethod
    def check(cls, folder: str, runtime) -> None:
        from specrag.jobio.run_folder import manifest_kinds
        kinds = manifest_kinds(folder, "datastore", "specrag build-datastore")
        if runtime.datastore_kind not in kinds:
            raise ValueError(f"datastore {folder} has no {runtime.datastore_kind!r} index (has: {sorted(kinds)})")

    @classmethod
    def open(cls, folder: str, runtime) -> "Datastore":
        from specrag.inference.models import cache_dir
        from specrag.jobio.files import localize
        # a datastore on gs:// or s3:// is copied to the worker once: FAISS reads local files
        return Datastore(localize(folder, cache_dir()), runtime.datastore_kind, scan_precision=runtime.scan_precision())

    @classmethod
    def identity_extras(cls, folder: str | None, runtime) -> dict:
        return {"datastore_kind": runtime.datastore_kind if folder else None}
