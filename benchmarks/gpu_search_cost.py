"""Exact search cost against batch size on a GPU: the paper's premise that a batch costs one search.

Usage (on a CUDA machine; needs torch only):

    python benchmarks/gpu_search_cost.py [--rows 1000000,5000000] [--out results.md]

For a flat exact index (inner product, 384-dim unit vectors: MiniLM's) and a KNN-LM datastore
(squared L2, 576-dim: SmolLM2's hidden size), both resident on the GPU in fp32 and bf16, the
median wall time of one top-20 search of s queries (s = 1, 2, 3, 4, 8, 16) — one matmul and
``torch.topk``, synchronised — and that cost in single searches. The CPU counterpart is
benchmarks/search_cost.py (results/search_cost.md).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

BATCHES = (1, 2, 3, 4, 8, 16)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1000000,5000000")
    ap.add_argument("--l2-rows", default="1000000,5000000", help="datastore sizes (576-dim fp32: 2.3 GB a million)")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--out", default="-")
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("gpu_search_cost.py needs a CUDA device")
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    lines = [f"Device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", "",
             "| index | rows | dtype | " + " | ".join(f"s={s} ms" for s in BATCHES) + " | "
             + " | ".join(f"x{s}" for s in BATCHES[1:]) + " |",
             "|---|---|---|" + "---|" * (2 * len(BATCHES) - 1)]
    l2_rows = {int(x) for x in args.l2_rows.split(",") if x}
    for n in [int(x) for x in args.rows.split(",")]:
        for name, dim, metric in (("flat IP", 384, "ip"), ("datastore L2", 576, "l2")):
            if metric == "l2" and n not in l2_rows:
                continue
            base = torch.randn(n, dim, device=dev, generator=gen)
            if metric == "ip":
                base /= base.norm(dim=1, keepdim=True)
            for dtype in (torch.float32, torch.bfloat16):
                x = base.to(dtype)
                norms = torch.cat([(c.float() ** 2).sum(1) for c in x.split(1 << 20)]) if metric == "l2" else None
                costs = {}
                for s in BATCHES:
                    times = []
                    for r in range(args.reps):
                        q = torch.randn(s, dim, device=dev, generator=gen).to(dtype)
                        torch.cuda.synchronize()
                        t = time.perf_counter()
                        scores = (q @ x.T).float()
                        if metric == "l2":
                            scores = 2 * scores - norms  # -(|x|^2 - 2 q.x): nearest = largest
                        torch.topk(scores, 20, dim=1).indices.cpu()
                        times.append(time.perf_counter() - t)
                    costs[s] = statistics.median(times[1:])
                lines.append(f"| {name} | {n:,} | {str(dtype).split('.')[-1]} | "
                             + " | ".join(f"{1000 * costs[s]:.2f}" for s in BATCHES) + " | "
                             + " | ".join(f"{costs[s] / costs[1]:.2f}" for s in BATCHES[1:]) + " |")
                print(lines[-1], file=sys.stderr, flush=True)
                del x
            del base
            torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    if args.out == "-":
        print(text)
    else:
        open(args.out, "w").write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
