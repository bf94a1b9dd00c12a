"""Index folders: what ``specrag build-index`` writes and how retrievers open them.

Layout::

    index_dir/
      manifest.json        kinds, passage count, corpus fingerprint, embedder, parameters
      files.json           the size of every file a retriever opens (checked before a job starts)
      passages.parquet     the validated, deduplicated passages (the document store)
      embeddings/*.parquet embedding shards written by the Beam job (dense only)
      bm25/                bm25s index
      lucene/index/        Lucene index (Anserini, with document vectors)
      vectors.npy          the embedding matrix (document-store row order)
      dense/ hnsw/ ivf/    FAISS indexes: exact, HNSW, IVF
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow.parquet as pq

from specrag.jobio.run_folder import read_json
from specrag.registry import RETRIEVERS
from specrag.retrieval.base import DocStore, Retriever

DENSE_KINDS = {"dense": "flat", "hnsw": "hnsw", "ivf": "ivf"}  # index kind -> FAISS kind
KINDS = ("bm25", "lucene", *DENSE_KINDS)
MANIFEST = "manifest.json"
FILES = "files.json"  # beside the manifest, not in it: the manifest's content is the runs' identity


def finish_index(index_dir: Path, kinds: list[str], embedder: str | None, extra: dict,
                 dense_params: dict[str, dict] | None = None, precomputed: Sequence[str] = ()) -> dict:
    """Build the requested index kinds from the passages (and embedding shards, with any
    precomputed vector files) on disk."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown index kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    store = DocStore(index_dir / "passages.parquet")
    if len(store) == 0:
        raise ValueError("the corpus has no valid passages; nothing to index")
    manifest = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "passages": len(store), "kinds": {}, **extra}
    if "bm25" in kinds:
        from specrag.retrieval.bm25 import build_bm25
        out = index_dir / "bm25"
        out.mkdir(exist_ok=True)
        manifest["kinds"]["bm25"] = build_bm25(store, out)
    if "lucene" in kinds:
        from specrag.retrieval.lucene import build_lucene
        manifest["kinds"]["lucene"] = build_lucene(store, index_dir / "lucene")
    dense = [k for k in kinds if k in DENSE_KINDS]
    if dense:
        from specrag.retrieval.dense import VECTORS, build_faiss
        matrix, unused = assemble_vectors(index_dir / "embeddings", store, precomputed)
        if precomputed:
            manifest["precomputed_vectors"] = {"files": len(precomputed), "unused": unused}
        np.save(index_dir / VECTORS, matrix)
        for kind in dense:
            params = build_faiss(matrix, index_dir / kind, DENSE_KINDS[kind], **(dense_params or {}).get(kind, {}))
            manifest["kinds"][kind] = {**params, "embedder": embedder}
    opened = [index_dir / "passages.parquet", *(index_dir / k for k in manifest["kinds"])]
    if dense:
        opened.append(index_dir / VECTORS)
    sizes = {p.relative_to(index_dir).as_posix(): p.stat().st_size
             for top in opened for p in ([top] if top.is_file() else sorted(top.rglob("*"))) if p.is_file()}
    (index_dir / FILES).write_text(json.dumps(sizes, indent=2, sort_keys=True))
    (index_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def assemble_vectors(shard_dir: Path, store: DocStore, precomputed: Sequence[str] = ()) -> tuple[np.ndarray, int]:
    """The job's embedding shards and the precomputed (id, vector) files the job did not embed
    again, as one matrix in document-store row order; and how many precomputed vectors belong
    to no passage (their rows were dead-lettered or are absent), which are skipped."""
    from specrag.jobio import files as fs
    names = [str(f) for f in sorted(Path(shard_dir).glob("*.parquet"))] + list(precomputed)
    if not names:
        raise FileNotFoundError(f"no embedding shards in {shard_dir}")
    matrix, seen, unused = None, np.zeros(len(store), dtype=bool), 0
    for name in names:  # one file in memory at a time: 5M vectors are 7.7 GB
        t = fs.read_parquet(name, ["id", "vector"])
        ids = t.column("id").to_pylist()
        if not ids:
            continue
        flat = t.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        if len(flat) % len(ids):
            raise ValueError(f"{name}: vectors of different lengths")
        vecs = np.asarray(flat, dtype=np.float32).reshape(len(ids), -1)
        if matrix is None:
            matrix = np.zeros((len(store), vecs.shape[1]), dtype=np.float32)
        if vecs.shape[1] != matrix.shape[1]:
            raise ValueError(f"{name}: {vecs.shape[1]}-dimensional vectors, the others have {matrix.shape[1]}")
        known = [i for i, d in enumerate(ids) if d in store.row_of]
        unused += len(ids) - len(known)
        rows = store.rows([ids[i] for i in known])
        matrix[rows] = vecs[known]
        seen[rows] = True
    if matrix is None or not seen.all():
        raise ValueError(f"{int((~seen).sum())} passages have no embedding")
    return matrix, unused


def read_manifest(index_dir: Path) -> dict:
    path = Path(index_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{index_dir} is not a specrag index (no {MANIFEST}); "
                                "build one with `specrag build-index`")
    return read_json(str(path))


def open_retriever(index_dir: Path | str, kind: str,
                   embed: Callable[[list[str]], np.ndarray] | None = None,
                   scan_precision: str | None = "int8") -> Retriever:
    """Open one kind of an index folder; dense needs the query embedder. ``scan_precision``:
    the exact (flat) search's candidate pass (retrieval/exact_batch.py), None for FAISS's."""
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    if kind not in manifest["kinds"]:
        raise ValueError(f"index {index_dir} has no {kind!r} index (has: {sorted(manifest['kinds'])}); "
                         f"rebuild with `specrag build-index --kinds {kind}`")
    store = DocStore(index_dir / "passages.parquet")
    cls = RETRIEVERS[kind]
    if kind not in DENSE_KINDS:
        return cls(index_dir / kind, store)
    if embed is None:
        raise ValueError(f"{kind} retrieval needs a query embedder")
    extra = {"scan_precision": scan_precision} if DENSE_KINDS[kind] == "flat" else {}
    retriever = cls(index_dir / kind, store, embed, **extra)
    retriever.kind = kind
    return retriever
