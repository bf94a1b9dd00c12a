"""A one-logit cross-encoder over a BERT-style encoder: S(q, u) = w · meanpool(enc([q; u])) + b.

AED-RAG's utility predictor. Mean pooling, not the [CLS] pooler: the offline base model
(all-MiniLM-L6-v2) was trained with mean pooling, its [CLS] state and pooler carry no trained
meaning. Saved as the encoder's transformers folder plus ``head.safetensors``; the model card
(``specrag_model.json``) says so.
"""
from __future__ import annotations

from pathlib import Path

HEAD_FILE = "head.safetensors"


def _torch():
    import torch
    return torch


def build_model_class():
    """The module class (defined on first use: torch is imported lazily)."""
    torch = _torch()

    class _CrossEncoder(torch.nn.Module):
        def __init__(self, encoder, head):
            super().__init__()
            self.encoder, self.head = encoder, head

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            out = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                               **({"token_type_ids": token_type_ids} if token_type_ids is not None else {}))
            mask = attention_mask.unsqueeze(-1).to(out.last_hidden_state.dtype)
            pooled = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return self.head(pooled).squeeze(-1)

    return _CrossEncoder


def _first_logit_class():
    torch = _torch()

    class _FirstLogit(torch.nn.Module):
        def __init__(self, classifier):
            super().__init__()
            self.classifier = classifier

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            return self.classifier(input_ids=input_ids, attention_mask=attention_mask,
                                   **({"token_type_ids": token_type_ids} if token_type_ids is not None else {})
                                   ).logits[:, 0]

    return _FirstLogit


def new_cross_encoder(base: Path | str, seed: int, dtype=None):
    """The encoder's weights from ``base``, a fresh head (normal(0, 0.02) weights, zero bias, seeded)."""
    torch = _torch()
    from transformers import AutoModel
    encoder = AutoModel.from_pretrained(base, **({"dtype": dtype} if dtype is not None else {}))
    generator = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(encoder.config.hidden_size, 1)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator) * 0.02)
        head.bias.zero_()
    return build_model_class()(encoder, head)


def load_cross_encoder(folder: Path | str, dtype=None):
    """specrag's (encoder folder + head file), or any one-label ``ForSequenceClassification``
    folder (an off-the-shelf reranker), as a module giving one score per pair."""
    torch = _torch()
    from safetensors.torch import load_file
    from transformers import AutoModel
    if not (Path(folder) / HEAD_FILE).is_file():
        from transformers import AutoModelForSequenceClassification
        classifier = AutoModelForSequenceClassification.from_pretrained(
            folder, **({"dtype": dtype} if dtype is not None else {}))
        return _first_logit_class()(classifier)
    encoder = AutoModel.from_pretrained(folder, **({"dtype": dtype} if dtype is not None else {}))
    head = torch.nn.Linear(encoder.config.hidden_size, 1)
    head.load_state_dict(load_file(str(Path(folder) / HEAD_FILE)))
    if dtype is not None:
        head = head.to(dtype)
    return build_model_class()(encoder, head)


def save_cross_encoder(model, folder: Path | str) -> None:
    from safetensors.torch import save_file
    folder = Path(folder)
    model.encoder.save_pretrained(folder)
    save_file({k: v.contiguous() for k, v in model.head.state_dict().items()}, str(folder / HEAD_FILE))
