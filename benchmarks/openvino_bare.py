"""Bare OpenVINO GenAI for benchmarks/peers.py: its continuous-batching pipeline on the given
prompt token ids.

Run by the OpenVINO venv's Python (``.venv-openvino/bin/python``, ``make install-openvino``: its
exporter cannot be imported beside specrag); reads a JSON job on stdin (specrag's model folder,
weight format, dtype, threads, prompts as token ids, sampling settings) and prints one JSON line
after ``RESULT``: the export time (0 when the exported model was cached), the pipeline's load
time, the generation wall time and each prompt's generated token ids.

The model is exported once per weight format with ``optimum-cli export openvino`` (OpenVINO's
documented path; ``int8`` is its weight-only compression, ``fp32`` keeps the weights as they
are) into ``~/.cache/specrag/openvino/``. The run's dtype is OpenVINO's inference precision
hint (bf16 on a CPU with AMX or AVX512-BF16), its threads ``INFERENCE_NUM_THREADS``; prefix
caching is on, as for vLLM; the scheduler's other settings are OpenVINO's defaults.

Known here: OpenVINO 2026.4.1 dies with SIGFPE compiling a model whose weights are not compressed
for bf16 on one thread (openvinotoolkit/openvino#33300, fp16 weights under ``taskset -c 0``; the
same with fp32 weights and ``INFERENCE_NUM_THREADS=1``); the int8 export and f32 both run.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULT = "BARE_OPENVINO_RESULT "
PRECISION = {"float32": "f32", "bfloat16": "bf16"}


def exported(folder: str, weights: str) -> tuple[Path, float]:
    """The model exported to OpenVINO IR with the given weight format, and the seconds it took
    (0 when an export of the same folder, format and OpenVINO version was there already)."""
    import openvino
    cache = Path(os.environ.get("SPECRAG_CACHE", Path.home() / ".cache" / "specrag"))
    out = cache / "openvino" / f"{Path(folder).name}-{weights}"
    key = json.dumps({"folder": str(Path(folder).resolve()), "weights": weights, "openvino": openvino.__version__})
    stamp = out / ".specrag-exported"
    if stamp.exists() and stamp.read_text() == key:
        return out, 0.0
    started = time.perf_counter()
    cli = Path(sys.executable).parent / "optimum-cli"
    done = subprocess.run([str(cli), "export", "openvino", "--model", folder, "--task", "text-generation-with-past",
                           "--weight-format", weights, str(out)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"optimum-cli export failed ({done.returncode}):\n{done.stderr[-3000:]}")
    stamp.write_text(key)
    return out, time.perf_counter() - started


def main() -> int:
    job = json.load(sys.stdin)
    model_dir, export_s = exported(job["folder"], job["weights"])
    started = time.perf_counter()
    import openvino as ov
    import openvino_genai as genai
    scheduler = genai.SchedulerConfig()
    scheduler.cache_size = 1  # GB of KV cache: the prompts of one run fit many times over
    scheduler.enable_prefix_caching = True
    scheduler.max_num_seqs = job["max_num_seqs"]
    pipe = genai.ContinuousBatchingPipeline(
        str(model_dir), scheduler, "CPU",
        {"INFERENCE_NUM_THREADS": job["threads"], "INFERENCE_PRECISION_HINT": PRECISION[job["dtype"]]})
    loaded = time.perf_counter()
    config = genai.GenerationConfig()
    config.do_sample = False
    config.max_new_tokens = job["max_new_tokens"]
    config.stop_strings = set(job["stop"])
    config.stop_token_ids = set(job["eos_ids"])
    warm = genai.GenerationConfig()
    warm.max_new_tokens = 2
    pipe.generate([ov.Tensor([job["prompts"][0][:64]])], [warm])  # first-call set-up out of the timing
    tensors = [ov.Tensor([p]) for p in job["prompts"]]
    start = time.perf_counter()
    outputs = pipe.generate(tensors, [config] * len(tensors))
    wall = time.perf_counter() - start
    ids = [[t for t in o.m_generation_ids[0] if t not in job["eos_ids"]] for o in outputs]
    print(RESULT + json.dumps({"export_s": export_s, "load_s": loaded - started, "wall_s": wall, "token_ids": ids}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
