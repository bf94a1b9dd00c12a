"""Runtime scaling: worker processes, the per-process engine vs fixed batches, and memory.

Every run is a real `specrag answer` job (FnApiRunner) in a fresh child process, on PopQA
with BM25 over the pooled corpus, SmolLM2 at one torch thread per worker:

- standard RAG on the first ``--questions`` PopQA questions with 1 and 2 worker processes
  (``--direct_running_mode=multi_processing``), and with 1 worker in the earlier execution
  (``--execution fixed-batch``: shard, batch by key, drain one batch at a time) at the same
  batch size as the engine's micro-batches;
- peak RSS (VmHWM of the single worker process, sampled) at 10% / 50% / 100% of the answered
  queries for standard RAG over ``--rss-standard`` questions and Speculative RAG over
  ``--rss-specrag``.

    python benchmarks/scaling.py --questions 128 --rss-standard 1000 --rss-specrag 100

Claim line: scaling_2w (queries/s with 2 workers over 1), engine_vs_fixed_batch (queries/s of
the engine over fixed batches, 1 worker), rss_growth (largest peak-RSS ratio 100%/10%).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import imported_data, machine_line, markdown_table, publish  # noqa: E402

RESULTS = "benchmarks/results/scaling.md"
WORK = Path(os.environ.get("SPECRAG_BENCH_DIR", "/tmp/specrag-srag-bench"))


def prepare(data_dir: str) -> Path:
    from specrag.pipelines.build_index import run_build_index
    data = imported_data(WORK, data_dir)
    if not (WORK / "index" / "manifest.json").exists():
        run_build_index(str(data / "pooled_corpus.parquet"), str(WORK / "index"), ["bm25"])
    return data


def subset(data: Path, n: int) -> str:
    import pyarrow.parquet as pq
    path = WORK / "scaling" / f"popqa-{n}.parquet"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pq.read_table(data / "popqa" / "queries.parquet").slice(0, n)
        pq.write_table(table, path, row_group_size=16)
    return str(path)


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def run_one(spec: dict) -> dict:
    """In the child: one answer job; wall time and peak RSS at 10/50/100% of the answers."""
    from specrag.inference.engine import EngineConfig
    from specrag.methods import create_method
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.transforms.runtime import RuntimeConfig
    method = create_method(spec["method"], **spec["settings"])
    runtime = RuntimeConfig(index_dir=str(WORK / "index"), num_threads=1,
                            engine=EngineConfig(max_batch=spec["batch"], max_in_flight=spec["in_flight"])
                            ).with_roles(method.model_roles)
    out = Path(spec["out"])
    shutil.rmtree(out, ignore_errors=True)  # progress is counted from this run's shards only
    n, shard = spec["n"], spec["shard_rows"]
    marks, samples, stop = {}, [], threading.Event()

    def sample():
        while not stop.is_set():
            done = len(list(out.glob("results-*.parquet"))) * shard
            samples.append((done, _vm("VmRSS")))
            for frac in (0.1, 0.5):
                if done >= frac * n and frac not in marks:
                    marks[frac] = _vm("VmHWM")
            stop.wait(0.5)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    manifest = run_answer(AnswerJob(spec["queries"], str(out), method, runtime, beam_args=tuple(spec["beam_args"]),
                                    execution=spec["execution"], batch_size=spec["batch"], num_shards=4,
                                    shard_rows=shard, overwrite=True))
    wall = time.perf_counter() - start
    marks[1.0] = _vm("VmHWM")
    stop.set()
    sampler.join()
    return {"wall_s": wall, "answered": manifest["counters"].get("answered", 0),
            "dead": manifest["dead_letter_share"], "rss": {str(k): v for k, v in marks.items()},
            "counters": manifest["counters"]}


def measured_path(spec: dict) -> Path:
    """Each run's measurement is kept (per spec): a later invocation re-runs only what changed."""
    key = hashlib.sha256(json.dumps({k: v for k, v in spec.items() if k != "out"}, sort_keys=True).encode()).hexdigest()
    return WORK / "scaling" / "measured" / f"{key[:16]}.json"


def launch(spec: dict) -> dict:
    kept = measured_path(spec)
    if kept.exists():
        result = json.loads(kept.read_text())
        print(f"{spec['label']}: {result['wall_s']:.1f} s, {result['answered']} answered (kept measurement)")
        return result
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "SPECRAG_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"run {spec['label']} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(result))
    print(f"{spec['label']}: {result['wall_s']:.1f} s, {result['answered']} answered", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.environ.get("SPECRAG_DATA", "../shared/data"))
    ap.add_argument("--questions", type=int, default=128)
    ap.add_argument("--rss-standard", type=int, default=1000)
    ap.add_argument("--rss-specrag", type=int, default=100)
    ap.add_argument("--batch", type=int, default=16, help="engine micro-batch = fixed batch size")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(json.loads(args.one))))
        return
    data = prepare(args.data_dir)
    runs = WORK / "scaling" / "runs"
    standard = {"method": "standard", "settings": {"top_k": 5, "max_new_tokens": 32}}
    one = ["--runner=FnApiRunner"]
    two = one + ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    base = {"batch": args.batch, "in_flight": 64, "shard_rows": 8, "n": args.questions,
            "queries": subset(data, args.questions)}
    scaling = {
        "engine, 1 worker": {**base, **standard, "beam_args": one, "execution": "streaming"},
        "engine, 2 workers": {**base, **standard, "beam_args": two, "execution": "streaming"},
        "fixed batches, 1 worker": {**base, **standard, "beam_args": one, "execution": "fixed-batch"},
    }
    measured = {}
    for label, spec in scaling.items():
        measured[label] = launch({**spec, "label": label, "out": str(runs / label.replace(" ", "").replace(",", "-"))})
    rows = []
    for label, m in measured.items():
        rows.append({"run": label, "questions": args.questions, "answered": m["answered"], "wall_s": m["wall_s"],
                     "queries_per_s": m["answered"] / m["wall_s"]})
    qps = {r["run"]: r["queries_per_s"] for r in rows}
    scaling_2w = qps["engine, 2 workers"] / qps["engine, 1 worker"]
    engine_vs_fixed = qps["engine, 1 worker"] / qps["fixed batches, 1 worker"]

    rss_specs = {
        f"standard RAG, {args.rss_standard} PopQA": {
            **standard, "n": args.rss_standard, "queries": subset(data, args.rss_standard)},
        f"Speculative RAG, {args.rss_specrag} PopQA": {
            "method": "speculative-rag", "settings": {"answer_max_new_tokens": 32, "rationale_max_new_tokens": 32},
            "n": args.rss_specrag, "queries": subset(data, args.rss_specrag)},
    }
    rss_rows = []
    for label, spec in rss_specs.items():
        m = launch({**spec, "label": label, "batch": args.batch, "in_flight": 64,
                    "shard_rows": max(1, spec["n"] // 20), "beam_args": one, "execution": "streaming",
                    "out": str(runs / label.split(",")[0].replace(" ", "-"))})
        gb = {k: v / 2 ** 30 for k, v in m["rss"].items()}
        rss_rows.append({"run": label, "answered": m["answered"], "wall_s": m["wall_s"],
                         "peak_rss_10%_GB": gb.get("0.1", float("nan")), "peak_rss_50%_GB": gb.get("0.5", float("nan")),
                         "peak_rss_100%_GB": gb["1.0"], "growth_100/10": gb["1.0"] / gb.get("0.1", gb["1.0"])})
    rss_growth = max(r["growth_100/10"] for r in rss_rows)
    setup = (f"{machine_line(1)}; one torch thread per worker process; SmolLM2-135M-Instruct fp32; BM25 over the "
             f"pooled corpus. Standard RAG: top-5 documents, 32 new tokens; engine micro-batch {args.batch}, "
             f"at most 64 queries in flight per worker; fixed batches of {args.batch} queries (4 shard keys). "
             "Speculative RAG: paper settings (top-10, 5 drafts of 2 documents, Gemma-3-270M verifier) with 32-token "
             "answers and rationales. Each run is a fresh child process; wall time includes model loading.\n")
    report = "\n".join(["", "## Throughput", "", *markdown_table(rows, ["run", "questions", "answered", "wall_s",
                                                                          "queries_per_s"]),
                        "", "## Peak RSS of the worker process during a run", "",
                        *markdown_table(rss_rows, ["run", "answered", "wall_s", "peak_rss_10%_GB", "peak_rss_50%_GB",
                                                   "peak_rss_100%_GB", "growth_100/10"])])
    last = f"scaling_2w={scaling_2w:.2f} engine_vs_fixed_batch={engine_vs_fixed:.2f} rss_growth={rss_growth:.2f}"
    publish(RESULTS, "Runtime scaling and memory", setup, report, last)


if __name__ == "__main__":
    main()
