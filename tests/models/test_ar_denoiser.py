"""SARDI's denoiser adapted from an autoregressive model (inference/ar_denoiser.py): it starts from
the AR model, sees the response bidirectionally, keeps the prompt causal, and learns."""
import pytest
import torch

from specrag.inference.ar_denoiser import ARDenoiserInputs, MASK_TOKEN, new_ar_denoiser
from specrag.inference.models import materialise


@pytest.fixture(scope="module")
def adapted():
    torch.manual_seed(0)
    model, tokenizer = new_ar_denoiser(materialise("smollm2-135m-instruct"))
    return model.eval(), ARDenoiserInputs(tokenizer)


def _window(inputs, context: str, response: list[int]):
    return inputs.batch([inputs.context_ids(context)], [response])


def test_at_initialisation_the_first_response_position_is_the_ar_models_next_token(adapted):
    model, inputs = adapted
    assert inputs.tokenizer.convert_ids_to_tokens(inputs.mask) == MASK_TOKEN and inputs.mask not in range(49152)
    context = inputs.context_ids("What is the capital of France? Answer in one word.")
    ids, attention, types, starts, cut = inputs.batch([context], [[inputs.mask] * 8])
    assert (starts, cut) == ([len(context)], [0]) and types[0].tolist() == [0] * len(context) + [1] * 8
    with torch.no_grad():
        first = model(ids, attention, types)[0, starts[0]]
        ar = model.lm(input_ids=torch.tensor([context])).logits[0, -1]
    assert torch.allclose(first, ar, atol=1e-3)
    assert inputs.tokenizer.decode(first.argmax()) == inputs.tokenizer.decode(ar.argmax())


def test_the_response_is_seen_bidirectionally_and_the_prompt_causally(adapted):
    model, inputs = adapted
    word = inputs.tokenizer(" Paris", add_special_tokens=False)["input_ids"][0]
    masked = [inputs.mask] * 6
    filled = masked[:-1] + [word]  # only the window's last position differs
    ids_a, att, types, starts, _ = _window(inputs, "Name a city.", masked)
    ids_b = _window(inputs, "Name a city.", filled)[0]
    with torch.no_grad():
        a, b = model(ids_a, att, types)[0], model(ids_b, att, types)[0]
    start = starts[0]
    # the second response position is predicted from the output at the first, which sees the last
    assert not torch.allclose(a[start + 1], b[start + 1], atol=1e-4)
    # the prompt never sees the response: the first response position (predicted from the
    # prompt's last output) and every prompt position are the same
    assert torch.equal(a[:start + 1], b[:start + 1])


def test_masked_diffusion_training_lowers_the_loss(adapted):
    import copy
    from specrag.training.denoiser import diffusion_loss
    model, inputs = copy.deepcopy(adapted[0]), adapted[1]  # the other tests keep the untrained model
    rows = [(inputs.context_ids(q), inputs.response_ids(a, 8)) for q, a in
            [("Capital of France?", "### Paris"), ("Author of Hamlet?", "### William Shakespeare"),
             ("Largest planet?", "### Jupiter")]]
    ratios = torch.tensor([0.5, 0.7, 0.9])
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss = lambda: diffusion_loss(model, inputs, rows, ratios, torch.Generator().manual_seed(1))  # noqa: E731
    losses = []
    for _ in range(2):  # the same masks each step (a fixed seed): the loss is comparable across steps
        step = loss()
        optimizer.zero_grad()
        step.backward()
        optimizer.step()
        losses.append(float(step.detach()))
    with torch.no_grad():
        losses.append(float(loss()))
    assert losses[2] < losses[1] < losses[0] and losses[2] < 0.7 * losses[0], losses


def test_a_saved_adapted_denoiser_is_served_by_the_denoise_operation(adapted, tmp_path):
    """The model folder (weights, tokenizer, card with its family) loads in the local backend's
    denoise(), which gives the in-memory model's argmax at the masked positions and keeps the
    committed ones."""
    from specrag.training.denoiser import DenoiserReport, DenoiserTrainingConfig, save_trained
    from specrag.inference.local_base import LocalModelConfig
    from specrag.inference.local_denoiser import LocalDenoiser
    from specrag.inference.types import DenoiseRequest
    model, inputs = adapted
    folder = tmp_path / "adapted"
    save_trained(model, inputs.tokenizer, DenoiserTrainingConfig(response_tokens=8, max_positions=512),
                 DenoiserReport(), folder, "smollm2-135m-instruct", True, {})
    served = LocalDenoiser(LocalModelConfig(str(folder)))
    word = inputs.tokenizer(" Paris", add_special_tokens=False)["input_ids"][0]
    window = (word,) + (inputs.mask,) * 5
    out = served.denoise([DenoiseRequest("Name the capital of France.", window)])[0]
    ids, attention, types, starts, _ = inputs.batch([inputs.context_ids("Name the capital of France.")], [list(window)])
    with torch.no_grad():
        logits = model(ids, attention, types)[0, starts[0]:starts[0] + 6]
    logits[:, inputs.banned] = float("-inf")
    assert out.argmax[0] == word and out.confidence[0] == 1.0  # committed
    assert out.argmax[1:] == logits.argmax(-1).tolist()[1:]


def test_prompt_keys_and_values_are_reused_and_give_the_full_forwards_logits(adapted):
    """Rows of different context and window lengths (one context cut to fit): the cached path's
    logits equal the full forward's, and a second step over the same prompts computes no prompt."""
    from specrag.inference.ar_denoiser import ARDenoiserInputs, PromptCache, cached_response_logits
    model, base = adapted
    inputs = ARDenoiserInputs(base.tokenizer, max_positions=48)
    word = inputs.tokenizer(" Paris", add_special_tokens=False)["input_ids"][0]
    contexts = [inputs.context_ids(t) for t in ("Name a city.", "Which city is the capital of France, the country "
                                                "in western Europe whose capital is on the Seine river? Say it.", "Hi")]
    responses = [[inputs.mask] * 6, [word] + [inputs.mask] * 7, [inputs.mask, word, inputs.mask]]
    ids, attention, types, starts, cut = inputs.batch(contexts, responses)
    assert cut[1] > 0  # the long context is cut to fit 48 positions
    where = inputs.response_positions(ids.shape, starts, [len(r) for r in responses])
    cache = PromptCache()
    with torch.no_grad():
        full = model(ids, attention, types, positions=where)
        cached, cached_cut = cached_response_logits(model, inputs, cache, contexts, responses)
        assert cached_cut == cut and cache.stats["misses"] == 3
        assert torch.allclose(cached, full, atol=2e-3), (cached - full).abs().max()
        assert torch.equal(cached.argmax(-1), full.argmax(-1))
        again, _ = cached_response_logits(model, inputs, cache, contexts, responses)
    assert cache.segments.stats["evictions"] == 0 and cache.stats == {"hits": 3, "misses": 3, "computed_tokens": sum(len(c) - 1 for c in
                                                                                        [inputs.fit(c, len(r))[0] for c, r in zip(contexts, responses)])}
    assert torch.equal(again, cached)


def _toy_training(tmp_path, probe, **settings):
    """MiniLM (the small test denoiser) on a few synthetic traces: orchestration, not quality."""
    from specrag.training.denoiser import ENCODER_BASE, DenoiserTrainingConfig, TraceExample, train_denoiser
    facts = [("Paris", "France"), ("Rome", "Italy"), ("Madrid", "Spain"), ("Berlin", "Germany"), ("Lisbon", "Portugal"),
             ("Vienna", "Austria"), ("Athens", "Greece"), ("Dublin", "Ireland"), ("Oslo", "Norway"), ("Bern", "Switzerland")]
    traces = [TraceExample(f"q{i}", f"Question: capital of {c}? Facts: {city} is the capital of {c}.",
                           f"Step 1: {city} is the capital of {c}.\n### {city}") for i, (city, c) in enumerate(facts)]
    passages = [f"{city} is the capital and largest city of {c}." for city, c in facts]
    config = DenoiserTrainingConfig(**{"corpus_steps": 2, "trace_epochs": 3, "batch_size": 4, "response_tokens": 16,
                                       "max_positions": 64, "held_out": 0.2, "checkpoint_every": 1, **settings})
    return train_denoiser(passages, traces, config, tmp_path / "model", probe=probe, base=ENCODER_BASE)


def test_checkpoints_keep_the_best_stop_early_and_resume_where_a_killed_run_stopped(tmp_path):
    """The probe's F1 picks the weights kept; patience stops training; a run killed after a
    checkpoint resumes from it and ends with the uninterrupted run's losses and weights."""
    import json
    from safetensors.torch import load_file
    from specrag.training.denoiser import partial_dir
    scores = iter([10.0, 30.0, 20.0, 20.0, 20.0, 20.0])
    report = _toy_training(tmp_path / "a", lambda folder: {"f1": next(scores), "folder": str(folder)}, patience=2)
    assert [c["step"] for c in report.checkpoints] == [1, 2, 3, 4] and report.stopped_early
    assert report.best_step == 2 and not partial_dir(tmp_path / "a" / "model").exists()
    card = json.loads((tmp_path / "a" / "model" / "training_manifest.json").read_text())
    assert card["report"]["best_step"] == 2

    class Killed(Exception):
        pass

    calls = []

    def probe(folder):
        calls.append(folder)
        if len(calls) == 3:
            raise Killed  # the process dies during its third checkpoint
        return {"f1": float(len(calls))}

    rising = iter(range(1, 100))
    whole = _toy_training(tmp_path / "whole", lambda folder: {"f1": float(next(rising))})
    with pytest.raises(Killed):
        _toy_training(tmp_path / "b", probe)
    assert (partial_dir(tmp_path / "b" / "model") / "state.pt").is_file()
    import shutil
    shutil.copytree(partial_dir(tmp_path / "b" / "model"), partial_dir(tmp_path / "c" / "model"))
    with pytest.raises(ValueError, match="other settings"):  # another run's state is not taken over
        _toy_training(tmp_path / "c", probe, seed=1)
    resumed = _toy_training(tmp_path / "b", probe)
    assert resumed.resumed_at == [2] and [c["step"] for c in resumed.checkpoints] == [1, 2, 3, 4, 5, 6]
    assert resumed.trace_step_loss == whole.trace_step_loss and resumed.corpus_step_loss == whole.corpus_step_loss
    assert resumed.best_step == 6 == whole.best_step and not partial_dir(tmp_path / "b" / "model").exists()
    for name in ("model.safetensors", "mlm_head.safetensors"):
        a, b = (load_file(str(tmp_path / run / "model" / name)) for run in ("whole", "b"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def test_a_replay_of_the_kept_step_gives_the_recorded_runs_weights_without_its_probes(tmp_path):
    """stop_at_step trains straight to a recorded run's best step (the schedule still sized by the
    whole stage), with no checkpoint or probe before it: the weights are the recorded run's."""
    from safetensors.torch import load_file
    from specrag.training.denoiser import DenoiserTrainingConfig
    scores = iter([10.0, 30.0, 20.0, 20.0])
    recorded = _toy_training(tmp_path / "a", lambda folder: {"f1": next(scores)}, patience=2)
    assert recorded.best_step == 2 and recorded.stopped_early

    def no_probe(folder):
        raise AssertionError("a replay runs no probe")

    replay = _toy_training(tmp_path / "r", no_probe, checkpoint_every=0, stop_at_step=recorded.best_step)
    assert replay.best_step == 2 and [c["step"] for c in replay.checkpoints] == [2] and not replay.stopped_early
    assert replay.trace_step_loss == recorded.trace_step_loss[:2] and replay.corpus_step_loss == recorded.corpus_step_loss
    for name in ("model.safetensors", "mlm_head.safetensors"):
        a, b = (load_file(str(tmp_path / run / "model" / name)) for run in ("a", "r"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    with pytest.raises(ValueError, match="past the trace stage"):
        _toy_training(tmp_path / "x", None, checkpoint_every=0, stop_at_step=99)
    with pytest.raises(ValueError, match="no checkpoint_every or patience"):
        DenoiserTrainingConfig(stop_at_step=2, patience=1).validate()
