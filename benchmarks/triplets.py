"""Triplet extraction throughput: `specrag extract-triplets` over the pooled corpus, 1 and 2 workers.

Each run is the real Beam job (FnApiRunner; two workers with
``--direct_num_workers=2 --direct_running_mode=multi_processing``) in a fresh child process,
with the default extractor (spaCy en_core_web_sm dependency rules, tok2vec + parser only),
one thread per worker. passages/s = passages extracted / the job's wall time (worker start
and model load included).

    python benchmarks/triplets.py

Claim line: passages_per_s (2 workers) and scaling_2w (2 workers over 1).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import imported_data, machine_line, markdown_table, publish  # noqa: E402

RESULTS = "benchmarks/results/triplets.md"
WORK = Path(os.environ.get("SPECRAG_BENCH_DIR", "/tmp/specrag-srag-bench"))


def prepare(data_dir: str) -> Path:
    return imported_data(WORK, data_dir) / "pooled_corpus.parquet"


def run(corpus: Path, workers: int, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    beam = ["--runner=FnApiRunner"]
    if workers > 1:
        beam += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "SPECRAG_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "specrag.pipelines.cli", "extract-triplets", "--corpus", str(corpus),
                           "--output", str(out), *beam], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"extract-triplets with {workers} worker(s) failed:\n{proc.stderr[-3000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    return {"workers": workers, "passages": manifest["passages"], "dead_letters": manifest["dead_letters"],
            "triplets": manifest["triplets"], "sentences": manifest["sentences"],
            "wall_s": manifest["wall_s"], "process_s": time.time() - started,
            "passages_per_s": manifest["passages"] / manifest["wall_s"],
            "triplets_per_passage": manifest["triplets"] / max(1, manifest["passages"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.environ.get("SPECRAG_DATA", "../shared/data"))
    args = ap.parse_args()
    corpus = prepare(args.data_dir)
    rows = [run(corpus, w, WORK / "triplets" / f"workers-{w}") for w in (1, 2)]
    for r in rows:
        print(f"{r['workers']} worker(s): {r['passages_per_s']:.1f} passages/s", flush=True)
    one, two = rows
    scaling = two["passages_per_s"] / one["passages_per_s"]
    per_worker = two["passages_per_s"] / 2
    wiki_h = {n: 21_000_000 / (per_worker * n) / 3600 for n in (2, 16, 64)}
    setup = (f"{machine_line(1)}; one thread per worker process; spaCy en_core_web_sm 3.8 (tok2vec + parser), "
             f"dependency rules; extract batch 64 passages; the pooled corpus of ../shared/data "
             f"({one['passages']} passages, {one['sentences']} sentences). Each run is a fresh child process; "
             "wall time is the Beam job's (worker start and model load included).\n")
    report = "\n".join(["", "## Throughput", "", *markdown_table(
        [{**r, "wall_s": float(r["wall_s"]), "passages_per_s": float(r["passages_per_s"]),
          "triplets_per_passage": float(r["triplets_per_passage"])} for r in rows],
        ["workers", "passages", "dead_letters", "triplets", "triplets_per_passage", "wall_s", "passages_per_s"]),
        "", "A 21M-passage Wikipedia dump at this per-worker rate ("
        f"{per_worker:.0f} passages/s per worker, one core each): "
        + ", ".join(f"{n} workers ≈ {h:.1f} h" for n, h in wiki_h.items()) + "."])
    publish(RESULTS, "Triplet extraction throughput", setup, report,
            f"passages_per_s={two['passages_per_s']:.0f} scaling_2w={scaling:.2f}")


if __name__ == "__main__":
    main()
