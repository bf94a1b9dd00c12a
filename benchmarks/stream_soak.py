"""Stream soak: memory of a streaming `specrag answer` over a steady stream, minute by minute.

A watched folder gets one Parquet file of ``--batch`` new queries every ``--every`` seconds for
``--minutes`` (PopQA questions with fresh ids; 1 in 50 files is a copy of an earlier one, and
1 in 50 a bad JSON-lines file: repeats and dead letters by design). `specrag answer --streaming`
(retrieve-only over the shared sets' pooled BM25 index: real validation, dedupe state, windows,
retrieval and shard writes, no model, so the stream measures the job) answers them on

- ``--runner flink``: the local Flink cluster (deploy/flink; two TaskManagers of one slot, their
  SDK workers started by specrag-worker), with ``--dedupe-horizon`` short enough for the dedupe
  state to expire inside the run; or
- ``--runner fnapi``: the FnApiRunner (two processes), which keeps answered ids for the job's
  life (it warns so), so some growth per id is expected there.

Every minute it records the resident memory (RSS) of the launcher, of the Python SDK workers and
(Flink) of the TaskManagers' JVMs, and the queries answered. Then it stops the job with SIGINT
and checks the account (every query once, the bad lines as dead letters). One torch thread.

    .venv/bin/python benchmarks/stream_soak.py --runner flink --minutes 30   # writes results/stream_soak.md

Status (2026-12-04, f1f7727): on the local Flink cluster a 30-minute stream ran to the end
(6,888 answered once, none lost, SIGINT to exit 8.1 s); the Python workers' and the launcher's
RSS flat, the TaskManager JVMs' RSS grew 1.69 → 2.24 GB (results/stream_soak.md). Before
f1f7727 every stream there died 2-4 minutes in (Flink's runner ended the impulse source at once).

The claim line: ``rss_growth_workers`` and ``rss_growth_launcher`` (mean RSS over the last
third of the run / over the middle third: the first third is warm-up), ``answered``, ``lost``,
``duplicated``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "stream_soak.md"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def sample(launcher: int, jvms: list[int]) -> dict:
    """RSS (MB): the launcher process; the Python SDK workers (the launcher's children on the
    FnApiRunner, the TaskManagers' on Flink); the TaskManagers' JVMs."""
    workers = [p for root in [launcher, *jvms] for p in _descendants(root)
               if "python" in _cmdline(p) or "specrag-worker" in _cmdline(p)]
    return {"launcher": _rss_mb(launcher), "workers": sum(_rss_mb(p) for p in workers), "n_workers": len(workers),
            "jvms": sum(_rss_mb(p) for p in jvms)}


def _count(out: Path, kind: str) -> int:
    import pyarrow.parquet as pq
    return sum(pq.ParquetFile(f).metadata.num_rows for f in out.glob(f"{kind}-stream-*.parquet"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runner", choices=("flink", "fnapi"), default="flink")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--every", type=float, default=2.0, help="seconds between two query files")
    ap.add_argument("--batch", type=int, default=8, help="queries per file")
    ap.add_argument("--window", type=float, default=10)
    ap.add_argument("--dedupe-horizon", type=float, default=300)
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq
    sys.path.insert(0, str(REPO / "benchmarks"))
    from workloads import imported_data, machine_line
    work = Path(tempfile.mkdtemp(prefix="specrag-stream-soak-"))
    env = dict(os.environ, SPECRAG_THREADS="1", OMP_NUM_THREADS="1", SPECRAG_PROGRESS_S="0")
    specrag = [sys.executable, "-m", "specrag.pipelines.cli"]
    data = imported_data(work, args.data_dir)
    questions = pq.read_table(data / "popqa" / "queries.parquet", columns=["question"]).column("question").to_pylist()
    corpus = data / "pooled_corpus.parquet"
    index = work / "index"
    subprocess.run([*specrag, "build-index", "--corpus", str(corpus), "--index", str(index), "--kinds", "bm25"],
                   env=env, check=True, capture_output=True)
    cluster, flags = None, []
    if args.runner == "flink":
        launch = _load("specrag_flink_launch", REPO / "deploy" / "flink" / "launch.py")
        launch.install()
        cluster = launch.Cluster(work / "flink", taskmanagers=2, slots=1, env=env).start()
        flags = cluster.flags()
    else:
        flags = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    incoming, out = work / "incoming", work / "out"
    incoming.mkdir()
    job = subprocess.Popen([*specrag, "answer", "--streaming", "--queries", f"{incoming}/", "--output", str(out),
                            "--index", str(index), "--method", "retrieve-only", "--poll-interval", "1",
                            "--window", str(args.window), "--dedupe-horizon", str(args.dedupe_horizon),
                            "--stop-after", str(int(args.minutes * 60 + 900)), *flags],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    jvms = [p.pid for name, p in (cluster.processes.items() if cluster else []) if name.startswith("taskmanager")]
    rows, samples, sent, files = [], [], 0, 0
    started = next_sample = time.time()
    try:
        while time.time() - started < args.minutes * 60:
            assert job.poll() is None, job.stdout.read()[-3000:]
            files += 1
            if files % 50 == 25 and rows:  # a copy of an earlier file: its rows are repeats
                pq.write_table(pa.Table.from_pylist(rows[-args.batch:]), incoming / f"copy-{files:06d}.parquet")
            elif files % 50 == 0:
                (incoming / f"bad-{files:06d}.jsonl").write_text("not json\n")
            else:
                batch = [{"id": f"s{sent + i:07d}", "question": questions[(sent + i) % len(questions)]}
                         for i in range(args.batch)]
                tmp = incoming / f".tmp-{files:06d}"
                pq.write_table(pa.Table.from_pylist(batch), tmp)
                tmp.rename(incoming / f"q-{files:06d}.parquet")  # never read half written
                rows.extend(batch)
                sent += len(batch)
            if time.time() >= next_sample:
                s = sample(job.pid, jvms)
                s.update(minute=round((time.time() - started) / 60, 1), sent=sent, answered=_count(out, "results"))
                samples.append(s)
                print(json.dumps(s), flush=True)
                next_sample += 60
            time.sleep(args.every)
        time.sleep(5)  # the last file is listed (a poll every second) before the stop marker ends the watch
        stopping = time.time()
        job.send_signal(signal.SIGINT)
        job.wait(timeout=600)
        stop_s = time.time() - stopping
    finally:
        if job.poll() is None:
            job.kill()
        if cluster:
            cluster.stop()
    manifest = json.loads((out / "manifest.json").read_text())
    import pyarrow.parquet as pq
    ids = pq.read_table(sorted(out.glob("results-stream-*.parquet")), columns=["id"]).column("id").to_pylist()
    lost = len({r["id"] for r in rows} - set(ids))
    duplicated = len(ids) - len(set(ids))
    third = max(1, len(samples) // 3)
    middle, last = samples[third:2 * third] or samples, samples[2 * third:] or samples

    def growth(key: str) -> float:
        return round(statistics.mean(s[key] for s in last) / statistics.mean(s[key] for s in middle), 3)

    claim = (f"rss_growth_workers={growth('workers')} rss_growth_launcher={growth('launcher')} "
             f"answered={len(set(ids))} lost={lost} duplicated={duplicated}")
    table = ["| minute | queries sent | answered (written) | launcher RSS MB | Python workers RSS MB (n) | "
             "TaskManager JVMs RSS MB |", "|---|---|---|---|---|---|"]
    table += [f"| {s['minute']} | {s['sent']} | {s['answered']} | {s['launcher']:.0f} | {s['workers']:.0f} "
              f"({s['n_workers']}) | {s['jvms']:.0f} |" for s in samples]
    text = "\n".join([
        f"# Stream soak: `specrag answer --streaming` on {'Flink' if cluster else 'the FnApiRunner'}, "
        f"{args.minutes:g} minutes", "",
        f"Command: `.venv/bin/python benchmarks/stream_soak.py --runner {args.runner} --minutes {args.minutes:g} "
        f"--every {args.every:g} --batch {args.batch} --window {args.window:g} --dedupe-horizon "
        f"{args.dedupe_horizon:g}`", "",
        f"{machine_line(1)} per worker; retrieve-only over the pooled BM25 index of "
        f"the shared sets. One file of {args.batch} new PopQA questions every {args.every:g} s (1 in 50 files a "
        "copy of an earlier one, 1 in 50 a bad JSON line), the watched folder polled every second, windows of "
        f"{args.window:g} s, dedupe state kept {args.dedupe_horizon:g} s of event time. Stopped with SIGINT. "
        f"Manifest: status `{manifest['status']}`, account {json.dumps(manifest['account'])}; SIGINT to exit "
        f"{stop_s:.1f} s.", "",
        *table, "", claim, ""])
    print(text)
    if not args.no_record:
        Path(args.results).write_text(text)
    return 0 if lost == 0 and duplicated == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
