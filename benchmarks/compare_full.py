"""Every method on five benchmark sets: prepare what `benchmarks/suites/full.yaml` needs, then run it.

Preparation (each step a real specrag job, skipped when its output exists under ``--work``):
import ../shared/data with a pooled corpus, BM25 over it, the KNN-LM datastore (the first
``--datastore-entries`` teacher-forced states of the corpus), triplets of every passage, AED-RAG's
utility predictor (CPPL labels of the first 300 aed_train questions, top-5 passages each, then
distillation: the recipe and the folder names of `benchmarks/aed.py --train 300 --label-top-k 5`)
and SARDI's denoiser (the recipe of `benchmarks/sardi.py`). Then

    specrag compare --suite benchmarks/suites/full.yaml --workdir WORK/compare \
        --report-dir benchmarks/results/compare-full

which answers 200 questions per set with every method as a `specrag answer` job (finished jobs
are reused, an interrupted one resumed: rerun this script after a stop) and writes the report.
The suite's paths name the folders made here, so ``--work`` must stay ``runs/full`` for it.

    python benchmarks/compare_full.py                     # everything (hours on 2 cores)
    python benchmarks/compare_full.py --prepare-only
    python benchmarks/compare_full.py -- --limit 10       # anything after -- goes to specrag compare
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import aed  # noqa: E402
import sardi  # noqa: E402
from workloads import REPO, specrag_cli as specrag  # noqa: E402

SUITE = REPO / "benchmarks" / "suites" / "full.yaml"
UTILITY_TRAIN, UTILITY_TOP_K = 300, 5  # benchmarks/aed.py's recorded run (results/aed.md)


def prepare(data_dir: str, work: Path, datastore_entries: int) -> dict:
    started = time.time()
    paths = aed.prepare(data_dir, UTILITY_TRAIN, per_dataset=1, work=work)  # data, index, triplets
    predictor = aed.train_predictor(paths, UTILITY_TRAIN, UTILITY_TOP_K)
    denoiser = sardi.prepare(data_dir, 1, work=work)["denoiser"]
    datastore = work / "datastore"
    if not (datastore / "manifest.json").exists():  # keys from the model in the dtype the suite runs it in
        from specrag.pipelines.suite import load_suite
        dtype = load_suite(SUITE).flags.get("dtype", "float32")
        specrag("build-datastore", "--corpus", str(paths["data"] / "pooled_corpus.parquet"),
                "--datastore", str(datastore), "--max-entries", str(datastore_entries), "--dtype", dtype,
                "--overwrite")
    print(f"prepared in {time.time() - started:.0f} s: index {paths['index']}, triplets {paths['triplets']}, "
          f"utility {predictor}, denoiser {denoiser}, datastore {datastore}", flush=True)
    return {"predictor": predictor, "denoiser": denoiser, "datastore": datastore}


def main() -> None:
    argv = sys.argv[1:]
    passthrough = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.environ.get("SPECRAG_DATA", "../shared/data"))
    ap.add_argument("--work", default="runs/full", help="where the suite's resources and runs live")
    ap.add_argument("--datastore-entries", type=int, default=200_000)
    ap.add_argument("--report-dir", default="benchmarks/results/compare-full")
    ap.add_argument("--prepare-only", action="store_true")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    work = Path(args.work)
    if work.resolve() != (REPO / "runs" / "full").resolve():
        raise SystemExit("the suite's paths name runs/full: run from the repository root with --work runs/full")
    prepare(args.data_dir, work, args.datastore_entries)
    if args.prepare_only:
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "specrag.pipelines.cli", "compare", "--suite", str(SUITE),
           "--workdir", str(work / "compare"), "--report-dir", args.report_dir, *passthrough]
    print(" ".join(cmd), flush=True)
    raise SystemExit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
