"""The adapted denoiser's prompt cache: one denoising step with the prompts' keys and values
reused, against the full forward over prompt + window.

SARDI's steps repeat their prompt while the evidence is unchanged (every step for DLM static
retrieval; SARDI reuses the last result while its query is unchanged). The adapted denoiser's
prompt attends causally to itself (inference/ar_denoiser.py), so its keys and values can be
kept; a step then computes the prompt's last token and the response window only, and the LM
head only at the still-masked positions.

Workload: SmolLM2-135M-Instruct adapted (untrained: the cost does not depend on the weights),
``--rows`` SARDI prompts of 7 passages of 40 words from the pooled corpus, a 100-token window.
Measured: the first step (prompts computed and cached), a later step (all masked: the cache
alone), a late step (a quarter masked: the head only there), and the full forward; the
argmax of the cached step against the full forward's.

    python benchmarks/denoiser_prompt_cache.py --rows 20 --threads 2

Claim line: speedup_all_masked (full / cached step), speedup_quarter_masked, argmax_equal (rows).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import imported_data, machine_line, markdown_table, publish  # noqa: E402

RESULTS = "benchmarks/results/denoiser_prompt_cache.md"
WORK = Path(os.environ.get("SPECRAG_BENCH_DIR", "/tmp/specrag-srag-bench"))
WINDOW, PASSAGES, PASSAGE_WORDS = 100, 7, 40


def median_seconds(f, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        f()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.environ.get("SPECRAG_DATA", "../shared/data"))
    ap.add_argument("--rows", type=int, default=20, help="queries in one denoising step (SARDI batches them)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import pyarrow.parquet as pq
    import torch
    from specrag.inference.ar_denoiser import new_ar_denoiser
    from specrag.training.denoiser import DenoiserReport, DenoiserTrainingConfig, save_trained
    from specrag.inference.local_base import LocalModelConfig
    from specrag.inference.local_denoiser import LocalDenoiser
    from specrag.inference.models import materialise
    from specrag.inference.types import DenoiseRequest
    from specrag.methods.prompts import sardi_prompt
    torch.manual_seed(0)
    data = imported_data(WORK, args.data_dir)
    corpus = pq.read_table(data / "pooled_corpus.parquet", columns=["title", "text"]).to_pylist()
    folder = Path(tempfile.mkdtemp(prefix="adapted-"))
    model, tokenizer = new_ar_denoiser(materialise("smollm2-135m-instruct"))
    save_trained(model, tokenizer, DenoiserTrainingConfig(response_tokens=WINDOW, max_positions=1024),
                 DenoiserReport(), folder, "smollm2-135m-instruct", True, {})
    del model
    served = LocalDenoiser(LocalModelConfig(str(folder), num_threads=args.threads))
    contexts = []
    for i in range(args.rows):
        docs = corpus[i * PASSAGES:(i + 1) * PASSAGES]
        contexts.append(sardi_prompt(f"Which passage names question {i}?",
                                     [" ".join(f"{d['title']}: {d['text']}".split()[:PASSAGE_WORDS]) for d in docs]))
    m = served.mask_id
    every = [DenoiseRequest(c, (m,) * WINDOW) for c in contexts]
    quarter = [DenoiseRequest(c, tuple(m if i % 4 == 0 else 1000 + i for i in range(WINDOW))) for c in contexts]
    prompt_tokens = statistics.mean(len(served.inputs.context_ids(c)) for c in contexts)
    started = time.perf_counter()
    cached = served.denoise(every)
    first = time.perf_counter() - started
    rows = [{"step": "first (prompts computed, then cached)", "masked": WINDOW, "seconds": round(first, 3)}]
    warm_all = median_seconds(lambda: served.denoise(every), args.repeats)
    warm_quarter = median_seconds(lambda: served.denoise(quarter), args.repeats)
    cache, served.prompt_cache = served.prompt_cache, None  # the full forward over prompt + window
    full_all = median_seconds(lambda: served.denoise(every), args.repeats)
    full_quarter = median_seconds(lambda: served.denoise(quarter), args.repeats)
    full = served.denoise(every)
    served.prompt_cache = cache
    equal = sum(a.argmax == b.argmax for a, b in zip(cached, full))
    rows += [{"step": "later, prompts cached", "masked": WINDOW, "seconds": round(warm_all, 3),
              "full_forward_s": round(full_all, 3), "speedup": round(full_all / warm_all, 2)},
             {"step": "late, prompts cached", "masked": WINDOW // 4, "seconds": round(warm_quarter, 3),
              "full_forward_s": round(full_quarter, 3), "speedup": round(full_quarter / warm_quarter, 2)}]
    setup = (f"{machine_line(args.threads)}. One denoising step of {args.rows} SARDI prompts ({prompt_tokens:.0f} "
             f"tokens on average: {PASSAGES} pooled-corpus passages of {PASSAGE_WORDS} words) with a {WINDOW}-token "
             f"window; SmolLM2-135M-Instruct adapted (untrained), float32; median of {args.repeats}.\n")
    report = "\n".join(["", "## One denoising step", "", *markdown_table(rows, ["step", "masked", "seconds",
                                                                               "full_forward_s", "speedup"]),
                        "", f"Rows whose argmax equals the full forward's: {equal}/{args.rows}."])
    publish(RESULTS, "The adapted denoiser's prompt cache", setup, report,
            f"speedup_all_masked={full_all / warm_all:.2f} speedup_quarter_masked={full_quarter / warm_quarter:.2f} "
            f"argmax_equal={equal}/{args.rows}")


if __name__ == "__main__":
    main()
