"""One output folder, one run: the rules every job follows before, while and after it writes.

Every job that writes a folder (``answer`` batch and streaming, ``extract-triplets``,
``build-index``, ``build-datastore``, the training commands, ``compare``'s reuse) asks its
``RunFolder`` what it may do there, as a library call and from the CLI alike:

- **refuse**: a folder that holds an earlier run is kept unless ``resume`` or ``overwrite`` says
  what to do with it (an identity file alone is a run that produced nothing);
- **resume**: only with the same run identity and the same inputs, or with ``grow_from`` over an
  input that holds the earlier one unchanged and more (``check_resumable``, ``check_inputs``);
- **overwrite** is a transaction (``writing``): the earlier run's files are moved into
  ``.replaced-<token>/``; if the new run fails for any reason (its failure share included) they
  are put back and the failed run's files are kept in ``.failed-<token>/`` (the last failed run
  only: a new failure removes the one before); if it is killed,
  the next command over the folder settles it (``--resume`` completes the new run, anything else
  puts the earlier one back, saying so); they are deleted only once the new run's manifest is
  written and judged;
- **reconcile** and **failure share**: where every input row went over all attempts, and the
  ``RunFailed`` that a run ending over ``max_failure_fraction`` raises.

Example usage::

    folder = RunFolder("out/", ANSWER)
    with folder.writing(resume=False, overwrite=True) as lease:
        ...  # write results under lease.token, then the manifest
        folder.judge(folder.reconcile(inputs), max_failure_fraction=0.5)
"""
from __future__ import annotations

import contextlib
import json
import sys
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from specrag.jobio.files import (delete, exists, is_local, join, match_files, mkdirs, open_parquet, read_parquet,
                                 read_text, remove_tree, write_parquet)
from specrag.jobio.lease import LEASE_FILE, Lease
from specrag.wording import count

IDENTITY_FILE = "identity.json"
INPUTS_FILE = "inputs.json"  # the input files' contents (no paths), written before the run
MANIFEST_FILE = "manifest.json"
ASIDE = ".replaced-"
FAILED = ".failed-"


class RunFailed(RuntimeError):
    """The run wrote its outputs, but too many inputs ended as dead letters (or some were lost)."""


class EarlierRun(ValueError):
    """The folder holds an earlier run and nothing said what to do with it."""


@dataclass(frozen=True)
class RunLayout:
    """Which files of a folder are one run's: ``held`` names what counts as an earlier run (label,
    glob), ``owned`` every glob an overwrite sets aside (None: every file not hidden), ``results``
    / ``dead_letters`` and ``id_column`` what reconciliation counts, ``unit`` what its messages say."""
    job: str
    held: tuple[tuple[str, str], ...]
    owned: tuple[str, ...] | None
    results: str = "results-*.parquet"
    dead_letters: str = "dead_letters-*.parquet"
    id_column: str = "id"
    unit: str = "input rows"


EVALUATION_FILE = "evaluation.json"  # `evaluate`'s report of the run: derived, so it goes where the run goes
ANSWER = RunLayout("answer", (("results", "results-*.parquet"), ("dead letters", "dead_letters-*.parquet"),
                              ("a manifest", MANIFEST_FILE)),
                   ("results-*.parquet", "dead_letters-*.parquet", MANIFEST_FILE, IDENTITY_FILE, INPUTS_FILE,
                    EVALUATION_FILE))
EXTRACT_TRIPLETS = RunLayout(
    "extract-triplets", (("extracted triplets", "extracted-*.parquet"), ("dead letters", "dead_letters-*.parquet"),
                         ("a manifest", MANIFEST_FILE)),
    ("extracted-*.parquet", "triplets-*.parquet", "dead_letters-*.parquet", MANIFEST_FILE, IDENTITY_FILE),
    results="extracted-*.parquet", id_column="passage_id", unit="passages")
INDEX = RunLayout("build-index", (("an index", MANIFEST_FILE),), None, dead_letters="dead_letters*.parquet",
                  unit="passages")
# a training command's model folder: any file there is an earlier model (or its dead letters)
TRAINED_MODEL = RunLayout("train", (("files (a model or its dead letters)", "[!.]*"),), None,
                          dead_letters="dead_letters.parquet")
DATASTORE = RunLayout("build-datastore", (("a datastore", MANIFEST_FILE),), None, dead_letters="dead_letters*.parquet",
                      unit="passages")


def slug(label: str) -> str:
    """A folder name for a label (stable, readable): a suite's dataset and method labels."""
    import re
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "run"


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _say(line: str) -> None:
    print(f"specrag: {line}", file=sys.stderr, flush=True)


class RunFolder:
    """The rules of one output folder for one kind of job (see the module's docstring)."""

    def __init__(self, path: str, layout: RunLayout, say: Callable[[str], None] = _say):
        self.path, self.layout, self.say = str(path), layout, say

    # --- what is there -------------------------------------------------------------------------
    def held(self) -> list[str]:
        """What an earlier run left here, by label ("results", "a manifest", ...)."""
        return [label for label, pattern in self.layout.held if match_files(join(self.path, pattern))]

    def run_files(self) -> list[str]:
        """Every file of the run in this folder (what an overwrite sets aside)."""
        if self.layout.owned is not None:
            return sorted({f for pattern in self.layout.owned for f in match_files(join(self.path, pattern))})
        prefix = self.path.rstrip("/") + "/"
        return [f for f in match_files(prefix + "**") if not f[len(prefix):].startswith(".")]

    def has_run(self) -> bool:
        """Whether any run (finished, failed or killed) wrote here: its files, or a stopped overwrite."""
        return bool(self.run_files() or self.pending())

    def pending(self) -> list[str]:
        """Set-aside folders of --overwrite runs that never finished (killed), oldest name first."""
        prefix = self.path.rstrip("/") + "/"
        return sorted({prefix + f[len(prefix):].split("/", 1)[0]
                       for f in match_files(join(self.path, f"{ASIDE}*", "**"))})

    def failed_runs(self) -> list[str]:
        """Folders of the files of failed --overwrite runs (``.failed-<token>/``)."""
        prefix = self.path.rstrip("/") + "/"
        return sorted({prefix + f[len(prefix):].split("/", 1)[0]
                       for f in match_files(join(self.path, f"{FAILED}*", "**"))})

    def refuse_earlier(self) -> None:
        held = self.held()
        if held:
            raise EarlierRun(f"{self.path} already holds an earlier run ({', '.join(held)}): pass --resume to complete "
                             "that run, --overwrite to replace it, or choose another output folder"
                             if self.layout.job in ("answer", "extract-triplets") else
                             f"{self.path} already holds {held[0]}: pass --overwrite to rebuild it, or choose "
                             "another output folder")

    def check_readable(self) -> None:
        """For commands that read a run (evaluate, report): a killed --overwrite is named, not read."""
        pending = self.pending()
        if pending:
            raise ValueError(f"{self.path} holds an --overwrite run that never finished (the run it replaces is set "
                             f"aside in {pending[-1]}): run it again with --resume to complete it, or run any other "
                             "command over the folder to put the earlier run back")

    # --- the transaction -----------------------------------------------------------------------
    @contextlib.contextmanager
    def writing(self, *, resume: bool = False, overwrite: bool = False) -> Iterator[Lease]:
        """Hold the folder for one run: refuse, settle a killed overwrite, set the earlier run aside.

        Yields the lease (its token goes to every shard commit). Whatever ends the body with an
        exception, an earlier run set aside is put back; it is deleted when the body returns."""
        if resume and overwrite:
            raise ValueError("--resume and --overwrite exclude each other")
        if not (resume or overwrite) and not self.pending():
            self.refuse_earlier()  # before touching anything (a folder is not even created)
        mkdirs(self.path)
        with Lease(self.path) as lease:  # one writer per folder; a killed run's lease is stale
            aside = self._settle(resume, overwrite)
            if not (resume or overwrite):
                self.refuse_earlier()
            if overwrite:
                aside = self._set_aside()
            try:
                yield lease
            except BaseException as error:
                if aside:
                    earlier_failures = self.failed_runs()
                    failed = self._put_back(aside)
                    raise _amended(error, f"the earlier run is back in {self.path}"
                                   + (f"; this run's files are in {failed}" if failed else "")
                                   + ("; the last failed run's files are kept; the one before was removed"
                                      if failed and earlier_failures else "")) from None
                raise
            if aside:
                remove_tree(aside)

    def _settle(self, resume: bool, overwrite: bool) -> str | None:
        """A killed --overwrite left its earlier run aside: --resume carries the new run on (the
        earlier one stays aside until it succeeds), any other command puts the earlier one back."""
        pending = self.pending()
        if not pending:
            return None
        if resume:
            for older in pending[:-1]:
                remove_tree(older)
            self.say(f"resuming the --overwrite run that was stopped in {self.path}; the run it replaces stays in "
                     f"{pending[-1]} until this one succeeds")
            return pending[-1]
        for aside in reversed(pending):
            failed = self._put_back(aside)
            self.say(f"{self.path}: an --overwrite run had been stopped before it finished; the run it was replacing "
                     f"is back in place{f' (the stopped run is in {failed})' if failed else ''}")
        return None

    def _set_aside(self) -> str | None:
        paths = self.run_files()
        if not paths:
            return None
        aside = join(self.path, f"{ASIDE}{uuid.uuid4().hex[:12]}")
        self._move(paths, self.path, aside)
        return aside

    def _put_back(self, aside: str) -> str | None:
        """Move a failed or stopped run's files into ``.failed-<token>/`` (None when it wrote none),
        and the set-aside run back into place."""
        written = self.run_files()
        failed = join(self.path, f"{FAILED}{_name(aside)[len(ASIDE):]}") if written else None
        if written:
            for older in self.failed_runs():  # the last failed run is the one looked at; the rest would pile up
                remove_tree(older)
            self._move(written, self.path, failed)
        self._move(match_files(aside.rstrip("/") + "/**"), aside, self.path)
        remove_tree(aside)
        return failed

    @staticmethod
    def _move(paths: list[str], source: str, target: str) -> None:
        from apache_beam.io.filesystems import FileSystems
        prefix = source.rstrip("/") + "/"
        targets = [join(target, p[len(prefix):]) for p in paths]
        for t in sorted({t.rsplit("/", 1)[0] for t in targets}):
            mkdirs(t)
        if paths:
            FileSystems.rename(list(paths), targets)
        if is_local(source):  # folders the moved files leave empty
            import os
            for p in sorted({os.path.dirname(p) for p in paths}, key=len, reverse=True):
                while p.rstrip("/") != source.rstrip("/") and os.path.isdir(p) and not os.listdir(p):
                    os.rmdir(p)
                    p = os.path.dirname(p)

    # --- resume ----------------------------------------------------------------------------------
    def check_resumable(self, identity: dict[str, Any]) -> None:
        """Refuse to resume a folder whose earlier run had another identity, saying what differs.
        The identity file is written before a run starts, so it covers every result file there."""
        earlier = self.recorded_identity()
        if earlier is None:
            if match_files(join(self.path, self.layout.results)):
                raise ValueError(f"cannot resume {self.path}: it holds results but no {IDENTITY_FILE} that says how "
                                 "they were made; use --overwrite or a new output folder")
            return
        diffs = identity_differences(earlier, json.loads(json.dumps(identity, default=str)))
        if diffs:
            raise ValueError(f"cannot resume {self.path}: its results were made with a different run identity "
                             f"({'; '.join(diffs)}); use the same settings, --overwrite, or a new output folder")

    def recorded_identity(self) -> dict | None:
        """The identity the run here was started with (written before its first result), or None."""
        path = join(self.path, IDENTITY_FILE)
        return read_json(path) if exists(path) else None

    def recorded_inputs(self) -> list[dict] | None:
        """What the input files of the run here held (``input_contents``), from inputs.json or, for a
        run from before that file was written, its manifest; None when neither says."""
        if exists(join(self.path, INPUTS_FILE)):
            return read_json(join(self.path, INPUTS_FILE))
        if exists(join(self.path, MANIFEST_FILE)):
            return input_contents(read_json(join(self.path, MANIFEST_FILE)).get("inputs") or {}) or None
        return None

    def check_inputs(self, inputs: dict, grow_from: dict | None = None, grow_from_name: str = "") -> dict | None:
        """Refuse to resume over other input files than the earlier attempts answered: the results
        would mix two query sets. With ``grow_from`` (the fingerprint of the earlier, smaller input)
        the earlier input must be exactly what they answered, and every one of its rows must be in
        this input unchanged; returns it then (None when the inputs are the same)."""
        recorded = self.recorded_inputs()
        if recorded is None or recorded == json.loads(json.dumps(input_contents(inputs))):
            return None
        if grow_from is None and _prefix_of(recorded, json.loads(json.dumps(input_contents(inputs)))):
            return dict(enumerate(recorded))  # a larger --limit over the same files: the earlier rows lead
        if grow_from is None:
            raise ValueError(f"cannot resume {self.path}: its results were made from other input files than "
                             f"{', '.join(inputs) or 'these'}; use the same --queries, --grow-from EARLIER_QUERIES when "
                             "these queries hold the earlier ones and more, --overwrite, or a new --output")
        if recorded != json.loads(json.dumps(input_contents(grow_from))):
            raise ValueError(f"cannot grow {self.path} from {grow_from_name}: its results were made from other input "
                             f"files ({sum(r.get('rows') or 0 for r in recorded)} rows) than {grow_from_name}")
        missing = rows_not_contained(list(grow_from), list(inputs))
        if missing:
            raise ValueError(f"cannot grow {self.path} from {grow_from_name}: {len(missing)} of its rows are not in the "
                             f"new input unchanged (first: id {missing[0]!r}); the earlier results would answer other "
                             "questions")
        return grow_from

    def finished(self) -> tuple[list[str], int]:
        """Earlier attempts' result files and the next attempt number (``<kind>-<NNN>-...``)."""
        files = match_files(join(self.path, self.layout.results))
        numbers = [n.split("-")[1] for n in map(_name, files)]
        attempts = [int(n) for n in numbers if n.isdigit()]
        return files, (max(attempts) + 1 if attempts else 0)

    def clear_for_attempt(self, resume: bool) -> None:
        """What an attempt replaces: earlier dead letters (they are retried), half-written shards,
        and without resume every earlier result."""
        stale = match_files(join(self.path, self.layout.dead_letters)) + match_files(join(self.path, ".*.inprogress"))
        if not resume:
            stale += match_files(join(self.path, self.layout.results))
        delete(stale)

    # --- compaction --------------------------------------------------------------------------------
    def compact(self) -> list[str]:
        """A finished run's result shards as one file, and its dead-letter shards as one: what a
        versioned runs folder keeps (a suite's run is hundreds of shards, written as queries finish
        so that a killed run resumes). Rows keep their order (the first result of an id is still the
        first) and every row is kept, duplicates included, so reports and reconciliation read the
        same. A run still being written, stopped mid-overwrite or streaming (its shard names hold
        their windows) is left as it is. Returns the files written."""
        manifest = join(self.path, MANIFEST_FILE)
        if (not exists(manifest) or exists(join(self.path, LEASE_FILE)) or self.pending()
                or read_json(manifest).get("mode") == "streaming"):
            return []
        import pyarrow as pa
        written = []
        for pattern in (self.layout.results, self.layout.dead_letters):
            shards = match_files(join(self.path, pattern))
            if len(shards) < 2:
                continue
            names = [_name(f) for f in shards]
            attempts = [int(n.split("-")[1]) for n in names if n.split("-")[1].isdigit()]
            kind = pattern.split("*", 1)[0].rstrip("-")
            target = join(self.path, f"{kind}-{max(attempts, default=0):03d}-compacted.parquet")
            table = pa.concat_tables([read_parquet(f) for f in shards], promote_options="default")
            write_parquet(target, table)  # whole before any shard goes: a kill here duplicates, never loses
            delete([f for f in shards if f != target])
            written.append(target)
        return written

    # --- reconcile and judge ---------------------------------------------------------------------
    def reconcile(self, inputs: dict) -> dict:
        """Where every input row went, over all attempts of the run. An attempt keeps the results
        of the earlier ones and judges every other row again (earlier dead letters are retried), so
        the input rows must equal the distinct result ids plus the last attempt's distinct dead
        letters (an unreadable file is one dead letter without rows). ``lost`` > 0 means rows
        vanished; ``duplicated`` counts rows a retried bundle wrote twice (readers keep one per id).
        Read from the files themselves: it holds on any runner, with or without metrics."""
        input_rows = sum(v["rows"] for v in inputs.values() if isinstance(v.get("rows"), int))
        column = self.layout.id_column
        ids = [i for f in match_files(join(self.path, self.layout.results))
               for i in read_parquet(f, columns=[column]).column(column).to_pylist()]
        dead = [tuple(r.values()) for f in match_files(join(self.path, self.layout.dead_letters))
                for r in read_parquet(f, columns=["id", "stage", "raw"]).to_pylist()]
        distinct_dead = set(dead)
        unreadable = sum(1 for d in distinct_dead if d[1] == "read")  # one dead letter per unreadable file
        answered = len(set(ids))
        return {"input_rows": input_rows, "results": answered, "dead_letters": len(distinct_dead),
                "unreadable_files": unreadable, "lost": input_rows - answered - (len(distinct_dead) - unreadable),
                "duplicated": len(ids) - answered + len(dead) - len(distinct_dead)}

    def account(self, kept: int) -> dict:
        """A build's reconciliation (an index or datastore keeps its passages in its own files):
        ``kept`` passages and the dead letters written here."""
        dead = sum(open_parquet(f).metadata.num_rows for f in match_files(join(self.path, self.layout.dead_letters)))
        return {"input_rows": kept + dead, "results": kept, "dead_letters": dead, "unreadable_files": 0, "lost": 0,
                "duplicated": 0}

    def judge(self, rec: dict, max_failure_fraction: float) -> None:
        """Raise RunFailed when input rows were lost or the run's dead-letter share (every attempt's)
        exceeds ``max_failure_fraction``; inside ``writing``, so an overwritten run comes back."""
        unit = self.layout.unit
        if rec["lost"] > 0:
            raise RunFailed(f"{reconciliation_line(rec)}: {rec['lost']} {unit} are in neither results nor dead "
                            f"letters; outputs and manifest are in {self.path}")
        share = failure_share(rec)
        if share > max_failure_fraction:
            what = f"{unit} and unreadable files" if rec["unreadable_files"] else unit
            raise RunFailed(f"{rec['dead_letters']} of {rec['results'] + rec['dead_letters']} {what} ended as dead "
                            f"letters ({share:.0%} > --max-failure-fraction {max_failure_fraction}) over every "
                            f"attempt of the run; outputs and manifest are in {self.path}")


def _amended(error: BaseException, note: str) -> BaseException:
    """``error`` with what the overwrite transaction did, in its one line where the type allows."""
    if isinstance(error, Exception) and error.args and isinstance(error.args[0], str):
        try:
            return type(error)(f"{error.args[0]} ({note})", *error.args[1:])
        except Exception:  # a type whose constructor takes other arguments
            pass
    error.add_note(note)
    return error


def failure_share(rec: dict) -> float:
    """The run's dead-letter share: of every input row (and unreadable file), over all attempts."""
    handled = rec["results"] + rec["dead_letters"]
    return round(rec["dead_letters"] / handled, 6) if handled else 0.0


def reconciliation_line(rec: dict) -> str:
    files = f" + {count(rec['unreadable_files'], 'unreadable file')}" if rec["unreadable_files"] else ""
    return (f"{count(rec['input_rows'], 'input row')}{files} = {count(rec['results'], 'result')} + "
            f"{count(rec['dead_letters'], 'dead letter')} (lost {rec['lost']}, duplicated {rec['duplicated']})")


def read_json(path: str) -> Any:
    """A JSON file of a run or an index; a corrupt one is an error naming the file."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); the folder's run or index is damaged") from None


def read_manifest(folder: str, what: str, build: str) -> dict:
    """A built folder's manifest (an index's, a datastore's, a triplet folder's), through
    FileSystems (the folder may be remote); ``what`` names the folder, ``build`` the command that
    makes one, both for the error of a folder that is not one."""
    from specrag.wording import a
    path = join(folder, "manifest.json")
    if not exists(path):
        raise ValueError(f"{folder} is not {a(what)} (no manifest.json); build one with `{build}`")
    manifest = read_json(path)
    if not isinstance(manifest, dict):
        raise ValueError(f"{path} is not a manifest (a JSON {type(manifest).__name__}); build the {what} again "
                         f"with `{build}`")
    return manifest


def manifest_kinds(folder: str, what: str, build: str) -> dict:
    """The kinds an index's or datastore's manifest lists; another job's manifest (a results
    folder's, a triplet folder's) is named as such, not a KeyError."""
    from specrag.wording import a
    manifest = read_manifest(folder, what, build)
    if not isinstance(manifest.get("kinds"), dict):
        job = manifest.get("job")
        raise ValueError(f"{folder} is not {a(what)}: its manifest.json is "
                         f"{'a `specrag ' + job + '` manifest' if job else 'not one'}; build one with `{build}`")
    return manifest["kinds"]


def identity_differences(earlier: dict, now: dict, prefix: str = "") -> list[str]:
    """'key: earlier -> now' for every part that differs (nested keys joined by dots)."""
    out = []
    for key in sorted(set(earlier) | set(now), key=str):
        a, b = earlier.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += identity_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def input_contents(inputs: dict) -> list[dict]:
    """What the input files hold, without their paths: the same queries copied to a bucket are
    the same input; a different file is not."""
    return sorted((v for v in inputs.values()), key=lambda v: json.dumps(v, sort_keys=True))


def _prefix_of(recorded: list[dict], contents: list[dict]) -> bool:
    """Whether the recorded inputs are the first rows of the same files (``--limit`` grew)."""
    def file_of(entry: dict) -> dict:
        return {k: v for k, v in entry.items() if k not in ("rows", "of_rows")}
    new = {json.dumps(file_of(c), sort_keys=True): c for c in contents}
    for r in recorded:
        c = new.get(json.dumps(file_of(r), sort_keys=True))
        if c is None or not isinstance(r.get("rows"), int) or not isinstance(c.get("rows"), int) or r["rows"] > c["rows"]:
            return False
        if r["rows"] < c["rows"] and "of_rows" not in r:  # the earlier run read the whole file
            return False
    return True


def rows_not_contained(earlier: list[str], files: list[str]) -> list[str]:
    """Ids of the rows of the ``earlier`` files that ``files`` lack or hold with other content, in file order."""
    import hashlib

    def digest(row: dict) -> str:
        return hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()
    from specrag.jobio.tables import read_table
    held = {(r.get("id"), digest(r)) for f in files for r in read_table(f).to_pylist()}
    return [str(r.get("id")) for f in earlier for r in read_table(f).to_pylist()
            if (r.get("id"), digest(r)) not in held]


__all__ = ["ANSWER", "ASIDE", "DATASTORE", "EXTRACT_TRIPLETS", "EarlierRun", "FAILED", "IDENTITY_FILE", "INDEX",
           "INPUTS_FILE", "LEASE_FILE", "MANIFEST_FILE", "RunFailed", "RunFolder", "RunLayout", "TRAINED_MODEL", "failure_share",
           "identity_differences", "input_contents", "read_json", "reconciliation_line", "rows_not_contained", "slug"]
