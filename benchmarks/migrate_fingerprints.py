"""Rebind versioned runs to the build-record-free index and datastore fingerprints.

Until 2026-11-25 a run's identity named its index and datastore by the sha256 of their whole
``manifest.json``, build time included, so the rebuild that every new sitting needs made the
committed runs of ``benchmarks/results/compare-full/runs`` strangers to it. Now the fingerprint
leaves the build record out (``transforms/runtime.py::manifest_fingerprint``, prefixed ``v2:``).

This does not trust a rebuild, it proves it: the old fingerprint is a hash of the old manifest's
bytes, and the rebuilt manifest differs from it only in its build record (``created`` to the
second, ``build_s`` to the centisecond) and perhaps in how the corpus path was spelled (relative
or absolute). Searching those for the values that reproduce the old hash finds them exactly when
every other field (corpus sha256 and rows, passages, kinds, parameters, model, dtype) is equal. Only then is the run's identity rewritten, its run fingerprint recomputed, and the
migration recorded in its manifest (``fingerprint_migration``: from, to, the recovered values).

    python benchmarks/migrate_fingerprints.py                  # after compare_full.py --prepare-only
    python benchmarks/migrate_fingerprints.py --dry-run
"""
from __future__ import annotations

import argparse
import calendar
import hashlib
import itertools
import json
import multiprocessing
import sys
import time
from pathlib import Path

from specrag.jobio.run_folder import IDENTITY_FILE
from specrag.pipelines.identity import run_fingerprint
from specrag.transforms.runtime import BUILD_RECORD_KEYS, manifest_fingerprint

RUNS = "benchmarks/results/compare-full/runs"
FOLDERS = {"index": "index_dir", "datastore": "datastore_dir"}  # identity key -> runtime key
_CREATED = "\x00created\x00"  # placeholders, found again in the rendered text
_BUILD_S = 987654.125


def _render(manifest: dict) -> str:
    """The manifest as the builders wrote it (retrieval/index.py, retrieval/datastore.py)."""
    return json.dumps(manifest, indent=2, sort_keys=True)


def _with_placeholders(value, build_s: dict, path=()):
    """The manifest with ``created`` and each ``build_s`` (name -> rebuilt value) replaced by placeholders."""
    if not isinstance(value, dict):
        return value
    out = {}
    for k, v in value.items():
        if k == "created":
            out[k] = _CREATED
        elif k == "build_s":
            build_s[".".join((*path, k))] = v
            out[k] = _BUILD_S + len(build_s)
        else:
            out[k] = _with_placeholders(v, build_s, (*path, k))
    return out


def _search(args) -> tuple | None:
    template, stamps, combos, old = args
    for combo in combos:
        text = template
        for i, value in enumerate(combo, 1):
            text = text.replace(repr(_BUILD_S + i), value)
        head, tail = text.split(json.dumps(_CREATED))
        for stamp in stamps:
            if hashlib.sha256((head + stamp + tail).encode()).hexdigest()[:16] == old:
                return stamp, combo
    return None


def recover_build_record(manifest: dict, old: str, since: int, until: int, spread: float = 0.5,
                         processes: int = 1) -> dict | None:
    """The ``created`` (and ``build_s``) values under which ``manifest`` hashes to ``old``, or None.
    ``created`` is searched to the second in [since, until], latest first; each ``build_s`` to the
    centisecond within ``spread`` (a fraction) of its rebuilt value, nearest first."""
    build_s: dict = {}
    template = _render(_with_placeholders(manifest, build_s))
    stamps = [time.strftime('"%Y-%m-%dT%H:%M:%SZ"', time.gmtime(t)) for t in range(until, since - 1, -1)]
    axes = []
    for value in build_s.values():
        centre, width = round(value * 100), max(50, round(abs(value) * 100 * spread))
        axes.append(sorted(range(max(0, centre - width), centre + width + 1), key=lambda c, m=centre: abs(c - m)))
    ranks = [{c: r for r, c in enumerate(axis)} for axis in axes]
    combos = sorted(itertools.product(*axes), key=lambda cs: sum(r[c] for r, c in zip(ranks, cs)))
    combos = [tuple(repr(round(c / 100, 2)) for c in cs) for cs in combos]
    chunks = [(template, stamps, combos[i:i + 500], old) for i in range(0, len(combos), 500)]
    with multiprocessing.Pool(processes) as pool:
        for hit in pool.imap(_search, chunks):
            if hit:
                pool.terminate()
                stamp, combo = hit
                return {"created": json.loads(stamp), **{k: float(v) for k, v in zip(build_s, combo)}}
    return None


def _spellings(manifest: dict) -> list[dict]:
    """The manifest with its corpus paths as written here, absolute, and relative to here: the
    fingerprint used to hash the path as the build command spelled it."""
    corpus = manifest.get("corpus") or {}
    here = Path.cwd().resolve()

    def spelled(path: str, absolute: bool) -> str:
        p = Path(path)
        if absolute:
            return str(p if p.is_absolute() else here / p)
        return str(p.relative_to(here)) if p.is_absolute() and p.is_relative_to(here) else path
    out = [manifest]
    for absolute in (True, False):
        variant = {**manifest, "corpus": {spelled(k, absolute): v for k, v in corpus.items()}}
        if variant not in out:
            out.append(variant)
    return out


def _epoch(stamp: str) -> int:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs-dir", default=RUNS)
    ap.add_argument("--window-s", type=int, default=900, help="how long before the first run over a folder "
                    "(``compare_full.py`` builds a folder just before its first job) its build may have ended")
    ap.add_argument("--spread", type=float, default=0.5, help="how far (a fraction) an old build_s may be "
                    "from the rebuilt one")
    ap.add_argument("--folders", default="index,datastore")
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    assert BUILD_RECORD_KEYS == {"created", "build_s"}, "the search covers these two fields only"
    runs = sorted(Path(args.runs_dir).glob("*/*/manifest.json"))
    # the earliest start of a run over each (folder, old fingerprint): the folder was built before it
    first: dict[tuple[str, str], int] = {}
    for path in runs:
        m = json.loads(path.read_text())
        for key, runtime_key in FOLDERS.items():
            old = m["identity"].get(key)
            if old and not old.startswith("v2:") and key in args.folders.split(","):
                start = _epoch(m["written"]) - int(m.get("wall_s") or 0)
                k = (m["runtime"][runtime_key], old)
                first[k] = min(first.get(k, start), start)
    recovered: dict[tuple[str, str], dict | None] = {}
    for (folder, old), start in sorted(first.items()):
        path = Path(folder) / "manifest.json"
        if not path.exists():
            print(f"{folder}: not built here; rebuild it first (compare_full.py --prepare-only)", flush=True)
            recovered[(folder, old)] = None
            continue
        manifest = json.loads(path.read_text())
        t0 = time.time()
        found = next((dict(found, corpus=list(m.get("corpus") or {})) for m in _spellings(manifest)
                      if (found := recover_build_record(m, old, start - args.window_s, start, args.spread,
                                                        args.processes))), None)
        recovered[(folder, old)] = found and {"from": old, "to": manifest_fingerprint(manifest), "recovered": found}
        print(f"{folder} {old}: " + (f"same content, built {found} -> {manifest_fingerprint(manifest)}" if found else
              "NOT reproduced: the rebuilt folder differs beyond its build record; its runs keep their identity")
              + f" ({time.time() - t0:.0f} s)", flush=True)
    moved = 0
    for path in runs:
        m = json.loads(path.read_text())
        if m["run_fingerprint"] != run_fingerprint(m["identity"]):
            sys.exit(f"{path}: its run fingerprint does not follow from its identity; not touched")
        if json.loads((path.parent / IDENTITY_FILE).read_text()) != m["identity"]:
            sys.exit(f"{path.parent}: {IDENTITY_FILE} and the manifest's identity differ; not touched")
        migration = {}
        for key, runtime_key in FOLDERS.items():
            old = m["identity"].get(key)
            done = recovered.get((m["runtime"][runtime_key], old)) if old else None
            if done:
                m["identity"][key] = done["to"]
                migration[key] = done
        if not migration:
            continue
        m["run_fingerprint"] = run_fingerprint(m["identity"])
        m["fingerprint_migration"] = {**m.get("fingerprint_migration", {}), **migration}  # an earlier pass kept
        moved += 1
        if not args.dry_run:
            path.write_text(json.dumps(m, indent=2, sort_keys=True, default=str))
            (path.parent / IDENTITY_FILE).write_text(json.dumps(m["identity"], indent=2, sort_keys=True, default=str))
    print(f"{'would rebind' if args.dry_run else 'rebound'} {moved} of {len(runs)} runs", flush=True)


if __name__ == "__main__":
    main()
