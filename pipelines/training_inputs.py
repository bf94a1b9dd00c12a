"""The rules every job follows, for the training commands (train-utility, train-denoiser).

They run on the launcher, not as Beam jobs, but their outputs are as costly to lose: their model
folder goes through the same lifecycle as every job's output (``training_run``: refused unless
``--resume`` continues a killed run or ``--overwrite`` replaces the model), and input rows that
cannot be used become dead letters beside the model (``dead_letters.parquet``) instead of
being skipped unseen; when their share exceeds ``--max-failure-fraction`` the command fails
before training, with the dead letters written.
"""
from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa

from specrag.jobio.files import join
from specrag.jobio.job_run import job_run
from specrag.jobio.run_folder import TRAINED_MODEL, EarlierRun, RunFolder
from specrag.schemas.tables import DEAD_LETTERS
from specrag.schemas.validation import RowError
from specrag.transforms.records import dead_letter

DEAD_LETTERS_FILE = "dead_letters.parquet"


class TrainingInputFailed(RuntimeError):
    """Too large a share of a training command's input rows could not be used."""


def training_tables(pattern: str, file_name: str, command: str) -> list[str]:
    """The Parquet files a training command reads: a folder's ``file_name`` (what ``command``
    wrote), a file, or a glob."""
    from specrag.jobio.files import match_files
    files = match_files(pattern) if "*" in pattern or pattern.endswith(".parquet") else []
    files = files or match_files(join(pattern, file_name))
    if not files:
        raise FileNotFoundError(f"no {file_name} at {pattern!r} (run `specrag {command}` first)")
    return sorted(files)


@contextlib.contextmanager
def training_run(out_dir: str | Path, *, resume: bool = False, overwrite: bool = False) -> Iterator[Path]:
    """A training command's run in its model folder, through the one job lifecycle (``job_run``)
    as every job's: a folder holding a model is kept unless ``overwrite`` (a transaction: the
    earlier model comes back if training fails); a killed run's checkpoint (``OUTPUT.partial``)
    is continued only with ``resume`` and dropped with ``overwrite``.

    Yields the local folder to write the model to: ``out_dir`` itself, or for an object-store
    output a staging folder on this machine (torch and transformers save to a local disk; a
    killed run's checkpoint stays beside it for ``--resume``), whose files go up to ``out_dir``
    when the run ends, its model or, where it failed, its dead letters."""
    import hashlib
    import shutil
    from specrag.jobio.files import is_local, publish
    from specrag.training.state import partial_dir
    out = str(out_dir)
    staged = not is_local(out)
    local = _staging_root() / hashlib.sha256(out.encode()).hexdigest()[:16] if staged else Path(out)
    checkpoint = partial_dir(local)
    if overwrite:
        shutil.rmtree(checkpoint, ignore_errors=True)  # trained anew
    elif checkpoint.is_dir() and not resume:
        raise EarlierRun(f"{out}: a killed training run left its checkpoint in {checkpoint}: pass --resume to "
                         "continue it, --overwrite to train anew, or choose another --output")
    elif resume and not checkpoint.is_dir() and RunFolder(out, TRAINED_MODEL).held():
        raise EarlierRun(f"{out} holds a model and no checkpoint of a killed run to resume: pass --overwrite to "
                         "train it again, or choose another --output")
    with job_run(out, TRAINED_MODEL, resume=resume, overwrite=overwrite):
        if staged:
            shutil.rmtree(local, ignore_errors=True)  # an earlier attempt's files: the store holds what counts
            local.mkdir(parents=True)
        try:
            yield local
        finally:
            if staged:  # before the transaction judges: a failed run's files go where it puts them
                publish(local, out)
                shutil.rmtree(local, ignore_errors=True)


def _staging_root() -> Path:
    from specrag.inference.models import cache_dir
    return cache_dir() / "training-staging"


def split_rows(rows: Iterable[dict], validator: Callable[[dict], Any], stage: str) -> tuple[list, list[dict]]:
    """(validated rows, dead letters): a row the validator rejects (RowError) is one dead letter."""
    good, dead = [], []
    for row in rows:
        try:
            good.append(validator(row))
        except RowError as e:
            dead.append(dead_letter(row.get("id", row.get("query_id")), stage, e, row))
    return good, dead


def check_failures(out_dir: str | Path, dead: list[dict], total: int, max_failure_fraction: float,
                   what: str, shown_in: str | Path | None = None) -> None:
    """Write the dead letters (if any) into ``out_dir``; raise when their share is too large,
    naming them in ``shown_in`` (the output folder, where ``out_dir`` stages it)."""
    if not 0.0 <= max_failure_fraction <= 1.0:
        raise ValueError(f"--max-failure-fraction must be in [0, 1], got {max_failure_fraction}")
    out = Path(out_dir)
    (out / DEAD_LETTERS_FILE).unlink(missing_ok=True)  # a replaced model's
    if dead:
        import pyarrow.parquet as pq
        out.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(dead, schema=DEAD_LETTERS), out / DEAD_LETTERS_FILE)
    if total and len(dead) / total > max_failure_fraction:
        raise TrainingInputFailed(f"{len(dead)} of {total} {what} cannot be used ({len(dead) / total:.0%} > "
                                  f"--max-failure-fraction {max_failure_fraction}); nothing was trained; "
                                  f"the reasons are in {join(str(shown_in or out), DEAD_LETTERS_FILE)}")


def validate_label(row: dict) -> dict:
    """A label-utility row the predictor can learn from: ids and text present, a finite CPPL."""
    for field in ("query_id", "question", "text", "kind"):
        if not isinstance(row.get(field), str) or not row[field].strip():
            raise RowError(field, "missing or empty")
    cppl = row.get("cppl")
    if isinstance(cppl, bool) or not isinstance(cppl, (int, float)) or not math.isfinite(cppl):
        raise RowError("cppl", f"expected a finite number, got {cppl!r}")
    return row
