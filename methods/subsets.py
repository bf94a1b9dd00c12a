"""Multi-perspective document subsets (Speculative RAG §3.2; reused by SPS per stage).

The retrieved documents are clustered by content (seeded k-means on their embeddings) and
each subset takes one document per cluster, so a draft sees every "perspective" once and no
two near-duplicates. The ablations of both papers are modes of the same sampler: random
subsets without clustering, and all documents from one cluster. Everything is seeded per
query (``query_seed``), so a query's subsets do not depend on what else runs with it.
"""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import numpy as np

SUBSET_MODES = ("multi_perspective", "random", "same_cluster")
MAX_ENUMERATED = 4096  # above this many combinations, draw them at random without repeats


def query_seed(seed: int, query_id: str) -> int:
    """A stable per-query seed (Python's hash() is salted per process)."""
    digest = hashlib.sha256(f"{seed}:{query_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def kmeans(vectors: np.ndarray, k: int, seed: int, iterations: int = 50) -> np.ndarray:
    """Cluster labels of ``vectors`` (rows) into ``k`` non-empty clusters: k-means++ seeding,
    Lloyd iterations, ties broken by the lowest index. Deterministic for a seed."""
    x = np.asarray(vectors, dtype=np.float64)
    n = len(x)
    if not 1 <= k <= n:
        raise ValueError(f"k-means needs 1 <= k <= number of vectors, got k={k} for {n}")
    rng = np.random.default_rng(seed)
    centres = [x[int(rng.integers(n))]]
    for _ in range(1, k):
        d2 = np.min([((x - c) ** 2).sum(1) for c in centres], axis=0)
        if d2.sum() <= 0:  # all remaining points coincide with a centre: take the first unused
            used = {int(np.argmin(((x - c) ** 2).sum(1))) for c in centres}
            centres.append(x[next(i for i in range(n) if i not in used)])
            continue
        centres.append(x[int(rng.choice(n, p=d2 / d2.sum()))])
    c = np.stack(centres)
    labels = np.full(n, -1)
    for _ in range(iterations):
        d = ((x[:, None, :] - c[None, :, :]) ** 2).sum(-1)
        new = np.argmin(d, axis=1)
        for j in range(k):  # an emptied cluster takes the point farthest from its own centre
            if not (new == j).any():
                far = np.argsort(-d[np.arange(n), new], kind="stable")
                for i in far:
                    if (new == new[i]).sum() > 1:
                        new[i] = j
                        break
        if np.array_equal(new, labels):
            break
        labels = new
        c = np.stack([x[labels == j].mean(0) for j in range(k)])
    return labels


@dataclass(frozen=True)
class Subsets:
    """Document indices per subset, and the clusters they were drawn from."""

    subsets: list[list[int]]
    clusters: list[list[int]]  # document indices per cluster ([] for random mode)


def sample_subsets(vectors: np.ndarray, k: int, m: int, seed: int,
                   mode: str = "multi_perspective") -> Subsets:
    """``m`` subsets of ``k`` documents each (fewer when fewer documents were retrieved).

    multi_perspective: one document per k-means cluster; no subset repeats while an unused
    combination remains (then they repeat, in the same shuffled order). random: k documents
    uniformly, no clustering. same_cluster: all k documents from one cluster (the largest
    clusters first; a cluster smaller than k contributes all it has).
    """
    if mode not in SUBSET_MODES:
        raise ValueError(f"unknown subset mode {mode!r}; known: {', '.join(SUBSET_MODES)}")
    n = len(vectors)
    if n == 0:
        return Subsets([[] for _ in range(m)], [])
    k = min(k, n)
    rng = np.random.default_rng(seed)
    if mode == "random":
        combos = [sorted(int(i) for i in rng.choice(n, size=k, replace=False)) for _ in range(m)]
        return Subsets(combos, [])
    labels = kmeans(vectors, k, seed)
    clusters = [[i for i in range(n) if labels[i] == j] for j in range(k)]
    if mode == "multi_perspective":
        total = int(np.prod([len(c) for c in clusters]))
        if total <= MAX_ENUMERATED:
            every = [list(c) for c in itertools.product(*clusters)]
            order = rng.permutation(len(every))
            return Subsets([every[order[i % len(every)]] for i in range(m)], clusters)
        seen: set[tuple[int, ...]] = set()
        subsets = []
        while len(subsets) < m:  # total > m here, so new combinations keep coming
            combo = tuple(int(c[rng.integers(len(c))]) for c in clusters)
            if combo not in seen:
                seen.add(combo)
                subsets.append(list(combo))
        return Subsets(subsets, clusters)
    ranked = sorted(range(k), key=lambda j: (-len(clusters[j]), j))
    subsets = []
    for i in range(m):
        members = clusters[ranked[i % k]]
        take = min(k, len(members))
        subsets.append(sorted(int(x) for x in rng.choice(members, size=take, replace=False)))
    return Subsets(subsets, clusters)
