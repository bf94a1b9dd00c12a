"""Prefix KV reuse: a request that extends an earlier request's tokens reuses their KV cache.

RaLMSeq and RaLMSpec prefill document + question + answer-so-far again every 4 tokens, and a
KNN-LM step runs the model over its whole prefix for one token (issue 31: generation is
1.8-2.4 s of a 3-7 s query). Like vLLM's automatic prefix caching, this cache holds the keys
and values of *segments* of a request's tokens, each keyed by a hash chained over every token
up to its end, so a segment serves every later request whose tokens coincide up to there (the
steps of one request while its document is unchanged, other queries with the same prompt), in
LRU order under a byte budget, per model and worker process.

Segments follow the request, never the cache's state: the prompt (document + question, the
``head``) is one segment, prefilled in one forward as without the cache; the continuation ids
after it (the answer so far) are blocks of ``block_tokens`` counted from the head's end, each
one forward; a partial last block is computed and not kept. A segment's forward sees the same
inputs whichever segments came from the cache (its tokens and the exact keys/values of the
segments before it), so every key, value, logit and hidden state is the same bits with a cold
cache, a warm one or one that evicted half its entries: RaLMSpec still equals RaLMSeq, KNN-LM-
spec KNN-LM. (One forward over 300 tokens can differ from ten over 30 in the last bits — GEMM
blocking changes with the shape — so segments are never merged or re-cut.)

Cost: a decode step on CPU reads every weight (~50 ms for SmolLM2-135M in fp32) whether it
feeds 1 token or 4, so with blocks of RaLM's stride (4) a step's new tokens cost one forward,
and the prompt is encoded once per document instead of once per step.

Example usage::

    cache = PrefixKVCache(block_tokens=4, budget_bytes=512 << 20)
    past, logits, hidden, reused = cache.prefill(model, prompt_ids, answer_ids)  # a DynamicCache of both
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

BLOCK_TOKENS = 4  # RaLM's retrieval stride: one block per step


def segment_bounds(head: int, continuation: int, block_tokens: int) -> list[int]:
    """End offsets of the segments of ``head + continuation`` tokens: the head, then blocks."""
    ends = [head] if head else []
    ends += list(range(head + block_tokens, head + continuation, block_tokens))
    if head + continuation > (ends[-1] if ends else 0):
        ends.append(head + continuation)
    return ends


def segment_keys(ids: Sequence[int], ends: list[int]) -> list[bytes]:
    """One key per segment: a hash chained over every token up to that segment's end."""
    arr = np.asarray(ids, dtype=np.int64)
    keys, h, start = [], hashlib.blake2b(digest_size=16), 0
    for end in ends:
        h.update(np.int64(end - start).tobytes())  # the cut is part of the key, not just the tokens
        h.update(arr[start:end].tobytes())
        keys.append(h.copy().digest())
        start = end
    return keys


class PrefixKVCache:
    """KV of earlier requests' segments (LRU under ``budget_bytes``) and the segmented prefill."""

    def __init__(self, block_tokens: int = BLOCK_TOKENS, budget_bytes: int = 512 << 20):
        if block_tokens < 1 or budget_bytes < 0:
            raise ValueError("prefix cache needs block_tokens >= 1 and budget_bytes >= 0")
        self.block_tokens, self.budget_bytes = block_tokens, budget_bytes
        self._entries: OrderedDict[bytes, tuple[list[tuple[Any, Any]], int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.stats = {"prefills": 0, "reused_tokens": 0, "computed_tokens": 0, "forwards": 0, "evictions": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every segment (a benchmark's fresh worker); the counters stay."""
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def lookup(self, keys: list[bytes]) -> list[list[tuple[Any, Any]]]:
        found = []
        with self._lock:
            for k in keys:
                entry = self._entries.get(k)
                if entry is None:
                    break
                self._entries.move_to_end(k)
                found.append(entry[0])
        return found

    def store(self, key: bytes, layers: list[tuple[Any, Any]]) -> None:
        """Keep a segment's per-layer (keys, values), evicting the least recently used over the budget."""
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if size > self.budget_bytes:
            return
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
            self._entries[key] = (layers, size)
            self.bytes += size
            while self.bytes > self.budget_bytes:
                _, (_, freed) = self._entries.popitem(last=False)
                self.bytes -= freed
                self.stats["evictions"] += 1

    def prefill(self, model, head: Sequence[int], continuation: Sequence[int] = (), hidden: bool = False):
        """(DynamicCache over ``head + continuation``, logits of the last token [1, vocab], its
        last hidden state [hidden] or None, how many leading tokens came from the cache) — reusing
        the longest cached run of segments."""
        import torch
        from transformers.cache_utils import DynamicCache
        ids = list(head) + list(continuation)
        if not ids:
            raise ValueError("cannot prefill an empty prompt")
        ends = segment_bounds(len(head), len(continuation), self.block_tokens)
        keys = segment_keys(ids, ends)
        # the segment holding the last token is always computed: its forward gives the logits
        found = self.lookup(keys[:-1])
        past = DynamicCache()
        if found:
            for layer in range(len(found[0])):
                past.update(torch.cat([seg[layer][0] for seg in found], dim=2),
                            torch.cat([seg[layer][1] for seg in found], dim=2), layer)
        device = next(model.parameters()).device
        reused = start = ends[len(found) - 1] if found else 0
        res = None
        for s in range(len(found), len(ends)):
            end = ends[s]
            last = s == len(ends) - 1
            res = model(input_ids=torch.tensor([ids[start:end]], device=device), past_key_values=past,
                        use_cache=True, logits_to_keep=1, output_hidden_states=hidden and last)
            past = res.past_key_values
            if end == len(head) or end - start == self.block_tokens:
                # a whole segment (the head, a full block; never a partial last block): keep copies
                self.store(keys[s], [(lay.keys[:, :, start:end].clone(), lay.values[:, :, start:end].clone())
                                      for lay in past.layers])
            start = end
        with self._lock:
            self.stats["prefills"] += 1
            self.stats["reused_tokens"] += reused
            self.stats["computed_tokens"] += len(ids) - reused
            self.stats["forwards"] += len(ends) - len(found)
        last_hidden = res.hidden_states[-1][0, -1] if hidden else None
        return past, res.logits[:, -1, :], last_hidden, reused
