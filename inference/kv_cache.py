"""A KV cache for batched decoding on CPU: rows prefilled alone, decoded together.

transformers' DynamicLayer appends by ``torch.cat``, which copies the whole cache at every
step: at batch 16 with 700-token prompts that is ~0.5 GB per step and eats the gain of
batching. GrowingLayer writes into a buffer with spare capacity (doubling when full) and
hands attention a view. Prompts are prefilled one by one (no padding, so attention takes
its causal fast path and each row computes exactly as it would alone) and their caches are
stacked, left-padded, into one batch for decoding.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class GrowingLayer(DynamicLayer):
    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
        super().__init__()
        b, h, n, d = keys.shape
        self._k = keys.new_zeros((b, h, max(capacity, n), d))
        self._v = values.new_zeros((b, h, max(capacity, n), values.shape[-1]))
        self._k[:, :, :n] = keys
        self._v[:, :, :n] = values
        self._n = n
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys = self._k[:, :, : self._n]
        self.values = self._v[:, :, : self._n]

    def update(self, key_states, value_states, *args, **kwargs):
        add = key_states.shape[-2]
        if self._n + add > self._k.shape[2]:
            cap = max(2 * self._k.shape[2], self._n + add)
            k = self._k.new_zeros((*self._k.shape[:2], cap, self._k.shape[3]))
            v = self._v.new_zeros((*self._v.shape[:2], cap, self._v.shape[3]))
            k[:, :, : self._n] = self.keys
            v[:, :, : self._n] = self.values
            self._k, self._v = k, v
        self._k[:, :, self._n: self._n + add] = key_states
        self._v[:, :, self._n: self._n + add] = value_states
        self._n += add
        self._views()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k = self._k[indices]
        self._v = self._v[indices]
        self._views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove")
        self._n -= abs(tokens_to_remove)
        self._views()


def can_stack(cache: DynamicCache) -> bool:
    """Only plain full-attention layers are stacked (sliding-window layers keep their own logic)."""
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def cast_cache(cache: DynamicCache, dtype: torch.dtype) -> DynamicCache:
    """The cache's keys and values in ``dtype``, in place: a prefill's cache decoded in another
    dtype (``--dtype bfloat16-prefill``: bfloat16 prefill, float32 decode steps)."""
    for layer in cache.layers:
        if isinstance(layer, GrowingLayer):
            layer._k, layer._v = layer._k.to(dtype), layer._v.to(dtype)
            layer._views()
        elif getattr(layer, "keys", None) is None or layer.keys.dtype == dtype:
            continue
        else:
            layer.keys, layer.values = layer.keys.to(dtype), layer.values.to(dtype)
        layer.dtype = dtype
    return cache


def stack_caches(caches: list[DynamicCache], extra_capacity: int, dtype: torch.dtype | None = None) -> DynamicCache:
    """Left-pad single-row caches to a common length and stack them into one batch (in ``dtype``
    when given: a cast on the way, not a second pass)."""
    width = max(c.layers[0].keys.shape[-2] for c in caches)
    out = DynamicCache()
    layers = []
    for i in range(len(caches[0].layers)):
        ks, vs = [], []
        for c in caches:
            k, v = c.layers[i].keys, c.layers[i].values
            if dtype is not None:
                k, v = k.to(dtype), v.to(dtype)
            pad = width - k.shape[-2]
            if pad:
                k = torch.nn.functional.pad(k, (0, 0, pad, 0))
                v = torch.nn.functional.pad(v, (0, 0, pad, 0))
            ks.append(k)
            vs.append(v)
        layers.append(GrowingLayer(torch.cat(ks), torch.cat(vs), width + extra_capacity))
    out.layers = layers
    return out
