"""A masked-diffusion denoiser built on a BERT-style encoder (SARDI's denoiser, small).

No diffusion LM and no masked-LM head ships with weights on PyPI, so specrag trains one:
the offline all-MiniLM-L6-v2 encoder (bidirectional, 512 positions, uncased WordPiece) with
an MLM head tied to its word embeddings (dense → GELU → LayerNorm → the embedding matrix
transposed + a bias, as BERT's), trained with the masked-diffusion objective
(``training/denoiser.py``).

One sequence: ``[CLS] context [SEP] response [SEP]`` with token types 0 (context) and 1
(response). The response window holds the answer's tokens and then ``[SEP]`` to its end (the
end-of-text fill, as Dream fills with EOS); a masked position holds ``[MASK]``. Saved as the
encoder's transformers folder plus ``mlm_head.safetensors`` and the model card.
"""
from __future__ import annotations

from pathlib import Path

HEAD_FILE = "mlm_head.safetensors"
KIND = "masked-diffusion"


def _torch():
    import torch
    return torch


def build_model_class():
    """The module class (defined on first use: torch is imported lazily)."""
    torch = _torch()

    class _MLMHead(torch.nn.Module):
        def __init__(self, hidden: int, vocab: int, eps: float):
            super().__init__()
            self.dense = torch.nn.Linear(hidden, hidden)
            self.norm = torch.nn.LayerNorm(hidden, eps=eps)
            self.bias = torch.nn.Parameter(torch.zeros(vocab))

        def forward(self, states, embedding_weight):
            x = self.norm(torch.nn.functional.gelu(self.dense(states)))
            return x @ embedding_weight.T + self.bias  # tied to the input embeddings

    class _Denoiser(torch.nn.Module):
        def __init__(self, encoder):
            super().__init__()
            cfg = encoder.config
            self.encoder = encoder
            self.head = _MLMHead(cfg.hidden_size, cfg.vocab_size, cfg.layer_norm_eps)

        def forward(self, input_ids, attention_mask, token_type_ids, positions=None):
            """Logits [B, T, V]; or, with ``positions`` (a bool mask [B, T]), only at those
            positions, flattened [N, V] (the head over 30k words is most of the cost)."""
            states = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids).last_hidden_state
            if positions is not None:
                states = states[positions]
            return self.head(states, self.encoder.embeddings.word_embeddings.weight)

    return _Denoiser


def new_denoiser(base: Path | str, seed: int):
    """The encoder's weights from ``base``; a fresh head (BERT's init: normal(0, 0.02), seeded)."""
    torch = _torch()
    from transformers import AutoModel
    encoder = AutoModel.from_pretrained(base, add_pooling_layer=False)
    model = build_model_class()(encoder)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.head.dense.weight.copy_(torch.randn(model.head.dense.weight.shape, generator=generator) * 0.02)
        model.head.dense.bias.zero_()
    return model


def load_denoiser(folder: Path | str, dtype=None):
    from safetensors.torch import load_file
    from transformers import AutoModel
    encoder = AutoModel.from_pretrained(folder, add_pooling_layer=False,
                                        **({"dtype": dtype} if dtype is not None else {}))
    model = build_model_class()(encoder)
    model.head.load_state_dict(load_file(str(Path(folder) / HEAD_FILE)))
    return model.to(dtype) if dtype is not None else model


def save_denoiser(model, folder: Path | str) -> None:
    from safetensors.torch import save_file
    folder = Path(folder)
    model.encoder.save_pretrained(folder)
    save_file({k: v.contiguous() for k, v in model.head.state_dict().items()}, str(folder / HEAD_FILE))


def padded(rows: list[list[int]], types: list[list[int]], pad: int):
    """Right-padded tensors of token rows: (ids, attention mask, token types)."""
    torch = _torch()
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    tt = torch.zeros((len(rows), width), dtype=torch.long)
    for b, (r, t) in enumerate(zip(rows, types)):
        ids[b, :len(r)] = torch.tensor(r)
        attention[b, :len(r)] = 1
        tt[b, :len(t)] = torch.tensor(t)
    return ids, attention, tt


class DenoiserInputs:
    """Token layout of (context, response) pairs: the one place that knows it, shared by
    training and serving so the two never drift apart."""

    def __init__(self, tokenizer, max_positions: int = 512):
        self.tokenizer = tokenizer
        self.max_positions = max_positions
        self.cls, self.sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        self.mask, self.pad = tokenizer.mask_token_id, tokenizer.pad_token_id
        self.end = self.sep  # fills the response window after the text
        # never predicted: structure and padding (the end token is a word of the response)
        self.banned = sorted({tokenizer.cls_token_id, tokenizer.mask_token_id, tokenizer.pad_token_id,
                              tokenizer.unk_token_id})

    def context_ids(self, text: str) -> list[int]:
        """All of the context's tokens: ``batch`` cuts them to the window and counts the cut
        (hence no truncation here, and no tokenizer warning about the length)."""
        return self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]

    def response_ids(self, text: str, length: int) -> list[int]:
        """The text's tokens, then the end token to ``length`` (cut at ``length``)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:length]
        return ids + [self.end] * (length - len(ids))

    def batch(self, contexts: list[list[int]], responses: list[list[int]]):
        """Padded tensors (input ids, attention mask, token types) and, per row, where its
        response starts and how many context tokens were cut to fit the window."""
        rows, types, starts, cut = [], [], [], []
        for ctx, resp in zip(contexts, responses):
            room = self.max_positions - len(resp) - 3
            if room < 0:
                raise ValueError(f"denoise: a response window of {len(resp)} tokens leaves no room in "
                                 f"{self.max_positions} positions")
            cut.append(max(0, len(ctx) - room))
            ctx = ctx[:room]
            rows.append([self.cls, *ctx, self.sep, *resp, self.sep])
            types.append([0] * (len(ctx) + 2) + [1] * (len(resp) + 1))
            starts.append(len(ctx) + 2)
        return (*padded(rows, types, self.pad), starts, cut)

    @staticmethod
    def response_positions(shape, starts: list[int], lengths: list[int]):
        """Bool mask [B, T] of each row's response window: where the head has to run."""
        torch = _torch()
        where = torch.zeros(shape, dtype=torch.bool)
        for b, (start, n) in enumerate(zip(starts, lengths)):
            where[b, start:start + n] = True
        return where
