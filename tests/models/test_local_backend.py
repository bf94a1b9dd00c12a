"""The local transformers backend with the real offline models."""
import math

import numpy as np
import pytest

from specrag.inference.types import GenerateRequest, ScoreRequest

PROMPTS = ["What is the capital of France? Answer in a few words.",
           "Name a primary colour.",
           "Documents:\n[1] Canberra: Canberra is the capital city of Australia. It was chosen as a "
           "compromise between Sydney and Melbourne.\n\nQuestion: What is the capital of Australia?\nAnswer:",
           "Write one sentence about the sea."]


def test_batched_greedy_equals_one_by_one(generator):
    requests = [GenerateRequest(p, max_new_tokens=12 + 4 * i) for i, p in enumerate(PROMPTS)]
    batched = generator.generate(requests)
    for req, out in zip(requests, batched):
        alone = generator.generate([req])[0]
        assert alone.token_ids == out.token_ids
        assert alone.text == out.text
        np.testing.assert_allclose(alone.token_logprobs, out.token_logprobs, atol=1e-4)


def test_limits_stop_strings_and_logprobs(generator):
    long, stopped = generator.generate([
        GenerateRequest("Count from one to fifty in words, separated by commas.", max_new_tokens=5),
        GenerateRequest("Count from one to fifty in words, separated by commas.", max_new_tokens=40, stop=(",",)),
    ])
    assert long.finish_reason == "length" and len(long.token_ids) == 5
    assert stopped.finish_reason == "stop" and "," not in stopped.text
    assert all(lp <= 0 for lp in long.token_logprobs) and long.prompt_tokens > 5


def test_sampling_is_reproducible_per_seed(generator):
    req = lambda seed: GenerateRequest("Tell me a surprising fact.", max_new_tokens=16, temperature=1.0, seed=seed)
    a, b, c, d = generator.generate([req(1), req(1), req(2), req(3)])
    assert a.token_ids == b.token_ids
    assert len({tuple(a.token_ids), tuple(c.token_ids), tuple(d.token_ids)}) > 1


def test_generation_logprobs_match_teacher_forced_score(generator):
    out = generator.generate([GenerateRequest("The capital of France is", max_new_tokens=6, chat=False)])[0]
    tok = generator._impl.tokenizer
    if tok(out.text, add_special_tokens=False)["input_ids"] != out.token_ids:
        pytest.skip("generated text re-tokenises differently")  # rare; the invariant needs equal ids
    scored = generator.score([ScoreRequest("The capital of France is", out.text)])[0]
    np.testing.assert_allclose(scored.token_logprobs, out.token_logprobs, atol=1e-3)


def test_scorer_is_finite_for_long_continuations(scorer):
    rationale = " ".join(["The document states that the river flows north into the sea."] * 40)
    short, long = scorer.score([ScoreRequest("Question: Where does the Nile flow?\nAnswer:", " north"),
                                ScoreRequest("Question: Where does the Nile flow?\nAnswer:", " north. " + rationale)])
    assert math.isfinite(long.total) and long.total < short.total < 0
    assert len(long.token_logprobs) > 300
    yes, no = scorer.score([ScoreRequest("Is Paris in France? Answer yes or no:", " yes"),
                            ScoreRequest("Is Paris in France? Answer yes or no:", " banana")])
    assert yes.total > no.total


def test_embeddings_are_normalised_and_semantic(embedder):
    v = embedder.embed(["A cat sits on the mat.", "A kitten is sitting on a rug.", "Stock markets fell sharply."])
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.3


def test_scoring_in_sub_batches_equals_one_batch(scorer, monkeypatch):
    """Only the continuation's positions are projected onto the vocabulary, in sub-batches
    under a memory budget; the scores do not depend on how the batch was cut."""
    import specrag.inference.local_causal_lm as local
    requests = [ScoreRequest("The capital of France is", " Paris, a city on the Seine."),
                ScoreRequest("Water boils at", " 100 degrees Celsius at sea level."),
                ScoreRequest("Q: Who wrote Hamlet?\n", "Answer: Shakespeare\nDoes it hold?", ("Answer: Shakespeare", "\nDoes it hold?"))]
    whole = scorer.score(requests)
    monkeypatch.setattr(local, "SCORE_LOGITS_BUDGET", 1)  # every row alone
    alone = scorer.score(requests)
    for a, b in zip(whole, alone):
        assert a.tokens == b.tokens and a.segment_lengths == b.segment_lengths
        assert max(abs(x - y) for x, y in zip(a.token_logprobs, b.token_logprobs)) < 1e-3
    assert whole[2].segment_lengths and sum(whole[2].segment_lengths) == len(whole[2].token_logprobs)


def test_one_token_options_after_one_prompt_share_a_row_and_equal_scoring_each_alone(generator, monkeypatch):
    """Closed-set scoring: the options of one prompt are read off one next-token distribution;
    each option's score equals scoring it alone, and a multi-token option beside them is intact."""
    prompt = "Is the sky blue? Reply true or false."
    options = ["true", "True", "false", "False", " maybe not"]
    requests = [ScoreRequest(prompt, o, chat=True) for o in options]
    rows = []
    impl = generator._impl
    original = type(impl)._score_rows
    monkeypatch.setattr(type(impl), "_score_rows",
                        lambda self, r, s, t, idx, out: (rows.extend(idx), original(self, r, s, t, idx, out))[1])
    together = generator.score(requests)
    one_token = [o for o in options if len(impl.tokenizer(o, add_special_tokens=False)["input_ids"]) == 1]
    assert len(one_token) >= 2 and len(rows) == len(options) - len(one_token) + 1
    for req, got in zip(requests, together):
        alone = generator.score([req])[0]
        assert got.tokens == alone.tokens and got.prompt_tokens == alone.prompt_tokens
        np.testing.assert_allclose(got.token_logprobs, alone.token_logprobs, atol=1e-4)


def _ralm_steps(model, prompt: str, steps: int) -> list:
    """RaLM-style requests: each continues the previous one's tokens (batch-invariant rows)."""
    out, gens = [], []
    for _ in range(steps):
        gen = model.generate([GenerateRequest(prompt, max_new_tokens=4, continuation_ids=tuple(out),
                                              batch_invariant=True)])[0]
        gens.append((gen.token_ids, gen.token_logprobs))
        out += gen.token_ids
    return gens


def test_each_step_says_how_much_of_its_prompt_the_prefix_cache_supplied(generator, prefix_generator):
    """A RaLM request's first step computes its whole prompt; each later step takes all of it but
    the newest block (the stride's 4 tokens) from the cache and says so; without a cache, none."""
    for model, reused in ((prefix_generator(), lambda prompt: prompt - 4), (generator, lambda prompt: 0)):
        out, seen = [], []
        for _ in range(4):
            gen = model.generate([GenerateRequest(PROMPTS[3], max_new_tokens=4, continuation_ids=tuple(out),
                                                  batch_invariant=True)])[0]
            assert len(gen.token_ids) == 4
            seen.append((gen.prompt_tokens, gen.cached_tokens))
            out += gen.token_ids
        assert seen[0][1] == 0 and [cached for _, cached in seen[1:]] == [reused(p) for p, _ in seen[1:]]


def test_prefix_reuse_returns_the_tokens_of_a_cold_cache(prefix_generator):
    """Warm (blocks of earlier steps and prompts), cold (a new cache for every request) and a
    cache too small to keep anything give the same tokens and log-probabilities, bit for bit;
    so do next-token states (KNN-LM)."""
    from specrag.inference.types import NextTokenRequest
    warm = prefix_generator()
    warm_out = [_ralm_steps(warm, p, 4) for p in PROMPTS[2:]]
    assert warm._impl.prefix_cache.stats["reused_tokens"] > warm._impl.prefix_cache.stats["computed_tokens"] / 2
    cold_out = []
    for p in PROMPTS[2:]:
        gens, out = [], []
        for _ in range(4):
            gen = prefix_generator().generate([GenerateRequest(p, max_new_tokens=4, continuation_ids=tuple(out),
                                                               batch_invariant=True)])[0]
            gens.append((gen.token_ids, gen.token_logprobs))
            out += gen.token_ids
        cold_out.append(gens)
    assert warm_out == cold_out
    tiny = prefix_generator(budget=1)  # evicts everything
    assert [_ralm_steps(tiny, p, 4) for p in PROMPTS[2:]] == warm_out and len(tiny._impl.prefix_cache) == 0
    ids = tuple(t for ids, _ in warm_out[0] for t in ids)
    states = [warm.next_token([NextTokenRequest(PROMPTS[2], ids[:n])])[0] for n in range(0, len(ids), 3)]
    again = [prefix_generator().next_token([NextTokenRequest(PROMPTS[2], ids[:n])])[0] for n in range(0, len(ids), 3)]
    for a, b in zip(states, again):
        assert np.array_equal(a.hidden, b.hidden) and np.array_equal(a.logprobs, b.logprobs)


def test_prefix_segments_follow_the_request_not_the_cache():
    """The prompt is one segment, continuation ids blocks counted from its end, a partial block last."""
    from specrag.inference.prefix_cache import segment_bounds, segment_keys
    assert segment_bounds(5, 0, 4) == [5]
    assert segment_bounds(5, 9, 4) == [5, 9, 13, 14]
    assert segment_bounds(5, 8, 4) == [5, 9, 13]
    assert segment_bounds(0, 6, 4) == [4, 6]
    ids = list(range(100, 114))
    keys = segment_keys(ids, [5, 9, 13, 14])
    assert segment_keys(ids[:13], [5, 9, 13]) == keys[:3]  # a longer request finds the shorter one's segments
    assert segment_keys(ids[:13], [9, 13])[-1] != keys[2]  # the same tokens cut elsewhere are other KV


def test_prefix_reuse_of_a_plain_prompt_is_one_forward_as_without_it(generator, prefix_generator):
    """A request without continuation ids is prefilled as one forward, cache or not: same bits."""
    requests = [GenerateRequest(p, max_new_tokens=6, batch_invariant=True) for p in PROMPTS[:2]]
    cached = prefix_generator()
    for req in requests:
        with_cache, without = cached.generate([req])[0], generator.generate([req])[0]
        assert with_cache.token_ids == without.token_ids and with_cache.token_logprobs == without.token_logprobs
    assert cached._impl.prefix_cache.stats["forwards"] == len(requests)
