"""`specrag compare`: every method × dataset of a suite as a normal answer job, then one report.

Each job is the `specrag answer` job its flags describe (any runner), written under
``WORKDIR/runs/DATASET/METHOD``. A job whose manifest shows it finished with the same run
identity is reused as it is; a killed one is resumed (only its missing queries run). Then every
run is evaluated against its dataset's gold and the report (Markdown, self-contained HTML, JSON)
is written; ``--check`` compares the results with the suite's expectations.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from specrag.pipelines.suite import Suite, SuiteDataset, load_suite, slug

log = logging.getLogger(__name__)


@dataclass
class RunRecord:
    """One method on one dataset: where it ran and how it went."""
    dataset: str
    label: str
    method: str
    output: str
    queries: str
    index: str | None
    status: str = "pending"  # ran | resumed | reused | failed | not applicable
    error: str = ""
    wall_s: float = 0.0
    manifest: dict = field(default_factory=dict)


@dataclass
class CompareOutcome:
    records: list[RunRecord]
    report: dict
    files: dict[str, str]
    failed_expectations: list[str]


def prepare_dataset(dataset: SuiteDataset, workdir: Path) -> tuple[str, str | None]:
    """(queries file or glob, index folder or None): the bundled demo data written out, the
    first ``limit`` questions taken, the index built from ``corpus`` once."""
    import pyarrow as pa
    from specrag.pipelines.build_index import run_build_index
    from specrag.importers.demo import write_demo_tables
    from specrag.jobio.tables import read_table
    from specrag.jobio.inputs import expand_inputs
    here = workdir / "data" / slug(dataset.name)
    queries, corpus = dataset.queries, dataset.corpus
    if "demo" in (queries, corpus):
        demo_queries, demo_corpus = write_demo_tables(here / "demo")
        queries = str(demo_queries) if queries == "demo" else queries
        corpus = str(demo_corpus) if corpus == "demo" else corpus
    if dataset.limit or dataset.split:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        from specrag.evaluation.splits import load_split
        keep = pa.array(load_split(dataset.split)) if dataset.split else None
        limit = dataset.limit or None
        rows: list[dict] = []
        schema = None
        for f in expand_inputs(queries):  # sorted file order, then row order: deterministic
            table = read_table(f)
            if keep is not None:  # held-out questions only: none a trained component has seen
                table = table.filter(pc.is_in(table.column("id"), value_set=keep))
            schema = schema or table.schema
            rows.extend(table.slice(0, limit - len(rows) if limit else None).to_pylist())
            if limit and len(rows) >= limit:
                break
        if not rows:
            raise ValueError(f"dataset {dataset.name}: no questions in {queries}"
                             + (f" belong to split {dataset.split}" if dataset.split else ""))
        here.mkdir(parents=True, exist_ok=True)
        name = "-".join(["queries", *([dataset.split] if dataset.split else []), f"first-{limit or 'all'}"])
        path = here / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        queries = str(path)
    index = dataset.index
    if index is None and corpus:
        index = str(workdir / "indexes" / slug(dataset.name))
        if not (Path(index) / "manifest.json").exists():
            print(f"compare: building a BM25 index of {corpus} for {dataset.name}", flush=True)
            run_build_index(corpus, index, ["bm25"])
    return queries, index


def _finished(output: str, fingerprint: str, contents: list[dict]) -> dict | None:
    """The manifest of a finished run with this identity over these inputs, or None (a suite whose
    ``limit`` grew finds its earlier, smaller run: that one is grown, not reported as this)."""
    from specrag.jobio.files import exists, join, read_text
    path = join(output, "manifest.json")
    if not exists(path):
        return None
    manifest = json.loads(read_text(path))
    return manifest if manifest.get("run_fingerprint") == fingerprint and answered(manifest) == _plain(contents) else None


def answered(manifest: dict) -> list[dict]:
    """The inputs a finished run answered, as its manifest records them (inputs.json is written when
    an attempt starts: a grown attempt that was stopped names inputs the run has not answered)."""
    from specrag.jobio.run_folder import input_contents
    return _plain(input_contents(manifest.get("inputs") or {}))


def _plain(contents: list[dict]) -> list[dict]:
    return json.loads(json.dumps(contents))


def reusable_elsewhere(reuse_from: list[str], fingerprint: str, contents: list[dict]) -> str | None:
    """A finished run in another suite's runs folder (ROOT/DATASET/METHOD) with this run identity
    and these input contents, whatever its labels: the same job need not run twice."""
    from specrag.jobio.files import join, match_files, read_text
    for root in reuse_from:
        for manifest_path in sorted(match_files(join(root, "*", "*", "manifest.json"))):
            manifest = json.loads(read_text(manifest_path))
            if manifest.get("run_fingerprint") == fingerprint and answered(manifest) == _plain(contents):
                return manifest_path.rsplit("/", 1)[0]
    return None


def earlier_prefix(dataset: SuiteDataset, workdir: Path, output: str, contents: list[dict]) -> str | None:
    """The queries file of the run in ``output`` when they are a prefix of this dataset's questions
    (the run was made with a smaller ``limit``): the same questions taken with that limit, whose
    contents match what the run recorded. None when the run answered these inputs or others."""
    from specrag.jobio.inputs import dataset_fingerprint
    from specrag.jobio.run_folder import ANSWER, RunFolder, input_contents
    recorded = RunFolder(output, ANSWER).recorded_inputs()
    if not recorded or recorded == _plain(contents):
        return None
    rows, now = sum(r.get("rows") or 0 for r in recorded), sum(r.get("rows") or 0 for r in contents)
    if not 0 < rows < now:
        return None
    prefix, _ = prepare_dataset(replace(dataset, limit=rows), workdir)
    same = _plain(input_contents(dataset_fingerprint([prefix]))) == recorded
    return prefix if same else None


def copy_run(source: str, out: str) -> dict:
    """A finished run's files copied into this suite's folder (it stays self-contained and
    versionable on its own); returns the manifest."""
    from specrag.jobio.files import join, mkdirs, read_bytes, read_text, write_bytes
    from specrag.jobio.run_folder import ANSWER, RunFolder
    mkdirs(out)
    for f in RunFolder(source, ANSWER).run_files():  # results, dead letters, identity and inputs first: the manifest last
        if not f.endswith("/manifest.json"):
            write_bytes(join(out, f.rsplit("/", 1)[-1]), read_bytes(f))
    manifest = read_text(join(source, "manifest.json"))
    write_bytes(join(out, "manifest.json"), manifest.encode())
    return json.loads(manifest)


def task_types_of(queries: str) -> set[str]:
    """The task types among a dataset's questions (a missing one is short-form, as validation reads it)."""
    from specrag.jobio.tables import read_table
    from specrag.jobio.inputs import expand_inputs
    types = set()
    for f in expand_inputs(queries):
        table = read_table(f)
        column = table.column("task_type").to_pylist() if "task_type" in table.column_names else [None]
        types.update(t or "short_form" for t in column)
    return types


def run_jobs(suite: Suite, workdir: Path, extra_flags: list[str] = (), runs_dir: Path | None = None,
             report_only: bool = False, reuse_from: list[str] = ()) -> list[RunRecord]:
    """Every method × dataset, reusing finished runs; a failed job is recorded and the rest go on;
    a method that answers none of a dataset's task types is not run there (status "not applicable").
    The answer jobs write under ``runs_dir`` (default WORKDIR/runs): a folder kept apart from the
    data copies can be versioned, so a suite longer than one sitting resumes on another machine.
    ``report_only`` starts no job and builds no identity: each finished run found is taken as its
    manifest records it (trained models of an earlier sitting need not exist), the rest are "not run".
    ``reuse_from``: other suites' runs folders; a finished run there with the same identity and
    input contents is copied instead of run again."""
    from specrag.methods.base import method_class
    from specrag.jobio.run_folder import ANSWER, RunFailed, RunFolder, input_contents
    from specrag.pipelines.answer import answer_job_from_flags, run_answer, run_fingerprint, run_identity
    from specrag.jobio.files import exists, join, read_text
    from specrag.jobio.inputs import dataset_fingerprint, expand_inputs
    records = []
    total = len(suite.datasets) * len(suite.methods)
    for dataset in suite.datasets:
        queries, index = prepare_dataset(dataset, workdir)
        tasks = task_types_of(queries)
        for method in suite.methods:
            out = str((runs_dir or workdir / "runs") / slug(dataset.name) / slug(method.label))
            rec = RunRecord(dataset.name, method.label, method.method, out, queries, index)
            records.append(rec)
            flags = [*suite.job_flags(dataset, method), *extra_flags, "--queries", queries, "--output", out]
            if index:
                flags += ["--index", index]
            step = f"[{len(records)}/{total}] {dataset.name} × {method.label}"
            answers = method_class(method.method).task_types
            if answers is not None and not tasks & set(answers):
                rec.error = (f"{method.method} answers {', '.join(answers)} questions only; "
                             f"{dataset.name} has {', '.join(sorted(tasks))}")
            elif method.datasets and dataset.name not in method.datasets:
                rec.error = f"the suite runs it on {', '.join(method.datasets)} only"
            if rec.error:
                rec.status = "not applicable"
                print(f"{step}: not applicable ({rec.error})", flush=True)
                continue
            if report_only:
                manifest = join(out, "manifest.json")
                found = json.loads(read_text(manifest)) if exists(manifest) else None
                if found and found.get("method") == method.method:
                    rec.status, rec.manifest = "reused", found
                elif found:  # a folder of another method: never reported under this label
                    rec.status, rec.error = "not run", f"the run in {out} is of method {found.get('method')!r}"
                else:
                    rec.status, rec.error = "not run", f"no finished run in {out} yet"
                print(f"{step}: {rec.status}", flush=True)
                continue
            try:
                job = answer_job_from_flags(flags, "compare")
                job = replace(job, extra_manifest={"suite": suite.name, "suite_label": method.label,
                                                   "suite_dataset": dataset.name})
                fingerprint = run_fingerprint(run_identity(job))
                contents = input_contents(dataset_fingerprint(expand_inputs(job.queries)))
                done = _finished(out, fingerprint, contents)
                if done is not None:
                    rec.status, rec.manifest = "reused", done
                    print(f"{step}: reused ({out})", flush=True)
                    continue
                resume = RunFolder(out, ANSWER).has_run()
                source = None if resume else reusable_elsewhere(list(reuse_from), fingerprint, contents)
                if source is not None:
                    rec.status, rec.manifest = "reused", copy_run(source, out)
                    print(f"{step}: reused (copied from {source})", flush=True)
                    continue
                grow_from = earlier_prefix(dataset, workdir, out, contents) if resume else None
                job = replace(job, resume=resume, grow_from=grow_from, overwrite=False)
                print(f"{step}: {'resuming' if resume else 'running'} {method.method}"
                      f"{f' (growing the run over {grow_from})' if grow_from else ''} …", flush=True)
                started = time.time()
                rec.manifest = run_answer(job)
                rec.status, rec.wall_s = ("resumed" if resume else "ran"), time.time() - started
                RunFolder(out, ANSWER).compact()  # a finished run is kept as one results file, not its shards
                print(f"{step}: done in {rec.wall_s:.1f} s", flush=True)
            except (RunFailed, ValueError, FileNotFoundError, KeyError, TypeError, RuntimeError) as e:
                rec.status, rec.error = "failed", f"{type(e).__name__}: {e}"
                print(f"{step}: FAILED: {rec.error}", flush=True)
                log.warning("compare: %s failed: %s", step, rec.error)
    return records


def check_expectations(suite: Suite, report: dict) -> tuple[list[dict], list[str]]:
    """Each expectation with its measured value; the messages of those that do not hold."""
    checked, failed = [], []
    for e in suite.expect:
        row = report["rows"].get(e.dataset, {}).get(e.method) or {}
        measured = row.get(e.metric)
        ok = e.holds(measured)
        checked.append({"dataset": e.dataset, "method": e.method, "metric": e.metric, "expected": e.value,
                        "tolerance": e.tolerance, "measured": measured, "ok": ok})
        if not ok:
            failed.append(f"{e.dataset} × {e.method}: {e.metric} = {measured} is outside "
                          f"{e.value} ± {e.tolerance}")
    return checked, failed


def run_compare(suite_path: str | Path, workdir: str | Path, report_dir: str | Path | None = None,
                check: bool = False, extra_flags: list[str] = (), limit: int = 0,
                methods: tuple[str, ...] = (), datasets: tuple[str, ...] = (),
                runs_dir: str | Path | None = None, report_only: bool = False,
                reuse_from: tuple[str, ...] = ()) -> CompareOutcome:
    from specrag.evaluation.compare_report import build_report, write_report
    suite = load_suite(suite_path).narrowed(limit, tuple(methods), tuple(datasets))
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    records = run_jobs(suite, workdir, list(extra_flags), Path(runs_dir) if runs_dir else None, report_only,
                       list(reuse_from))
    report = build_report(suite, records)
    checked, failed = check_expectations(suite, report)
    report["expectations"] = checked
    failed += [f"{r.dataset} × {r.label}: the job failed ({r.error})" for r in records if r.status == "failed"]
    files = write_report(report, Path(report_dir or workdir))
    if check and not suite.expect:
        failed.append(f"suite {suite.name} has no expectations to check")
    return CompareOutcome(records, report, files, failed if check else [])
