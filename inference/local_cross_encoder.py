"""The local backend's cross-encoder (AED-RAG's utility predictor): one logit per (query, text).
"""
from __future__ import annotations

import threading

from specrag.inference.local_base import LocalModelConfig, set_torch_threads
from specrag.inference.models import materialise
from specrag.inference.types import RerankRequest


class LocalCrossEncoder:
    """rerank(): one score per (query, text) pair from a cross-encoder specrag trained
    (inference/cross_encoder.py; ``specrag train-utility`` writes one). Pairs are cut to the
    card's ``max_length`` tokens, the text side first."""

    def __init__(self, config: LocalModelConfig):
        import json
        import torch
        from transformers import AutoTokenizer
        from specrag.inference.cross_encoder import load_cross_encoder
        from specrag.inference.models import CARD
        set_torch_threads(config.num_threads)
        path = materialise(config.model)
        card = json.loads((path / CARD).read_text()) if (path / CARD).is_file() else {}
        self.name = config.model
        self.max_length = int(card.get("max_length", 256))
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = torch.device(config.device)
        self.model = load_cross_encoder(path, dtype=config.torch_dtype()).to(self.device).eval()
        self._lock = threading.Lock()

    def rerank(self, requests: list[RerankRequest], batch_size: int = 32) -> list[float]:
        import torch
        out = [0.0] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].query) + len(requests[i].text))
        with self._lock, torch.inference_mode():
            for s in range(0, len(order), batch_size):
                idx = order[s:s + batch_size]
                enc = self.tokenizer([requests[i].query for i in idx], [requests[i].text for i in idx],
                                     padding=True, truncation="only_second", max_length=self.max_length,
                                     return_tensors="pt").to(self.device)
                for i, v in zip(idx, self.model(**enc).float().cpu().tolist()):
                    out[i] = float(v)
        return out
