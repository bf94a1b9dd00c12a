"""Workloads and reporting shared by the benchmarks (run as scripts from the repository root)."""
from __future__ import annotations

import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

from specrag.evaluation.report import markdown_table  # noqa: F401  (re-exported for the benchmarks)
from specrag.evaluation.stats import paired_bootstrap_ci  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
SHARED_SETS = ["hotpotqa", "popqa", "nq", "webquestions", "arc_challenge", "arc_challenge_selfrag", "pubhealth",
               "asqa"]


def specrag_cli(*args: str) -> str:
    """Run ``specrag ARGS`` as a fresh process (one torch thread per worker, offline); its
    stdout, or a RuntimeError with the end of its stderr. Its stderr (progress, warnings) passes
    through as it comes, so an hour-long training step shows where it is."""
    import collections
    import subprocess
    import threading
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "SPECRAG_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "specrag.pipelines.cli", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tail: collections.deque[str] = collections.deque(maxlen=200)

    def relay() -> None:
        for line in proc.stderr:
            tail.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()
    relaying = threading.Thread(target=relay, daemon=True)
    relaying.start()
    stdout = proc.stdout.read()
    proc.wait()
    relaying.join()
    if proc.returncode != 0:
        raise RuntimeError(f"specrag {args[0]} failed (exit status {proc.returncode}; negative: killed by that "
                           f"signal):\n{''.join(tail)[-4000:]}")
    print(stdout.strip().splitlines()[-1] if stdout.strip() else f"specrag {args[0]} done", flush=True)
    return stdout


def imported_data(work: Path, data_dir: str) -> Path:
    """../shared/data imported once under ``work`` (queries per set and the pooled corpus)."""
    from specrag.importers import import_datasets
    data = work / "data"
    if not (data / "pooled_corpus.parquet").exists():
        import_datasets(Path(data_dir), SHARED_SETS, data, pool=True)
    return data


def pooled_index(work: Path, data: Path) -> Path:
    """BM25 over the pooled corpus of every imported set (built once per work folder)."""
    index = work / "index"
    if not (index / "manifest.json").exists():
        specrag_cli("build-index", "--corpus", str(data / "pooled_corpus.parquet"), "--index", str(index))
    return index


def popqa_bm25(data_dir: str, n: int, prefix: str):
    """(workdir, BM25 retriever over the pooled corpus, first n PopQA queries)."""
    import pyarrow.parquet as pq
    from specrag.importers import import_datasets
    from specrag.pipelines.build_index import run_build_index
    from specrag.retrieval import open_retriever
    from specrag.schemas import validate_query
    work = Path(tempfile.mkdtemp(prefix=prefix))
    import_datasets(Path(data_dir), SHARED_SETS, work / "data", pool=True)
    run_build_index(str(work / "data" / "pooled_corpus.parquet"), str(work / "index"), ["bm25"])
    retriever = open_retriever(work / "index", "bm25")
    queries = [validate_query(r) for r in pq.read_table(work / "data" / "popqa" / "queries.parquet").to_pylist()]
    return work, retriever, queries[:n]


def drafting_workload(data_dir: str, dtype: str, threads: int, generator: str = "smollm2-135m-instruct",
                      backend: str = "local", configs: tuple = ()):
    """(work folder, imported data folder, Services) shared by the Speculative RAG and SPS
    benchmarks: BM25 over the pooled corpus; SmolLM2 (or ``generator``) as generator and drafter,
    Gemma-3 as verifier (with another generator: the generator itself), MiniLM as embedder; loaded
    once. ``backend`` serves the generator and verifier (``configs``: its own settings); the
    embedder is the embedded engine's."""
    from specrag.importers import import_datasets
    from specrag.inference import Services
    from specrag.inference.local import LocalBackend, LocalModelConfig
    from specrag.pipelines.build_index import run_build_index
    from specrag.retrieval import open_retriever
    from specrag.transforms.runtime import load_backend
    work = Path(os.environ.get("SPECRAG_BENCH_DIR", "/tmp/specrag-srag-bench"))
    data = work / "data"
    if not (data / "pooled_corpus.parquet").exists():
        import_datasets(Path(data_dir), SHARED_SETS, data, pool=True)
    if not (work / "index" / "manifest.json").exists():
        run_build_index(str(data / "pooled_corpus.parquet"), str(work / "index"), ["bm25"])

    def load(name: str):
        return load_backend(backend, name, threads, dtype, configs=configs)
    model = load(generator)
    verifier = load("gemma3-270m") if generator == "smollm2-135m-instruct" else model
    embedder = LocalBackend(LocalModelConfig("all-minilm-l6-v2", num_threads=threads, dtype="float32"))
    services = Services(models={"generator": model, "drafter": model, "verifier": verifier, "embedder": embedder},
                        retriever=open_retriever(work / "index", "bm25"))
    return work, data, services


def serve_one_by_one(engine, method, queries: list[dict], cache: Path | None = None,
                     reverse: bool = False) -> tuple[list[float], list]:
    """Serve queries one at a time (the papers' latency setting): per-query seconds and states.

    With ``cache`` (a file per method fingerprint), each finished query is kept there, so an
    interrupted or longer run (more questions) serves only the queries it has not measured yet.
    Processes sharing the cache share the work: a query is claimed before it is served, writes
    merge under a lock, and a process waits at the end for the queries another one is serving.
    """
    from specrag.methods.local_run import run_method
    done = _read_measured(cache)
    for q in (reversed(queries) if reverse else queries):
        if q["id"] in done or q["id"] in (done := _read_measured(cache, done)) or not _claim(cache, q["id"]):
            continue
        start = time.perf_counter()
        states, failures = run_method(engine, method, [q])
        elapsed = time.perf_counter() - start
        if failures:
            raise SystemExit(f"{method.name}: {failures}")
        if cache is None:
            done = {**done, q["id"]: (elapsed, states[0])}
            continue
        done = _merge_measured(cache, {q["id"]: (elapsed, states[0])})
        _claim_path(cache, q["id"]).unlink(missing_ok=True)
    while missing := [q["id"] for q in queries if q["id"] not in done]:
        if not any(_claimed_by_live_process(cache, i) for i in missing):  # its server died: serve it here
            return serve_one_by_one(engine, method, queries, cache, reverse)
        time.sleep(1.0)
        done = _read_measured(cache, done)
    return [done[q["id"]][0] for q in queries], [done[q["id"]][1] for q in queries]


def _claim_path(cache: Path, query_id: str) -> Path:
    import hashlib
    return cache.with_suffix(".claims") / hashlib.sha256(query_id.encode()).hexdigest()[:32]


def _claim(cache: Path | None, query_id: str) -> bool:
    """True when this process may serve the query: nobody alive is serving it."""
    if cache is None:
        return True
    path = _claim_path(cache, query_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            with open(path, "x") as f:
                f.write(str(os.getpid()))
            return True
        except FileExistsError:
            if _claimed_by_live_process(cache, query_id):
                return False
            path.unlink(missing_ok=True)  # a dead process's claim
    return False


def _claimed_by_live_process(cache: Path, query_id: str) -> bool:
    path = _claim_path(cache, query_id)
    try:
        text = path.read_text()
        if not text:  # being written just now, or left empty by a crash
            return time.time() - path.stat().st_mtime < 10
        os.kill(int(text), 0)
        return int(text) != os.getpid()
    except PermissionError:
        return True
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return False


def _read_measured(cache: Path | None, known: dict | None = None) -> dict:
    """The measurements kept in ``cache``; ``known`` again when the file has not changed since."""
    import pickle
    if cache is None or not cache.exists():
        return known or {}
    stamp = cache.stat().st_mtime_ns
    if known is not None and getattr(known, "stamp", None) == stamp:
        return known
    measured = _Measured(pickle.loads(cache.read_bytes()))
    measured.stamp = stamp
    return measured


def _merge_measured(cache: Path, new: dict) -> dict:
    """Add ``new`` to the file under an exclusive lock (another process may be adding too)."""
    import fcntl
    import pickle
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        measured = dict(_read_measured(cache))
        measured.update(new)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(measured))
        tmp.replace(cache)
        return _read_measured(cache)


class _Measured(dict):
    """A dict of measurements that remembers the file version it was read from."""
    stamp: int | None = None


def cache_file(work: Path, dataset: str, method, dtype: str, threads: int, serving: str = "") -> Path:
    """Where one (dataset, method settings, model dtype, threads) series of measurements is kept;
    ``serving`` names anything else that changes them (the backend, the models), "" for the defaults."""
    tag = f"-{serving}" if serving else ""
    return work / "measured" / dataset / f"{method.name}-{method.fingerprint()}-{dtype}-t{threads}{tag}.pkl"


def ablation_rounds(n: int, step: int = 10) -> list[int]:
    """Question counts at which ablations advance over every dataset together, so a run stopped
    early has them on the same questions everywhere."""
    return [*range(step, n, step), n] if n else []


def summarise(by: dict, datasets: list[str], label: str, baseline: str, method: str) -> dict:
    """One method's accuracy (mean over datasets, %) and mean latency from ``by[(dataset, label)]
    = (latencies, per-question accuracy)``, with its differences to ``baseline`` and ``method``
    computed on the same questions (an ablation may have been run on fewer)."""
    import statistics
    n = min(len(by[(ds, label)][0]) for ds in datasets)

    def acc(name: str) -> float:
        return statistics.mean(100 * statistics.mean(by[(ds, name)][1][:n]) for ds in datasets)

    def latency(name: str) -> float:
        return statistics.mean(x for ds in datasets for x in by[(ds, name)][0][:n])
    lo, hi = paired_bootstrap_ci([by[(ds, label)][1][:n] for ds in datasets],
                                 [by[(ds, baseline)][1][:n] for ds in datasets])
    return {"method": label, "questions": n, "mean_accuracy": acc(label), "mean_latency_s": latency(label),
            "acc_minus_standard": acc(label) - acc(baseline), "ci95_vs_standard": f"[{lo:.1f}, {hi:.1f}]",
            "acc_minus_method": acc(label) - acc(method), "latency_over_standard": latency(label) / latency(baseline)}


def by_label(summary: list[dict], label: str) -> dict:
    return next(r for r in summary if r["method"] == label)


def made_before(run: Path, commit: str, earliest: bool = False) -> bool:
    """Whether a run's code predates ``commit`` (its manifest's source revision, or for a run that
    recorded none, its time against the commit's): a latency from before an engine change is not
    comparable with one from after it. ``earliest``: judge the first manifest the folder was
    committed with, for a run grown or resumed since (its first answers keep their latencies)."""
    import json
    import subprocess
    git = lambda *a: subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True,  # noqa: E731
                                    env={**os.environ, "TZ": "UTC"})
    manifest = json.loads((Path(run) / "manifest.json").read_text())
    if earliest:
        path = (Path(run).resolve() / "manifest.json").relative_to(REPO)
        first = git("log", "--reverse", "--format=%H", "--", str(path)).stdout.split()
        if first:
            manifest = json.loads(git("show", f"{first[0]}:{path}").stdout)
    revision = manifest.get("versions", {}).get("specrag_source", "").removesuffix("+dirty")
    if len(revision) == 40:
        ancestry = git("merge-base", "--is-ancestor", commit, revision)  # 0: yes, 1: no, else unknown
        if ancestry.returncode not in (0, 1):
            raise ValueError(f"{run}: cannot place its commit {revision} against {commit}: {ancestry.stderr.strip()}")
        return ancestry.returncode == 1
    committed = git("log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%dT%H:%M:%SZ", commit)
    if committed.returncode or not committed.stdout.strip():
        raise ValueError(f"commit {commit} is not in {REPO}: {committed.stderr.strip()}")
    return manifest["written"] < committed.stdout.strip()  # both UTC, ISO 8601


def cpu_model() -> str:
    from specrag.inference.processor import cpu_model_and_flags
    return cpu_model_and_flags()[0]


def cpu_flags() -> list[str]:
    """The processor flags that decide kernel speed here: AVX2, AVX-512 BF16/VNNI, AMX."""
    from specrag.inference.processor import REPORTED_FLAGS, cpu_model_and_flags
    return sorted(cpu_model_and_flags()[1] & REPORTED_FLAGS)


def machine_line(threads: int) -> str:
    import torch
    return (f"Machine: {cpu_model()} ({platform.machine()}, flags {' '.join(cpu_flags()) or '-'}), "
            f"{os.cpu_count()} cores, torch {torch.__version__}, {threads} torch thread(s)")


def shown(folder: str) -> str:
    """A folder inside the repository as a path from its root (the results file is committed)."""
    path = Path(folder).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else folder


def recorded() -> str:
    return f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."


READING = "\n## Reading"


def publish_or_print(results: str | None, title: str, setup: str, report: str, last_line: str,
                     command: str | None = None) -> None:
    """``publish`` to ``results``, or with none print the whole record (a look without writing)."""
    if results:
        publish(str(results), title, setup, report, last_line, command)
    else:
        print(f"{setup}\n\n{report}\n\n{last_line}")


def publish(results: str, title: str, setup: str, report: str, last_line: str, command: str | None = None) -> None:
    """Print the report and its last line; record both with the command that made them.

    A hand-written ``## Reading`` section after the claim line is kept when the table is
    rewritten: a suite resumed over many sessions re-records its table each time, and the
    reading is the part no script can redo (a notice says to check it against the new table)."""
    print(report)
    command = command or shlex.join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    path = Path(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = f"# {title}\n\nCommand: `{command}`\n\n{setup}\n{recorded()}\n{report}\n\n{last_line}\n"
    old = path.read_text() if path.exists() else ""
    if READING in old and READING not in report:
        text += old[old.index(READING):]
        print(f"kept the hand-written reading of {results}: check it against the new table", flush=True)
    path.write_text(text)
    print(last_line)
