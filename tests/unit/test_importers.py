"""Importers on the real shared data: counts, gold fields only, pooled deduplication."""
import json

import pyarrow.parquet as pq
import pytest

from specrag.schemas import validate_passage, validate_query

EXPECTED = {  # queries, unique passages (DATA.md; PubHealth: the true/false claims)
    "hotpotqa": (500, 4858), "popqa": (1000, 1475), "nq": (2655, None), "webquestions": (2032, 0),
    "arc_challenge": (1172, None), "arc_challenge_selfrag": (100, None), "pubhealth": (986, None),
    "asqa": (500, None),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_import_counts_and_valid_rows(imported, name):
    queries = pq.read_table(imported / name / "queries.parquet").to_pylist()
    corpus = pq.read_table(imported / name / "corpus.parquet").to_pylist()
    n_q, n_p = EXPECTED[name]
    assert len(queries) == n_q
    if n_p is not None:
        assert len(corpus) == n_p
    assert len({q["id"] for q in queries}) == len(queries)
    for q in queries:
        validate_query(q)
    for p in corpus:
        validate_passage(p)
    ids = {p["id"] for p in corpus}
    assert all(g in ids for q in queries for g in q["gold_passage_ids"])


def test_gold_fields_only(imported):
    arc = pq.read_table(imported / "arc_challenge" / "queries.parquet").to_pylist()
    first = next(q for q in arc if q["id"] == "arc_challenge:Mercury_7175875")
    assert first["answers"] == ["C"] and first["choice_labels"] == ["A", "B", "C", "D"]
    assert "response" not in first["metadata"]
    pub = pq.read_table(imported / "pubhealth" / "queries.parquet").to_pylist()
    assert {q["answers"][0] for q in pub} == {"true", "false"}
    assert all("generated_result" not in q["metadata"] for q in pub)
    asqa = pq.read_table(imported / "asqa" / "queries.parquet").to_pylist()
    assert all(q["answer_groups"] for q in asqa) and all(q["answers"] for q in asqa)
    popqa = pq.read_table(imported / "popqa" / "queries.parquet").to_pylist()
    rankin = next(q for q in popqa if q["question"] == "What is George Rankin's occupation?")
    assert "politician" in rankin["answers"] and json.loads(rankin["metadata"])["prop"] == "occupation"


def test_pooled_corpus_is_the_deduplicated_union(imported):
    pooled = pq.read_table(imported / "pooled_corpus.parquet").column("id").to_pylist()
    union = set()
    for name in EXPECTED:
        union |= set(pq.read_table(imported / name / "corpus.parquet").column("id").to_pylist())
    assert len(pooled) == len(set(pooled)) == len(union)
    assert 9000 <= len(pooled) <= 16000
