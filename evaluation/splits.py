"""Named question splits over ../shared/data, kept as id files in the package.

AED-RAG trains its utility predictor on questions that no evaluation may see: ``aed_train``
(most of NQ-open and part of HotpotQA) and ``aed_eval`` (the rest of both, and all of
PopQA and WebQuestions) are disjoint by id. A question's side is decided by a hash of its id
(not by file order), so the split is stable under re-imports. Runs name the split they read
in their manifests (``split_fingerprint``).

Regenerate (only if the datasets change): ``python -m specrag.evaluation.splits --imported DIR``
where DIR is an ``specrag import-data --pool`` output.
"""
from __future__ import annotations

import argparse
import hashlib
from importlib import resources
from pathlib import Path

# dataset -> share of its questions that go to training (the rest are for evaluation)
AED_TRAIN_SHARE = {"nq": 0.85, "hotpotqa": 0.4, "popqa": 0.0, "webquestions": 0.0}
SPLITS = ("aed_train", "aed_eval")


def _bucket(qid: str) -> float:
    return int(hashlib.sha256(qid.encode()).hexdigest()[:8], 16) / 16 ** 8


def split_path(name: str) -> Path:
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; known: {', '.join(SPLITS)}")
    return Path(str(resources.files("specrag.evaluation") / "splits" / f"{name}.txt"))


def load_split(name: str) -> list[str]:
    """The split's question ids, in file order (sorted)."""
    return [line.strip() for line in split_path(name).read_text().splitlines() if line.strip()]


def split_fingerprint(name: str) -> str:
    return f"{name}@sha256:{hashlib.sha256(split_path(name).read_bytes()).hexdigest()[:16]}"


def make_aed_splits(imported: Path) -> dict[str, list[str]]:
    import pyarrow.parquet as pq
    train, evaluation = [], []
    for dataset, share in AED_TRAIN_SHARE.items():
        ids = pq.read_table(imported / dataset / "queries.parquet", columns=["id"]).column("id").to_pylist()
        for qid in ids:
            (train if _bucket(qid) < share else evaluation).append(qid)
    return {"aed_train": sorted(train), "aed_eval": sorted(evaluation)}


def main() -> None:
    ap = argparse.ArgumentParser(description="write the AED-RAG train/eval id splits")
    ap.add_argument("--imported", required=True, help="`specrag import-data --pool` output folder")
    args = ap.parse_args()
    for name, ids in make_aed_splits(Path(args.imported)).items():
        path = Path(__file__).parent / "splits" / f"{name}.txt"
        path.write_text("\n".join(ids) + "\n")
        print(f"{path}: {len(ids)} ids")


if __name__ == "__main__":
    main()
