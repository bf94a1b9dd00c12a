"""Compact every finished run folder under a results tree: each run's result shards become one
file and its dead-letter shards another (``RunFolder.compact``), so the committed suites hold a
few files a run, enough for ``--report-only`` and for resuming, and never in-progress shards.

    python benchmarks/compact_runs.py benchmarks/results

``specrag compare`` compacts the runs it finishes itself; this is for runs folders made before.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from specrag.jobio.run_folder import ANSWER, RunFolder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default="benchmarks/results")
    args = ap.parse_args()
    folders = sorted({p.parent for p in Path(args.root).rglob("manifest.json")})
    compacted = 0
    for folder in folders:
        written = RunFolder(str(folder), ANSWER).compact()
        if written:
            compacted += 1
            print(f"{folder}: {', '.join(Path(w).name for w in written)}")
    print(f"{compacted} of {len(folders)} run folders compacted")


if __name__ == "__main__":
    main()
