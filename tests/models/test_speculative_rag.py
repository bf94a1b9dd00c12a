"""Speculative RAG: multi-perspective subsets, drafting, one-pass verification, the Beam graph."""
import itertools
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrag.inference import Engine, Services
from specrag.inference.types import ScoreRequest
from specrag.methods import create_method
from specrag.methods.local_run import run_method
from specrag.methods.speculative_rag import DraftRecord, combined_score, parse_draft
from specrag.methods.subsets import kmeans, query_seed, sample_subsets
from specrag.retrieval import open_retriever
from specrag.schemas import validate_query


def _queries(imported, name, n):
    return [validate_query(r) for r in pq.read_table(imported / name / "queries.parquet").to_pylist()][:n]


@pytest.fixture(scope="module")
def retrieved_vectors(imported, pooled_bm25, embedder):
    """Embeddings of the top-10 BM25 documents of 20 real PopQA and HotpotQA questions."""
    retriever = open_retriever(pooled_bm25, "bm25")
    questions = [q["question"] for q in _queries(imported, "popqa", 10) + _queries(imported, "hotpotqa", 10)]
    return [embedder.embed([d.text for d in hits]) for hits in retriever.search(questions, 10)]


def test_every_subset_takes_one_document_from_every_cluster(retrieved_vectors):
    for i, vectors in enumerate(retrieved_vectors):
        for k, m in ((2, 5), (3, 10), (5, 5)):
            sampled = sample_subsets(vectors, k, m, seed=i)
            assert len(sampled.clusters) == k and all(sampled.clusters)
            assert sorted(itertools.chain(*sampled.clusters)) == list(range(len(vectors)))
            label = {d: c for c, members in enumerate(sampled.clusters) for d in members}
            combos = math.prod(len(c) for c in sampled.clusters)
            assert len(sampled.subsets) == m
            for subset in sampled.subsets:
                assert sorted(label[d] for d in subset) == list(range(k))  # one per cluster
            # no subset repeats while unused combinations remain
            assert len({tuple(s) for s in sampled.subsets}) == min(m, combos)


def test_subsets_are_reproducible_from_the_seed(retrieved_vectors):
    vectors = retrieved_vectors[0]
    for mode in ("multi_perspective", "random", "same_cluster"):
        a = sample_subsets(vectors, 2, 5, seed=query_seed(0, "popqa-1"), mode=mode)
        assert a == sample_subsets(vectors, 2, 5, seed=query_seed(0, "popqa-1"), mode=mode)
    draws = {tuple(map(tuple, sample_subsets(vectors, 2, 5, seed=s).subsets)) for s in range(8)}
    assert len(draws) > 1  # the seed matters
    assert query_seed(0, "a") == query_seed(0, "a") != query_seed(1, "a")
    np.testing.assert_array_equal(kmeans(vectors, 3, seed=7), kmeans(vectors, 3, seed=7))


def test_ablation_modes(retrieved_vectors):
    vectors = retrieved_vectors[3]
    same = sample_subsets(vectors, 2, 5, seed=1, mode="same_cluster")
    label = {d: c for c, members in enumerate(same.clusters) for d in members}
    for subset in same.subsets:
        assert len({label[d] for d in subset}) == 1  # every document from one cluster
    rnd = sample_subsets(vectors, 2, 5, seed=1, mode="random")
    assert rnd.clusters == [] and all(len(set(s)) == 2 for s in rnd.subsets)
    few = sample_subsets(vectors[:1], 2, 3, seed=1)  # fewer documents than clusters
    assert few.subsets == [[0], [0], [0]]
    assert sample_subsets(vectors[:0], 2, 3, seed=1).subsets == [[], [], []]


def test_parse_draft_never_fails():
    assert parse_draft(" Canberra\n", " It is the capital.\n\nMore") == ("Canberra", "It is the capital.", "ok")
    assert parse_draft("Canberra", "") == ("Canberra", "", "no_rationale")
    assert parse_draft("  \n ", " text")[2] == "empty"
    assert combined_score(DraftRecord(parsed="empty"), ("draft", "sc", "sr")) == -math.inf
    ok = DraftRecord(parsed="ok", rho_draft=-3.0, rho_sc=-4.0, rho_sr=-0.5, draft_tokens=3, sc_tokens=4)
    assert combined_score(ok, ("draft", "sc", "sr")) == -7.5
    assert combined_score(ok, ("draft", "sc"), length_normalize=True) == -2.0


def test_verifier_segments_and_long_drafts_stay_finite(scorer, imported):
    passages = pq.read_table(imported / "pooled_corpus.parquet").column("text").to_pylist()
    rationale = " ".join(p for p in passages[:40] if len(p) > 400)[:3000]  # a long, real, varied text
    segments = ("Answer: Canberra\nRationale: " + rationale, "\nDo you think the rationale supports the answer, yes or no?\nAnswer:",
                " Yes")
    scored = scorer.score([ScoreRequest.of_segments("Question: What is the capital of Australia?\n", segments)])[0]
    sc, reflection, sr = scored.segment_totals()
    assert len(scored.segment_lengths) == 3 and sum(scored.segment_lengths) == len(scored.token_logprobs)
    assert scored.segment_lengths[2] == 1  # " Yes" is one token
    assert all(math.isfinite(x) for x in (sc, reflection, sr))
    assert sc < -745 and math.exp(sc) == 0.0  # as a probability it would underflow to zero
    assert abs(sc + reflection + sr - scored.total) < 1e-6
    with pytest.raises(ValueError):
        ScoreRequest("p", "ab", ("a", "c"))


@pytest.fixture(scope="module")
def speculative_run(imported, pooled_bm25, generator, scorer, embedder):
    queries = (_queries(imported, "popqa", 1) + _queries(imported, "arc_challenge", 1)
               + _queries(imported, "pubhealth", 1))  # short form, four options, true/false
    engine = Engine(Services(models={"drafter": generator, "verifier": scorer, "embedder": embedder},
                             retriever=open_retriever(pooled_bm25, "bm25")))
    done, failures = run_method(engine, create_method("speculative-rag"), queries)
    engine.close()
    return queries, done, failures


def test_selected_draft_is_the_argmax_of_the_recorded_scores(speculative_run):
    queries, done, failures = speculative_run
    assert not failures and [s.id for s in done] == [q["id"] for q in queries]
    for s in done:
        drafts = s.trace.method.drafts
        assert len(drafts) == 5
        for d in drafts:
            assert d.parsed in ("ok", "no_rationale", "empty")
            if d.parsed != "empty":
                parts = [d.rho_draft, d.rho_sc, d.rho_sr]
                assert all(math.isfinite(p) and p <= 0 for p in parts)
                assert d.score == pytest.approx(sum(parts))
            assert len(d.doc_ids) == 2
        best = max(range(5), key=lambda i: (drafts[i].score, -i))
        assert s.trace.method.chosen_draft == best
        assert s.answer and drafts[best].answer
        # one retrieval for the query; 5 drafts x (answer + rationale) drafter calls; 5 verifier passes
        assert s.trace.counts["retrieval_calls"] == 1
        # closed-set drafts score their options first: 4 letters, or true/false in both casings
        options = 0 if s.query["task_type"] == "short_form" else 4 * len(drafts)
        assert s.trace.counts["score_calls"] == sum(d.parsed != "empty" for d in drafts) + options
        clusters = s.trace.method.clusters
        assert sorted(itertools.chain(*clusters)) == sorted(s.trace.retrieved[0]["doc_ids"])
    closed = [s for s in done if s.query["task_type"] != "short_form"]
    for s in closed:  # every draft's answer is its best-scored option; the choice is the chosen draft's
        labels = s.query.get("choice_labels") or ["true", "false"]
        for d in s.trace.method.drafts:
            assert d.answer == labels[max(range(len(labels)), key=lambda i: (d.option_logprobs[i], -i))]
        assert s.choice == s.trace.method.drafts[s.trace.method.chosen_draft].answer


def test_ablations_change_only_what_they_name(speculative_run, pooled_bm25, generator, scorer, embedder):
    queries, done, _ = speculative_run
    engine = Engine(Services(models={"drafter": generator, "verifier": scorer, "embedder": embedder},
                             retriever=open_retriever(pooled_bm25, "bm25")))
    rnd, failures = run_method(engine, create_method("speculative-rag", selection="random"), queries[:1])
    assert not failures
    for full, r in zip(done, rnd):
        assert r.trace.counts["score_calls"] == 0  # no verification at all
        assert [d.answer for d in r.trace.method.drafts] == [d.answer for d in full.trace.method.drafts]
    no_sr, _ = run_method(engine, create_method("speculative-rag", scores="draft,sc"), queries[:1])
    for full, r in zip(done, no_sr):
        for a, b in zip(full.trace.method.drafts, r.trace.method.drafts):
            if a.parsed != "empty":
                assert b.score == pytest.approx(a.rho_draft + a.rho_sc)
    engine.close()
    with pytest.raises(ValueError, match="scores"):
        create_method("speculative-rag", scores="draft,bogus")
    with pytest.raises(ValueError, match="subset_mode"):
        create_method("speculative-rag", subset_mode="clustered")


@pytest.mark.slow
def test_the_beam_graph_is_the_method(demo_tables, demo_index, tmp_path):
    """Retrieve → SampleSubsets (fan-out) → Draft → Verify → Select (keyed join) on the FnApiRunner;
    a query whose drafts fail ends in dead letters, every other one in results, equal to the
    in-memory run."""
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.transforms.runtime import RuntimeConfig, get_services
    rows = pq.read_table(demo_tables[0]).to_pylist()[:4]
    bad = dict(rows[0], id="demo-too-long", question="why " * 5000)
    path = tmp_path / "queries.parquet"
    pq.write_table(pa.Table.from_pylist(rows + [bad], schema=pq.read_schema(demo_tables[0])), path)
    method = create_method("speculative-rag", top_k=4, drafts=3, rationale_max_new_tokens=16, answer_max_new_tokens=12,
                           batch_invariant=True)  # short drafts: the claim is the graph, not their quality
    runtime = RuntimeConfig(index_dir=str(demo_index)).with_roles(method.model_roles)
    out = tmp_path / "out"
    run_answer(AnswerJob(str(path), str(out), method, runtime, batch_size=8, num_shards=2,
                         gather_timeout_s=600, beam_args=("--runner=FnApiRunner",)))
    results = pq.read_table(sorted(out.glob("results-*.parquet"))).to_pylist()
    dead = pq.read_table(sorted(out.glob("dead_letters-*.parquet"))).to_pylist()
    assert sorted(r["id"] for r in results) == sorted(r["id"] for r in rows)
    assert {d["id"] for d in dead} == {"demo-too-long"}
    assert all(d["stage"] in ("Retrieve", "SampleSubsets", "Draft", "Verify", "Select") for d in dead)
    engine = Engine(get_services(runtime))
    local, _ = run_method(engine, method, [validate_query(r) for r in rows])
    by_id = {r["id"]: r for r in results}
    for s in local:
        r = by_id[s.id]
        # drafts are batch-invariant: the same text whatever shared their batch
        assert [(d["answer"], d["rationale"]) for d in r["trace"]["drafts"]] == \
            [(d.answer, d.rationale) for d in s.trace.method.drafts]
        # verifier scores are batched with padding: equal up to float noise
        np.testing.assert_allclose([d["score"] for d in r["trace"]["drafts"]], [d.score for d in s.trace.method.drafts],
                                   rtol=1e-4)
        top = sorted((d.score for d in s.trace.method.drafts), reverse=True)
        if len(top) < 2 or top[0] - top[1] > 1e-2:
            assert r["trace"]["chosen_draft"] == s.trace.method.chosen_draft and r["answer"] == s.answer
        assert r["counts"]["retrieval_calls"] == 1  # pre-fork work counted once after the join
        assert r["trace"]["clusters"] == s.trace.method.clusters
        # timings add up: queue + served = total; no service took longer than the query was served
        t = r["timings"]
        assert t["total_s"] == pytest.approx(t["queue_s"] + t["served_s"], abs=1e-5)
        assert all(0 <= t[k] <= t["served_s"] + 1e-5 for k in ("retrieval_s", "generation_s", "verification_s",
                                                               "embedding_s", "other_s"))
        assert [st["stage"] for st in r["stages"]] == ["Retrieve", "SampleSubsets", "Draft", "Verify", "Select"]
        assert sum(st["seconds"] for st in r["stages"]) <= t["served_s"] + 1e-5
