"""The rules every job follows, for the training commands (train-utility, train-denoiser).

They run on the launcher, not as Beam jobs, but their outputs are as costly to lose: a model
folder that already holds a model is replaced only with ``--overwrite``, and input rows that
cannot be used become dead letters beside the model (``dead_letters.parquet``) instead of
being skipped unseen; when their share exceeds ``--max-failure-fraction`` the command fails
before training, with the dead letters written.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Iterable

import pyarrow as pa

from specrag.schemas.tables import DEAD_LETTERS
from specrag.schemas.validation import RowError
from specrag.transforms.records import dead_letter

DEAD_LETTERS_FILE = "dead_letters.parquet"


class TrainingInputFailed(RuntimeError):
    """Too large a share of a training command's input rows could not be used."""


def training_tables(pattern: str, file_name: str, command: str) -> list[str]:
    """The Parquet files a training command reads: a folder's ``file_name`` (what ``command``
    wrote), a file, or a glob."""
    from specrag.jobio.files import join, match_files
    files = match_files(pattern) if "*" in pattern or pattern.endswith(".parquet") else []
    files = files or match_files(join(pattern, file_name))
    if not files:
        raise FileNotFoundError(f"no {file_name} at {pattern!r} (run `specrag {command}` first)")
    return sorted(files)


def refuse_existing_model(folder: str | Path, overwrite: bool) -> None:
    """A model folder with files in it is kept unless ``overwrite``."""
    folder = Path(folder)
    if folder.is_dir() and any(folder.iterdir()) and not overwrite:
        raise ValueError(f"{folder} already holds files (a model or its dead letters): pass --overwrite to replace "
                         "them, or choose another --output")


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
                   what: str) -> None:
    """Write the dead letters (if any) into ``out_dir``; raise when their share is too large."""
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
                                  f"the reasons are in {out / DEAD_LETTERS_FILE}")


def validate_label(row: dict) -> dict:
    """A label-utility row the predictor can learn from: ids and text present, a finite CPPL."""
    for field in ("query_id", "question", "text", "kind"):
        if not isinstance(row.get(field), str) or not row[field].strip():
            raise RowError(field, "missing or empty")
    cppl = row.get("cppl")
    if isinstance(cppl, bool) or not isinstance(cppl, (int, float)) or not math.isfinite(cppl):
        raise RowError("cppl", f"expected a finite number, got {cppl!r}")
    return row
