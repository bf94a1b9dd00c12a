"""The local backend's sentence encoder (all-MiniLM-L6-v2): L2-normalised embeddings, pooled as the
model's own pooling config says.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from specrag.inference.local_base import LocalModelConfig, set_torch_threads
from specrag.inference.models import materialise


def encoder_pooling(path: Path) -> str:
    """"mean" or "cls": a sentence-transformers folder's pooling (``1_Pooling/config.json``),
    else mean (all-MiniLM-L6-v2's)."""
    import json
    config = path / "1_Pooling" / "config.json"
    if not config.is_file():
        return "mean"
    meta = json.loads(config.read_text())
    asked = sorted(k for k, v in meta.items() if k.startswith("pooling_mode_") and v)
    known = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean"}
    if len(asked) != 1 or asked[0] not in known:
        raise ValueError(f"{config}: specrag pools by mean or [CLS], one of them; this model asks for {asked}")
    return known[asked[0]]


# tokens of a text an embedder reads (all-MiniLM-L6-v2 was trained on 256; longer is truncated);
# the vllm backend's embedder truncates the same ids
EMBED_MAX_TOKENS = 256


class LocalEncoder:
    """embed(): L2-normalised sentence embeddings, pooled as the model was trained (mean for
    all-MiniLM-L6-v2, or what a sentence-transformers folder's pooling config says)."""

    def __init__(self, config: LocalModelConfig):
        import torch
        from transformers import AutoModel, AutoTokenizer
        set_torch_threads(config.num_threads)
        path = materialise(config.model)
        self.name = config.model
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = torch.device(config.device)
        self.model = config.quantise(AutoModel.from_pretrained(path, dtype=config.torch_dtype()).eval()).to(self.device)
        self.max_length = EMBED_MAX_TOKENS
        self._lock = threading.Lock()
        self.dim = int(self.model.config.hidden_size)
        self.pooling = encoder_pooling(Path(path))

    def embed(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        import torch
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # less padding per batch
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with self._lock, torch.inference_mode():
            for s in range(0, len(order), batch_size):
                idx = order[s:s + batch_size]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**enc).last_hidden_state
                if self.pooling == "cls":
                    pooled = hidden[:, 0]
                else:
                    m = enc["attention_mask"].unsqueeze(-1).float()
                    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
                out[idx] = pooled.float().cpu().numpy()
        return out
