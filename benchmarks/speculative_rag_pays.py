"""Speculative RAG with a drafter of the verifier's family (#79): the data, the drafter, the suite.

    python benchmarks/speculative_rag_pays.py synthesize --minutes 120   # resumable; stops itself
    python benchmarks/speculative_rag_pays.py status                     # kept so far, the rate
    python benchmarks/speculative_rag_pays.py train --examples all,1000,500 --minutes 120   # resumable too
    python benchmarks/speculative_rag_pays.py selection-queries          # questions for choosing the score
    python benchmarks/speculative_rag_pays.py ship                       # the trained drafter into the package

Synthesis: the drafter_train questions that the first tuned drafter's synthesis
(benchmarks/results/drafter/synthesis: the first 150 of each training set, local backend, 454
kept) did not read — 2,982 of 3,582 — written by the same 1.5B teacher, recipe and filters on
``--backend vllm`` (bfloat16), into benchmarks/results/speculative_rag_pays/synthesis. Both runs
together are the training data: `specrag train-drafter --rationales` takes a glob. The questions
are interleaved across the four sets (NQ, HotpotQA, PubHealth, ARC-Challenge), so a run stopped at
any point has taught every task type in proportion. Every verdict is committed as it comes
(``--shard_rows 1``); ``--minutes`` ends the job by itself so that a session's end never kills it
mid-write, and the next call resumes where it stopped.

Training (the paper's data-scaling points, its Table 9): Qwen2.5-Coder-0.5B-Instruct tuned on the
first ``--examples`` kept rationales of both syntheses in a seeded order (drawn once the synthesis is done, 500 ⊂ 1,000 ⊂ all),
a LoRA adapter of rank 8 on every linear layer, bf16 matmuls, each ARC question in 2 orders of
its options, 2 epochs of batch 8 (the first drafter's recipe otherwise), checkpointed every 40
steps under runs/full/drafter/qwen-0.5b-lora-<N>.partial, ended early once 2 checkpoints in a row
have not lowered the held-out loss (on all rationales it rose from 0.497 at step 360, the first
epoch's end, to 0.524 at step 400: the second epoch memorises); ``--minutes`` stops it at the deadline
(SIGTERM: its state saved after the step in flight) and the next call resumes from there. That state
is also copied to benchmarks/results/speculative_rag_pays/training/ (ignored by git: weights stay
out of the repository), a copy that resumes the run on another machine it is carried to. A step costs 27.8 s on 2 threads of the
AVX-512 EPYC in forward passes of 2 (benchmarks/results/drafter_step_cost.md), 17.8 s on the AMX
Xeon: 500 rationales ≈ 1 hour, 2,400 ≈ 4.6 hours on the EPYC, held-out checks on top.
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
SITTINGS = OUT / "sittings.json"  # the sittings, kept: compacting the finished run drops the timed shard names
# a stopped training run's state (71 MB for the 0.5B adapter), copied out of runs/: carried to another
# machine by hand, it resumes there instead of from step 0. Not committed: weights stay out of git
KEPT_STATES = OUT / "training"
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


def kept_rationales() -> int:
    """Rationales kept by both syntheses together (the training data's size)."""
    import pyarrow.parquet as pq
    return sum(r["trace"]["kept"] for folder in (REPO / FIRST_SYNTHESIS, SYNTHESIS)
               for f in sorted(folder.glob("results-*.parquet"))
               for r in pq.read_table(f, columns=["trace"]).to_pylist())


def synthesize(minutes: float, threads: int, in_flight: int, until_kept: int | None = None) -> None:
    """Run (or resume) the synthesis for at most ``minutes`` — or until both syntheses hold
    ``until_kept`` kept rationales (checked every two minutes) — then stop it cleanly."""
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
    # SIGINT restored: a job started from a background shell inherits it ignored
    proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60 * minutes
    checked = time.monotonic()
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(5)
        if until_kept and time.monotonic() - checked > 120:
            checked = time.monotonic()
            if kept_rationales() >= until_kept:
                print(f"{until_kept} rationales kept: stopping", flush=True)
                break
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)  # a clean stop: finished verdicts stay, the lease is released
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    now = status()
    SITTINGS.write_text(json.dumps(now["sittings"], indent=1) + "\n")
    print(json.dumps(now), flush=True)


DRAFTER_BASE = "qwen2.5-coder-0.5b-instruct"
TRAINING = ("--lora-rank", "8", "--lora-alpha", "16", "--compute-dtype", "bfloat16", "--option-orders", "2",
            "--epochs", "2", "--batch-size", "8", "--micro-batch", "2", "--learning-rate", "2e-4", "--held-out", "0.03",
            "--checkpoint-every", "40", "--patience", "2")


def rationale_subset(n: int | None, refresh: bool = False) -> Path:
    """The first ``n`` kept rationales of both syntheses (all: None) in a seeded order, as one table
    (``refresh``: the synthesis' own table rebuilt from its verdicts so far first)."""
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq
    from specrag.pipelines.drafter import RATIONALES, RATIONALES_FILE, write_rationales
    data = imported_data(WORK, str(REPO.parent / "shared" / "data"))
    index = pooled_index(WORK, data)
    if refresh or not (SYNTHESIS / RATIONALES_FILE).exists():
        write_rationales(str(SYNTHESIS), str(rest_questions(data)), str(index))
    rows = [r for d in (REPO / FIRST_SYNTHESIS, SYNTHESIS) for r in pq.read_table(d / RATIONALES_FILE).to_pylist()]
    rows.sort(key=lambda r: hashlib.sha256(f"0:{r['id']}".encode()).hexdigest())
    if n is not None and n > len(rows):
        raise SystemExit(f"{n} rationales asked for, {len(rows)} kept so far: synthesize more first")
    out = WORK / "drafter" / f"qwen-rationales-{n or 'all'}.parquet"
    if not out.exists():
        pq.write_table(pa.Table.from_pylist(rows[:n], schema=RATIONALES), out)
    return out


def drafter_folder(n: int | None) -> Path:
    """Where the drafter tuned on ``n`` rationales (all: None) is trained."""
    return WORK / "drafter" / f"qwen-0.5b-lora-{n or 'all'}"


def kept_state(n: int | None) -> Path:
    """The committed copy of the training state of the drafter on ``n`` rationales."""
    return KEPT_STATES / f"{drafter_folder(n).name}.state.pt"


def train(n: int | None, minutes: float, threads: int, refresh: bool = False) -> Path:
    """Train (or resume) the 0.5B drafter on ``n`` rationales for at most ``minutes``; a run
    stopped at the deadline leaves its state in ``kept_state(n)`` too, to carry elsewhere."""
    import shutil
    from specrag.training.state import STATE_FILE, partial_dir
    rationales = rationale_subset(n, refresh)
    folder = drafter_folder(n)
    if not (partial_dir(folder) / STATE_FILE).is_file() and kept_state(n).is_file():
        partial_dir(folder).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kept_state(n), partial_dir(folder) / STATE_FILE)
        print(f"resuming from the committed state {kept_state(n)}", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "specrag.pipelines.cli", "train-drafter", "--rationales", str(rationales),
           "--output", str(folder), "--base", DRAFTER_BASE, *TRAINING, "--threads", str(threads),
           *(["--resume"] if partial_dir(folder).is_dir() else [])]
    print(" ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        proc.wait(timeout=60 * minutes)
    except subprocess.TimeoutExpired:  # SIGTERM: the state after the step in flight is saved
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:  # a kill: the last checkpoint stays
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        print(f"stopped after {minutes:.0f} minutes; run again to resume from {partial_dir(folder)}", flush=True)
        if (partial_dir(folder) / STATE_FILE).is_file():
            KEPT_STATES.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(partial_dir(folder) / STATE_FILE, kept_state(n))
            print(f"its state copied to {kept_state(n)}: another machine resumes from that copy", flush=True)
    else:
        from specrag.training.drafter import MANIFEST
        if (folder / MANIFEST).is_file():  # finished: the trained drafter's folder supersedes the copy
            kept_state(n).unlink(missing_ok=True)
    return folder


def train_points(points: list[int | None], minutes: float, threads: int, refresh: bool = False) -> None:
    """Train the drafters on each of ``points`` rationales in turn (a finished one is skipped), all
    within ``minutes``: one command carries the data-scaling points on from session to session."""
    from specrag.training.drafter import MANIFEST
    deadline = time.time() + 60 * minutes
    for n in points:
        if (drafter_folder(n) / MANIFEST).is_file():
            print(f"the drafter on {n or 'all'} rationales is trained", flush=True)
            continue
        left = (deadline - time.time()) / 60
        if left < 5:  # loading the model and a first step take minutes: leave it to the next call
            break
        if not (train(n, left, threads, refresh) / MANIFEST).is_file():
            break  # stopped at the deadline (its state saved)


SHIPPED_NAME = "qwen2.5-coder-0.5b-rag-drafter"  # the registered name of the drafter specrag ships


def ship(n: int | None = None) -> Path:
    """Copy the drafter tuned on ``n`` rationales (all: None) into the package, where the registry's
    ``SHIPPED_NAME`` loads it: the float16 adapter (8.8 MB), its config, card and training manifest."""
    import shutil
    from safetensors import safe_open
    from specrag.inference.models import ADAPTER_WEIGHTS, CARD, SHIPPED
    from specrag.training.drafter import MANIFEST
    folder = drafter_folder(n)
    if not (folder / MANIFEST).is_file():
        raise SystemExit(f"{folder} is not trained yet: run `train --examples {n or 'all'}` to its end first")
    with safe_open(str(folder / ADAPTER_WEIGHTS), "pt") as weights:
        dtypes = {str(weights.get_slice(k).get_dtype()) for k in weights.keys()}
    if dtypes != {"F16"}:
        raise SystemExit(f"{folder / ADAPTER_WEIGHTS} holds {sorted(dtypes)}, not float16: save it again with "
                         "the current train-drafter (a --resume of the finished run rewrites it)")
    target = SHIPPED / SHIPPED_NAME
    target.mkdir(parents=True, exist_ok=True)
    for name in (ADAPTER_WEIGHTS, "adapter_config.json", CARD, MANIFEST):
        shutil.copyfile(folder / name, target / name)
    return target


SELECTION = WORK / "drafter" / "selection"  # <set>.parquet: questions for choosing the verifier's score
SELECTION_IDS = OUT / "selection_ids.json"  # which of them were held out and which had no kept rationale


def _flag(name: str) -> str:
    return TRAINING[TRAINING.index(name) + 1]


def held_out_ids() -> set[str]:
    """The question ids whose rationales the drafter on all rationales held out: the examples and
    the split as `train-drafter` makes them (pipelines/drafter.py, training/state.py)."""
    import pyarrow.parquet as pq
    from specrag.evaluation.splits import evaluation_ids
    from specrag.pipelines.drafter import validate_rationale
    from specrag.schemas.validation import RowError
    from specrag.training.drafter import DrafterTrainingConfig
    from specrag.training.state import split_held_out
    rows = sorted(pq.read_table(rationale_subset(None)).to_pylist(), key=lambda r: str(r.get("id")))
    evaluation, examples = evaluation_ids(), []
    for row in rows:
        try:
            examples += validate_rationale(row, evaluation, int(_flag("--option-orders")))
        except RowError:  # a dead letter of the training run: no example there either
            continue
    return {e.id for e in split_held_out(examples, float(_flag("--held-out")), DrafterTrainingConfig.seed)[1]}


def selection_queries(per_set: int = 100) -> dict[str, dict[str, list[str]]]:
    """Per training set, up to ``per_set`` drafter_train questions the tuned drafter never learnt
    from, as ``SELECTION/<set>.parquet``: the questions of its held-out rationales first, then
    those with no kept rationale (in file order). Deliver 1 chooses the verifier's default score
    on their traces, not on the evaluation questions. The second kind leans hard: the teacher's
    rationale for them failed the filters or was never written, and the teacher is the verifier;
    the ids of each kind go to ``SELECTION_IDS`` so that the choice can be read on the first alone."""
    import pyarrow.parquet as pq
    from drafter import TRAIN_SETS
    from specrag.evaluation.splits import load_split
    data = imported_data(WORK, str(REPO.parent / "shared" / "data"))
    train = set(load_split("drafter_train"))
    kept = {r["id"] for r in pq.read_table(rationale_subset(None), columns=["id"]).to_pylist()}
    held = held_out_ids()
    SELECTION.mkdir(parents=True, exist_ok=True)
    ids = {}
    for name in TRAIN_SETS:
        table = pq.read_table(data / name / "queries.parquet")
        rows = [(i, q) for i, q in enumerate(table.column("id").to_pylist()) if q in train]
        first = [i for i, q in rows if q in held] + [i for i, q in rows if q not in kept]
        chosen = first[:per_set]
        pq.write_table(table.take(chosen), SELECTION / f"{name}.parquet")
        picked = table.column("id").take(chosen).to_pylist()
        ids[name] = {"held_out": [q for q in picked if q in held], "not_kept": [q for q in picked if q not in kept]}
    SELECTION_IDS.write_text(json.dumps(ids, indent=1) + "\n")
    return ids


def sittings(gap_s: float = 600) -> list[dict]:
    """The synthesis' verdicts by sitting (a pause over ``gap_s`` between two verdicts starts a new
    one): how many, over how long, at what rate (a stopped attempt writes no manifest). Once the
    run is compacted, as ``SITTINGS`` recorded them."""
    # a shard's name holds the time it was written (transforms/sinks.py), which a checkout keeps
    times = sorted(int(f.name.split("-")[2]) / 1e9 for f in SYNTHESIS.glob("results-*.parquet")
                   if f.name.split("-")[2].isdigit())
    if not times:
        return json.loads(SITTINGS.read_text()) if SITTINGS.is_file() else []
    out, start = [], 0
    for i in range(1, len(times) + 1):
        if i == len(times) or times[i] - times[i - 1] > gap_s:
            span = times[i - 1] - times[start]
            out.append({"verdicts": i - start, "hours": round(span / 3600, 2),
                        "per_hour": round((i - start - 1) * 3600 / span) if span else None})
            start = i
    return out


def sitting_text(rates: list[dict]) -> str:
    return "; ".join(f"{x['verdicts']} verdicts in {x['hours']} h ({x['per_hour']}/h)" for x in rates) or "none"


def training_report(n: int | None) -> tuple[str, dict] | None:
    """("finished" | "in progress", the training report) of the drafter on ``n`` rationales: its
    manifest's once it has finished, else its last checkpoint's; None before it starts."""
    from specrag.training.drafter import MANIFEST
    from specrag.training.state import STATE_FILE, partial_dir
    folder = drafter_folder(n)
    if (folder / MANIFEST).is_file():
        return "finished", json.loads((folder / MANIFEST).read_text())["report"]
    if (partial_dir(folder) / STATE_FILE).is_file():
        import torch
        return "in progress", torch.load(partial_dir(folder) / STATE_FILE, weights_only=False)["report"]
    return None


def training_lines(window: int = 40) -> list[str]:
    """The drafters' training so far: steps, time, the loss by ``window`` steps, held-out loss."""
    rows = []
    for n in (500, 1000, None):
        found = training_report(n)
        if found is None:
            rows.append(f"| {n or 'all'} | not started | | | | |")
            continue
        state, r = found
        steps, loss = len(r["step_loss"]), r["step_loss"]
        curve = " ".join(f"{sum(loss[i:i + window]) / len(loss[i:i + window]):.3f}" for i in range(0, steps, window))
        held = " → ".join([f"{r['held_out_loss_untrained']:.3f}"]
                          + [f"{c['held_out_loss']:.3f} (step {c['step']})" for c in r["checkpoints"]])
        recipe = lambda flag: int(TRAINING[TRAINING.index(flag) + 1])  # noqa: E731
        # a checkpoint written before reports carried total_steps: the recipe's count (training/drafter.py)
        total = r.get("total_steps") or -(-r["examples"] // recipe("--batch-size")) * recipe("--epochs")
        if r.get("stopped_early_at"):  # --patience ended it: the best checkpoint is the drafter
            state = f"stopped early (the drafter: step {r['best_step']})"
        rows.append(f"| {n or 'all'} ({r['examples']} examples) | {state}: step {steps}/{total} | "
                    f"{r['wall_s'] / 3600:.2f} h ({r['wall_s'] / max(steps, 1):.1f} s/step) | {curve} | {held} | "
                    f"{', '.join(map(str, r['resumed_at'])) or 'none'} |")
    return ["## Training (the paper's data-scaling points: ~500, ~1,000 and all rationales)", "",
            f"| rationales | steps | wall time | training loss, mean of each {window} steps | held-out response loss "
            "(untrained → checkpoints) | resumed at |", "|---|---|---|---|---|---|", *rows]


def report() -> None:
    """benchmarks/results/speculative_rag_pays.md: the data and the drafter so far (the suites'
    tables join it once they have run)."""
    import pyarrow.parquet as pq
    from workloads import machine_line, publish
    first = json.loads((REPO / FIRST_SYNTHESIS / "synthesis.json").read_text())
    now = status()
    rates = [x for x in sittings() if x["per_hour"]]
    per_hour = round(sum(x["verdicts"] for x in rates) / sum(x["hours"] for x in rates)) if rates else None
    total = pq.read_metadata(QUESTIONS).num_rows
    left = total - now["verdicts"]
    lines = ["## Data", "",
             "| synthesis | questions | verdicts | kept | by set | filtered | teacher |", "|---|---|---|---|---|---|---|",
             f"| first (benchmarks/results/drafter/synthesis) | 600 | {first['questions']} | {first['kept']} | "
             f"{', '.join(f'{k} {v}' for k, v in first['kept_by_dataset'].items())} | "
             f"{', '.join(f'{k} {v}' for k, v in first['by_reason'].items() if k != 'kept')} | 1.5B, local backend, "
             "float32 |",
             f"| the rest (benchmarks/results/speculative_rag_pays/synthesis) | {total} | {now['verdicts']} | "
             f"{now['kept']} | {', '.join(f'{k} {v}' for k, v in now['kept_by_dataset'].items())} | "
             f"{', '.join(f'{k} {v}' for k, v in now['by_reason'].items() if k != 'kept')} | 1.5B, vLLM, bfloat16 |",
             "",
             f"Rate on vLLM (2 server threads, 16 questions in flight), by sitting: "
             f"{sitting_text(rates)}"
             + (f". At {per_hour or '?'} verdicts an hour the {left} questions left take "
                f"{f'{left / per_hour:.1f}' if per_hour else '?'} hours; kept so far " if left else
                f"; finished at {per_hour} verdicts an hour in all; kept ")
             + f"{first['kept'] + now['kept']} of the 2,000 the issue asks for.", "", *training_lines()]
    values = {"specrag_minus_standard": "na", "latency_ratio": "na", "chosen_over_oracle": "na", "sets_better": "na"}
    suite_lines, found = suites_lines()
    lines += suite_lines
    values.update(found)
    claim = " ".join(f"{k}={v}" for k, v in values.items()) + f" rationales_kept={first['kept'] + now['kept']}"
    publish(str(REPO / "benchmarks" / "results" / "speculative_rag_pays.md"),
            "Speculative RAG with a drafter of the verifier's family", machine_line(2), "\n".join(lines), claim,
            "python benchmarks/speculative_rag_pays.py report")


def suites_lines() -> tuple[list[str], dict]:
    """The quality and latency suites' tables and claim values, for those that have run."""
    import speculative_rag_pays_tables as tables
    from verifier_selection import gold_answers
    quality, latency = tables.load(tables.QUALITY), tables.load(tables.LATENCY)
    lines, values = [], {}
    if quality or latency:
        gold = gold_answers(REPO.parent / "shared" / "data", WORK / "data")
    if quality:
        majority = {s: tables.majority_share(quality, s, gold["pubhealth"]) for s in quality["datasets"]
                    if s == "PubHealth"}
        found, values = tables.quality_lines(quality, majority)
        share, mixed, answered = tables.chosen_over_oracle(quality, gold)
        if share is not None:
            values["chosen_over_oracle"] = round(share, 3)
        lines += ["", *found, "", f"The method's own choice is right on {100 * (share or 0):.1f}% of the {mixed} of "
                  f"{answered} questions whose drafts hold a right and a wrong answer (chosen_over_oracle)."]
    if latency:
        found, more = tables.latency_lines(latency)
        lines += ["", *found]
        values.update(more)
    return lines, values


def status() -> dict:
    """Verdicts so far (kept, by reason, by set) and the rate of each sitting."""
    import collections

    import pyarrow.parquet as pq
    rows = [r for f in sorted(SYNTHESIS.glob("results-*.parquet"))
            for r in pq.read_table(f, columns=["id", "dataset", "trace"]).to_pylist()]
    by_reason = collections.Counter(r["trace"]["reason"] for r in rows)
    kept = collections.Counter(r["dataset"] for r in rows if r["trace"]["kept"])
    return {"verdicts": len(rows), "kept": sum(kept.values()), "kept_by_dataset": dict(sorted(kept.items())),
            "by_reason": dict(sorted(by_reason.items())), "sittings": sittings()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="step", required=True)
    s = sub.add_parser("synthesize", help="run or resume the synthesis for at most --minutes")
    s.add_argument("--minutes", type=float, default=60)
    s.add_argument("--threads", type=int, default=1, help="the vLLM server's CPU threads")
    s.add_argument("--in-flight", type=int, default=16, help="questions in flight (one engine batch)")
    s.add_argument("--until-kept", type=int, default=None,
                   help="stop once both syntheses hold this many kept rationales (the issue asks 2,000)")
    sub.add_parser("status", help="verdicts so far and the rate")
    q = sub.add_parser("selection-queries", help="write the drafter_train questions the drafter did not learn from "
                                                  "(for choosing the verifier's score)")
    q.add_argument("--per-set", type=int, default=100)
    sub.add_parser("report", help="record benchmarks/results/speculative_rag_pays.md from what exists")
    h = sub.add_parser("ship", help=f"copy the trained drafter into the package as {SHIPPED_NAME}")
    h.add_argument("--examples", default="all", help="which data-scaling point to ship (all, 1000, 500)")
    t = sub.add_parser("train", help="train or resume the 0.5B drafter on --examples rationales")
    t.add_argument("--examples", default="all",
                   help="500, 1000, ... or all (nested subsets); several, comma-separated, are trained in turn")
    t.add_argument("--minutes", type=float, default=60)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--refresh", action="store_true", help="rebuild the synthesis' rationale table first")
    args = ap.parse_args()
    if args.step == "synthesize":
        synthesize(args.minutes, args.threads, args.in_flight, args.until_kept)
    elif args.step == "report":
        report()
    elif args.step == "selection-queries":
        ids = selection_queries(args.per_set)
        print(json.dumps({k: {kind: len(v) for kind, v in x.items()} for k, x in ids.items()}))
    elif args.step == "ship":
        print(f"shipped in {ship(None if args.examples == 'all' else int(args.examples))}")
    elif args.step == "train":
        points = [None if x == "all" else int(x) for x in args.examples.split(",")]
        train_points(points, args.minutes, args.threads, args.refresh)
    else:
        print(json.dumps(status(), indent=2))


if __name__ == "__main__":
    main()
