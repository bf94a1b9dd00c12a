"""Retrieval backends side by side: build time, index size, memory, latency, throughput.

Usage (from the repository root, after `make install`):

    .venv/bin/python benchmarks/retrieval.py [--synthetic-passages 1000000] [--synthetic-vectors 200000]

Corpora: (a) the pooled corpus of the shared sets (real passages; dense over real MiniLM
embeddings, queries = PopQA + HotpotQA questions), (b) synthetic: N passages of Zipf-
distributed words for BM25 (bm25s, Lucene) and M random unit vectors x 384 for FAISS flat /
HNSW / IVF (queries: perturbed copies of stored vectors). Each backend is loaded and measured
in a child process, so its memory is its own: RSS after loading, median single-query latency
over 200 queries, and throughput of batches of 32. Dense latencies exclude query encoding.
Writes benchmarks/results/retrieval.md; last line
`lucene_batch_qps=<n> flat_single_ms=<n> hnsw_single_ms=<n>` (synthetic corpora).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
SPARSE, DENSE = ("bm25", "lucene"), ("dense", "hnsw", "ivf")


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def child(index_dir: str, kind: str, queries_file: str) -> None:
    """Load one backend, measure it, print one JSON line."""
    import numpy as np
    from specrag.retrieval import open_retriever
    queries = json.loads(Path(queries_file).read_text())
    base = _rss_mb()
    embed = None
    if kind in DENSE:
        vectors = np.load(Path(queries_file).with_suffix(".npy"))
        lookup = {q: v for q, v in zip(queries, vectors)}
        embed = lambda texts: np.stack([lookup[t] for t in texts])
    start = time.perf_counter()
    r = open_retriever(index_dir, kind, embed)
    r.search(queries[:1], 10)  # warm (JVM JIT, page cache)
    load_s = time.perf_counter() - start
    rss = _rss_mb() - base
    single = []
    for q in queries[:200]:
        t = time.perf_counter()
        r.search([q], 10)
        single.append(time.perf_counter() - t)
    batch = queries[: max(32, min(len(queries), 640)) // 32 * 32]
    t = time.perf_counter()
    for i in range(0, len(batch), 32):
        r.search(batch[i:i + 32], 10)
    qps = len(batch) / (time.perf_counter() - t)
    print(json.dumps({"load_s": load_s, "rss_mb": rss, "single_ms": 1000 * statistics.median(single), "batch32_qps": qps}))


def synthetic_passages(n: int, seed: int = 7):
    import numpy as np
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(50_000)]
    ranks = np.arange(1, len(vocab) + 1)
    p = 1.0 / ranks ** 1.07
    p /= p.sum()
    lengths = rng.integers(40, 120, size=n)
    words = rng.choice(len(vocab), size=int(lengths.sum()), p=p)
    pos = 0
    for i, length in enumerate(lengths):
        yield {"id": f"s{i:07d}", "title": "", "text": " ".join(vocab[w] for w in words[pos:pos + length])}
        pos += length


def write_synthetic_corpus(path: Path, n: int) -> Path:
    """``synthetic_passages(n)`` as a Parquet corpus, written 100k rows at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    writer, batch = None, []
    for p in synthetic_passages(n):
        batch.append(p)
        if len(batch) == 100_000:
            t = pa.Table.from_pylist(batch)
            writer = writer or pq.ParquetWriter(path, t.schema)
            writer.write_table(t)
            batch = []
    if batch:
        t = pa.Table.from_pylist(batch)
        writer = writer or pq.ParquetWriter(path, t.schema)
        writer.write_table(t)
    writer.close()
    return path


def build(corpus: Path, index: Path, kinds: list[str], matrix=None) -> float:
    """Build the index kinds; dense kinds from a given matrix (synthetic) or the Beam embedding job."""
    from specrag.pipelines.build_index import run_build_index
    from specrag.retrieval.index import finish_index
    start = time.perf_counter()
    if matrix is None:
        run_build_index(str(corpus), str(index), kinds)
    else:
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq
        index.mkdir(parents=True, exist_ok=True)
        ids = [f"v{i:07d}" for i in range(len(matrix))]
        pq.write_table(pa.table({"id": ids, "title": [""] * len(ids), "text": ids}), index / "passages.parquet")
        (index / "embeddings").mkdir(exist_ok=True)
        vectors = pa.ListArray.from_arrays(np.arange(0, matrix.size + 1, matrix.shape[1], dtype=np.int32),
                                           pa.array(matrix.astype(np.float32).ravel()))
        pq.write_table(pa.table({"id": ids, "vector": vectors}), index / "embeddings" / "part-0.parquet")
        finish_index(index, kinds, "synthetic", {})
    return time.perf_counter() - start


def measure(index: Path, kind: str, queries_file: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(index), kind, str(queries_file)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--synthetic-passages", type=int, default=1_000_000)
    ap.add_argument("--synthetic-vectors", type=int, default=200_000)
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--skip-pooled-dense", action="store_true", help="skip embedding the pooled corpus")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "retrieval.md"))
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return 0

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from specrag.importers import FORMATS, import_datasets
    work = Path(tempfile.mkdtemp(prefix="retrieval-bench-"))
    rows = []

    def record(corpus_name, kind, build_s, index_dir, queries_file):
        m = measure(index_dir, kind, queries_file)
        size = _dir_mb(index_dir / kind)
        if kind in DENSE:  # the shared vector matrix is part of every dense index
            size += (index_dir / "vectors.npy").stat().st_size / 2**20
        rows.append({"corpus": corpus_name, "backend": kind, "build_s": build_s, "index_mb": size, **m})
        print(f"  {corpus_name} {kind}: {m}", file=sys.stderr, flush=True)

    # (a) pooled corpus of the shared sets
    import_datasets(Path(args.data_dir), list(FORMATS), work / "data", pool=True)
    questions = []
    for name in ("popqa", "hotpotqa"):
        questions += pq.read_table(work / "data" / name / "queries.parquet").column("question").to_pylist()[:400]
    qfile = work / "pooled_queries.json"
    qfile.write_text(json.dumps(questions))
    for kind in SPARSE:
        index = work / f"pooled-{kind}"
        record("pooled", kind, build(work / "data" / "pooled_corpus.parquet", index, [kind]), index, qfile)
    if not args.skip_pooled_dense:
        from specrag.transforms.runtime import load_backend
        np.save(qfile.with_suffix(".npy"), load_backend("local", "all-minilm-l6-v2", 1).embed(questions))
        index = work / "pooled-dense"
        t = build(work / "data" / "pooled_corpus.parquet", index, list(DENSE))
        for kind in DENSE:
            record("pooled", kind, t, index, qfile)

    # (b) synthetic corpora
    corpus = write_synthetic_corpus(work / "synthetic.parquet", args.synthetic_passages)
    texts = pq.read_table(corpus, columns=["text"]).column("text").to_pylist()
    rng = np.random.default_rng(11)
    squeries = [" ".join(rng.choice(texts[i].split(), size=5)) for i in rng.integers(0, len(texts), 640)]
    del texts
    sq = work / "synthetic_queries.json"
    sq.write_text(json.dumps(squeries))
    for kind in SPARSE:
        index = work / f"synthetic-{kind}"
        record(f"synthetic {args.synthetic_passages:,}", kind, build(corpus, index, [kind]), index, sq)
    matrix = rng.standard_normal((args.synthetic_vectors, 384)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    picks = rng.integers(0, len(matrix), 640)
    qv = matrix[picks] + 0.3 * rng.standard_normal((640, 384)).astype(np.float32) / np.sqrt(384)
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    vq = work / "vector_queries.json"
    vq.write_text(json.dumps([f"vq{i}" for i in range(640)]))
    np.save(vq.with_suffix(".npy"), qv)
    index = work / "synthetic-dense"
    t = build(None, index, list(DENSE), matrix)
    for kind in DENSE:
        record(f"synthetic {args.synthetic_vectors:,}x384", kind, t, index, vq)

    cols = ["corpus", "backend", "build_s", "index_mb", "load_s", "rss_mb", "single_ms", "batch32_qps"]
    fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)
    table = "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] +
                      ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows])
    pick = lambda corpus_prefix, kind, col: next(r[col] for r in rows if r["corpus"].startswith(corpus_prefix) and r["backend"] == kind)
    last = (f"lucene_batch_qps={pick('synthetic', 'lucene', 'batch32_qps'):.0f} "
            f"flat_single_ms={pick('synthetic', 'dense', 'single_ms'):.2f} "
            f"hnsw_single_ms={pick('synthetic', 'hnsw', 'single_ms'):.2f}")
    print(table)
    command = " ".join(["python", "benchmarks/retrieval.py", *sys.argv[1:]])
    Path(args.results).write_text(
        f"# Retrieval benchmark\n\nCommand: `{command}`\n\nMachine: {platform.machine()}, {os.cpu_count()} cores, "
        f"OMP threads {os.environ.get('OMP_NUM_THREADS')}; recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
        "build_s for dense kinds is the shared build (embedding + all three FAISS indexes); "
        "rss_mb is the memory a child process gained by loading the backend; dense latencies exclude query encoding.\n\n"
        f"{table}\n\n{last}\n")
    print(last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
