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

Beyond the paper, ``plan`` decides whether a round can pay at all. It models the real
costs: a speculation step (cache look-up + generation), a verification, the regeneration a
mismatch costs (RaLMSpec regenerates the step with the true document; KNN-LM needs none:
the verification yields the true token), against a sequential step (one index search + one
generation, measured on the request's own real steps). Where retrieval is cheap (BM25 over a
small corpus, ~1 ms against ~250 ms of generation) nothing can be saved and every mismatch
costs a step, so the loop takes plain sequential steps — RaLMSeq's own — instead; it
speculates again when the measured costs say it pays. The decision uses the measured γ, not
the paper's capped one (γmax = 0.6 keeps OS³'s stride choice cautious, but as a forecast of
whether a round pays it said "never" on a 3M-passage index where 193 of 193 rounds matched);
with nothing measured lately it tries a round where one with every step guessed would be
``EXPLORE_GAIN`` faster than sequential steps. Decisions are the trace's ``stride_history``
(0 = a sequential step).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

EXPLORE_GAIN = 1.1  # try speculating (to measure γ) only where the best case is this much faster


def expected_verified(gamma: float, s: int) -> float:
    """E[# documents verified in a round of stride s] = Σ_{i<s} γ^i."""
    return float(s) if gamma >= 1.0 else (1.0 - gamma ** s) / (1.0 - gamma)


def round_latency(s: int, a: float, b: float, gamma: float, asynchronous: bool) -> float:
    sync = s * a + b
    if not asynchronous:
        return sync
    all_match = gamma ** s
    return all_match * ((s - 1) * a + max(a, b)) + (1.0 - all_match) * sync


def best_stride(a: float, b: float, gamma: float, asynchronous: bool, max_stride: int,
                regeneration: float = 0.0) -> int:
    """argmax_s verified documents per unit time; the smallest s among equals."""
    return max(range(1, max_stride + 1),
               key=lambda s: (speculation_rate(s, a, b, gamma, asynchronous, regeneration), -s))


def speculation_rate(s: int, a: float, b: float, gamma: float, asynchronous: bool,
                     regeneration: float = 0.0) -> float:
    """Expected steps kept per second by a round of stride s: the verified steps, and after a
    mismatch (probability 1-γ^s) the corrected step, which costs ``regeneration``."""
    latency = round_latency(s, a, b, gamma, asynchronous) + (1.0 - gamma ** s) * regeneration
    return expected_verified(gamma, s) / max(latency, 1e-12)


@dataclass
class StrideScheduler:
    window: int = 5
    gamma_max: float = 0.6
    max_stride: int = 16
    asynchronous: bool = False
    regenerates: bool = True  # a mismatch regenerates its step (RaLMSpec), or not (KNN-LM)
    _steps: deque = field(default_factory=deque)
    _searches: deque = field(default_factory=deque)  # single index searches (sequential steps)
    _generations: deque = field(default_factory=deque)  # generation steps, any kind
    _sequential_run: int = 0  # sequential steps since the last verification
    _verifications: deque = field(default_factory=deque)
    _rounds: deque = field(default_factory=deque)  # (stride, matched)

    def __post_init__(self):
        if self.window < 1 or not 0.0 < self.gamma_max < 1.0 or self.max_stride < 1:
            raise ValueError("OS3 needs window >= 1, 0 < gamma_max < 1, max_stride >= 1")
        self._steps = deque(maxlen=self.window)
        self._verifications = deque(maxlen=self.window)
        self._rounds = deque(maxlen=self.window)
        self._searches = deque(maxlen=self.window)
        self._generations = deque(maxlen=self.window)

    def record_search(self, seconds: float) -> None:
        self._searches.append(seconds)

    def record_generation(self, seconds: float) -> None:
        self._generations.append(seconds)

    def record_step(self, seconds: float) -> None:
        self._steps.append(seconds)

    def record_verification(self, seconds: float, stride: int, matched: int) -> None:
        self._sequential_run = 0
        self._verifications.append(seconds)
        self._rounds.append((stride, matched))

    def gamma(self, capped: bool = True) -> float:
        """The paper's estimate (capped at ``gamma_max``), or the plain measured one."""
        matched = sum(m for _, m in self._rounds)
        misses = sum(1 for s, m in self._rounds if m < s)
        if matched + misses == 0:
            return 0.0
        measured = matched / (matched + misses)
        return min(measured, self.gamma_max) if capped else measured

    def next_stride(self) -> int:
        if not self._steps or not self._verifications:
            return 1
        a = sum(self._steps) / len(self._steps)
        b = sum(self._verifications) / len(self._verifications)
        return best_stride(a, b, self.gamma(), self.asynchronous, self.max_stride)

    def next_round(self, fixed: int | None, fallback: bool) -> int:
        """The next round's stride: ``fixed`` or OS³'s, through ``plan`` when the loop may fall
        back to sequential steps (0), as RaLMSpec and KNN-LM-spec both decide."""
        if fallback:
            return self.plan(fixed)
        return fixed or self.next_stride()

    def plan(self, stride: int | None = None) -> int:
        """The next round: its stride (``stride`` fixed, or OS³'s over the real costs), or 0 for
        a sequential step when no stride is expected to keep steps faster than sequential steps
        do. Before a speculation step or verification is measured, a step is estimated as one
        generation and a verification as one search. With rounds measured lately, the round
        pays at the measured γ or not at all; with none (a new request, or ``window``
        sequential steps since), it is tried where even its best case (every step guessed)
        would be ``EXPLORE_GAIN`` faster — so one unlucky round does not rule speculation out
        for the rest of a request, and cheap retrieval never pays for a trial."""
        if not self._searches or not self._generations:
            return stride or self.next_stride()
        search = _mean(self._searches)
        generation = _mean(self._generations)
        a = _mean(self._steps) if self._steps else generation
        b = _mean(self._verifications) if self._verifications else search
        fresh = self._rounds and self._sequential_run < self.window
        regeneration = generation if self.regenerates else 0.0
        if stride is None:  # OS³'s choice, with the paper's cautious γ
            stride = best_stride(a, b, self.gamma() if fresh else self.gamma_max, self.asynchronous,
                                 self.max_stride, regeneration)
        sequential_rate = 1.0 / max(search + generation, 1e-12)
        if fresh:
            pays = speculation_rate(stride, a, b, self.gamma(capped=False), self.asynchronous,
                                    regeneration) > sequential_rate
        else:
            pays = speculation_rate(stride, a, b, 1.0, self.asynchronous, regeneration) > EXPLORE_GAIN * sequential_rate
        self._sequential_run = 0 if pays else self._sequential_run + 1
        return stride if pays else 0


def _mean(values) -> float:
    return sum(values) / len(values)
