"""What every local model kind shares: its settings (``LocalModelConfig``), torch's thread
count, how a prompt becomes ids, and the small tensor helpers of batched decoding.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from specrag.inference.prefix_cache import BLOCK_TOKENS
from specrag.inference.processor import MODEL_DTYPES
from specrag.inference.types import GenerateRequest


def set_torch_threads(n: int) -> None:
    """Pin torch's intra-op threads; 1 per worker on a busy 2-core machine."""
    import torch
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    os.environ.setdefault("OMP_NUM_THREADS", str(n))


def prompt_token_ids(tokenizer, prompt: str, chat: bool) -> list[int]:
    """A prompt's ids as every operation feeds them: in the chat template (a user turn, then the
    assistant's turn opened) when ``chat``; training a model to reply (train-drafter) uses the same."""
    if chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


SCORE_LOGITS_BUDGET = 512 * 2 ** 20  # bytes of logits one scoring forward may hold


@dataclass(frozen=True)
class LocalModelConfig:
    model: str
    num_threads: int = 1
    max_prompt_tokens: int = 4096
    # bfloat16 (AMX/AVX512-BF16 CPUs), bfloat16-prefill and int8 are faster, not bit-equal
    dtype: str = "float32"
    device: str = "cpu"  # "cuda:N" when a Triton GPU instance serves the model
    # prefix KV reuse (inference/prefix_cache.py): MiB of KV segments kept per model and process;
    # 0 = off (one forward over each prompt). On, a prompt's continuation ids are prefilled in blocks.
    prefix_cache_mb: int = 0
    prefix_block_tokens: int = BLOCK_TOKENS

    def torch_dtype(self):
        """The dtype of every forward but a causal LM's decode steps (int8 loads float32, then
        quantises: ``quantise``; bfloat16-prefill computes in bfloat16)."""
        import torch
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(MODEL_DTYPES)}, got {self.dtype!r}")
        return torch.float32 if self.dtype == "int8" else getattr(torch, self.dtype.removesuffix("-prefill"))

    def decode_torch_dtype(self):
        """The dtype of a causal LM's decode steps: float32 under bfloat16-prefill, else ``torch_dtype``."""
        import torch
        return torch.float32 if self.dtype == "bfloat16-prefill" else self.torch_dtype()

    def quantise(self, model):
        """int8: the linear layers' weights int8 per output channel, activations quantised per call
        (PyTorch dynamic quantisation, fbgemm). Not bit-equal to float32, and a batched row's
        activation scale depends on its batch."""
        if self.dtype != "int8":
            return model
        if self.device != "cpu":
            raise ValueError(f"dtype int8 (dynamic quantisation) runs on the CPU, not {self.device}")
        import torch
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)


def left_pad(rows: list[list[int]], pad_id: int, device=None):
    import torch
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[b, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def choose_token(logp, request: GenerateRequest, generator) -> int:
    import torch
    if request.temperature <= 0:
        return int(torch.argmax(logp))
    probs = torch.softmax(logp / request.temperature, dim=-1)
    if request.top_p < 1.0:
        sorted_p, sorted_i = torch.sort(probs, descending=True, stable=True)
        keep = sorted_p.cumsum(-1) - sorted_p < request.top_p
        probs = torch.zeros_like(probs).scatter(0, sorted_i[keep], sorted_p[keep])
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=generator))


def first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    cuts = [text.find(s) for s in stops if s and s in text]
    return min(cuts) if cuts else None
