"""Prefill and one decode step, float32 against bfloat16, at batch 1 and 16: where each dtype pays.

Usage (from the repository root, after `make install`; nothing else running):

    .venv/bin/python benchmarks/decode_dtype.py [--model smollm2-135m-instruct] [--context 1500] [--threads 1]

Random prompt ids of ``--context`` tokens, the model's own forward with its KV cache (no engine):
the prefill's wall time, then the median of 20 decode steps after 4 warm ones. Prints a markdown
table and the claim line ``bf16_prefill_speedup=… bf16_decode_b1_speedup=… bf16_decode_b16_speedup=…``
(above 1: bfloat16 is faster). The basis for a dtype per phase in the local backend (#68).
"""
from __future__ import annotations

import argparse
import statistics
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.cache_utils import DynamicCache
    from specrag.inference.models import materialise
    torch.set_num_threads(args.threads)
    path = materialise(args.model)
    times = {}
    print("| dtype | batch | prefill s | decode step ms |\n|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        for batch in (1, 16):
            ids = torch.randint(10, model.config.vocab_size - 10, (batch, args.context),
                                generator=torch.Generator().manual_seed(0))
            with torch.no_grad():
                cache = DynamicCache()
                start = time.perf_counter()
                out = model(input_ids=ids, past_key_values=cache, use_cache=True)
                prefill = time.perf_counter() - start
                token, steps = out.logits[:, -1:].argmax(-1), []
                for _ in range(24):
                    start = time.perf_counter()
                    out = model(input_ids=token, past_key_values=cache, use_cache=True)
                    steps.append(time.perf_counter() - start)
                    token = out.logits[:, -1:].argmax(-1)
            step = statistics.median(steps[4:])
            times[(str(dtype).split(".")[1], batch)] = (prefill, step)
            print(f"| {str(dtype).split('.')[1]} | {batch} | {prefill:.2f} | {1000 * step:.1f} |", flush=True)
    f32, b16 = "float32", "bfloat16"
    print(f"\nbf16_prefill_speedup={times[(f32, 16)][0] / times[(b16, 16)][0]:.2f} "
          f"bf16_decode_b1_speedup={times[(f32, 1)][1] / times[(b16, 1)][1]:.2f} "
          f"bf16_decode_b16_speedup={times[(f32, 16)][1] / times[(b16, 16)][1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
