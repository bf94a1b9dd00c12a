"""Standard RAG throughput: specrag against the ways a user would otherwise run the same model.

Usage (from the repository root, after `make install`):

    .venv/bin/python benchmarks/peers.py [--queries 32] [--dtype float32] [--threads 1] [--batch 16] [--runs 3]

Each system answers every question --runs times, each run from an empty prefix cache (a new
process for the bare peers, a fresh cache namespace for specrag's engines); the median wall time
is recorded, every run's beside it.

Every system answers the same first N PopQA questions with the same ten BM25 documents, the same
prompt token ids (specrag's prompt, chat template applied), greedy decoding, the same stop
string, token limit and end-of-sequence ids, the same weights, dtype and torch threads:

- ``specrag``: the `standard` method through specrag's engine (micro-batches of --batch rows);
  its wall time includes the BM25 searches the others are handed for free.
- ``hf_generate_loop``: transformers' ``model.generate``, one question at a time.
- ``hf_padded_batches``: ``model.generate`` over left-padded batches of --batch questions.
- ``beam_runinference_hf``: Beam's RunInference on the in-process runner, the HF model loaded by
  Beam's PyTorch model handler (its HF handler cannot be imported next to transformers 5), batches
  of --batch from BatchElements, an inference_fn that left-pads and calls ``generate``.
- ``specrag_vllm``: the `standard` method through specrag's engine on ``--backend vllm`` (vLLM's
  server for the model, compiled, prefix caching on; every query in flight at once).
- ``bare_vllm``: vLLM's offline ``LLM.generate`` over all prompts at once (benchmarks/vllm_bare.py,
  in .venv-vllm), the same engine settings.
- ``same_work_vllm``: the script a user would write instead of specrag (benchmarks/vllm_same_work.py,
  in .venv-vllm): it reads the questions' Parquet, searches the same bm25s index with bm25s's own
  ``retrieve``, builds the same prompt text, answers with vLLM's offline ``LLM.chat`` and writes
  Parquet, all timed, where bare vLLM is handed the token ids. ``vs_same_work_peer`` compares
  specrag's best whole job with it; the table's note says how many of its prompts equal specrag's
  token for token (a BM25 tie broken another way changes a document).
- ``openvino_genai`` / ``openvino_genai_int8``: OpenVINO GenAI's continuous-batching pipeline over
  all prompts at once (benchmarks/openvino_bare.py, in .venv-openvino: ``make install-openvino``),
  the model exported with its weights as they are / compressed to int8 (OpenVINO's weight-only
  int8, what its CPU guide recommends for LLMs), computing in the run's dtype. The int8 row is
  shown for reference: ``vs_best_peer`` compares with the best peer running the same weights.
- ``specrag_job`` / ``specrag_job_vllm``: the whole Beam job (``specrag answer``'s ``run_answer``,
  the FnApiRunner: reading the queries' Parquet, the method's stages, writing results, dead letters
  and the manifest) on the local backend / on vLLM; the worker's model is loaded (``load_backend``)
  before the job is timed and counted as its load. With them, ``vs_best_peer`` takes specrag's best
  whole job, not its engine alone.

Model load (weights, and for vLLM its compile and warm-up) is timed apart from the answers; the
break-even number of questions is where specrag on vLLM, load included, overtakes the local backend.

Useful model FLOPs are counted from the model's shapes (weights x tokens, attention over the real
context, the vocabulary projection for each generated token; padding counts as nothing) and divided
by the wall time; ``mfu`` is that rate over the measured peak of a matmul of the model's own
shapes in the same dtype and threads. Writes benchmarks/results/peers.md, ending
``vs_best_peer=<specrag's best backend's throughput / best peer's> vs_same_work_peer=<... / the same-work
peer's> vllm_backend_vs_bare_vllm=<...> mfu=<specrag's share of the matmul peak>`` (a term only when its
systems ran).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
PEERS = ("hf_generate_loop", "hf_padded_batches", "beam_runinference_hf", "bare_vllm", "same_work_vllm",
         "openvino_genai", "openvino_genai_int8")
OPENVINO = {"openvino_genai": "fp32", "openvino_genai_int8": "int8"}  # system -> exported weight format
OTHER_WEIGHTS = ("openvino_genai_int8",)  # int8 weights: shown, but not the peer the claim compares with
OURS = ("specrag", "specrag_vllm")
JOBS = ("specrag_job", "specrag_job_vllm")  # the whole Beam job around the engine


def model_flops(config, prompt_tokens: int, new_tokens: int) -> float:
    """Useful forward FLOPs of one greedy answer: 2 per weight per token, attention's QK^T and AV
    over the causal context, the vocabulary projection where a next token is chosen (the last
    prompt position and each generated one but the last)."""
    d, layers = config.hidden_size, config.num_hidden_layers
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    per_layer = d * heads * head_dim * 2 + d * kv_heads * head_dim * 2 + 3 * d * config.intermediate_size
    weights = layers * per_layer
    total = prompt_tokens + max(new_tokens - 1, 0)  # the last chosen token is never fed back
    attended = total * (total + 1) / 2  # sum over positions of the context each attends to
    attention = layers * 2 * 2 * heads * head_dim * attended
    vocab = 2 * d * config.vocab_size * max(new_tokens, 1)
    return 2 * weights * total + attention + vocab


def matmul_peak(dtype, d: int, ff: int, seconds: float = 2.0) -> float:
    """The best FLOP rate of the model's own GEMM shapes (tokens x d @ d x ff and back) here."""
    import torch
    best = 0.0
    for m in (512, 1024, 2048):
        for k, n in ((d, ff), (ff, d), (d, d)):
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            a @ b
            reps, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / 9:
                a @ b
                reps += 1
            best = max(best, 2 * m * k * n * reps / (time.perf_counter() - start))
    return best


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    cuts = [text.find(s) for s in stop if s and s in text]
    return text[:min(cuts)] if cuts else text


def left_padded(rows: list[list[int]], pad_id: int):
    import torch
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def hf_generate(model, tokenizer, rows: list[list[int]], task: dict) -> list[list[int]]:
    """``model.generate`` as its documentation shows it: greedy, one call per batch."""
    import torch
    ids, mask = left_padded(rows, task["pad_id"])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=task["max_new_tokens"], stop_strings=list(task["stop"]) or None,
                             tokenizer=tokenizer, eos_token_id=task["eos_ids"], pad_token_id=task["pad_id"])
    return [[t for t in row.tolist() if t != task["pad_id"]] for row in out[:, ids.shape[1]:]]


def shared_prefix_tokens(prompts: list[list[int]], block: int = 1) -> int:
    """Prompt tokens a prefix cache could serve at best, whatever the order of the requests: each
    prompt's longest common prefix with its neighbour in sorted order (the most any earlier prompt
    shares with it), in whole blocks of ``block`` tokens (vLLM caches whole blocks only)."""
    ordered = sorted(prompts)
    shared = 0
    for a, b in zip(ordered, ordered[1:]):
        common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        shared += common // block * block
    return shared


def causal_lm_from_config(config, dtype):
    """Beam's PyTorch handler builds the model with ``model_class(**model_params)``."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def run_beam(model, tokenizer, prompts: list[list[int]], task: dict, batch: int, work: Path) -> list[list[int]]:
    """Beam RunInference on the in-process runner, the model loaded by Beam's PyTorch handler
    from a state dict (Beam 2.77's HuggingFaceModelHandlerTensor imports tensorflow and
    transformers' TFAutoModel, which transformers 5 no longer has: it cannot be imported here).
    The inference_fn left-pads the batch and calls ``generate``."""
    import apache_beam as beam
    import torch
    from apache_beam.ml.inference.base import KeyedModelHandler, PredictionResult, RunInference
    from apache_beam.ml.inference.pytorch_inference import PytorchModelHandlerTensor
    from apache_beam.options.pipeline_options import PipelineOptions

    state_dict = work / "model.pt"
    torch.save(model.state_dict(), state_dict)

    def generate_fn(batch, model, device, inference_args, model_id=None):
        generated = hf_generate(model, tokenizer, [t.tolist() for t in batch], inference_args["task"])
        return [PredictionResult(example, g, model_id) for example, g in zip(batch, generated)]

    handler = KeyedModelHandler(PytorchModelHandlerTensor(
        state_dict_path=str(state_dict), model_class=causal_lm_from_config,
        model_params={"config": model.config, "dtype": model.dtype}, device="CPU",
        inference_fn=generate_fn, min_batch_size=batch, max_batch_size=batch))
    options = PipelineOptions(["--direct_num_workers=1", "--direct_running_mode=in_memory"])
    with beam.Pipeline(options=options) as p:
        _ = (p | beam.Create([(i, torch.tensor(ids)) for i, ids in enumerate(prompts)])
             | RunInference(handler, inference_args={"task": task})
             | beam.Map(lambda kv: json.dumps([kv[0], list(kv[1].inference)]))
             | beam.io.WriteToText(str(work / "generated"), shard_name_template="", file_name_suffix=".jsonl"))
    got = dict(json.loads(line) for line in (work / "generated.jsonl").read_text().splitlines())
    return [got[i] for i in range(len(prompts))]


def openvino_python() -> Path:
    """The OpenVINO venv's interpreter (``make install-openvino``), or one line saying how to get it."""
    python = Path(os.environ.get("SPECRAG_OPENVINO_VENV", REPO / ".venv-openvino")) / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"openvino_genai needs OpenVINO's virtualenv and {python} does not exist: run "
                         "`make install-openvino` (or set SPECRAG_OPENVINO_VENV), or leave it out of --systems")
    return python


class PeerFailed(RuntimeError):
    """A peer's own engine failed on this machine: its row is left out and the reason printed under the table."""


def run_bare(python: Path, script: str, marker: str, job: dict, env: dict | None = None) -> dict:
    """One peer run bare in its own venv: the job as JSON on stdin, its result as the JSON after
    ``marker`` (the script's RESULT) on stdout (the engines log to stdout as well)."""
    import signal
    import subprocess
    path = REPO / "benchmarks" / script
    done = subprocess.run([str(python), str(path)], input=json.dumps(job), capture_output=True, text=True, env=env)
    if done.returncode:
        how = (f"killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else f"exit status {done.returncode}")
        raise PeerFailed(f"{script} failed, {how}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}")
    line = next((line for line in done.stdout.splitlines() if line.startswith(marker)), None)
    if line is None:
        raise PeerFailed(f"{script} exited 0 without a {marker.strip()} line\n{done.stdout[-1500:]}")
    return json.loads(line[len(marker):])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16, help="rows per model call for specrag and the batched peers")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each system; the median is recorded")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--systems", default=",".join((*OURS, *PEERS)))
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "peers.md"))
    args = ap.parse_args()
    systems = args.systems.split(",")
    if "specrag" not in systems or not set(systems) & set(PEERS) or set(systems) - {*OURS, *JOBS, *PEERS}:
        raise SystemExit(f"--systems: specrag, at least one of {PEERS}, and optionally specrag_vllm, {', '.join(JOBS)}")
    if set(systems) & set(OPENVINO):
        openvino_python()  # before the long run, not after it

    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from specrag.evaluation.metrics import contains
    from specrag.inference import Engine, EngineConfig, Services
    from specrag.inference.local import LocalBackend, LocalModelConfig
    from specrag.inference.models import materialise
    from specrag.inference.vllm import CPU_BLOCK_SIZE, VllmBackend, VllmConfig
    from specrag.methods import create_method
    from specrag.methods.local_run import run_method
    from specrag.methods.prompts import DOCUMENT_CHARS, MAX_NEW_TOKENS, STOP, build_prompt
    from workloads import machine_line, markdown_table, popqa_bm25, publish

    work, retriever, queries = popqa_bm25(args.data_dir, args.queries, "peers-")
    if {q["task_type"] for q in queries} != {"short_form"}:
        raise SystemExit("peers.py expects short-form questions (one stop string and token limit for all)")
    model_name = "smollm2-135m-instruct"
    loads, exports = {}, {}  # exports: OpenVINO's one-time model conversion, apart from its load
    failed = {}  # a peer whose engine failed here: system -> why (listed under the table)
    same_work = {}  # a peer that builds its own prompts: system -> how many equal specrag's token for token
    started = time.perf_counter()
    backend = LocalBackend(LocalModelConfig(model_name, num_threads=args.threads, dtype=args.dtype))
    loads["specrag"] = time.perf_counter() - started
    lm = backend._impl
    model, tokenizer = lm.model, lm.tokenizer
    task = {"max_new_tokens": MAX_NEW_TOKENS["short_form"], "stop": STOP["short_form"], "eos_ids": lm.eos_ids,
            "pad_id": lm.pad_id}

    # the prompts every peer is handed: specrag's own, as token ids
    hits = retriever.search([q["question"] for q in queries], args.top_k)
    prompts = [lm.prompt_ids(build_prompt(q, h), chat=True) for q, h in zip(queries, hits)]
    prompt_tokens = sum(len(p) for p in prompts)
    warm = prompts[0][:64]
    hf_generate(model, tokenizer, [warm], {**task, "max_new_tokens": 2})  # first-call set-up out of the timings

    rows, answers = [], {}

    def record(system: str, walls: list[float], generated: list[int], texts: list[str]) -> None:
        wall = statistics.median(walls)
        flops = sum(model_flops(model.config, len(p), g) for p, g in zip(prompts, generated))
        answers[system] = [cut_at_stop(t, task["stop"]) for t in texts]
        rows.append({"system": system, "queries": len(texts), "wall_s": wall, "runs_s": " / ".join(f"{w:.1f}" for w in walls),
                     "queries_per_s": len(texts) / wall,
                     "prompt_tokens": prompt_tokens, "generated_tokens": sum(generated),
                     "model_gflop": flops / 1e9, "gflop_per_s": flops / wall / 1e9,
                     "contains_acc": 100 * sum(contains(a, q["answers"]) for a, q in zip(answers[system], queries))
                     / len(queries)})
        print(f"  {system}: {wall:.1f}s (runs {rows[-1]['runs_s']})", file=sys.stderr, flush=True)

    def measure(system: str, once) -> None:
        """``once()`` answers every question from an empty prefix cache and returns (wall seconds,
        generated token counts, texts); it runs --runs times and the median wall is recorded."""
        runs = [once() for _ in range(args.runs)]
        record(system, [r[0] for r in runs], runs[-1][1], runs[-1][2])

    def engine_run(served, label: str):
        """specrag's engine over the prompts' questions: the ``standard`` method, micro-batched."""
        def once():
            served.clear_prefix_cache()
            engine = Engine(Services(models={"generator": served}, retriever=retriever),
                            EngineConfig(max_batch=args.batch, max_wait_s=0.005))
            start = time.perf_counter()
            states, failures = run_method(engine, create_method("standard", top_k=args.top_k), queries)
            wall = time.perf_counter() - start
            engine.close()
            if failures:
                raise SystemExit(f"{label}: {len(failures)} queries failed: {failures[:2]}")
            return wall, [s.trace.counts["generated_tokens"] for s in states], [s.raw_output for s in states]
        return once

    before = dict(lm.stats)
    measure("specrag", engine_run(backend, "specrag"))
    if lm.stats["prefill_tokens"] - before["prefill_tokens"] != args.runs * prompt_tokens:
        raise SystemExit("specrag's prompts are not the ones handed to the peers")
    specrag_split = {k: (lm.stats[k] - before[k]) / args.runs for k in ("prefill_s", "decode_s")}

    if "specrag_vllm" in systems:
        from specrag.inference.types import GenerateRequest
        started = time.perf_counter()
        served = VllmBackend(model_name, VllmConfig(), dtype=args.dtype, threads=args.threads)
        served.generate([GenerateRequest("Hello", max_new_tokens=2)])  # first-call set-up, as for the others
        loads["specrag_vllm"] = time.perf_counter() - started
        measure("specrag_vllm", engine_run(served, "specrag_vllm"))
        served.server.stop()
    if set(systems) & {"bare_vllm", "same_work_vllm"}:
        from specrag.inference.vllm_server import VllmServer, VllmServerConfig, vllm_python
        folder = str(materialise(model_name))
        server = VllmServer(VllmServerConfig(model_name, folder, dtype=args.dtype, threads=args.threads))
        engine_job = {"folder": folder, "dtype": args.dtype, "max_model_len": server.config.max_model_len,
                      "max_num_seqs": server.config.max_num_seqs, "max_new_tokens": task["max_new_tokens"],
                      "stop": list(task["stop"]), "eos_ids": list(task["eos_ids"])}

        def bare_run(system: str, script: str, marker: str, job: dict):
            def once():  # a new process each run: an empty prefix cache, a fresh load
                bare = run_bare(vllm_python(), script, marker, job, env=server.environment())
                loads[system] = bare["load_s"]
                if "prompt_ids" in bare:  # the peer built its own prompts: are they specrag's?
                    same_work[system] = {"equal": sum(a == b for a, b in zip(bare["prompt_ids"], prompts)),
                                         "wall_s": bare["wall_s"], "search_s": bare["search_s"],
                                         "generate_s": bare["generate_s"]}
                return bare["wall_s"], [len(g) for g in bare["token_ids"]], lm.detokenize(bare["token_ids"])
            return once
        if "bare_vllm" in systems:
            measure("bare_vllm", bare_run("bare_vllm", "vllm_bare.py", "BARE_VLLM_RESULT ",
                                          {**engine_job, "prompts": prompts}))
        if "same_work_vllm" in systems:
            from specrag.methods.prompts import INSTRUCTIONS
            measure("same_work_vllm", bare_run("same_work_vllm", "vllm_same_work.py", "SAME_WORK_VLLM_RESULT ", {
                **engine_job, "queries": str(work / "data" / "popqa" / "queries.parquet"), "limit": len(queries),
                "passages": str(work / "index" / "passages.parquet"), "bm25": str(work / "index" / "bm25"),
                "k": args.top_k, "instruction": INSTRUCTIONS["short_form"], "max_chars": DOCUMENT_CHARS,
                "output": str(work / "same-work-answers.parquet")}))
    for system in (s for s in OPENVINO if s in systems):
        job = {"folder": str(materialise(model_name)), "weights": OPENVINO[system], "dtype": args.dtype,
               "threads": args.threads, "prompts": prompts,
               "max_num_seqs": VllmConfig().max_num_seqs,  # the scheduler's width as vLLM's, the rest its defaults
               "max_new_tokens": task["max_new_tokens"], "stop": list(task["stop"]), "eos_ids": list(task["eos_ids"])}

        def openvino_once():
            bare = run_bare(openvino_python(), "openvino_bare.py", "BARE_OPENVINO_RESULT ", job,
                            env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
            loads[system], exports[system] = bare["load_s"], bare["export_s"]
            return bare["wall_s"], [len(g) for g in bare["token_ids"]], lm.detokenize(bare["token_ids"])
        try:
            measure(system, openvino_once)
        except PeerFailed as e:
            print(f"  {system}: {e}", file=sys.stderr, flush=True)
            failed[system] = str(e).splitlines()[0]

    for system in (s for s in JOBS if s in systems):
        import pyarrow.parquet as pq
        from specrag.pipelines.answer import AnswerJob, run_answer
        from specrag.transforms.runtime import RuntimeConfig, load_backend
        kind = "vllm" if system.endswith("_vllm") else "local"
        vllm = (VllmConfig(),) if kind == "vllm" else ()
        runtime = RuntimeConfig(backend=kind, models=(("generator", model_name),), index_dir=str(work / "index"),
                                retriever="bm25", num_threads=args.threads, dtype=args.dtype, backend_configs=vllm,
                                engine=EngineConfig(max_batch=args.batch, max_wait_s=0.005))
        started = time.perf_counter()
        worker_model = load_backend(kind, model_name, args.threads, args.dtype, configs=vllm)  # the job reuses it
        loads[system] = time.perf_counter() - started

        def job_once(run=iter(range(args.runs))):
            out = work / f"{system}-{next(run)}"  # a new folder each run: a finished one would be resumed
            worker_model.clear_prefix_cache()
            start = time.perf_counter()
            run_answer(AnswerJob(str(work / "data" / "popqa" / "queries.parquet"), str(out),
                                 create_method("standard", top_k=args.top_k), runtime, limit=len(queries)))
            wall = time.perf_counter() - start
            results = {r["id"]: r for r in pq.read_table(sorted(out.glob("results-*.parquet"))).to_pylist()}
            if set(results) != {q["id"] for q in queries}:
                raise SystemExit(f"{system}: {len(results)} of {len(queries)} queries answered")
            done = [results[q["id"]] for q in queries]
            return wall, [r["counts"]["generated_tokens"] for r in done], [r["raw_output"] for r in done]
        measure(system, job_once)
        if getattr(worker_model, "server", None) is not None:
            worker_model.server.stop()

    def timed(call):
        start = time.perf_counter()
        generated = call()
        return time.perf_counter() - start, [len(g) for g in generated], lm.detokenize(generated)
    if "hf_generate_loop" in systems:
        measure("hf_generate_loop", lambda: timed(lambda: [hf_generate(model, tokenizer, [p], task)[0] for p in prompts]))
    if "hf_padded_batches" in systems:
        measure("hf_padded_batches", lambda: timed(lambda: [
            g for i in range(0, len(prompts), args.batch) for g in hf_generate(model, tokenizer, prompts[i:i + args.batch], task)]))
    if "beam_runinference_hf" in systems:
        def beam_once():
            with tempfile.TemporaryDirectory(prefix="peers-beam-") as tmp:
                return timed(lambda: run_beam(model, tokenizer, prompts, task, args.batch, Path(tmp)))
        measure("beam_runinference_hf", beam_once)
    peak = matmul_peak(lm.config.torch_dtype(), model.config.hidden_size, model.config.intermediate_size)
    for r in rows:
        r["mfu"] = r["gflop_per_s"] * 1e9 / peak
        r["load_s"] = loads.get(r["system"])
        r["same_answers"] = sum(a == b for a, b in zip(answers[r["system"]], answers["specrag"]))
    by = {r["system"]: r for r in rows}
    ours_set = JOBS if set(JOBS) & set(by) else OURS  # the whole job, when it ran
    ours = max((r for r in rows if r["system"] in ours_set), key=lambda r: r["queries_per_s"])
    same_weights = [r for r in rows if r["system"] in PEERS and r["system"] not in OTHER_WEIGHTS]
    if not same_weights:
        raise SystemExit(f"no peer with the same weights ran: {failed or 'only ' + ', '.join(OTHER_WEIGHTS)}")
    best = max(same_weights, key=lambda r: r["queries_per_s"])
    cols = ["system", "queries", "load_s", "wall_s", "runs_s", "queries_per_s", "prompt_tokens", "generated_tokens",
            "model_gflop", "gflop_per_s", "mfu", "same_answers", "contains_acc"]
    claim = f"vs_best_peer={ours['queries_per_s'] / best['queries_per_s']:.2f}"
    extra = ""
    for system, how in same_work.items():
        # what a RAG batch could save over the peer: its retrieval and I/O (overlapped), and the
        # prompt tokens one prompt shares with another (a prefix cache), taken as all of generation's time
        block = VllmConfig().block_size or CPU_BLOCK_SIZE
        shared = {b: shared_prefix_tokens(prompts, b) / prompt_tokens for b in (1, block)}
        wall = how["wall_s"]  # the split is of one run (the last), not of the median's
        ceiling = wall / (how["generate_s"] * (1 - shared[block]))
        claim += (f" vs_same_work_peer={ours['queries_per_s'] / by[system]['queries_per_s']:.2f}"
                  f" same_work_ceiling={ceiling:.2f}")
        extra += (f" {system} (its last run, {wall:.1f} s): reading, BM25 and prompts {how['search_s']:.2f} s, "
                  f"generation {how['generate_s']:.1f} s, the rest (the Parquet write) "
                  f"{wall - how['search_s'] - how['generate_s']:.2f} s;"
                  f" {how['equal']} of {len(prompts)} prompts equal specrag's token for token. Its prompts share "
                  f"{100 * shared[1]:.1f}% of their tokens with another at best ({100 * shared[block]:.1f}% in whole "
                  f"{block}-token blocks), so a job doing the same work beats it by at most {ceiling:.2f}x here "
                  "(its time outside generation overlapped, and the shared blocks' share of generation saved).")
    if "specrag_vllm" in by and "bare_vllm" in by:
        ratio = by["specrag_vllm"]["queries_per_s"] / by["bare_vllm"]["queries_per_s"]
        claim += f" vllm_backend_vs_bare_vllm={ratio:.2f}"
        local, served = by["specrag"], by["specrag_vllm"]
        saved = 1 / local["queries_per_s"] - 1 / served["queries_per_s"]  # seconds per question
        extra += (f" Break-even: specrag on vLLM, its load included, overtakes the local backend after "
                 f"{(served['load_s'] - local['load_s']) / saved:.0f} questions." if saved > 0 else
                 " specrag on vLLM answered no faster than on the local backend here: no break-even.")
    lines = ["", *markdown_table(rows, cols), "",
             f"Measured matmul peak ({args.dtype}, {args.threads} thread(s), the model's GEMM shapes): "
             f"{peak / 1e9:.1f} GFLOP/s. specrag's model time: prefill {specrag_split['prefill_s']:.1f} s, "
             f"decode {specrag_split['decode_s']:.1f} s. specrag's best backend: {ours['system']}; best peer: "
             f"{best['system']}.{extra}"
             + "".join(f" {s}'s export to OpenVINO IR: {t:.1f} s (once per model; 0 when cached)."
                       for s, t in exports.items())
             + "".join(f" **{s} did not run**: {why}." for s, why in failed.items())]
    publish(args.results, "Standard RAG throughput: specrag and its peers",
            f"{machine_line(args.threads)}, dtype {args.dtype}; data: first {len(queries)} PopQA questions, "
            f"BM25 over the pooled corpus of the shared sets, top-{args.top_k} documents; batches of {args.batch}.",
            "\n".join(lines), f"{claim} mfu={ours['mfu']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
