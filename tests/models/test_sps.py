"""SPS: staged retrieval overlapped with chunked generation, self-consistency selection."""
import numpy as np
import pyarrow.parquet as pq
import pytest

from specrag.inference import Engine, Services
from specrag.methods import create_method
from specrag.methods.local_run import run_method
from specrag.methods.sps import most_consistent
from specrag.retrieval import open_retriever
from specrag.schemas import validate_query

# short chunks so that real ASQA answers take several stages in little time; documents first, where
# SmolLM2's answers to these questions run past two chunks (with the question first, the default,
# they end within two, and shorter chunks cost make test ~35 s more): the stages are what is tested
SHORT = dict(chunk_tokens=12, max_new_tokens=48, top_k=5, groups=3, candidates=3, question_first=False)


def _queries(imported, name, n):
    return [validate_query(r) for r in pq.read_table(imported / name / "queries.parquet").to_pylist()][:n]


@pytest.fixture(scope="module")
def sps_runs(imported, pooled_bm25, generator, embedder):
    queries = _queries(imported, "asqa", 3)
    engine = Engine(Services(models={"generator": generator, "embedder": embedder},
                             retriever=open_retriever(pooled_bm25, "bm25")))
    runs = {}
    # the ablations change what every question does alike: one question each shows it
    for label, extra, n in (("sps", {}, 3), ("static", {"staged_retrieval": False}, 1),
                            ("random", {"selection": "random"}, 1)):
        done, failures = run_method(engine, create_method("sps", **SHORT, **extra), queries[:n])
        assert not failures
        runs[label] = done
    engine.close()
    return queries, runs


def test_most_consistent_picks_the_candidate_closest_to_the_others():
    e = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 2.0], [0.95, 0.05]])
    cos = lambda a, b: float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))  # noqa: E731
    expected = [sum(cos(a, b) for b in e) for a in e]
    chosen, sums = most_consistent(e)
    assert np.allclose(sums, expected) and chosen == int(np.argmax(expected)) == 1 and sums[2] == min(sums)
    assert most_consistent(np.array([[1.0, 0.0], [1.0, 0.0]]))[0] == 0  # ties: lowest index


def test_retrieval_for_the_next_stage_overlaps_the_current_chunk(sps_runs):
    queries, runs = sps_runs
    multi = [s for s in runs["sps"] if len(s.trace.method.stages) >= 3]
    assert multi, ("no multi-stage answer: the test would prove nothing",
                   [(len(s.trace.method.stages), s.answer) for s in runs["sps"]])
    for s in multi:
        stages = s.trace.method.stages
        question = s.query["question"]
        assert stages[0].docs_query == question and stages[1].docs_query == question  # RET_0 for chunks 1, 2
        assert stages[0].next_retrieval is None  # nothing to retrieve with before chunk 1 exists
        for i, st in enumerate(stages[1:], start=2):
            r = st.next_retrieval
            assert r.for_stage == i + 1
            # started once chunk i-1 was chosen (its text is the query) and before chunk i was written:
            # concurrent with chunk i, not after it. Stamp order, not a timing tolerance: a busy machine
            # may put milliseconds between spawning the search and starting the chunk.
            assert stages[i - 2].gen_end <= r.start <= st.gen_start < st.gen_end
            answer_before = "".join(x.candidates[x.chosen] for x in stages[:i - 1])
            assert r.query.startswith(question) and r.query.rstrip().endswith(answer_before.strip()[-20:])
            if i < len(stages):  # the next stage used exactly these documents: one chunk stale
                assert r.used and stages[i].doc_ids == r.doc_ids and stages[i].docs_query == r.query
            else:
                assert r.used is False  # the answer ended: its retrieval was not waited for
        overlapped = [st for st in stages[1:-1] if st.next_retrieval.end]
        assert any(st.next_retrieval.end > st.gen_start for st in overlapped)


def test_stage_records_and_selection(sps_runs):
    queries, runs = sps_runs
    for s in runs["sps"]:
        out = s.trace.method.output_ids
        stages = s.trace.method.stages
        assert len(out) <= SHORT["max_new_tokens"]
        for st in stages:
            assert len(st.candidates) == SHORT["candidates"] and len(st.subsets) == SHORT["candidates"]
            assert all(len(sub) == min(3, len(st.doc_ids)) for sub in st.subsets)
            assert st.chosen == int(np.argmax(st.similarity))
        assert s.answer.strip() == "".join(st.candidates[st.chosen] for st in stages).strip()
    for s in runs["static"]:  # ablation: the question's documents throughout, no staged retrieval
        stages = s.trace.method.stages
        assert all(st.next_retrieval is None and st.docs_query == s.query["question"] for st in stages)
        assert s.trace.counts["retrieval_calls"] == 1
    for s in runs["random"]:
        assert all(st.similarity == [] for st in s.trace.method.stages)


def test_reproducible(sps_runs, pooled_bm25, generator, embedder):
    queries, runs = sps_runs
    engine = Engine(Services(models={"generator": generator, "embedder": embedder},
                             retriever=open_retriever(pooled_bm25, "bm25")))
    again, _ = run_method(engine, create_method("sps", **SHORT), queries[:1])
    engine.close()
    first = runs["sps"][0].trace.method.stages
    assert [(st.subsets, st.chosen) for st in again[0].trace.method.stages] == \
        [(st.subsets, st.chosen) for st in first]
    with pytest.raises(ValueError, match="groups"):
        create_method("sps", top_k=3, groups=5)
