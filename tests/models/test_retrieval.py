"""Retrievers on real data: index scores reproduced by score(), sensible rankings, dead letters."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrag.retrieval import open_retriever


def _questions(imported, name, n):
    return pq.read_table(imported / name / "queries.parquet").to_pylist()[:n]


def test_bm25_score_matches_search_and_finds_gold(imported, pooled_bm25):
    r = open_retriever(pooled_bm25, "bm25")
    queries = _questions(imported, "popqa", 200)
    results = r.search([q["question"] for q in queries], 10)
    hits_with_gold = 0
    for q, hits in zip(queries, results):
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        rescored = r.score(q["question"], [h.doc_id for h in hits])
        np.testing.assert_allclose(rescored, [h.score for h in hits], rtol=1e-6)
        hits_with_gold += bool(set(q["gold_passage_ids"]) & {h.doc_id for h in hits})
    assert hits_with_gold / len(queries) >= 0.8  # PopQA's entity names make BM25 strong


def _windows(text: str, n: int, width: int = 24, shift: int = 4) -> list[str]:
    """RaLMSpec's speculated queries: windows of one text, ``shift`` words apart."""
    words = text.split()
    return [" ".join(words[shift * i: shift * i + width]) for i in range(n)]


def test_bm25_batch_equals_single_searches_and_reads_shared_postings_once(imported, pooled_bm25):
    """A verification's queries (windows of one text 4 words apart) in one search: each query's
    hits, scores included, are those of its own search, ``score`` gives the same numbers, and
    the batch adds up about half the postings the single searches do; unrelated queries cost
    no more than their single searches."""
    r = open_retriever(pooled_bm25, "bm25")
    passages = pq.read_table(pooled_bm25 / "passages.parquet", columns=["text"]).column("text").to_pylist()
    texts = [t for t in passages if len(t.split()) >= 60][:12]
    questions = [q["question"] for q in _questions(imported, "popqa", 8)]
    for text in texts:
        windows = _windows(text, 6)
        before = r.postings_read
        singles = [r.search([q], 20)[0] for q in windows]
        alone = r.postings_read - before
        before = r.postings_read
        assert r.search(windows, 20) == singles
        assert r.postings_read - before <= 0.6 * alone, (r.postings_read - before, alone)
        for q, hits in zip(windows, singles):
            assert r.score(q, [h.doc_id for h in hits]) == [h.score for h in hits]
    before = r.postings_read
    singles = [r.search([q], 20)[0] for q in questions]
    alone, before = r.postings_read - before, r.postings_read
    assert r.search(questions, 20) == singles and r.postings_read - before <= alone


def test_bm25_batch_sums_from_nothing_where_a_sum_could_round(imported, pooled_bm25, monkeypatch):
    """Where float64 sums of a query's weights could round, each query is summed in term order
    from nothing, as ``score`` sums it: the batch still equals the single searches."""
    r = open_retriever(pooled_bm25, "bm25")
    passages = pq.read_table(pooled_bm25 / "passages.parquet", columns=["text"]).column("text").to_pylist()
    windows = _windows(next(t for t in passages if len(t.split()) >= 60), 5)
    singles = [r.search([q], 20)[0] for q in windows]
    monkeypatch.setattr(r, "_exact", lambda counts: False)
    before = r.postings_read
    assert r.search(windows, 20) == singles
    length = lambda t: int(r._indptr[t + 1] - r._indptr[t])  # noqa: E731
    assert r.postings_read - before == sum(length(t) for ids in r._query_ids(windows) for t in set(ids))
    for q, hits in zip(windows, singles):
        assert r.score(q, [h.doc_id for h in hits]) == [h.score for h in hits]


def test_bm25_query_without_indexed_terms_returns_no_hits(pooled_bm25):
    r = open_retriever(pooled_bm25, "bm25")
    assert r.search(["zzqxj vvkkwq"], 5) == [[]]



@pytest.mark.slow
def test_the_bm25_index_files_do_not_depend_on_the_process(demo_tables, tmp_path):
    """The same corpus gives the same BM25 files in any process: bm25s numbered its vocabulary in
    set order, i.e. by Python's per-process string hashing (a Flink worker's build differed)."""
    import os
    import subprocess
    import sys
    for seed in ("1", "2"):
        subprocess.run([sys.executable, "-m", "specrag.pipelines.cli", "build-index", "--corpus", str(demo_tables[1]),
                        "--index", str(tmp_path / seed), "--kinds", "bm25"], check=True, capture_output=True,
                       env=dict(os.environ, PYTHONHASHSEED=seed))
    files = sorted(p.name for p in (tmp_path / "1" / "bm25").iterdir())
    assert "vocab.index.json" in files and files == sorted(p.name for p in (tmp_path / "2" / "bm25").iterdir())
    for name in files:
        assert (tmp_path / "1" / "bm25" / name).read_bytes() == (tmp_path / "2" / "bm25" / name).read_bytes(), name

@pytest.mark.slow
def test_dense_flat_scores_are_dot_products(demo_index, embedder, demo_tables):
    r = open_retriever(demo_index, "dense", embedder.embed)
    queries = [q["question"] for q in pq.read_table(demo_tables[0]).to_pylist()]
    for q, hits in zip(queries, r.search(queries, 5)):
        np.testing.assert_allclose(r.score(q, [h.doc_id for h in hits]), [h.score for h in hits], rtol=1e-4, atol=1e-5)
    top = r.search(["What is the capital city of Australia?"], 1)[0][0]
    assert top.title == "Canberra"


def test_build_index_sends_bad_passages_to_dead_letters(tmp_path):
    from specrag.pipelines.build_index import run_build_index
    rows = [{"id": "a", "title": "A", "text": "alpha beta"}, {"id": "b", "title": "B", "text": ""},
            {"id": "a", "title": "A2", "text": "duplicate"}, {"id": "c", "title": None, "text": "gamma delta"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "corpus.parquet")
    manifest = run_build_index(str(tmp_path / "corpus.parquet"), str(tmp_path / "idx"), ["bm25"])
    assert manifest["index"]["passages"] == 2 and manifest["index"]["dead_letters"] == 2
    dead = pq.read_table(next((tmp_path / "idx").glob("dead_letters-*.parquet"))).to_pylist()
    assert sorted((d["id"], d["message"]) for d in dead) == [
        ("a", "duplicate id 'a' (first seen at " + str(tmp_path / "corpus.parquet") + " row 1)"),
        ("b", "text: empty")]
    r = open_retriever(tmp_path / "idx", "bm25")
    assert [h.doc_id for h in r.search(["gamma"], 3)[0]] == ["c"]


def test_a_rebuilt_index_keeps_its_identity(tmp_path, monkeypatch):
    """Runs over an index stay comparable with runs over its rebuild: the fingerprint is what the
    index holds, not when it was built or how its corpus's path was spelled."""
    import json

    from specrag.pipelines.build_index import run_build_index
    from specrag.transforms.runtime import _folder_fingerprint, manifest_fingerprint
    rows = [{"id": "a", "title": "A", "text": "alpha beta"}, {"id": "c", "title": "C", "text": "gamma delta"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "corpus.parquet")
    run_build_index(str(tmp_path / "corpus.parquet"), str(tmp_path / "first"), ["bm25"])
    monkeypatch.chdir(tmp_path)
    run_build_index("corpus.parquet", "again", ["bm25"])
    again = json.loads((tmp_path / "again" / "manifest.json").read_text())
    again["created"] = "2027-01-01T00:00:00Z"
    (tmp_path / "again" / "manifest.json").write_text(json.dumps(again))
    first = json.loads((tmp_path / "first" / "manifest.json").read_text())
    assert first != again and list(first["corpus"]) != list(again["corpus"])
    assert _folder_fingerprint(str(tmp_path / "first")) == _folder_fingerprint(str(tmp_path / "again"))
    pq.write_table(pa.Table.from_pylist(rows[:1]), tmp_path / "other.parquet")
    run_build_index("other.parquet", "other", ["bm25"])
    assert _folder_fingerprint("other") != _folder_fingerprint("again")
    store = {"entries": 9, "created": "2026-11-25T17:00:00Z", "kinds": {"flat": {"build_s": 0.41}}}
    assert manifest_fingerprint(store) == manifest_fingerprint({**store, "created": "x", "kinds": {"flat": {"build_s": 3.0}}})
    assert manifest_fingerprint(store) != manifest_fingerprint({**store, "entries": 10})


def test_missing_kind_is_a_clear_error(pooled_bm25):
    with pytest.raises(ValueError, match="no 'dense' index"):
        open_retriever(pooled_bm25, "dense", lambda t: None)


def test_evaluate_reports_recall_of_gold_passages(imported, pooled_bm25, tmp_path):
    from specrag.evaluation.report import evaluate_run
    from specrag.methods import create_method
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.transforms.runtime import RuntimeConfig
    queries = str(imported / "hotpotqa" / "queries.parquet")
    method = create_method("retrieve-only")
    run_answer(AnswerJob(queries, str(tmp_path / "bm25"), method,
                         RuntimeConfig(index_dir=str(pooled_bm25)).with_roles(method.model_roles)))
    row = evaluate_run(tmp_path / "bm25", queries)["rows"][0]
    assert row["n"] == 500 and row["dataset"] == "hotpotqa"
    assert row["recall@1"] <= 50.0  # two supporting paragraphs per question
    assert row["recall@1"] < row["recall@5"] < row["recall@10"] and row["recall@10"] >= 80.0


def test_top_k_rows_is_a_stable_full_sort_prefix():
    from specrag.retrieval.bm25 import top_k_rows
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, size=1000).astype(np.float32)  # many ties
    for k in (1, 7, 100, 1000, 2000):
        expected = np.lexsort((np.arange(len(scores)), -scores))[:k]
        assert top_k_rows(scores, k).tolist() == expected.tolist()
    # large arrays take the sampled bound: spread scores, ties, mostly zeros (few matches)
    spread = rng.standard_normal(200_000)
    tied = rng.integers(0, 50, size=200_000).astype(np.float64)
    sparse = np.where(rng.random(200_000) < 0.0005, rng.random(200_000), 0.0)
    for scores in (spread, tied, sparse):
        for k in (1, 20, 500):
            expected = np.lexsort((np.arange(len(scores)), -scores))[:k]
            assert top_k_rows(scores, k).tolist() == expected.tolist()


@pytest.mark.parametrize("precision", ["int8", "bf16", "fp32"])
def test_low_precision_scan_candidates_hold_the_exact_top_k(precision):
    """The proven candidates contain the canonical fp32 top-k (ties by row) for IP and L2, with
    exact duplicate rows (ties that no bound can split), mixed norms and batch sizes 1-16."""
    from specrag.retrieval.exact_batch import LowPrecisionScan
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((6000, 48)).astype(np.float32)
    xb[:3000] /= np.linalg.norm(xb[:3000], axis=1, keepdims=True)
    xb[::50] = xb[7]  # 120 identical rows
    xb[5] = 0.0  # a zero row
    scan = LowPrecisionScan(xb, precision, block_rows=1024)  # several blocks, one partial
    for nq in (1, 2, 3, 16):
        xq = xb[rng.integers(0, len(xb), nq)] + 0.03 * rng.standard_normal((nq, 48)).astype(np.float32)
        xq[0] = xb[7]  # a query that ties with 120 rows
        for metric in ("ip", "l2"):
            for q, rows in zip(xq, scan.candidates(xq, 10, metric)):
                if metric == "ip":
                    canon = np.array([np.dot(x, q) for x in xb], dtype=np.float64)
                else:
                    diff = xb - q
                    canon = -np.einsum("ij,ij->i", diff, diff).astype(np.float64)
                want = np.lexsort((np.arange(len(xb)), -canon))[:10]
                assert set(want.tolist()) <= set(rows.tolist()), (precision, nq, metric)
                assert np.all(np.diff(rows) > 0)
    with pytest.raises(ValueError):
        scan.candidates(xq[:, :3], 10)
    assert [len(r) for r in scan.candidates(np.zeros((0, 48), np.float32), 10)] == []
