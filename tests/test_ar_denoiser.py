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
    from specrag.inference.denoiser_training import diffusion_loss
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
    from specrag.inference.denoiser_training import DenoiserReport, DenoiserTrainingConfig, save_trained
    from specrag.inference.local import LocalDenoiser, LocalModelConfig
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
