"""Named question splits over ../shared/data, kept as id files in the package.

AED-RAG trains its utility predictor on questions that no evaluation may see: ``aed_train``
(most of NQ-open and part of HotpotQA) and ``aed_eval`` (the rest of both, and all of
PopQA and WebQuestions) are disjoint by id. Speculative RAG's drafter is tuned on
``drafter_train``: ``aed_train`` plus half of PubHealth and of ARC-Challenge (the paper tunes on
claim and multiple-choice sets too), and evaluated on ``drafter_eval``, the rest. A question's
side is decided by a hash of its id (not by file order), so the split is stable under
re-imports, and the same hash makes ``drafter_train`` ⊇ ``aed_train`` and
``drafter_eval`` ⊇ ``aed_eval`` on NQ and HotpotQA. Runs name the split they read in their
manifests (``split_fingerprint``).

Regenerate (only if the datasets change): ``python -m specrag.evaluation.splits --imported DIR``
where DIR is an ``specrag import-data --pool`` output.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
from importlib import resources
from pathlib import Path

# dataset -> share of its questions that go to training (the rest are for evaluation)
AED_TRAIN_SHARE = {"nq": 0.85, "hotpotqa": 0.4, "popqa": 0.0, "webquestions": 0.0}
DRAFTER_TRAIN_SHARE = {**AED_TRAIN_SHARE, "pubhealth": 0.5, "arc_challenge": 0.5}
SPLITS = ("aed_train", "aed_eval", "drafter_train", "drafter_eval")
# the splits no training may read (synthesize-rationales and train-drafter refuse their ids)
EVALUATION_SPLITS = ("aed_eval", "drafter_eval")


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


@functools.lru_cache(maxsize=1)
def evaluation_ids() -> frozenset[str]:
    """Every id of an evaluation split: training data must hold none of them."""
    return frozenset(i for name in EVALUATION_SPLITS for i in load_split(name))


def _split(imported: Path, shares: dict[str, float]) -> tuple[list[str], list[str]]:
    import pyarrow.parquet as pq
    train, evaluation = [], []
    for dataset, share in shares.items():
        ids = pq.read_table(imported / dataset / "queries.parquet", columns=["id"]).column("id").to_pylist()
        for qid in ids:
            (train if _bucket(qid) < share else evaluation).append(qid)
    return sorted(train), sorted(evaluation)


def make_aed_splits(imported: Path) -> dict[str, list[str]]:
    train, evaluation = _split(imported, AED_TRAIN_SHARE)
    return {"aed_train": train, "aed_eval": evaluation}


def make_drafter_splits(imported: Path) -> dict[str, list[str]]:
    train, evaluation = _split(imported, DRAFTER_TRAIN_SHARE)
    return {"drafter_train": train, "drafter_eval": evaluation}


def main() -> None:
    ap = argparse.ArgumentParser(description="write the AED-RAG and drafter train/eval id splits")
    ap.add_argument("--imported", required=True, help="`specrag import-data --pool` output folder")
    args = ap.parse_args()
    for name, ids in {**make_aed_splits(Path(args.imported)), **make_drafter_splits(Path(args.imported))}.items():
        path = Path(__file__).parent / "splits" / f"{name}.txt"
        path.write_text("\n".join(ids) + "\n")
        print(f"{path}: {len(ids)} ids")


if __name__ == "__main__":
    main()
