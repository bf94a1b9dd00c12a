"""Speculative RAG with a drafter of the verifier's family (#79): the data, the drafter, the suite.

    python benchmarks/speculative_rag_pays.py synthesize --minutes 120   # resumable; stops itself
    python benchmarks/speculative_rag_pays.py status                     # kept so far, the rate

Synthesis: the drafter_train questions that the first tuned drafter's synthesis
(benchmarks/results/drafter/synthesis: the first 150 of each training set, local backend, 454
kept) did not read — 2,982 of 3,582 — written by the same 1.5B teacher, recipe and filters on
``--backend vllm`` (bfloat16), into benchmarks/results/speculative_rag_pays/synthesis. Both runs
together are the training data: `specrag train-drafter --rationales` takes a glob. The questions
are interleaved across the four sets (NQ, HotpotQA, PubHealth, ARC-Challenge), so a run stopped at
any point has taught every task type in proportion. Every verdict is committed as it comes
(``--shard_rows 1``); ``--minutes`` ends the job by itself (SIGINT: the stream's own clean stop) so
that a session's end never kills it mid-write, and the next call resumes where it stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from drafter import SYNTHESIS as FIRST_SYNTHESIS, TEACHER, TRAIN_SETS  # noqa: E402
from workloads import REPO, imported_data, pooled_index  # noqa: E402

WORK = Path("runs/full")
OUT = REPO / "benchmarks" / "results" / "speculative_rag_pays"
SYNTHESIS = OUT / "synthesis"
QUESTIONS = WORK / "drafter" / "train-rest.parquet"


def rest_questions(data: Path, out: Path = QUESTIONS) -> Path:
    """The drafter_train questions the first synthesis did not read, round-robin over the sets
    (file order within each), so any prefix holds all four task types in proportion."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from specrag.evaluation.splits import load_split
    if out.exists():
        return out
    train = set(load_split("drafter_train"))
    done = {r["id"] for f in (REPO / FIRST_SYNTHESIS).glob("results-*.parquet")
            for r in pq.read_table(f, columns=["id"]).to_pylist()}
    per_set = [[q for q in pq.read_table(data / d / "queries.parquet").to_pylist()
                if q["id"] in train and q["id"] not in done] for d in TRAIN_SETS]
    # a longer set's tail follows once the shorter ones end: the share of each set stays its share
    # of what is left, as evenly spread as the counts allow
    total = sum(map(len, per_set))
    keyed = [((i + 0.5) / len(rows), s, i) for s, rows in enumerate(per_set) for i in range(len(rows))]
    rows = [per_set[s][i] for _, s, i in sorted(keyed)]
    assert len(rows) == total and not any(r["id"] in done for r in rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out


def synthesize(minutes: float, threads: int, in_flight: int) -> None:
    """Run (or resume) the synthesis for at most ``minutes``, then stop it cleanly."""
    data = imported_data(WORK, str(REPO.parent / "shared" / "data"))
    index = pooled_index(WORK, data)
    queries = rest_questions(data)
    resume = ["--resume"] if (SYNTHESIS / "identity.json").exists() else []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "specrag.pipelines.cli", "synthesize-rationales", "--queries", str(queries),
           "--index", str(index), "--output", str(SYNTHESIS), "--model", f"teacher={TEACHER}",
           "--backend", "vllm", "--dtype", "bfloat16", "--threads", str(threads), "--stage_timeout", "3600",
           "--shard_rows", "1", "--max_in_flight", str(in_flight), *resume]
    print(" ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    deadline = time.monotonic() + 60 * minutes
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(5)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)  # the stream's clean stop: finished verdicts stay, the lease is released
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(json.dumps(status()), flush=True)


def status() -> dict:
    """Verdicts so far (kept, by reason, by set) and the rate of the attempts made here."""
    import collections

    import pyarrow.parquet as pq
    rows = [r for f in sorted(SYNTHESIS.glob("results-*.parquet"))
            for r in pq.read_table(f, columns=["id", "dataset", "trace"]).to_pylist()]
    by_reason = collections.Counter(r["trace"]["reason"] for r in rows)
    kept = collections.Counter(r["dataset"] for r in rows if r["trace"]["kept"])
    manifest = json.loads((SYNTHESIS / "manifest.json").read_text()) if (SYNTHESIS / "manifest.json").exists() else {}
    wall = sum(a.get("wall_s", 0) for a in manifest.get("attempts", []))
    answered = sum(a.get("counters", {}).get("answered", 0) for a in manifest.get("attempts", []))
    return {"verdicts": len(rows), "kept": sum(kept.values()), "kept_by_dataset": dict(sorted(kept.items())),
            "by_reason": dict(sorted(by_reason.items())), "attempts_wall_s": round(wall),
            "questions_per_hour": round(3600 * answered / wall, 1) if wall else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="step", required=True)
    s = sub.add_parser("synthesize", help="run or resume the synthesis for at most --minutes")
    s.add_argument("--minutes", type=float, default=60)
    s.add_argument("--threads", type=int, default=1, help="the vLLM server's CPU threads")
    s.add_argument("--in-flight", type=int, default=16, help="questions in flight (one engine batch)")
    sub.add_parser("status", help="verdicts so far and the rate")
    args = ap.parse_args()
    if args.step == "synthesize":
        synthesize(args.minutes, args.threads, args.in_flight)
    else:
        print(json.dumps(status(), indent=2))


if __name__ == "__main__":
    main()
