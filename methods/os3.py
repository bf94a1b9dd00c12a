"""OS³, RaLMSpec's optimal speculation stride scheduler (paper §4 and appendix A.2).

Given the latency a of a speculation step, b of a verification, and the speculation
accuracy γ, the expected number of documents verified per round with stride s is
(1-γ^s)/(1-γ). The scheduler picks the s that maximises verified documents per second:

    synchronous:  (1-γ^s) / ((1-γ) (s·a + b))
    asynchronous: (1-γ^s) / ((1-γ) [γ^s ((s-1)·a + max(a, b)) + (1-γ^s)(s·a + b)])

a and b are the means of the last ``window`` measurements; γ is the maximum-likelihood
estimate over the last ``window`` verifications, Σ M / (Σ M + Σ 1[M < s]) with M the
matched count of a round of stride s, capped at ``gamma_max`` (paper: w=5, γmax=0.6).
The stride starts at 1 (paper) until there is a measurement of each.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


def expected_verified(gamma: float, s: int) -> float:
    """E[# documents verified in a round of stride s] = Σ_{i<s} γ^i."""
    return float(s) if gamma >= 1.0 else (1.0 - gamma ** s) / (1.0 - gamma)


def round_latency(s: int, a: float, b: float, gamma: float, asynchronous: bool) -> float:
    sync = s * a + b
    if not asynchronous:
        return sync
    all_match = gamma ** s
    return all_match * ((s - 1) * a + max(a, b)) + (1.0 - all_match) * sync


def best_stride(a: float, b: float, gamma: float, asynchronous: bool, max_stride: int) -> int:
    """argmax_s verified documents per unit time; the smallest s among equals."""
    def rate(s: int) -> float:
        return expected_verified(gamma, s) / max(round_latency(s, a, b, gamma, asynchronous), 1e-12)
    return max(range(1, max_stride + 1), key=lambda s: (rate(s), -s))


@dataclass
class StrideScheduler:
    window: int = 5
    gamma_max: float = 0.6
    max_stride: int = 16
    asynchronous: bool = False
    _steps: deque = field(default_factory=deque)
    _verifications: deque = field(default_factory=deque)
    _rounds: deque = field(default_factory=deque)  # (stride, matched)

    def __post_init__(self):
        if self.window < 1 or not 0.0 < self.gamma_max < 1.0 or self.max_stride < 1:
            raise ValueError("OS3 needs window >= 1, 0 < gamma_max < 1, max_stride >= 1")
        self._steps = deque(maxlen=self.window)
        self._verifications = deque(maxlen=self.window)
        self._rounds = deque(maxlen=self.window)

    def record_step(self, seconds: float) -> None:
        self._steps.append(seconds)

    def record_verification(self, seconds: float, stride: int, matched: int) -> None:
        self._verifications.append(seconds)
        self._rounds.append((stride, matched))

    def gamma(self) -> float:
        matched = sum(m for _, m in self._rounds)
        misses = sum(1 for s, m in self._rounds if m < s)
        if matched + misses == 0:
            return 0.0
        return min(matched / (matched + misses), self.gamma_max)

    def next_stride(self) -> int:
        if not self._steps or not self._verifications:
            return 1
        a = sum(self._steps) / len(self._steps)
        b = sum(self._verifications) / len(self._verifications)
        return best_stride(a, b, self.gamma(), self.asynchronous, self.max_stride)
