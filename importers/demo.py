"""The bundled demo data (36 passages, a few questions of each task type): written out as the
standard queries and corpus Parquet tables, so ``specrag demo``, the suites' ``demo`` dataset and
the tests run with no benchmark data on the machine."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from specrag.schemas.tables import PASSAGES, QUERIES


def write_demo_tables(workdir: Path) -> tuple[Path, Path]:
    """The bundled demo JSONL → queries.parquet and corpus.parquet in ``workdir``."""
    data = resources.files("specrag.importers") / "demo_data"
    workdir.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, schema in (("queries", QUERIES), ("corpus", PASSAGES)):
        rows = [json.loads(line) for line in (data / f"{name}.jsonl").read_text().splitlines() if line]
        for r in rows:
            if name == "queries":
                r.setdefault("metadata", "{}")
        path = workdir / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        out[name] = path
    return out["queries"], out["corpus"]
