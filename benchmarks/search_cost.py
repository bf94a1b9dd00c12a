"""Search cost against batch size: what one RaLMSpec verification of s queries costs.

Usage (from the repository root, after `make install`):

    .venv/bin/python benchmarks/search_cost.py [--dense 1000000] [--datastore 1000000] [--passages 1000000]

For each retriever, the median wall time of one ``search`` call with s queries (s = 1, 2, 3,
4, 8, 16; distinct queries every call), and that cost in single searches (cost(s)/cost(1)).
Exact dense (flat, inner product) and the KNN-LM datastore (flat, squared L2) run with each
candidate pass of retrieval/exact_batch.py (int8, fp32; bf16 where the CPU has bf16
instructions) and with FAISS's own fp32 scan — every exact variant returns the same top-k,
which this script checks. HNSW, bm25s and Lucene (its batch search) are measured as they are.

Data: dense = random unit vectors x 384 (MiniLM's dimension), queries perturbed copies of
stored vectors; datastore = Gaussian vectors x 576 (SmolLM2's hidden size), queries likewise;
sparse = Zipf-distributed words (benchmarks/retrieval.py's generator), 5-word queries drawn
from stored passages, and RaLMSpec's verification queries: s windows of 24 words of one stored
passage, 3 words apart (its query is the last 32 tokens, moved on by a 4-token stride). Writes benchmarks/results/search_cost.md, whose table section ends with
`flat_int8_batch8=<cost in single fp32 searches> datastore_int8_batch8=<…> int8_single_speedup=<…>`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from workloads import cpu_flags, cpu_model  # noqa: E402
BATCHES = (1, 2, 3, 4, 8, 16)


def time_batches(search, queries: list, reps: int, batch_of=None) -> dict[int, float]:
    """Median seconds of one call per batch size; every call asks new queries: the next s of
    ``queries``, or ``batch_of(s, call)`` where given."""
    search(queries[:1])  # warm: lazy low-precision copy, JIT, page cache
    out, pos, call = {}, 1, 0
    for s in BATCHES:
        times = []
        for _ in range(reps):
            if batch_of is None:
                batch = [queries[(pos + i) % len(queries)] for i in range(s)]
                pos += s
            else:
                batch, call = batch_of(s, call), call + 1
            t = time.perf_counter()
            search(batch)
            times.append(time.perf_counter() - t)
        out[s] = statistics.median(times)
    return out


def window_batches(texts: list[str], width: int = 24, shift: int = 3):
    """RaLMSpec's verification queries: s windows of one text ``shift`` words apart (its query is
    the last 32 tokens, ~24 words, moved on by a 4-token stride), a new text every call."""
    long = [t.split() for t in texts if len(t.split()) >= width + shift * (BATCHES[-1] - 1)]
    if not long:
        raise SystemExit(f"no passage has {width + shift * (BATCHES[-1] - 1)} words for the window queries")
    return lambda s, call: [" ".join(long[call % len(long)][shift * i: shift * i + width]) for i in range(s)]


def dense_rows(n: int, reps: int, work: Path, bf16: bool, hnsw_n: int) -> list[dict]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from specrag.retrieval.base import DocStore
    from specrag.retrieval.dense import VECTORS, DenseRetriever, build_faiss
    rng = np.random.default_rng(3)
    matrix = rng.standard_normal((n, 384), dtype=np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    picks = rng.integers(0, n, 400)
    qv = matrix[picks] + 0.5 * rng.standard_normal((400, 384), dtype=np.float32) / np.sqrt(384)
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    names = [f"vq{i}" for i in range(len(qv))]
    lookup = dict(zip(names, qv))
    embed = lambda texts: np.stack([lookup[t] for t in texts])
    rows = []
    for label, size, kinds in (("dense", n, ("flat",)), ("dense-hnsw", hnsw_n, ("hnsw",))):
        if not size:
            continue
        folder = work / label
        folder.mkdir()
        ids = [f"v{i:07d}" for i in range(size)]
        pq.write_table(pa.table({"id": ids, "title": [""] * size, "text": [""] * size}), folder / "passages.parquet")
        np.save(folder / VECTORS, matrix[:size])
        store = DocStore(folder / "passages.parquet")
        for kind in kinds:
            t = time.perf_counter()
            build_faiss(matrix[:size], folder / kind, kind)
            print(f"  built {label} {kind} in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
        if label == "dense":
            variants = [("int8", "int8"), ("fp32 scan", "fp32"), ("faiss fp32", None)] + \
                ([("bf16", "bf16")] if bf16 else [])
            results = {}
            for name, precision in variants:
                r = DenseRetriever(folder / "flat", store, embed, scan_precision=precision)
                t = time.perf_counter()
                r.scan() if precision else None
                prep = time.perf_counter() - t
                costs = time_batches(lambda b: r.search(b, 20), names, reps)
                results[name] = [[h.doc_id for h in hits] for hits in r.search(names[:16], 20)]
                rows.append({"retriever": f"flat {size:,}x384", "variant": name, "prep_s": prep, **costs})
                del r
            same = all(v == results["faiss fp32"] for v in results.values())
            for row in rows[-len(variants):]:
                row["same"] = same
        else:
            r = DenseRetriever(folder / "hnsw", store, embed)
            rows.append({"retriever": f"HNSW {size:,}x384", "variant": "faiss (M=32, efSearch=128)", "prep_s": 0.0,
                         **time_batches(lambda b: r.search(b, 20), names, reps)})
    return rows


def datastore_rows(n: int, reps: int, work: Path, bf16: bool) -> list[dict]:
    import numpy as np
    from specrag.retrieval.datastore import Datastore, write_datastore
    rng = np.random.default_rng(5)
    keys = rng.standard_normal((n, 576), dtype=np.float32)
    write_datastore(keys, rng.integers(0, 49152, n), work / "datastore", "synthetic", kinds=("flat",))
    queries = list(keys[rng.integers(0, n, 400)] + 0.5 * rng.standard_normal((400, 576), dtype=np.float32))
    del keys
    rows, results = [], {}
    variants = [("int8", "int8"), ("fp32 scan", "fp32"), ("faiss fp32", None)] + ([("bf16", "bf16")] if bf16 else [])
    for name, precision in variants:
        store = Datastore(work / "datastore", "flat", scan_precision=precision)
        t = time.perf_counter()
        store.scan() if precision else None
        prep = time.perf_counter() - t
        costs = time_batches(lambda b: store.search(b, 16), queries, reps)
        results[name] = [ids.tolist() for ids, _ in store.search(queries[:16], 16)]
        rows.append({"retriever": f"datastore {n:,}x576", "variant": name, "prep_s": prep, **costs})
        del store
    same = all(v == results["faiss fp32"] for v in results.values())
    for row in rows:
        row["same"] = same
    return rows


def sparse_rows(n: int, reps: int, work: Path) -> list[dict]:
    import numpy as np
    import pyarrow.parquet as pq
    from retrieval import build, write_synthetic_corpus
    from specrag.retrieval import open_retriever
    from specrag.retrieval.bm25 import top_k_rows
    corpus = write_synthetic_corpus(work / "synthetic.parquet", n)
    texts = pq.read_table(corpus, columns=["text"]).column("text").to_pylist()
    rng = np.random.default_rng(11)
    queries = [" ".join(rng.choice(texts[i].split(), size=5)) for i in rng.integers(0, len(texts), 400)]
    windows = window_batches([texts[i] for i in rng.integers(0, len(texts), 400)])
    del texts
    rows = []
    for kind in ("bm25", "lucene"):
        index = work / f"sparse-{kind}"
        t = time.perf_counter()
        build(corpus, index, [kind])
        print(f"  built {kind} in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
        r = open_retriever(index, kind)
        name = f"{'bm25s' if kind == 'bm25' else 'Lucene'} {n:,} passages"
        rows.append({"retriever": name, "variant": "distinct 5-word queries", "prep_s": 0.0,
                     **time_batches(lambda b: r.search(b, 20), queries, reps)})
        rows.append({"retriever": name, "variant": "RaLMSpec windows (24 words, 3 apart)", "prep_s": 0.0,
                     **time_batches(lambda b: r.search(b, 20), queries, reps, windows)})
        if kind == "bm25":  # bm25s's own scoring, a query at a time (specrag's search before it shared a batch)
            own = lambda b: [top_k_rows(r.index.get_scores_from_ids(ids), 20) for ids in r._query_ids(b)]  # noqa: E731
            rows.insert(-2, {"retriever": name, "variant": "bm25s scoring, distinct", "prep_s": 0.0,
                             **time_batches(own, queries, reps)})
            rows.insert(-1, {"retriever": name, "variant": "bm25s scoring, windows", "prep_s": 0.0,
                             **time_batches(own, queries, reps, windows)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dense", type=int, default=1_000_000, help="flat vectors x 384 (0: skip)")
    ap.add_argument("--hnsw", type=int, default=200_000, help="HNSW vectors x 384 (0: skip; builds ~1 min / 100k)")
    ap.add_argument("--datastore", type=int, default=1_000_000, help="datastore entries x 576 (0: skip)")
    ap.add_argument("--passages", type=int, default=1_000_000, help="bm25s and Lucene passages (0: skip)")
    ap.add_argument("--reps", type=int, default=7, help="calls per batch size (median)")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "search_cost.md"))
    args = ap.parse_args()
    import torch
    threads = int(os.environ.get("SPECRAG_THREADS", "1"))
    torch.set_num_threads(threads)
    import faiss
    faiss.omp_set_num_threads(threads)
    flags = cpu_flags()
    bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    work = Path(tempfile.mkdtemp(prefix="search-cost-", dir=os.environ.get("TMPDIR")))
    rows = []
    if args.dense:
        rows += dense_rows(args.dense, args.reps, work, bf16, args.hnsw)
    if args.datastore:
        rows += datastore_rows(args.datastore, args.reps, work, bf16)
    if args.passages:
        rows += sparse_rows(args.passages, args.reps, work)
    for r in rows:
        print(json.dumps(r), file=sys.stderr)

    def single_fp32(retriever: str) -> float | None:
        return next((r[1] for r in rows if r["retriever"] == retriever and r["variant"] == "faiss fp32"), None)

    head = ["retriever", "candidate pass", "prep_s"] + [f"s={s} ms" for s in BATCHES] + \
        [f"s={s} / 1 fp32" for s in (1, 3, 8, 16)] + ["same top-k"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        base = single_fp32(r["retriever"]) or r[1]
        lines.append("| " + " | ".join([r["retriever"], r["variant"], f"{r['prep_s']:.1f}"] +
                                       [f"{1000 * r[s]:.1f}" for s in BATCHES] +
                                       [f"{r[s] / base:.2f}" for s in (1, 3, 8, 16)] +
                                       [{True: "yes", False: "NO"}.get(r.get("same"), "—")]) + " |")

    def pick(prefix: str, variant: str, s: int) -> float:
        row = next(r for r in rows if r["retriever"].startswith(prefix) and r["variant"] == variant)
        return row[s] / (single_fp32(row["retriever"]) or row[1])

    claims = []
    if args.dense:
        claims += [f"flat_int8_batch8={pick('flat', 'int8', 8):.2f}", f"flat_int8_single={pick('flat', 'int8', 1):.2f}"]
    if args.datastore:
        claims += [f"datastore_int8_batch8={pick('datastore', 'int8', 8):.2f}",
                   f"datastore_int8_single={pick('datastore', 'int8', 1):.2f}"]
    if args.passages:
        claims += [f"bm25_windows_batch3={pick('bm25s', 'RaLMSpec windows (24 words, 3 apart)', 3):.2f}",
                   f"bm25_windows_batch8={pick('bm25s', 'RaLMSpec windows (24 words, 3 apart)', 8):.2f}",
                   f"bm25_distinct_batch2={pick('bm25s', 'distinct 5-word queries', 2):.2f}"]
    claims.append(f"same={str(all(r.get('same', True) for r in rows)).lower()}")
    command = " ".join(["python", "benchmarks/search_cost.py", *sys.argv[1:]])
    text = (f"# Search cost against batch size\n\nCommand: `{command}`\n\n"
            f"Machine: {cpu_model()}, {os.cpu_count()} cores, flags {' '.join(flags) or '-'}; torch/FAISS threads "
            f"{threads}; recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n"
            "Median wall time of one `search` call with s distinct queries (top-20; top-16 for the datastore), "
            "query encoding excluded; `/ 1 fp32` = that cost in single-query FAISS fp32 searches of the same "
            "index; prep_s = building the low-precision copy (once per worker). Every exact variant returned the "
            "same ids for 16 queries where `same top-k` says yes.\n\n" + "\n".join(lines) + "\n\n" + " ".join(claims) + "\n")
    Path(args.results).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
