"""Prefix KV reuse: a request that extends an earlier request's tokens reuses their KV cache.

RaLMSeq and RaLMSpec prefill document + question + answer-so-far again every 4 tokens, and a
KNN-LM step runs the model over its whole prefix for one token (issue 31: generation is
1.8-2.4 s of a 3-7 s query). Like vLLM's automatic prefix caching, this cache holds the keys
and values of *full* token blocks, each keyed by a hash of the whole prefix up to its end, so a
block serves every request whose tokens coincide up to there (the steps of one request while
its document is unchanged, other queries sharing a prompt head), in LRU order under a byte
budget, per model and worker process.

Exactness: with the cache on, a prompt is always prefilled block by block — one forward per
block of ``block_tokens`` tokens, then one over the partial tail — whether its blocks come from
the cache or not. Block b's forward sees the same inputs either way (its tokens and the exact
keys/values of blocks < b), so a token's keys, values, logits and hidden state are the same
bits with a cold cache, a warm one, or a cache that evicted half of them: RaLMSpec still equals
RaLMSeq, KNN-LM-spec KNN-LM. (One forward over 300 tokens can differ from ten over 30 in the
last bits — GEMM blocking changes with the shape — which is why blocks are never merged.)

Example usage::

    cache = PrefixKVCache(block_tokens=64, budget_bytes=512 << 20)
    past, logits, hidden = cache.prefill(model, ids)   # a DynamicCache of len(ids) tokens
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

BLOCK_TOKENS = 64  # small enough to reuse most of a 4-token step, large enough to keep forwards few


def block_keys(ids: Sequence[int], block_tokens: int) -> list[bytes]:
    """One key per full block: a hash chained over every token up to that block's end."""
    arr = np.asarray(ids, dtype=np.int64)
    keys, h = [], hashlib.blake2b(digest_size=16)
    for end in range(block_tokens, len(arr) + 1, block_tokens):
        h.update(arr[end - block_tokens:end].tobytes())
        keys.append(h.copy().digest())
    return keys


class PrefixKVCache:
    """Full-block KV of earlier prompts (LRU under ``budget_bytes``) and the blocked prefill."""

    def __init__(self, block_tokens: int = BLOCK_TOKENS, budget_bytes: int = 512 << 20):
        if block_tokens < 1 or budget_bytes < 0:
            raise ValueError("prefix cache needs block_tokens >= 1 and budget_bytes >= 0")
        self.block_tokens, self.budget_bytes = block_tokens, budget_bytes
        self._blocks: OrderedDict[bytes, tuple[list[tuple[Any, Any]], int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.stats = {"prefills": 0, "reused_tokens": 0, "computed_tokens": 0, "evictions": 0}

    def __len__(self) -> int:
        return len(self._blocks)

    def clear(self) -> None:
        """Forget every block (a benchmark's fresh worker); the counters stay."""
        with self._lock:
            self._blocks.clear()
            self.bytes = 0

    def _lookup(self, keys: list[bytes]) -> list[list[tuple[Any, Any]]]:
        found = []
        with self._lock:
            for k in keys:
                entry = self._blocks.get(k)
                if entry is None:
                    break
                self._blocks.move_to_end(k)
                found.append(entry[0])
        return found

    def _store(self, key: bytes, layers: list[tuple[Any, Any]]) -> None:
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if size > self.budget_bytes:
            return
        with self._lock:
            if key in self._blocks:
                self._blocks.move_to_end(key)
                return
            self._blocks[key] = (layers, size)
            self.bytes += size
            while self.bytes > self.budget_bytes:
                _, (_, freed) = self._blocks.popitem(last=False)
                self.bytes -= freed
                self.stats["evictions"] += 1

    def prefill(self, model, ids: Sequence[int], hidden: bool = False):
        """(DynamicCache over ``ids``, logits of the last token [1, vocab], its last hidden
        state [hidden] or None) — reusing the longest cached run of full blocks."""
        import torch
        from transformers.cache_utils import DynamicCache
        if not ids:
            raise ValueError("cannot prefill an empty prompt")
        b = self.block_tokens
        keys = block_keys(ids, b)
        # the block holding the last token is always computed: its forward gives the logits
        reusable = (len(ids) - 1) // b
        found = self._lookup(keys[:reusable])
        past = DynamicCache()
        if found:
            for layer, _ in enumerate(found[0]):
                past.update(torch.cat([blk[layer][0] for blk in found], dim=2),
                            torch.cat([blk[layer][1] for blk in found], dim=2), layer)
        device = next(model.parameters()).device
        start, res = len(found) * b, None
        while start < len(ids):
            end = min(start + b, len(ids))
            last = end == len(ids)
            res = model(input_ids=torch.tensor([list(ids[start:end])], device=device), past_key_values=past,
                        use_cache=True, logits_to_keep=1, output_hidden_states=hidden and last)
            past = res.past_key_values
            if end - start == b:  # a full block: keep its keys and values (copies: the cache grows by cat)
                self._store(keys[start // b], [(lay.keys[:, :, start:end].clone(), lay.values[:, :, start:end].clone())
                                               for lay in past.layers])
            start = end
        with self._lock:
            self.stats["prefills"] += 1
            self.stats["reused_tokens"] += len(found) * b
            self.stats["computed_tokens"] += len(ids) - len(found) * b
        last_hidden = res.hidden_states[-1][0, -1] if hidden else None
        return past, res.logits[:, -1, :], last_hidden
