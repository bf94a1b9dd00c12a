"""RaLMSpec: OS³ and the cache in isolation; then RaLMSpec == RaLMSeq token for token on real
questions for every retriever kind and every combination of prefetching (P), the stride
scheduler (S) and asynchronous verification (A)."""
from __future__ import annotations

import itertools

import pyarrow.parquet as pq
import pytest

from specrag.methods.os3 import StrideScheduler, best_stride, expected_verified, round_latency
from specrag.retrieval import open_retriever
from specrag.inference import ModelBackend
from specrag.retrieval.base import Retriever
from specrag.retrieval.speculation import SpeculationCache

# Small enough for the suite's time budget, long enough for several speculation rounds.
TEST_SETTINGS = dict(stride=4, max_new_tokens=16, doc_max_tokens=48, query_tokens=32)
QUESTIONS = 24  # enough for speculation to hit, miss and roll back many times (36 cost ~110 s more of CI)


# -- OS³ and the cache ------------------------------------------------------------------------
def test_expected_verified_matches_the_papers_sum():
    for gamma in (0.0, 0.3, 0.6):
        for s in range(1, 8):
            direct = 1 + sum(i * gamma ** i * (1 - gamma) for i in range(1, s - 1)) + (s - 1) * gamma ** (s - 1)
            assert expected_verified(gamma, s) == pytest.approx(direct if s > 1 else 1.0)
            assert expected_verified(gamma, s) == pytest.approx(sum(gamma ** i for i in range(s)))


def test_best_stride_follows_the_cost_of_verification():
    # verification as cheap as nothing: no reason to speculate past one step
    assert best_stride(a=1.0, b=0.0, gamma=0.6, asynchronous=False, max_stride=16) == 1
    # verification ten steps long: amortise it over a longer stride
    assert best_stride(a=1.0, b=10.0, gamma=0.6, asynchronous=False, max_stride=16) > 3
    # async hides b behind one step when all match: never a longer stride than sync needs for the same b
    assert round_latency(3, 1.0, 0.5, 0.6, True) < round_latency(3, 1.0, 0.5, 0.6, False)
    # hopeless speculation: stride 1
    assert best_stride(a=1.0, b=10.0, gamma=0.0, asynchronous=False, max_stride=16) == 1


def test_scheduler_estimates_gamma_over_its_window_with_the_cap():
    s = StrideScheduler(window=5, gamma_max=0.6)
    assert s.next_stride() == 1  # no measurements yet: the paper starts at 1
    for _ in range(5):
        s.record_step(1.0)
        s.record_verification(4.0, stride=3, matched=3)  # all matched: MLE 1.0, capped
    assert s.gamma() == 0.6
    for _ in range(5):
        s.record_verification(4.0, stride=3, matched=1)  # the window forgets the good rounds
    assert s.gamma() == pytest.approx(5 / (5 + 5))
    assert s.next_stride() == best_stride(1.0, 4.0, 0.5, False, 16)


def test_cache_ranks_by_score_and_breaks_ties_by_insertion():
    cache = SpeculationCache()
    cache.add(["a", "b", "a", "c"])
    assert cache.ids == ("a", "b", "c") and "b" in cache
    assert cache.best([0.1, 0.5, 0.2]) == "b"
    assert cache.best([0.5, 0.5, 0.2]) == "a"
    with pytest.raises(ValueError):
        SpeculationCache().best([])


@pytest.mark.slow
def test_bm25_cache_scores_equal_search_scores(pooled_bm25, imported):
    retriever = open_retriever(pooled_bm25, "bm25")
    questions = [q["question"] for q in pq.read_table(imported / "nq" / "queries.parquet").to_pylist()[:100]]
    for q, hits in zip(questions, retriever.search(questions, 20)):
        assert retriever.score(q, [h.doc_id for h in hits]) == [h.score for h in hits]


# -- the cost model: speculate where it pays, sequential steps where it cannot (fake cost clock) --
class _Clock:
    """Model time: each backend call advances it by that call's cost."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _ClockedLM(ModelBackend):
    """A deterministic generator: a step's tokens depend on its document and position; each
    batched call costs ``cost`` model seconds."""

    name, capabilities, eos_ids = "clocked-lm", frozenset({"generate"}), (0,)

    def __init__(self, clock: _Clock, cost: float, length: int = 24):
        self.clock, self.cost, self.length, self.calls = clock, cost, length, 0

    def tokenize(self, texts):
        return [[3 + len(w) for w in t.split()] for t in texts]

    def detokenize(self, ids):
        return [" ".join("w" * max(i - 2, 1) for i in row) for row in ids]

    def generate(self, requests):
        from specrag.inference.types import Generation
        self.clock.now += self.cost
        self.calls += 1
        out = []
        for r in requests:
            doc = int(r.prompt.split("doc-", 1)[1][:1])
            n = min(r.max_new_tokens, self.length - len(r.continuation_ids))
            ids = [3 + (doc + len(r.continuation_ids) + i) % 5 for i in range(n)]
            out.append(Generation(" ".join("w" * i for i in ids), ids, [0.0] * n, 10,
                                  "stop" if len(r.continuation_ids) + n >= self.length else "length"))
        return out


class _ClockedIndex(Retriever):
    """Five documents ranked by a fixed function of the query; a search call costs ``cost``."""

    kind = "bm25"

    def __init__(self, clock: _Clock, cost: float):
        from specrag.retrieval.base import Hit
        self.clock, self.cost, self.searches = clock, cost, 0
        self.docs = [Hit(f"doc-{i}", 0.0, f"doc-{i}", f"doc-{i} text") for i in range(5)]

    def _score(self, query: str, doc_id: str) -> float:
        return float((len(query.split()) // 12 + int(doc_id[-1])) % 5)  # the top document changes slowly

    def search(self, queries, k):
        from specrag.retrieval.base import Hit
        self.clock.now += self.cost
        self.searches += 1  # one call, however many queries (a verification is one batched search)
        out = []
        for q in queries:
            ranked = sorted(self.docs, key=lambda d: (-self._score(q, d.doc_id), d.doc_id))[:k]
            out.append([Hit(d.doc_id, self._score(q, d.doc_id), d.title, d.text) for d in ranked])
        return out

    def score(self, query, doc_ids):
        return [self._score(query, d) for d in doc_ids]


@pytest.mark.parametrize("search_s, generate_s, speculates", [(0.001, 0.25, False), (1.0, 0.05, True)])
def test_speculation_falls_back_to_sequential_steps_where_it_cannot_pay(monkeypatch, search_s, generate_s,
                                                                           speculates):
    """Cheap retrieval: after the first real step every step is RaLMSeq's own (stride 0 in the
    trace), with no cache look-up and no rollback. Slow retrieval: it speculates. Either way the
    output is RaLMSeq's."""
    from specrag.inference import Engine, EngineConfig, Services
    from specrag.methods import create_method, ralmspec
    from specrag.methods.local_run import run_method
    from specrag.schemas import validate_query
    clock = _Clock()
    monkeypatch.setattr(ralmspec, "time", clock)
    queries = [validate_query({"id": f"q{i}", "question": "which w" + "w" * i + " is it", "dataset": "t"})
               for i in range(4)]

    def run(method):
        lm, index = _ClockedLM(clock, generate_s), _ClockedIndex(clock, search_s)
        engine = Engine(Services(models={"generator": lm}, retriever=index), EngineConfig(max_in_flight=1))
        try:
            states, failures = run_method(engine, method, queries)
        finally:
            engine.close()
        assert not failures, failures
        return {s.id: s for s in states}, index

    settings = dict(stride=4, max_new_tokens=24, doc_max_tokens=48, query_tokens=32)
    baseline, _ = run(create_method("ralmseq", **settings))
    for extra in (dict(), dict(os3=True, prefetch=True)):
        states, index = run(create_method("ralmspec", **settings, **extra))
        for qid, s in states.items():
            assert s.trace.method.output_ids == baseline[qid].trace.method.output_ids
            assert s.trace.method.step_docs == baseline[qid].trace.method.step_docs
            history = s.trace.method.stride_history
            assert len([h for h in history if h]) == s.trace.method.verifications
            if not speculates:
                assert history and set(history) == {0}
                assert s.trace.counts["cache_hits"] == 0 and s.trace.counts["rollbacks"] == 0
                assert s.trace.method.speculation_steps == 0
            else:
                assert any(history) and s.trace.method.speculation_steps > 0
        if speculates:  # fewer index calls than one a step
            assert index.searches < sum(len(s.trace.method.step_docs) for s in baseline.values())


def test_plan_compares_speculation_with_a_sequential_step():
    cheap = StrideScheduler()
    cheap.record_search(0.001)
    cheap.record_generation(0.25)
    assert cheap.plan(3) == 0 and cheap.plan() == 0
    slow = StrideScheduler()
    slow.record_search(1.0)
    slow.record_generation(0.25)
    assert slow.plan(3) == 3 and slow.plan() > 1
    # KNN-LM: no regeneration after a mismatch, so speculation pays earlier
    for regenerates, want in ((True, 0), (False, 3)):
        s = StrideScheduler(regenerates=regenerates)
        s.record_search(0.2)
        s.record_generation(0.1)
        for _ in range(5):
            s.record_step(0.1)
            s.record_verification(0.2, stride=3, matched=1)
        assert s.plan(3) == want, regenerates


def test_plan_decides_on_the_measured_gamma_and_tries_where_the_best_case_pays():
    """A 3M-passage EDR setting (search 0.24 s, step 0.5 s): the prior γmax = 0.6 says a round
    does not pay, so a new request tries one (its best case would be 1.27x); every round matched,
    so it keeps speculating; after misses it stops, and tries again ``window`` steps later."""
    s = StrideScheduler()
    s.record_search(0.24)
    s.record_generation(0.5)
    assert s.plan(3) == 3  # a trial: nothing measured yet
    s.record_step(0.5)
    s.record_verification(0.3, stride=3, matched=3)
    assert s.gamma() == 0.6 and s.gamma(capped=False) == 1.0
    assert s.plan(3) == 3
    for _ in range(5):
        s.record_verification(0.3, stride=3, matched=0)
    assert [s.plan(3) for _ in range(6)] == [0, 0, 0, 0, 0, 3]


# -- exactness against the baseline -----------------------------------------------------------
def _questions(imported) -> list[dict]:
    from specrag.schemas import validate_query
    rows = pq.read_table(imported / "nq" / "queries.parquet").to_pylist()[:QUESTIONS]
    return [validate_query(r) for r in rows]


def _outputs(states) -> dict[str, tuple]:
    out = {}
    for s in states:
        out[s.id] = (tuple(s.trace.method.output_ids), tuple(s.trace.method.step_docs), s.raw_output)
    return out


def _run(engine_for, method, queries):
    from specrag.methods.local_run import run_method
    engine = engine_for()
    try:
        states, failures = run_method(engine, method, queries)
    finally:
        engine.close()
    assert not failures, failures[:3]
    return states


class _FindsNothingSometimes:
    """BM25 that finds no document for about a third of the generated-text queries, as the index does
    for degenerate text with no indexed term (`.A.S.S.S…`): both loops must keep the previous
    step's document alike. The questions themselves always find documents."""

    def __init__(self, inner, questions: list[str]):
        self.inner, self.questions, self.empty = inner, questions, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def search(self, queries, k):
        import zlib
        out = []
        for q, hits in zip(queries, self.inner.search(queries, k)):
            gap = zlib.crc32(q.encode()) % 3 == 0 and not any(x.endswith(q.strip()) for x in self.questions)
            self.empty += gap
            out.append([] if gap else hits)
        return out


def _retriever(kind: str, request):
    """Only the index a parameter needs is built (the dense ones embed the pooled corpus)."""
    if kind == "bm25-gaps":
        return _FindsNothingSometimes(_retriever("bm25", request),
                                      [q["question"] for q in _questions(request.getfixturevalue("imported"))])
    if kind in ("bm25", "lucene"):
        return open_retriever(request.getfixturevalue("pooled_bm25" if kind == "bm25" else "pooled_lucene_index"),
                              kind)
    return open_retriever(request.getfixturevalue("pooled_dense"), kind, request.getfixturevalue("embedder").embed)


@pytest.mark.slow
# sparse and dense exact search in every run; Lucene and HNSW (the same claim over the other two
# retrievers, ~100 s each) with the acceptance sizes under `make test-full`
@pytest.mark.parametrize("kind", ["bm25", "bm25-gaps", pytest.param("lucene", marks=pytest.mark.full), "dense",
                                  pytest.param("hnsw", marks=pytest.mark.full)])
def test_ralmspec_equals_ralmseq_token_for_token(kind, request, step_memo, imported):
    """RaLMSeq runs on the model; the eight RaLMSpec variants share a memo of its steps, so
    each pays only for the steps it generates with a document the baseline never used."""
    from specrag.inference import Engine, EngineConfig, Services
    from specrag.methods import create_method
    retriever = _retriever(kind, request)
    # dense: half the questions (its exact search decides the same things; the full count costs
    # ~200 s more of CI at its limit, and `make test-full` runs it)
    full_run = "full" in (request.config.getoption("markexpr") or "")
    queries = _questions(imported)[:QUESTIONS if kind.startswith("bm25") or full_run else QUESTIONS // 2]
    memo = step_memo()

    def engine_for(model):
        return lambda: Engine(Services(models={"generator": model}, retriever=retriever), EngineConfig(max_batch=16))
    baseline = _outputs(_run(engine_for(memo), create_method("ralmseq", **TEST_SETTINGS), queries))
    assert len(baseline) == len(queries)
    assert sum(len(ids) for ids, _, _ in baseline.values()) > 2 * TEST_SETTINGS["stride"] * len(queries)
    accepted = 0
    # the paper's eight variants always speculate; the cost model's fallback (on by default)
    # decides from timings, so its runs mix sequential steps and rounds: exact either way
    # every combination over BM25; over the other retrievers (their own scoring and tie rules)
    # none and all three, which keeps the suite within its time budget (`make test-full`: all)
    full = kind == "bm25" or full_run
    variants = [(p, s, a, False) for p, s, a in itertools.product([False, True], repeat=3)
                if full or p + s + a in (0, 3)]
    for p, s, a, fallback in variants + [(False, False, False, True), (True, True, True, True)]:
        method = create_method("ralmspec", prefetch=p, os3=s, async_verification=a, sequential_fallback=fallback,
                               **TEST_SETTINGS)
        states = _run(engine_for(memo), method, queries)
        got = _outputs(states)
        diff = [qid for qid in baseline if got[qid] != baseline[qid]]
        assert not diff, f"{kind} P={p} S={s} A={a} fallback={fallback}: {len(diff)} outputs differ, e.g. {diff[0]}: " \
                         f"{got[diff[0]]} vs {baseline[diff[0]]}"
        accepted += sum(st.trace.counts["speculation_accepted"] for st in states)
        for st in states:
            d = st.trace.method
            assert d.speculation_steps >= st.trace.counts["speculation_accepted"]
            assert len([h for h in d.stride_history if h]) == d.verifications
            if not s:
                assert set(d.stride_history) <= {0, 3}
    assert accepted > 0  # speculation did work, it was not all rollbacks
    if kind == "bm25-gaps":
        assert retriever.empty > 0  # steps did keep their document


@pytest.mark.slow
def test_ralmspec_equals_ralmseq_with_prefix_reuse(prefix_generator, pooled_bm25, imported):
    """Both loops on one generator whose prefix cache is shared and warm (as in a worker): the
    steps of RaLMSeq and of each RaLMSpec variant reuse each other's blocks, outputs stay equal."""
    from specrag.inference import Engine, EngineConfig, Services
    from specrag.methods import create_method
    retriever = open_retriever(pooled_bm25, "bm25")
    queries = _questions(imported)[:4]
    model = prefix_generator()
    engine_for = lambda: Engine(Services(models={"generator": model}, retriever=retriever),  # noqa: E731
                                EngineConfig(max_batch=16))
    states = _run(engine_for, create_method("ralmseq", **TEST_SETTINGS), queries)
    baseline = _outputs(states)
    # a step that keeps its document extends the step before: all but its newest block came from the cache
    same = [r for st in states for r in st.trace.method.step_reuse if not r.new_document]
    assert same and all(r.cached_tokens == r.prompt_tokens - TEST_SETTINGS["stride"] for r in same)
    assert all(st.trace.method.step_reuse[0].cached_tokens == 0 for st in states)  # a new prompt: computed
    for extra in (dict(sequential_fallback=False),
                  dict(prefetch=True, os3=True, async_verification=True, sequential_fallback=False)):
        assert _outputs(_run(engine_for, create_method("ralmspec", **TEST_SETTINGS, **extra), queries)) == baseline
    stats = model._impl.prefix_cache.stats
    assert stats["reused_tokens"] > stats["computed_tokens"]


@pytest.mark.slow
def test_batch_invariant_steps_do_not_depend_on_the_batch(generator, imported):
    from specrag.inference.types import GenerateRequest
    from specrag.methods.prompts import build_prompt
    queries = _questions(imported)[:6]
    steps = [GenerateRequest(build_prompt(q), max_new_tokens=6, continuation_ids=tuple(range(400, 400 + i)),
                             batch_invariant=True) for i, q in enumerate(queries)]
    alone = [generator.generate([r])[0] for r in steps]
    others = [GenerateRequest(build_prompt(q) + " Explain.", max_new_tokens=12) for q in queries]
    mixed = generator.generate(others[:3] + steps + others[3:])[3:3 + len(steps)]
    assert mixed == alone  # tokens and float logprobs, bit for bit


@pytest.mark.slow
def test_ralmspec_in_the_beam_pipeline_equals_ralmseq(demo_tables, demo_index, prism, tmp_path):
    """The real model and the Beam graph end to end, with every extra on: RaLMSpec on Prism (its own
    bundles, keyed state and shuffles) gives RaLMSeq's output on the FnApiRunner, token for token."""
    from specrag.methods import create_method
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.transforms.runtime import RuntimeConfig
    outputs = {}
    queries = tmp_path / "queries.parquet"  # 12 of the demo questions: several bundles and micro-batches
    pq.write_table(pq.read_table(demo_tables[0]).slice(0, 12), queries, row_group_size=4)
    runners = {"ralmseq": ("--runner=FnApiRunner",), "ralmspec": ("--runner=PrismRunner", f"--prism_location={prism}")}
    for name, extra in (("ralmseq", {}), ("ralmspec", dict(prefetch=True, os3=True, async_verification=True,
                                                           sequential_fallback=False))):
        method = create_method(name, **TEST_SETTINGS, **extra)
        out = tmp_path / name
        run_answer(AnswerJob(str(queries), str(out), method,
                             RuntimeConfig(index_dir=str(demo_index)).with_roles(method.model_roles),
                             batch_size=8, num_shards=2, beam_args=runners[name]))
        rows = pq.read_table(sorted(out.glob("results-*.parquet"))).to_pylist()
        assert not pq.read_table(sorted(out.glob("dead_letters-*.parquet"))).num_rows
        outputs[name] = {r["id"]: (r["raw_output"], r["trace"]["output_ids"]) for r in rows}
        if name == "ralmspec":
            counts = [r["counts"] for r in rows]
            assert sum(c["speculation_accepted"] for c in counts) > 0
    assert len(outputs["ralmseq"]) == 12
    assert outputs["ralmspec"] == outputs["ralmseq"]
