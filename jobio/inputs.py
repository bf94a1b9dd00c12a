"""The input files of a job, listed and fingerprinted without Beam: the launcher decides what a
run reads (and whether an earlier run read the same) before any pipeline exists."""
from __future__ import annotations

from specrag.jobio.files import UnreadableInput, content_identity, match_files
from specrag.jobio.tables import SUFFIXES, open_table


def expand_inputs(pattern: str) -> list[str]:
    """The files of a glob, or of a folder: its Parquet, JSON lines and CSV files (sorted)."""
    files = match_files(pattern)
    if not files:
        folder = pattern.rstrip("/")
        files = sorted(f for suffix in SUFFIXES for f in match_files(f"{folder}/*{suffix}"))
    if not files:
        raise FileNotFoundError(f"no Parquet, JSON lines or CSV files match {pattern!r}")
    return files


def inspect_inputs(files: list[str]) -> tuple[dict[str, int], dict[str, str]]:
    """({file: row groups} of the readable files, {file: why} of the unreadable ones)."""
    groups, bad = {}, {}
    for f in files:
        try:
            groups[f] = open_table(f).num_row_groups
        except UnreadableInput as e:
            bad[f] = str(e)
    return groups, bad


def expand_tables(pattern: str, required: tuple[str, ...], what: str) -> list[str]:
    """The input files of ``pattern`` (``expand_inputs``), the readable ones checked for ``required``."""
    files = expand_inputs(pattern)
    groups, _ = inspect_inputs(files)
    check_columns([f for f in files if f in groups], required, what)
    return files


def check_columns(files: list[str], required: tuple[str, ...], what: str) -> None:
    """One line naming the file and the columns it lacks (a queries table needs ``id`` and
    ``question``, a corpus ``id`` and ``text``), before any job runs: without the check every row
    would be a dead letter saying the same."""
    for f in files:
        names = open_table(f).schema_arrow.names
        missing = [c for c in required if c not in names]
        if missing:
            raise ValueError(f"{f}: the {what} table lacks column{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(missing)} (it has: {', '.join(names) or 'none'}); "
                             f"a {what} table needs {', '.join(required)}")


def rows_taken(files: list[str], limit: int | None) -> dict[str, int] | None:
    """``--limit N``: the first N rows in file order (files sorted, then row order), as rows taken
    per readable file (files past the limit take 0); None without a limit."""
    if limit is None:
        return None
    taken, left = {}, limit
    for f in files:
        try:
            rows = open_table(f).metadata.num_rows
        except UnreadableInput:
            continue  # judged by the read (an error, or one dead letter)
        taken[f] = min(rows, left)
        left -= taken[f]
    return taken


def dataset_fingerprint(files: list[str], limit: int | None = None) -> dict:
    """Row count (the Parquet footer) and content identity per input file, for the run manifest
    (``files.content_identity``: a hash of local files, the store's checksum of remote ones).
    With a ``limit``, ``rows`` is what the run takes of each file (``of_rows`` what it holds) and
    files it takes nothing of are left out."""
    taken = rows_taken(files, limit)
    out = {}
    for f in files:
        try:
            rows = open_table(f).metadata.num_rows
        except UnreadableInput as e:
            rows = f"unreadable: {e}"
        if taken is not None and isinstance(rows, int):
            if not taken.get(f):
                continue
            out[f] = {**content_identity(f), "rows": taken[f], "of_rows": rows}
            continue
        out[f] = {**content_identity(f), "rows": rows}
    return out
