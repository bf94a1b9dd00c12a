"""Paired intervals and Pareto fronts: the statistics of comparing methods on the same questions."""
from __future__ import annotations

from typing import Sequence


def paired_bootstrap_ci(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], draws: int = 2000,
                        seed: int = 0) -> tuple[float, float]:
    """95% interval of mean_over_datasets(mean(a) - mean(b)) in points, resampling each dataset's
    questions (the same questions for both methods: a paired comparison)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    stats = np.zeros(draws)
    for x, y in zip(a, b):
        if len(x) != len(y):
            raise ValueError(f"paired bootstrap needs the same questions for both: {len(x)} vs {len(y)}")
        diff = 100 * (np.asarray(x, dtype=float) - np.asarray(y, dtype=float))
        stats += diff[rng.integers(0, len(diff), size=(draws, len(diff)))].mean(axis=1)
    stats /= len(a)
    return float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points (cost, quality) that no other point beats on both: no cheaper
    point of at least the same quality and no point of higher quality at no more cost.
    Ties keep the first. Sorted by cost."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1], i))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front
