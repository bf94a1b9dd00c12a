"""Write converted datasets as Parquet: one queries/corpus pair per set, optionally a pooled corpus."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from specrag.importers.formats import FORMATS
from specrag.schemas.tables import PASSAGES, QUERIES


def import_datasets(data_dir: Path, names: list[str], out_dir: Path, pool: bool = False, limit: int = 0) -> dict:
    """Convert each named dataset; returns counts per dataset (and of the pooled corpus). With
    ``limit``, only each set's first N questions (in its file's order) and their passages.

    Example usage::

        import_datasets(Path("../shared/data"), ["popqa"], Path("data"), limit=20)
    """
    if limit < 0:
        raise ValueError(f"--limit must be >= 0 (0: every question), got {limit}")
    unknown = [n for n in names if n not in FORMATS]
    if unknown:
        raise ValueError(f"unknown dataset(s) {unknown}; known: {', '.join(sorted(FORMATS))}")
    out_dir.mkdir(parents=True, exist_ok=True)
    pooled: dict[str, dict] = {}
    summary: dict = {}
    for name in names:
        folder = data_dir / FORMATS[name].folder
        if not folder.is_dir():
            raise FileNotFoundError(f"{name}: no folder {folder} (is --data-dir right?)")
        queries, corpus = [], {}
        for q, passages in FORMATS[name].convert(folder):
            if limit and len(queries) == limit:
                break
            queries.append(q)
            for p in passages:
                corpus.setdefault(p["id"], p)
        target = out_dir / name
        target.mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_pylist(queries, schema=QUERIES), target / "queries.parquet")
        pq.write_table(pa.Table.from_pylist(sorted(corpus.values(), key=lambda p: p["id"]),
                                            schema=PASSAGES), target / "corpus.parquet")
        summary[name] = {"queries": len(queries), "passages": len(corpus)}
        for pid, p in corpus.items():
            pooled.setdefault(pid, p)
    if pool:
        rows = sorted(pooled.values(), key=lambda p: p["id"])
        pq.write_table(pa.Table.from_pylist(rows, schema=PASSAGES), out_dir / "pooled_corpus.parquet")
        summary["pooled_corpus"] = {"passages": len(rows), "datasets": names}
    (out_dir / "import_summary.json").write_text(json.dumps(summary, indent=2))
    return summary
