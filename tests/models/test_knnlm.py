"""KNN-LM: the datastore Beam job, the interpolation, and RaLMSpec for KNN-LM == KNN-LM token for token."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from specrag.inference.types import NextToken
from specrag.methods.knnlm import mix_next_token

QUESTIONS = 16  # enough for speculation to hit and miss many times; each costs real LM steps
PASSAGES = 150  # ~17k datastore entries: the LM over 150 passages and an HNSW build, ~1.5 min here


def test_mix_interpolates_knn_and_lm():
    logprobs = np.log(np.array([0.5, 0.3, 0.2], dtype=np.float32))
    state = NextToken(np.zeros(2, np.float32), logprobs, 1)
    values = np.array([2, 2, 1])
    assert mix_next_token(state, np.array([], dtype=np.int64), np.array([]), values, 0.25, 1.0) == 0
    # both neighbours say token 2: 0.75*0.2 + 0.25 = 0.400 beats 0.75*0.5 = 0.375
    assert mix_next_token(state, np.array([0, 1]), np.array([1.0, 1.0]), values, 0.25, 1.0) == 2
    # a weaker kNN weight leaves the model's choice
    assert mix_next_token(state, np.array([0, 1]), np.array([1.0, 1.0]), values, 0.1, 1.0) == 0
    # the nearer neighbour dominates at low temperature
    assert mix_next_token(state, np.array([2, 0]), np.array([0.0, 5.0]), values, 0.9, 0.1) == 1


@pytest.fixture(scope="module")
def datastore_dir(imported, tmp_path_factory):
    from specrag.pipelines.build_datastore import run_build_datastore
    work = tmp_path_factory.mktemp("knnlm")
    corpus = pq.read_table(imported / "nq" / "corpus.parquet").slice(0, PASSAGES)
    pq.write_table(corpus, work / "corpus.parquet")
    run_build_datastore(str(work / "corpus.parquet"), str(work / "ds"), max_tokens=128)
    return work / "ds"


@pytest.mark.slow
def test_datastore_holds_teacher_forced_states_in_corpus_order(datastore_dir, generator, imported):
    from specrag.retrieval.base import passage_text
    from specrag.retrieval.datastore import Datastore
    store = Datastore(datastore_dir, "flat")
    assert len(store) > 10 * PASSAGES
    passages = sorted(pq.read_table(imported / "nq" / "corpus.parquet").slice(0, PASSAGES).to_pylist(),
                      key=lambda p: p["id"])
    keys, values = generator.token_states([passage_text(passages[0]["title"], passages[0]["text"])], 128)[0]
    assert np.array_equal(store.values[:len(values)], values)
    assert np.array_equal(np.asarray(store.keys[:len(keys)]), keys)
    assert store.following([3], 2) == [4, 5]
    ids, dists = store.search([keys[5]], 4)[0]
    assert ids[0] == 5 and dists[0] == 0.0  # a stored context finds itself
    hnsw = Datastore(datastore_dir, "hnsw")
    assert hnsw.search([keys[5]], 4)[0][0][0] == 5
    # a distance does not depend on which other entries are asked for with it, nor their order
    rng = np.random.default_rng(0)
    picked = rng.choice(len(store), 500, replace=False)
    together = store.distances(keys[7], picked)
    assert all(store.distances(keys[7], [e])[0] == d for e, d in zip(picked[:50], together[:50]))
    assert np.array_equal(store.distances(keys[7], picked[::-1]), together[::-1])
    ids, dists = store.nearest_among(keys[7], picked, 8)
    assert np.array_equal(dists, np.sort(together)[:8])


@pytest.mark.slow
def test_batched_datastore_search_equals_per_query_exact_search(datastore_dir):
    """Flat search over real hidden states, any batch size and candidate precision: the exact
    fp32 k nearest (ids, distances, ties by id) as the canonical distances of every entry rank them."""
    from specrag.retrieval.datastore import Datastore
    rng = np.random.default_rng(0)
    stores = {p: Datastore(datastore_dir, "flat", scan_precision=p) for p in ("int8", "bf16", "fp32", None)}
    keys = np.asarray(stores[None].keys)
    picked = rng.choice(len(keys) - 1, 16, replace=False)
    queries = [keys[i] if j % 2 else (keys[i] + keys[i + 1]) / 2 for j, i in enumerate(picked)]  # on and off entries
    everything = np.arange(len(keys))
    want = []
    for q in queries:
        dist = stores[None].distances(q, everything)
        top = np.lexsort((everything, dist))[:16]
        want.append((top.tolist(), dist[top].tolist()))
    for precision, store in stores.items():
        for size in (1, 2, 3, 4, 8, 16) if precision == "int8" else (16,):
            got = [r for lo in range(0, 16, size) for r in store.search(queries[lo:lo + size], 16)]
            assert [(ids.tolist(), d.tolist()) for ids, d in got] == want, (precision, size)


@pytest.mark.slow
def test_max_entries_runs_the_model_over_the_needed_passages_only_with_the_same_entries(datastore_dir, tmp_path):
    """A capped datastore is the first N entries of the full one, built from the passages that
    hold them (not the whole corpus, as it was when the cap was applied after the job)."""
    import json
    from specrag.pipelines.build_datastore import run_build_datastore
    from specrag.retrieval.datastore import Datastore
    full = Datastore(datastore_dir, "flat")
    n = 1000
    run_build_datastore(str(datastore_dir.parent / "corpus.parquet"), str(tmp_path / "ds"), max_tokens=128,
                        max_entries=n, kinds=("flat",))
    capped = Datastore(tmp_path / "ds", "flat")
    assert len(capped) == n
    assert np.array_equal(capped.values, full.values[:n]) and np.array_equal(np.asarray(capped.keys),
                                                                            np.asarray(full.keys[:n]))
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["passages"] < PASSAGES / 10  # ~100 entries a passage: about ten passages ran


@pytest.fixture(scope="module")
def lm_memo(step_memo):
    """One memo for both index kinds: a prefix's next-token state does not depend on the index."""
    return step_memo()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_knnlm_spec_equals_knnlm_token_for_token(kind, datastore_dir, lm_memo, imported):
    from specrag.inference import Engine, EngineConfig, Services
    from specrag.methods import create_method
    from specrag.methods.local_run import run_method
    from specrag.retrieval.datastore import Datastore
    from specrag.schemas import validate_query
    store = Datastore(datastore_dir, kind)
    queries = [validate_query(r) for r in pq.read_table(imported / "nq" / "queries.parquet").to_pylist()[:QUESTIONS]]
    memo = lm_memo  # next-token states are per-row computations: see StepMemo

    def run(method):
        engine = Engine(Services(models={"generator": memo}, resources={"datastore": store}), EngineConfig(max_batch=16))
        states, failures = run_method(engine, method, queries)
        engine.close()
        assert not failures, failures[:3]
        return states

    settings = dict(k=16, max_new_tokens=16)
    baseline = {s.id: s.trace.method.output_ids for s in run(create_method("knnlm", **settings))}
    assert sum(map(len, baseline.values())) > 4 * len(queries)
    for os3, fallback in ((False, False), (True, False), (True, True)):
        states = run(create_method("knnlm-spec", os3=os3, sequential_fallback=fallback, **settings))
        got = {s.id: s.trace.method.output_ids for s in states}
        diff = [q for q in baseline if got[q] != baseline[q]]
        assert not diff, f"{kind} os3={os3} fallback={fallback}: {len(diff)} differ, e.g. {got[diff[0]]} vs {baseline[diff[0]]}"
        assert fallback or sum(s.trace.counts["speculation_accepted"] for s in states) > 0
        assert all(s.trace.method.cache_size > 0 for s in states)
        # every step reads its prompt and continuation: more than one token per generated token
        assert all(s.trace.counts["prompt_tokens"] > s.trace.counts["generated_tokens"] > 0 for s in states)


@pytest.mark.slow
def test_knnlm_spec_equals_knnlm_with_prefix_reuse(datastore_dir, prefix_generator, imported):
    """Every KNN-LM step extends the last one's prefix: with prefix KV reuse shared by both loops
    the outputs stay equal and most of each step's prefix comes from the cache."""
    from specrag.inference import Engine, EngineConfig, Services
    from specrag.methods import create_method
    from specrag.methods.local_run import run_method
    from specrag.retrieval.datastore import Datastore
    from specrag.schemas import validate_query
    store = Datastore(datastore_dir, "flat")
    queries = [validate_query(r) for r in pq.read_table(imported / "nq" / "queries.parquet").to_pylist()[:4]]
    model = prefix_generator()

    def run(method):
        engine = Engine(Services(models={"generator": model}, resources={"datastore": store}), EngineConfig(max_batch=16))
        states, failures = run_method(engine, method, queries)
        engine.close()
        assert not failures, failures[:3]
        return {s.id: s.trace.method.output_ids for s in states}

    baseline = run(create_method("knnlm", k=16, max_new_tokens=16))
    assert run(create_method("knnlm-spec", k=16, max_new_tokens=16, sequential_fallback=False)) == baseline
    stats = model._impl.prefix_cache.stats
    assert stats["reused_tokens"] > 2 * stats["computed_tokens"]


def test_extended_datastore_searches_exactly_over_real_and_generated_entries(datastore_dir, tmp_path):
    from specrag.importers.distractors import extend_datastore
    from specrag.retrieval.datastore import Datastore
    real = Datastore(datastore_dir, "flat")
    manifest = extend_datastore(datastore_dir, tmp_path / "big", len(real) + 3000, seed=1, chunk=1000)
    assert manifest["generated"]["generated_entries"] == 3000 and manifest["kinds"] == {"flat": {"faiss": False}}
    big = Datastore(tmp_path / "big", "flat")
    keys = np.load(tmp_path / "big" / "keys.npy")
    np.testing.assert_array_equal(keys[:len(real)], np.load(datastore_dir / "keys.npy"))
    assert set(np.load(tmp_path / "big" / "values.npy")[len(real):]) <= set(real.values)
    rng = np.random.default_rng(0)
    queries = [keys[i] + 0.1 * rng.standard_normal(keys.shape[1]).astype(np.float32)
               for i in (3, len(real) + 5, len(keys) - 1)]
    for q, (ids, dist) in zip(queries, big.search(queries, 8)):
        exact = ((keys - q) ** 2).sum(1)
        assert set(ids.tolist()) == set(np.lexsort((np.arange(len(keys)), exact))[:8].tolist())
        np.testing.assert_allclose(dist, np.sort(exact)[:8], rtol=1e-4)
    with pytest.raises(ValueError, match="scan-only"):
        Datastore(tmp_path / "big", "flat", scan_precision=None)
