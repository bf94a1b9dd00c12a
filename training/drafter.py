"""Instruction-tuning Speculative RAG's drafter on synthesized rationales (paper §3.1, App. A).

The paper fine-tunes Mistral-7B with "the standard language modeling objective" on (question,
documents) → (answer, rationale). Here: full fine-tuning of a small causal LM (SmolLM2-135M-
Instruct by default) on the Draft stage's own prompt (the standard RAG prompt on a document
subset, in the chat template) with the loss on the response only: the answer's tokens, the
"Rationale:" marker, the rationale and the end of the turn (``draft_target_ids``), so the tuned
model is served as ``--model drafter=FOLDER`` with no change to the method. Held-back examples
measure the response's per-token loss before training and at each checkpoint; the checkpoint
with the lowest is kept. Deterministic for a seed (one thread, seeded order); a killed run
resumes from ``<output>.partial``.

With ``lora_rank`` > 0 the base stays frozen and a LoRA adapter (peft) is trained on its linear
layers instead: a 0.5B drafter's full fine-tuning holds 6 GB of AdamW state and writes a 2 GB
folder, its adapter a few MB that can ship in the repository. The folder then holds the adapter
and a card naming its base and sha256; every backend loads it merged over the base
(inference/models.py), so the method and the engines see a plain causal LM.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from specrag.training.state import (TrainingStopped, adamw_with_warmup, load_state, partial_dir, save_state,
                                    split_held_out, stop_on_signals)
from specrag.wording import duration

log = logging.getLogger(__name__)
BASE_MODEL = "smollm2-135m-instruct"
PROGRESS_EVERY = 10
DEPARTURE = ("the paper tunes Mistral-7B on ~40k Open-Instruct and knowledge-intensive instances with up to 10 "
             "Contriever documents and Gemini-Ultra rationales; here a small causal LM is {how} on the "
             "synthesized rationales of our training split (BM25 top-10, the 2-document subset the drafter sees at run "
             "time), written by a local teacher model")


@dataclass(frozen=True)
class DrafterTrainingConfig:
    epochs: int = 2
    batch_size: int = 8
    learning_rate: float = 5e-5
    warmup_ratio: float = 0.05
    max_tokens: int = 1024  # prompt + response; a longer example is left out (counted)
    held_out: float = 0.05
    checkpoint_every: int = 0  # steps between checkpoints (0: at the end only)
    seed: int = 0
    threads: int = 1
    lora_rank: int = 0  # 0: full fine-tuning; else the rank of a LoRA adapter on every linear layer
    lora_alpha: int = 16  # the adapter's scale is lora_alpha / lora_rank
    option_orders: int = 0  # multiple-choice examples taught in this many orders of their options (0: as given)
    # the matmuls' dtype (autocast); the weights and the optimizer stay float32. bfloat16 is faster
    # on AVX512-BF16 or AMX (benchmarks/results/drafter_step_cost.md), emulated and slower without
    compute_dtype: str = "float32"
    micro_batch: int = 0  # examples a forward pass holds; gradients accumulate to batch_size (0: all)
    # stop once this many checkpoints in a row have not lowered the held-out loss (0: run every epoch);
    # the best checkpoint is what is saved either way
    patience: int = 0

    def validate(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.max_tokens < 16:
            raise ValueError("need epochs >= 1, batch_size >= 1, max_tokens >= 16")
        if self.lora_rank < 0 or self.lora_alpha < 1 or self.option_orders < 0:
            raise ValueError("need lora_rank >= 0, lora_alpha >= 1, option_orders >= 0")
        if self.micro_batch < 0 or self.patience < 0:
            raise ValueError("need micro_batch >= 0, patience >= 0")
        if self.compute_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"compute_dtype must be float32 or bfloat16, got {self.compute_dtype!r}")
        if not 0 <= self.held_out < 1 or self.learning_rate <= 0 or self.checkpoint_every < 0:
            raise ValueError("need 0 <= held_out < 1, learning_rate > 0, checkpoint_every >= 0")


@dataclass(frozen=True)
class DrafterExample:
    """One training pair: the Draft prompt (question + document subset) and its target."""

    id: str
    prompt: str
    answer: str
    rationale: str


@dataclass
class DrafterReport:
    examples: int = 0
    held_out_examples: int = 0
    too_long: int = 0  # examples over max_tokens, left out
    prompt_tokens: int = 0  # over the training examples
    response_tokens: int = 0
    step_loss: list[float] = field(default_factory=list)
    epoch_loss: list[float] = field(default_factory=list)
    held_out_loss_untrained: float | None = None  # per response token
    checkpoints: list[dict] = field(default_factory=list)  # {step, held_out_loss}
    best_step: int = 0
    held_out_loss_trained: float | None = None
    resumed_at: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    total_steps: int = 0  # of the whole run (what a checkpoint's report is a part of)
    stopped_early_at: int = 0  # the step after which ``patience`` ended the run (0: it ran every step)


def option_orders(choices: Sequence[str], labels: Sequence[str], answer: str, rationale: str, orders: int,
                  key: str) -> list[tuple[list[str], str, str]]:
    """A multiple-choice example in ``orders`` orders of its options: (choices, answer label,
    rationale) each, the gold option at a different letter in each (from a start seeded by
    ``key``), the others shuffled, and the rationale's letter references ("option B", "(B)",
    "B. <its option's text>") moved with their options. Why: a drafter tuned on 150 ARC rationales
    learnt to answer "A" (411 of 500 drafts, benchmarks/results/drafter.md) though its data spread
    the letters; a gold letter that moves while the option stays teaches the choice."""
    import random
    import re
    labels, choices = list(labels), list(choices)
    if answer not in labels or orders < 1:
        return [(choices, answer, rationale)]
    n, gold = len(labels), labels.index(answer)
    rng = random.Random(hashlib.sha256(key.encode()).hexdigest())
    start = rng.randrange(n)
    alternatives = "|".join(map(re.escape, labels))
    named = re.compile(rf"\b(?:option|choice|answer)(?:\s+is)?\s*\(?({alternatives})\b|\(({alternatives})\)")
    dotted = re.compile(rf"\b({alternatives})\.\s+")  # "C. blow up a balloon": moved only before its own text
    out = []
    for j in range(min(orders, n)):
        order = [i for i in range(n) if i != gold]
        rng.shuffle(order)
        order.insert((start + j) % n, gold)  # order[new position] = old index
        new = {labels[old]: labels[pos] for pos, old in enumerate(order)}

        def moved(m: re.Match) -> str:
            g = 1 if m.group(1) else 2
            return m.string[m.start():m.start(g)] + new[m.group(g)] + m.string[m.end(g):m.end()]

        def moved_dotted(m: re.Match) -> str:
            own = choices[labels.index(m.group(1))]
            return moved(m) if own and m.string[m.end():].lower().startswith(own[:12].lower()) else m.group(0)
        text = dotted.sub(moved_dotted, named.sub(moved, rationale)) if rationale else rationale
        out.append(([choices[i] for i in order], labels[order.index(gold)], text))
    return out


def encode(tokenizer, example: DrafterExample, chat: bool, end_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) exactly as Draft feeds and reads them."""
    from specrag.inference.local_base import prompt_token_ids
    from specrag.methods.speculative_rag import draft_target_ids
    tokenize = lambda t: tokenizer(t, add_special_tokens=False)["input_ids"]  # noqa: E731 (the backend's tokenize)
    return prompt_token_ids(tokenizer, example.prompt, chat), draft_target_ids(tokenize, example.answer,
                                                                               example.rationale, end_ids)


def response_loss(model, rows: Sequence[tuple[list[int], list[int]]], pad_id: int, reduction: str = "mean"):
    """Cross-entropy of the response tokens given the prompt (right-padded batch); ``sum`` returns
    (summed loss, response tokens)."""
    import torch
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for b, (p, r) in enumerate(rows):
        n = len(p) + len(r)
        ids[b, :n] = torch.tensor(p + r)
        labels[b, len(p):n] = torch.tensor(r)
        attention[b, :n] = 1
    target = labels[:, 1:]
    if getattr(model.config, "final_logit_softcapping", None):  # the head's output is transformed: the whole forward
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1][target != -100]
    else:
        # the output head on the response's positions only: a 151k-word vocabulary (Qwen) over all
        # 8 x 1,000 positions is 5 GB of logits a copy, and a quarter of a 0.5B model's step
        hidden = model.get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1]
        logits = model.get_output_embeddings()(hidden[target != -100])
    loss = torch.nn.functional.cross_entropy(logits, target[target != -100], reduction="sum")
    tokens = int((target != -100).sum())
    return (loss, tokens) if reduction == "sum" else loss / max(1, tokens)


def accumulated_loss(model, batch, pad_id: int, config: "DrafterTrainingConfig"):
    """The batch's per-token response loss with its gradients, taken ``micro_batch`` examples at a
    time, shortest first: the same mean over the batch's response tokens (up to float order), a fraction of the
    activations' memory — a 0.5B step of 8 examples of up to ~1,000 tokens peaks at 18 GB whole."""
    import torch
    size = config.micro_batch or len(batch)
    # a pass pads its examples to its longest: passes of neighbours in length pad least, and the
    # batch's loss is the same sum whatever passes it is split into
    batch = sorted(batch, key=lambda row: len(row[0]) + len(row[1]))
    tokens = sum(len(r) for _, r in batch)
    total = 0.0
    for s in range(0, len(batch), size):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.compute_dtype == "bfloat16"):
            part, _ = response_loss(model, batch[s:s + size], pad_id, reduction="sum")
        (part / tokens).backward()
        total += float(part.detach())
    return torch.tensor(total / tokens)


def held_out_loss(model, rows, pad_id: int, config: "DrafterTrainingConfig") -> float | None:
    """The held-out examples' per-token response loss, computed as training computes it (its
    matmul dtype) and in passes of like-length examples: in float32 and in random order, 94
    examples cost the 0.5B about 6 minutes at every checkpoint, most of a 20-step interval's time."""
    import torch
    if not rows:
        return None
    rows = sorted(rows, key=lambda row: len(row[0]) + len(row[1]))  # a sum: the order only pads less
    total, tokens = 0.0, 0
    model.eval()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                enabled=config.compute_dtype == "bfloat16"):
        for s in range(0, len(rows), config.batch_size):
            loss, n = response_loss(model, rows[s:s + config.batch_size], pad_id, reduction="sum")
            total, tokens = total + float(loss), tokens + n
    return round(total / max(1, tokens), 5)


def content_key(config: DrafterTrainingConfig, base_identity: str, examples: Sequence[DrafterExample],
                trajectory: bool = False) -> str:
    """What the trained weights depend on (threads aside): a folder with this key is reused. With
    ``trajectory``, what the steps depend on: a saved state with this key resumes, whatever the
    patience (it decides only where the run ends; a patience of 0 leaves the key as before it existed)."""
    settings = {**asdict(config), "threads": None, "base": base_identity}
    if trajectory or not config.patience:
        settings.pop("patience")
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for e in examples:
        h.update(json.dumps(asdict(e), sort_keys=True).encode())
    return h.hexdigest()


def train_drafter(examples: Sequence[DrafterExample], config: DrafterTrainingConfig, out_dir: str | Path, *,
                  base: str = BASE_MODEL, provenance: dict | None = None, progress=None) -> DrafterReport:
    """Fine-tune ``base`` on the examples; save the best checkpoint as a model folder (weights,
    tokenizer with its chat template, card, training manifest)."""
    import shutil
    import torch
    from specrag.inference.local_base import set_torch_threads
    from specrag.inference.models import model_identity
    config.validate()
    started = time.time()
    set_torch_threads(config.threads)
    torch.manual_seed(config.seed)
    tokenizer, model, trained = trainable(base, config)
    chat = bool(tokenizer.chat_template)
    end_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (end_ids or [0])[0]
    report = DrafterReport()
    train, held = split_held_out(list(examples), config.held_out, config.seed)
    encoded = lambda exs: [encode(tokenizer, e, chat, end_ids) for e in exs]  # noqa: E731
    train_rows, held_rows = encoded(train), encoded(held)
    fits = lambda r: len(r[0]) + len(r[1]) <= config.max_tokens  # noqa: E731
    report.too_long = sum(not fits(r) for r in train_rows + held_rows)
    train_rows, held_rows = [r for r in train_rows if fits(r)], [r for r in held_rows if fits(r)]
    if not train_rows:
        raise ValueError(f"no training example fits max_tokens={config.max_tokens} ({len(examples)} given)")
    report.examples, report.held_out_examples = len(train_rows), len(held_rows)
    report.prompt_tokens = sum(len(p) for p, _ in train_rows)
    report.response_tokens = sum(len(r) for _, r in train_rows)
    say = progress or log.info
    say(f"drafter training: {len(train_rows)} examples ({report.too_long} too long, left out), {len(held_rows)} held "
        f"out; base {base}")
    per_epoch = math.ceil(len(train_rows) / config.batch_size)
    total = per_epoch * config.epochs
    optimizer, schedule = adamw_with_warmup([{"params": trained, "lr": config.learning_rate}],
                                            config.warmup_ratio, total)
    generator, rng = torch.Generator().manual_seed(config.seed), np.random.default_rng(config.seed)
    state_dir = partial_dir(out_dir)
    identity = content_key(config, model_identity(base), examples)
    trajectory = content_key(config, model_identity(base), examples, trajectory=True)
    resumed = load_state(state_dir, trajectory)
    if resumed is None:
        report.held_out_loss_untrained = held_out_loss(model, held_rows, pad_id, config)
        say(f"held-out response loss, untrained: {report.held_out_loss_untrained}")
        order, done, best, best_weights, earlier_wall = [], 0, {"score": [float("inf")], "step": 0}, None, 0.0
    else:
        model.load_state_dict(resumed["model"], strict=not config.lora_rank)
        optimizer.load_state_dict(resumed["optimizer"])
        schedule.load_state_dict(resumed["schedule"])
        for k, v in resumed["report"].items():
            setattr(report, k, v)
        rng.bit_generator.state = resumed["rng"]
        torch.set_rng_state(resumed["torch_rng"])
        order, done, best, best_weights = resumed["order"], resumed["step"], resumed["best"], resumed["best_weights"]
        report.resumed_at.append(done)
        earlier_wall = report.wall_s
        say(f"drafter training: resumed from {state_dir} at step {done}")
    resumed, report.total_steps = None, total
    every = config.checkpoint_every or total
    spent = 0.0
    with stop_on_signals() as stop:
        for s in range(done, total):
            if patient_enough(report.checkpoints, best["step"], config.patience):
                report.stopped_early_at = s
                say(f"drafter training: {config.patience} checkpoints without a lower held-out loss than step "
                    f"{best['step']}'s: stopping after step {s}/{total} with that checkpoint")
                break
            step_started = time.time()
            if len(order) < config.batch_size:
                order += rng.permutation(len(train_rows)).tolist()
            batch, order = [train_rows[i] for i in order[:config.batch_size]], order[config.batch_size:]
            model.train()
            optimizer.zero_grad()
            loss = accumulated_loss(model, batch, pad_id, config)
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            schedule.step()
            report.step_loss.append(round(float(loss.detach()), 5))
            spent += time.time() - step_started
            if (s + 1) % PROGRESS_EVERY == 0 or s + 1 == total:
                recent, per_step = report.step_loss[-PROGRESS_EVERY:], spent / (s + 1 - done)
                say(f"drafter training: step {s + 1}/{total}, loss {sum(recent) / len(recent):.4f} (mean of the "
                    f"last {len(recent)}), {per_step:.1f} s/step, {duration((total - s - 1) * per_step)} of steps left")
            checkpoint = (s + 1) % every == 0 or s + 1 == total
            if checkpoint:
                loss_now = held_out_loss(model, held_rows, pad_id, config)
                report.checkpoints.append({"step": s + 1, "held_out_loss": loss_now})
                score = [loss_now if loss_now is not None else float(np.mean(report.step_loss[-per_epoch:]))]
                if score < best["score"]:
                    best = {"score": score, "step": s + 1}
                    best_weights = trained_weights(model, config)
                say(f"drafter checkpoint at step {s + 1}/{total}: held-out response loss {loss_now}; "
                    f"best: step {best['step']}")
            if s + 1 < total and (checkpoint or stop.is_set()):
                report.wall_s = round(earlier_wall + time.time() - started, 3)
                save_state(state_dir, trajectory, trained_weights(model, config), optimizer, schedule, generator, rng,
                           order, s + 1, best, best_weights, report)
                if stop.is_set():
                    raise TrainingStopped(f"drafter training stopped by a signal after step {s + 1}/{total}, its "
                                          f"state saved in {state_dir}: --resume continues from that step")
    report.epoch_loss = [round(float(np.mean(report.step_loss[e * per_epoch:(e + 1) * per_epoch])), 5)
                         for e in range(len(report.step_loss) // per_epoch)]
    model.load_state_dict(best_weights, strict=not config.lora_rank)
    report.best_step = best["step"]
    report.held_out_loss_trained = next(c["held_out_loss"] for c in report.checkpoints if c["step"] == best["step"])
    report.wall_s = round(earlier_wall + time.time() - started, 3)
    save_drafter(model, tokenizer, config, report, Path(out_dir), base, identity, provenance)
    shutil.rmtree(state_dir, ignore_errors=True)
    return report


def patient_enough(checkpoints: list[dict], best_step: int, patience: int) -> bool:
    """Whether the last ``patience`` checkpoints all came after the best one (early stopping)."""
    return bool(patience) and sum(c["step"] > best_step for c in checkpoints) >= patience


def departure(config: DrafterTrainingConfig) -> str:
    """How this drafter's recipe departs from the paper's."""
    return DEPARTURE.format(how=f"tuned as a LoRA adapter of rank {config.lora_rank}" if config.lora_rank
                            else "fully fine-tuned")


def trainable(base: str, config: DrafterTrainingConfig):
    """(tokenizer, float32 model, its trained parameters) of ``base``: the whole model, or with
    ``lora_rank`` its LoRA adapter over the frozen base."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from specrag.inference.models import materialise
    path = materialise(base)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if config.lora_rank:
        model = with_adapter(model, config)
    return tokenizer, model, [p for p in model.parameters() if p.requires_grad]


def with_adapter(model, config: DrafterTrainingConfig):
    """``model`` frozen under a LoRA adapter on all its linear layers but the output head (seeded)."""
    import torch
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(config.seed)  # the adapter's A matrices start random
    return get_peft_model(model, LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                                            target_modules="all-linear", task_type="CAUSAL_LM"))


def trained_weights(model, config: DrafterTrainingConfig) -> dict:
    """A copy of what training changes: the whole state, or only the adapter's matrices."""
    return {k: v.detach().clone() for k, v in model.state_dict().items() if not config.lora_rank or "lora_" in k}


MANIFEST = "training_manifest.json"


def save_drafter(model, tokenizer, config: DrafterTrainingConfig, report: DrafterReport, out: Path, base: str,
                 key: str, provenance: dict | None) -> None:
    """The model folder: a transformers causal LM any role loads (or a LoRA adapter, which every
    backend loads merged over its base), with the card and the manifest."""
    from specrag.inference.models import ADAPTER_WEIGHTS, CARD, model_identity
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    adapter = {}
    if config.lora_rank:  # the base's tokenizer comes with the base when the adapter is merged
        # peft writes the base's local path (another on each machine) and a README card of its own
        settings = json.loads((out / "adapter_config.json").read_text())
        (out / "adapter_config.json").write_text(json.dumps({**settings, "base_model_name_or_path": base}, indent=2,
                                                            sort_keys=True))
        (out / "README.md").unlink(missing_ok=True)
        half_adapter(out / ADAPTER_WEIGHTS)
        adapter = {"adapter_of": base, "adapter_dtype": "float16",
                   "adapter_sha256": hashlib.sha256((out / ADAPTER_WEIGHTS).read_bytes()).hexdigest()}
    else:
        tokenizer.save_pretrained(out)
    manifest = {"training": asdict(config), "report": asdict(report), "base_model": model_identity(base),
                "content_key": key, "departure": departure(config),
                "objective": "LM cross-entropy on the response (answer, 'Rationale:' marker, rationale, end of turn) "
                             "given the Draft prompt in the chat template", **(provenance or {})}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    (out / CARD).write_text(json.dumps({
        "kind": "causal-lm", "family": "speculative-rag-drafter",
        "description": f"Speculative RAG drafter ({base} tuned on {report.examples} synthesized rationales"
                       f"{f', a LoRA adapter of rank {config.lora_rank}' if config.lora_rank else ''})",
        "base_model": manifest["base_model"], "departure": departure(config), "training_manifest": MANIFEST, **adapter},
        indent=2, sort_keys=True))


def half_adapter(path: Path) -> None:
    """The adapter's matrices stored in float16, in place: half the bytes (a rank-8 adapter of the 0.5B
    drafter is 8.8 MB instead of 17.6, small enough to ship in the repository), and LoRA's small
    values keep 11 significant bits (bfloat16 would keep 8). Merging casts them back to the base's
    float32, so every backend serves the same merged weights."""
    import torch
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(path))
    save_file({k: v.to(torch.float16) if v.is_floating_point() else v for k, v in tensors.items()}, str(path),
              metadata={"format": "pt"})


def cached_report(out_dir: str | Path, key: str) -> dict | None:
    """The training manifest of a finished folder made from the same content, if any."""
    from specrag.inference.models import CARD
    out = Path(out_dir)
    if not (out / CARD).is_file() or not (out / MANIFEST).is_file():
        return None
    manifest = json.loads((out / MANIFEST).read_text())
    return manifest if manifest.get("content_key") == key else None
