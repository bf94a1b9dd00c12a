"""Comparison suites: which datasets, which methods with which settings and roles, which shared
resources, and what each result is expected to be (pyserini's reproduction YAMLs, for RAG).

A suite is YAML::

    name: smoke
    flags: {threads: 1, runner: FnApiRunner}      # every job: any `specrag answer` or Beam flag
    datasets:
      - name: demo
        queries: demo                            # the bundled demo questions, or Parquet file/glob
        index: {corpus: demo}                    # built once under the workdir; or an index folder
        split: aed_eval                          # only ids of evaluation/splits/NAME.txt (held out
                                                 # from the training splits of AED-RAG and SARDI)
        limit: 16                                # the first N questions, in file order
        headline: {short_form: contains}         # this dataset's metric (over the suite's headline)
    methods:
      - label: standard RAG
        method: standard
        set: {top_k: 3}                          # --set KEY=VALUE
        flags: {model: [generator=smollm2-135m-instruct]}
        baselines: [no retrieval]                # labels this method is compared with
        datasets: [demo]                         # only these datasets (default: every one)
    expect:
      - {dataset: demo, method: standard RAG, metric: contains, value: 50.0, tolerance: 15.0}
    headline: {short_form: f1}                   # the metric plotted and compared (default: the
                                                 # task's first, e.g. contains for short_form)

Flags merge suite < dataset < method: a single-valued flag is replaced, a repeated one
(``model``, ``set``) is appended to (for ``model`` the last role wins). Paths are relative to
the suite file: queries, index, corpus, the ``datastore`` and ``triplets`` flags, and model
files and folders (``model: [denoiser=../runs/denoiser]``: a value starting with . / ~, or one
that exists beside the suite; other ORG/NAME values are Hugging Face ids). Everything is
checked when the suite loads, before any job runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specrag.jobio.run_folder import slug  # noqa: F401 (a suite's run folders are named by it)

REPEATED_FLAGS = ("model", "set")
RESERVED_FLAGS = ("queries", "output", "method", "resume", "overwrite", "index")  # the suite sets these


@dataclass(frozen=True)
class SuiteDataset:
    name: str
    queries: str  # "demo" or a Parquet file/glob
    index: str | None = None  # an index folder
    corpus: str | None = None  # or a corpus to build a BM25 index from ("demo": the bundled one)
    limit: int = 0  # 0: every question
    flags: dict = field(default_factory=dict)
    split: str | None = None  # keep only this split's ids (evaluation/splits/NAME.txt)
    headline: dict = field(default_factory=dict)  # task type -> metric, over the suite's (the papers'
    # metric for this dataset, e.g. contains for PopQA)


@dataclass(frozen=True)
class SuiteMethod:
    label: str
    method: str
    settings: dict = field(default_factory=dict)
    flags: dict = field(default_factory=dict)
    baselines: tuple[str, ...] = ()
    note: str = ""  # why this entry is there (e.g. "the paper's baseline: standard RAG with the verifier")
    datasets: tuple[str, ...] = ()  # only these datasets (empty: every one)


@dataclass(frozen=True)
class Expectation:
    dataset: str
    method: str
    metric: str
    value: float
    tolerance: float

    def holds(self, measured: float | None) -> bool:
        return measured is not None and abs(measured - self.value) <= self.tolerance


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    datasets: tuple[SuiteDataset, ...]
    methods: tuple[SuiteMethod, ...]
    flags: dict = field(default_factory=dict)
    expect: tuple[Expectation, ...] = ()
    description: str = ""
    headline: dict = field(default_factory=dict)  # task type -> the metric plotted and compared

    def headline_for(self, dataset: SuiteDataset) -> dict:
        """Task type -> the metric plotted and compared on this dataset."""
        return {**self.headline, **dataset.headline}

    def method(self, label: str) -> SuiteMethod:
        return next(m for m in self.methods if m.label == label)

    def narrowed(self, limit: int = 0, methods: tuple[str, ...] = (), datasets: tuple[str, ...] = ()) -> "Suite":
        """A quick look at a big suite: at most ``limit`` questions per dataset, only the named
        methods (with the baselines they name) and datasets; its expectations then do not apply."""
        import dataclasses
        unknown = sorted(set(methods) - {m.label for m in self.methods}) + \
            sorted(set(datasets) - {d.name for d in self.datasets})
        if unknown:
            raise ValueError(f"suite {self.name} has no method or dataset {unknown}")
        keep = set(methods) | {b for m in self.methods if m.label in methods for b in m.baselines}
        chosen = tuple(m for m in self.methods if not methods or m.label in keep)
        picked, renamed = [], {}
        for d in self.datasets:
            if datasets and d.name not in datasets:
                continue
            n = min(d.limit or limit, limit or d.limit)
            # fewer questions: another name, so its runs go to other folders and the report says so
            picked.append(d if n == d.limit else dataclasses.replace(d, name=f"{d.name} (first {n})", limit=n))
            renamed[d.name] = picked[-1].name
        kept = []
        for m in chosen:  # a method limited to some datasets keeps those left, or none is run
            if m.datasets:
                mine = tuple(renamed[x] for x in m.datasets if x in renamed)
                if not mine:
                    continue
                m = dataclasses.replace(m, datasets=mine)
            kept.append(m)
        changed = methods or datasets or any(p.limit != d.limit for p, d in zip(picked, self.datasets))
        return dataclasses.replace(self, methods=tuple(kept), datasets=tuple(picked),
                                   expect=() if changed else self.expect)

    def job_flags(self, dataset: SuiteDataset, method: SuiteMethod) -> list[str]:
        """The `specrag answer` flags of one job, less --queries/--index/--output (the runner's)."""
        merged: dict[str, Any] = {}
        for source in (self.flags, dataset.flags, method.flags):
            for key, value in source.items():
                if key in REPEATED_FLAGS:
                    merged.setdefault(key, []).extend(_as_list(value))
                else:
                    merged[key] = value
        merged.setdefault("set", []).extend(f"{k}={_flag_value(v)}" for k, v in method.settings.items())
        args = ["--method", method.method]
        for key, value in merged.items():
            flag = f"--{key}"  # as written: specrag takes both spellings, Beam its own (direct_num_workers)
            if value is True:
                args.append(flag)
            elif value is False or value is None:
                continue
            else:
                for v in _as_list(value):
                    args += [flag, _flag_value(v)]
        return args


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file: every mistake is reported at once, before any job runs."""
    import yaml
    from specrag.methods.base import create_method, parse_settings
    from specrag.registry import METHODS
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())  # safe: tags such as !!python/object are never executed
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{path}: not a suite file{where}: {problem}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a suite is a YAML mapping")
    errors: list[str] = []
    unknown = set(raw) - {"name", "description", "flags", "datasets", "methods", "expect", "headline"}
    if unknown:
        errors.append(f"unknown keys {sorted(unknown)}")
    base = path.parent

    def resolve(p: str | None) -> str | None:
        if p is None or p == "demo" or "://" in p or Path(p).is_absolute():
            return p
        return str((base / p).resolve())

    flags = _check_flags(raw.get("flags") or {}, "flags", errors, resolve)
    datasets = []
    for i, d in enumerate(raw.get("datasets") or []):
        where = f"datasets[{i}]"
        if not isinstance(d, dict) or "name" not in d or "queries" not in d:
            errors.append(f"{where}: needs name and queries")
            continue
        bad = set(d) - {"name", "queries", "index", "limit", "flags", "split", "headline"}
        if bad:
            errors.append(f"{where}: unknown keys {sorted(bad)}")
        index, corpus = d.get("index"), None
        if isinstance(index, dict):
            corpus = index.get("corpus")
            index = None
            if not corpus:
                errors.append(f"{where}: index is a folder or {{corpus: PATH}}")
        limit = d.get("limit", 0)
        if not isinstance(limit, int) or limit < 0:
            errors.append(f"{where}: limit must be a whole number >= 0")
        split = d.get("split")
        if split is not None:
            from specrag.evaluation.splits import SPLITS
            if str(split) not in SPLITS:
                errors.append(f"{where}: unknown split {split!r} (known: {', '.join(SPLITS)})")
        datasets.append(SuiteDataset(str(d["name"]), resolve(str(d["queries"])), resolve(index), resolve(corpus),
                                     int(limit) if isinstance(limit, int) else 0,
                                     _check_flags(d.get("flags") or {}, where, errors, resolve),
                                     str(split) if split is not None else None,
                                     _check_headline(d.get("headline"), f"{where}: headline", errors)))
    methods = []
    for i, m in enumerate(raw.get("methods") or []):
        where = f"methods[{i}]"
        if not isinstance(m, dict) or "method" not in m:
            errors.append(f"{where}: needs method (and label)")
            continue
        bad = set(m) - {"label", "method", "set", "flags", "baselines", "note", "datasets"}
        if bad:
            errors.append(f"{where}: unknown keys {sorted(bad)}")
        name = str(m["method"])
        settings = m.get("set") or {}
        if name not in METHODS:
            errors.append(f"{where}: unknown method {name!r} (known: {', '.join(sorted(METHODS))})")
        else:
            try:  # the same parsing and validation `specrag answer --set` does
                create_method(name, **parse_settings(name, [f"{k}={_flag_value(v)}" for k, v in settings.items()]))
            except (ValueError, TypeError, KeyError) as e:
                errors.append(f"{where} ({name}): {e}")
        methods.append(SuiteMethod(str(m.get("label") or name), name, dict(settings),
                                   _check_flags(m.get("flags") or {}, where, errors, resolve),
                                   tuple(_as_list(m.get("baselines") or [])), str(m.get("note") or ""),
                                   tuple(str(d) for d in _as_list(m.get("datasets") or []))))
    labels = [m.label for m in methods]
    names = [d.name for d in datasets]
    for what, seen in (("method label", labels), ("dataset name", names)):
        dup = sorted({x for x in seen if seen.count(x) > 1})
        if dup:
            errors.append(f"duplicate {what}s {dup}")
    for what, seen in (("method label", labels), ("dataset name", names)):  # --methods/--datasets split on commas
        with_comma = [x for x in seen if "," in x]
        if with_comma:
            errors.append(f"{what}s {with_comma} hold a comma: --methods and --datasets could not name them")
    slugs = [slug(x) for x in labels]
    if len(set(slugs)) != len(slugs):
        errors.append(f"method labels {labels} name the same folders: make them differ in letters or digits")
    for m in methods:
        unknown_sets = sorted(set(m.datasets) - set(names))
        if unknown_sets:
            errors.append(f"method {m.label!r}: datasets {unknown_sets} are not datasets of the suite")
        for b in m.baselines:
            if b not in labels or b == m.label:
                errors.append(f"method {m.label!r}: baseline {b!r} is not another method of the suite")
    if not datasets or not methods:
        errors.append("a suite needs at least one dataset and one method")
    expect = []
    for i, e in enumerate(raw.get("expect") or []):
        where = f"expect[{i}]"
        try:
            x = Expectation(str(e["dataset"]), str(e["method"]), str(e["metric"]), float(e["value"]),
                            float(e["tolerance"]))
        except (KeyError, TypeError, ValueError):
            errors.append(f"{where}: needs dataset, method, metric, value and tolerance (numbers)")
            continue
        if x.dataset not in names or x.method not in labels:
            errors.append(f"{where}: no dataset {x.dataset!r} / method {x.method!r} in the suite")
        if x.tolerance < 0:
            errors.append(f"{where}: tolerance must be >= 0")
        expect.append(x)
    headline = _check_headline(raw.get("headline"), "headline", errors)
    if errors:
        raise ValueError(f"suite {path}: " + "; ".join(errors))
    return Suite(str(raw.get("name") or path.stem), path, tuple(datasets), tuple(methods), flags, tuple(expect),
                 str(raw.get("description") or ""), headline)


def _check_headline(headline: Any, where: str, errors: list[str]) -> dict:
    """A {task type: metric} mapping whose metrics belong to their task types."""
    from specrag.evaluation.metrics import TASK_METRICS
    headline = headline or {}
    for task, metric in (headline.items() if isinstance(headline, dict) else [(where, None)]):
        if metric not in TASK_METRICS.get(task, ()):
            errors.append(f"{where}: {task}: {metric!r} is not a metric of that task type "
                          f"({ {t: list(m) for t, m in TASK_METRICS.items()} })")
    return dict(headline) if isinstance(headline, dict) else {}


PATH_FLAGS = ("datastore", "triplets")  # folders, resolved against the suite file like queries


def _check_flags(flags: Any, where: str, errors: list[str], resolve=lambda p: p) -> dict:
    if not isinstance(flags, dict):
        errors.append(f"{where}: flags is a mapping of flag names to values")
        return {}
    taken = sorted(set(flags) & set(RESERVED_FLAGS))
    if taken:
        errors.append(f"{where}: flags {taken} are set by the suite itself (datasets, methods, workdir)")
    out = dict(flags)
    for key in PATH_FLAGS:
        if isinstance(out.get(key), str):
            out[key] = resolve(out[key])
    if "model" in out:  # ROLE=PATH (a value that is a path) resolves; a name or hub id (ORG/NAME) stays
        out["model"] = [f"{v.split('=', 1)[0]}={resolve(v.split('=', 1)[1])}"
                        if isinstance(v, str) and "=" in v and _is_path(v.split("=", 1)[1], resolve) else v
                        for v in _as_list(out["model"])]
    return out


def _is_path(value: str, resolve) -> bool:
    """A model value that names a file or folder: explicitly relative or absolute, or existing
    beside the suite; anything else with a slash is a Hugging Face id."""
    from pathlib import Path
    return value.startswith((".", "/", "~")) or ("/" in value and Path(resolve(value)).exists())


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _flag_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
