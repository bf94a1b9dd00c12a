"""The input files of a job, listed and fingerprinted without Beam: the launcher decides what a
run reads (and whether an earlier run read the same) before any pipeline exists."""
from __future__ import annotations

from specrag.jobio.files import UnreadableInput, content_identity, match_files, open_parquet


def expand_inputs(pattern: str) -> list[str]:
    files = match_files(pattern) or match_files(pattern.rstrip("/") + "/*.parquet")
    if not files:
        raise FileNotFoundError(f"no Parquet files match {pattern!r}")
    return files


def inspect_inputs(files: list[str]) -> tuple[dict[str, int], dict[str, str]]:
    """({file: row groups} of the readable files, {file: why} of the unreadable ones)."""
    groups, bad = {}, {}
    for f in files:
        try:
            groups[f] = open_parquet(f).num_row_groups
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
        names = open_parquet(f).schema_arrow.names
        missing = [c for c in required if c not in names]
        if missing:
            raise ValueError(f"{f}: the {what} table lacks column{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(missing)} (it has: {', '.join(names) or 'none'}); "
                             f"a {what} table needs {', '.join(required)}")


def dataset_fingerprint(files: list[str]) -> dict:
    """Row count (the Parquet footer) and content identity per input file, for the run manifest
    (``files.content_identity``: a hash of local files, the store's checksum of remote ones)."""
    out = {}
    for f in files:
        try:
            rows = open_parquet(f).metadata.num_rows
        except UnreadableInput as e:
            rows = f"unreadable: {e}"
        out[f] = {**content_identity(f), "rows": rows}
    return out
