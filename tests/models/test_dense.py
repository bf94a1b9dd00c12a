"""FAISS exact, HNSW and IVF over real MiniLM embeddings of the NQ + PopQA passages (~4k, committed
vectors: conftest.pooled_dense; the index cached after the first build)."""
import numpy as np
import pyarrow.parquet as pq
import pytest

from specrag.retrieval import open_retriever

pytestmark = pytest.mark.slow


def test_committed_vectors_equal_a_fresh_embedding(pooled_dense, embedder):
    """A sample of the committed passage vectors, embedded again by today's embedder and code:
    equal up to their float16 rounding (a changed model or passage text fails here)."""
    from conftest import POOLED_DENSE_VECTORS
    from specrag.retrieval.base import passage_text
    passages = pq.read_table(pooled_dense / "passages.parquet").to_pylist()
    vectors = np.load(pooled_dense / "vectors.npy")
    sample = list(range(0, len(passages), len(passages) // 24))[:24]
    fresh = embedder.embed([passage_text(passages[i]["title"], passages[i]["text"]) for i in sample])
    hint = ("the committed dense vectors are stale: rewrite them with SPECRAG_WRITE_GOLDEN=1 pytest "
            f"tests/models/test_dense.py ({POOLED_DENSE_VECTORS})")
    np.testing.assert_allclose(fresh, vectors[sample], atol=2e-3, err_msg=hint)


@pytest.fixture(scope="module")
def queries(imported):
    return [q["question"] for q in pq.read_table(imported / "popqa" / "queries.parquet").to_pylist()[:200]]


def test_flat_score_reproduces_search_scores(pooled_dense, embedder, queries):
    flat = open_retriever(pooled_dense, "dense", embedder.embed)
    for q, hits in zip(queries, flat.search(queries, 10)):
        want = np.array([h.score for h in hits])
        got = np.array(flat.score(q, [h.doc_id for h in hits]))
        assert np.max(np.abs(got - want) / np.abs(want)) <= 1e-4


@pytest.mark.parametrize("kind, min_recall", [("hnsw", 0.95), ("ivf", 0.75)])  # measured: 0.999, 0.84
def test_approximate_recall_of_exact_top10(pooled_dense, embedder, queries, kind, min_recall):
    exact = open_retriever(pooled_dense, "dense", embedder.embed).search(queries, 10)
    approx_retriever = open_retriever(pooled_dense, kind, embedder.embed)
    approx = approx_retriever.search(queries, 10)
    recall = np.mean([len({h.doc_id for h in a} & {h.doc_id for h in e}) / len(e) for a, e in zip(approx, exact)])
    assert recall >= min_recall
    q, hits = queries[0], approx[0]  # approximate search, exact scores of what it found
    np.testing.assert_allclose(approx_retriever.score(q, [h.doc_id for h in hits]), [h.score for h in hits], rtol=1e-4)


def test_sharded_flat_search_equals_unsharded(pooled_dense, embedder, queries, tmp_path):
    from specrag.retrieval.base import DocStore
    from specrag.retrieval.dense import DenseRetriever, build_faiss
    vectors = np.load(pooled_dense / "vectors.npy")
    build_faiss(vectors, tmp_path / "sharded", "flat", shards=3)
    store = DocStore(pooled_dense / "passages.parquet")
    sharded = DenseRetriever(tmp_path / "sharded", store, embedder.embed, vectors=pooled_dense / "vectors.npy")
    whole = open_retriever(pooled_dense, "dense", embedder.embed)
    for a, b in zip(sharded.search(queries[:50], 10), whole.search(queries[:50], 10)):
        assert [h.doc_id for h in a] == [h.doc_id for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=1e-6)


@pytest.mark.parametrize("precision", ["int8", "bf16", "fp32"])
def test_batched_exact_search_equals_per_query_fp32_search(pooled_dense, embedder, queries, precision):
    """Any batch size and candidate precision gives the exact fp32 top-k: ids, scores and ties
    by row, as the canonical scores of every vector rank them, and as FAISS's per-query scan."""
    from specrag.retrieval.base import DocStore
    from specrag.retrieval.dense import DenseRetriever, pair_scores
    store = DocStore(pooled_dense / "passages.parquet")
    scan = DenseRetriever(pooled_dense / "dense", store, embedder.embed, scan_precision=precision)
    faiss_path = DenseRetriever(pooled_dense / "dense", store, embedder.embed, scan_precision=None)
    asked = queries[:16]
    vectors = np.load(pooled_dense / "vectors.npy")
    want = []
    for q in scan._embed_queries(asked):
        canon = pair_scores(vectors, q).astype(np.float64)
        assert all(pair_scores(vectors[r:r + 1], q)[0] == canon[r] for r in range(0, len(vectors), 97))  # row-alone
        top = np.lexsort((np.arange(len(vectors)), -canon))[:20]
        want.append([(store.hit(int(r), canon[r]).doc_id, canon[r]) for r in top])
    for size in (1, 2, 3, 4, 8, 16):
        got = [hit for lo in range(0, len(asked), size) for hit in scan.search(asked[lo:lo + size], 20)]
        assert [[(h.doc_id, h.score) for h in hits] for hits in got] == want, size
    assert [[(h.doc_id, h.score) for h in hits] for hits in faiss_path.search(asked[:4], 20)] == want[:4]
