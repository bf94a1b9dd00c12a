"""What one training step of a drafter costs, by base and recipe, before hours are committed to it.

    python benchmarks/drafter_step_cost.py --base qwen2.5-coder-0.5b-instruct --steps 3 --threads 2

The same batches of real rationales (the first synthesis' kept rows, benchmarks/results/drafter/
synthesis) through `training/drafter.py`'s own loss (forward passes of 2, gradients accumulated to the step
of 8, as `--micro-batch 2`), one optimizer step each: full fine-tuning in
float32, a LoRA adapter of rank 8 in float32, and the adapter with bf16 matmuls. Every variant
sees the same batches in the same order, in one run, so their ratio holds on this machine. Records
benchmarks/results/drafter_step_cost.md: the median seconds a step (the first step, which pays
for allocation, is left out when there are more), the peak resident memory, and the hours the
recipes of benchmarks/speculative_rag_pays.py would take at that cost; claim line
``lora_bf16_step_s=… full_step_s=… lora_speedup=…``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from drafter import SYNTHESIS  # noqa: E402
from workloads import REPO, machine_line, markdown_table, publish  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "drafter_step_cost.md"
# each step of 8 in forward passes of 2 (--micro-batch): whole, a long batch's activations took
# 18 GB with bf16 matmuls and the float32 variants were killed for memory on 23 GB
VARIANTS = {"full fine-tuning, float32": {"micro_batch": 2}, "LoRA r=8, float32": {"lora_rank": 8, "micro_batch": 2},
            "LoRA r=8, bf16 matmuls": {"lora_rank": 8, "compute_dtype": "bfloat16", "micro_batch": 2}}


def one_variant(base: str, settings: dict, steps: int, batch: int, threads: int) -> dict:
    """Run in a fresh process (its own peak memory): seconds per step, loss, tokens."""
    import pyarrow.parquet as pq
    import torch
    from specrag.pipelines.drafter import validate_rationale
    from specrag.training.drafter import DrafterTrainingConfig, accumulated_loss, encode, trainable
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = DrafterTrainingConfig(**settings)
    rows = pq.read_table(REPO / SYNTHESIS / "rationales.parquet").to_pylist()
    examples = [e for r in rows[:steps * batch] for e in validate_rationale(r, frozenset())]
    tokenizer, model, trained = trainable(base, config)
    optimizer = torch.optim.AdamW(trained, lr=1e-4)
    end = [tokenizer.eos_token_id]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end[0]
    encoded = [encode(tokenizer, e, True, end) for e in examples]
    model.train()
    seconds, losses = [], []
    for s in range(steps):
        chunk = encoded[s * batch:(s + 1) * batch]
        started = time.perf_counter()
        optimizer.zero_grad()
        loss = accumulated_loss(model, chunk, pad, config)
        optimizer.step()
        seconds.append(round(time.perf_counter() - started, 2))
        losses.append(round(float(loss.detach()), 4))
    return {"seconds": seconds, "losses": losses, "trained_parameters": sum(p.numel() for p in trained),
            "tokens": sum(len(p) + len(r) for p, r in encoded) / len(encoded),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # one variant, in the child process
    args = ap.parse_args()
    if args.variant:
        print(json.dumps(one_variant(args.base, VARIANTS[args.variant], args.steps, args.batch, args.threads)))
        return
    rows, measured, tokens = [], {}, None
    for name in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--base", args.base, "--steps", str(args.steps), "--batch",
                              str(args.batch), "--threads", str(args.threads), "--variant", name],
                             capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"})
        if out.returncode:
            rows.append({"variant": name, "s/step (median)": f"failed: exit {out.returncode}"})
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        tokens = r["tokens"]
        step = round(statistics.median(r["seconds"][1:] or r["seconds"]), 1)
        measured[name] = step
        rows.append({"variant": name, "trained parameters": f"{r['trained_parameters']:,}",
                     "s/step (median)": f"{step:.1f}", "steps (s)": ", ".join(map(str, r["seconds"])),
                     "loss by step": ", ".join(map(str, r["losses"])), "peak RSS GB": r["peak_rss_gb"],
                     "500 rationales, 2 epochs (h)": f"{step * 2 * 500 / args.batch / 3600:.1f}",
                     "2,400 rationales (h)": f"{step * 2 * 2400 / args.batch / 3600:.1f}"})
        print(json.dumps({name: r}), flush=True)
    full, lora = measured.get("full fine-tuning, float32"), measured.get("LoRA r=8, bf16 matmuls")
    claim = (f"lora_bf16_step_s={lora if lora is not None else 'na'} full_step_s={full if full is not None else 'na'} "
             f"lora_speedup={f'{full / lora:.2f}' if full and lora else 'na'}")
    setup = (f"{machine_line(args.threads)}. Base {args.base}; batch {args.batch} of the first synthesis' kept "
             f"rationales (mean {tokens or 0:.0f} tokens an example), {args.steps} steps a variant, each variant in "
             "a fresh process; hours: 2 epochs at the median step, held-out checks and checkpoints not counted.")
    publish(str(RESULTS), "A drafter's training step, by recipe", setup,
            "\n".join(markdown_table(rows, max((list(r) for r in rows), key=len))), claim)


if __name__ == "__main__":
    main()
