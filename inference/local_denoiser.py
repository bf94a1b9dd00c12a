"""The local backend's masked-diffusion denoiser (SARDI): one denoising step per request.
"""
from __future__ import annotations

import threading

from specrag.inference.local_base import LocalModelConfig, set_torch_threads
from specrag.inference.models import materialise
from specrag.inference.types import Denoised, DenoiseRequest


class LocalDenoiser:
    """denoise(): one step of the masked-diffusion denoiser specrag trained (inference/denoiser.py;
    ``specrag train-denoiser`` writes one) for a batch of (context, partially masked response)
    rows: per response position the argmax word and its probability. The context's tail is cut
    to fit the window (counted in ``truncated_tokens``); the response never is."""

    def __init__(self, config: LocalModelConfig):
        import json
        import torch
        from transformers import AutoTokenizer
        from specrag.inference.denoiser import DenoiserInputs, load_denoiser
        from specrag.inference.models import CARD
        set_torch_threads(config.num_threads)
        path = materialise(config.model)
        card = json.loads((path / CARD).read_text()) if (path / CARD).is_file() else {}
        self.name = config.model
        self.device = torch.device(config.device)
        if card.get("family") == "ar-adapted":  # a causal LM adapted as Dream was (inference/ar_denoiser.py)
            from specrag.inference.ar_denoiser import ARDenoiserInputs, PromptCache, load_ar_denoiser
            model, self.tokenizer = load_ar_denoiser(path, dtype=config.torch_dtype())
            self.inputs = ARDenoiserInputs(self.tokenizer, int(card.get("max_positions", 2048)))
            self.prompt_cache = PromptCache()  # prompt keys and values, reused across denoising steps
        else:
            self.prompt_cache = None  # an encoder's context sees the response: nothing to reuse
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.inputs = DenoiserInputs(self.tokenizer, int(card.get("max_positions", 512)))
            model = load_denoiser(path, dtype=config.torch_dtype())
        self.mask_id, self.eos_ids = self.inputs.mask, [self.inputs.end]
        self.model = model.to(self.device).eval()
        self._lock = threading.Lock()

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [self.inputs.context_ids(t) for t in texts]

    def detokenize(self, ids: list[list[int]]) -> list[str]:
        """Text of token ids; masks and special tokens are dropped (WordPiece pieces joined)."""
        # WordPiece output needs the clean-up ("word ." -> "word."); BPE keeps its own spaces
        return [self.tokenizer.decode(r, skip_special_tokens=True, clean_up_tokenization_spaces=self.prompt_cache is None)
                for r in ids]

    def denoise(self, requests: list[DenoiseRequest]) -> list[Denoised]:
        import torch
        contexts = [self.inputs.context_ids(r.context) for r in requests]
        responses = [list(r.response_ids) for r in requests]
        lengths = [len(r) for r in responses]
        with self._lock, torch.inference_mode():
            if self.prompt_cache is not None:  # logits at the masked positions only
                from specrag.inference.ar_denoiser import cached_response_logits
                logits, cut = cached_response_logits(self.model, self.inputs, self.prompt_cache, contexts, responses,
                                                     only_masked=True)
                lengths = [sum(t == self.mask_id for t in r) for r in responses]
            else:
                ids, mask, types, starts, cut = self.inputs.batch(contexts, responses)
                where = self.inputs.response_positions(ids.shape, starts, lengths)
                # the head only over the response windows, flattened row by row
                logits = self.model(ids.to(self.device), mask.to(self.device), types.to(self.device),
                                    positions=where.to(self.device))
            logits = logits.float()
            logits[..., self.inputs.banned] = float("-inf")
            conf, arg = torch.softmax(logits, dim=-1).max(dim=-1)
        arg, conf = arg.cpu().split(lengths), conf.cpu().split(lengths)
        out = []
        for b, r in enumerate(requests):
            found, found_conf = iter(arg[b].tolist()), iter(conf[b].tolist())
            if self.prompt_cache is not None:  # committed positions: as they are, confidence 1
                a = [next(found) if t == self.mask_id else t for t in r.response_ids]
                c = [next(found_conf) if t == self.mask_id else 1.0 for t in r.response_ids]
            else:
                a, c = list(found), list(found_conf)
                for i, t in enumerate(r.response_ids):
                    if t != self.mask_id:  # committed: stays as it is
                        a[i], c[i] = t, 1.0
            out.append(Denoised(a, [float(x) for x in c], context_tokens=len(contexts[b]) - cut[b],
                                truncated_tokens=cut[b]))
        return out
