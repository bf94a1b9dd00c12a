"""Request and result types of the inference operations, shared by every backend."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class GenerateRequest:
    """One prompt to continue. ``temperature == 0`` is greedy; ``seed`` makes sampling repeatable."""

    prompt: str
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    chat: bool = True  # wrap the prompt in the model's chat template when it has one
    # tokens already generated, appended after the (templated) prompt: iterative methods
    # continue an answer across steps without re-tokenising its text
    continuation_ids: tuple[int, ...] = ()
    # decode this row alone so its tokens do not depend on what else shares the batch
    # (batched matmuls sum in another order); RaLMSpec's exactness needs it
    batch_invariant: bool = False


@dataclass(frozen=True)
class FusedDecodeRequest:
    """One greedy answer decoded from several context streams at once (AED-RAG, eq. 14):
    y_t = argmax_v sum_z w_z log P(v | prompt_z, y_<t). Every stream continues with the same
    chosen token; a stream of weight 0 contributes nothing and is not computed."""

    prompts: tuple[str, ...]
    weights: tuple[float, ...]
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    chat: bool = True

    def __post_init__(self):
        if not self.prompts or len(self.prompts) != len(self.weights):
            raise ValueError("FusedDecodeRequest: one weight per prompt, at least one prompt")
        if any(w < 0 or w != w for w in self.weights) or not any(w > 0 for w in self.weights):
            raise ValueError(f"FusedDecodeRequest: weights must be >= 0 with one > 0, got {self.weights}")

    def streams(self) -> list[tuple[str, float]]:
        """The (prompt, weight) pairs that are computed."""
        return [(p, w) for p, w in zip(self.prompts, self.weights) if w > 0]


@dataclass(frozen=True)
class RerankRequest:
    """A (query, unit) pair for a cross-encoder: one relevance or utility score (AED-RAG's S_phi)."""

    query: str
    text: str


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    token_logprobs: list[float]
    prompt_tokens: int
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    # of prompt_tokens, those whose keys and values came from the engine's prefix cache (a RaLM step
    # whose document is unchanged reuses its earlier steps'); None where the engine does not say
    cached_tokens: int | None = None


@dataclass(frozen=True)
class ScoreRequest:
    """Teacher-forced log-probabilities of ``continuation`` after ``prompt``.

    ``segments`` (optional) split the continuation into parts tokenised one by one, so a
    score over several parts in one forward pass (Speculative RAG: draft, reflection
    statement, "Yes") knows exactly which tokens are whose: ``Scored.segment_lengths``.
    """

    prompt: str
    continuation: str
    segments: tuple[str, ...] = ()
    # Contrastive scoring (CAD; AED-RAG's contrastive perplexity): with a contrast prompt, each
    # continuation token gets log softmax((1+alpha)·logit(·|prompt) − alpha·logit(·|contrast_prompt))
    # instead of its plain log-probability. A contrast prompt shared by several requests (a
    # question's no-context prompt) is computed once.
    contrast_prompt: str | None = None
    alpha: float = 0.0
    chat: bool = False  # wrap prompt (and contrast prompt) in the model's chat template

    def __post_init__(self):
        if self.segments and "".join(self.segments) != self.continuation:
            raise ValueError("ScoreRequest: the segments must join to the continuation")
        if self.contrast_prompt is None and self.alpha != 0.0:
            raise ValueError("ScoreRequest: alpha needs a contrast_prompt")

    @classmethod
    def of_segments(cls, prompt: str, segments: tuple[str, ...] | list[str]) -> "ScoreRequest":
        return cls(prompt, "".join(segments), tuple(segments))


@dataclass
class Scored:
    token_logprobs: list[float]
    prompt_tokens: int
    tokens: list[str] = field(default_factory=list)
    segment_lengths: list[int] = field(default_factory=list)  # tokens per request segment

    @property
    def total(self) -> float:
        return float(sum(self.token_logprobs))

    def segment_totals(self) -> list[float]:
        """Summed log-probability of each segment (log space: no underflow on long texts)."""
        if sum(self.segment_lengths) != len(self.token_logprobs):
            raise ValueError("Scored: no segment lengths for these logprobs (request had no segments?)")
        bounds = [0, *itertools.accumulate(self.segment_lengths)]
        return [float(sum(self.token_logprobs[a:b])) for a, b in zip(bounds, bounds[1:])]


@dataclass(frozen=True)
class NextTokenRequest:
    """The model's state after prompt + continuation: what token-level retrieval (KNN-LM) needs."""

    prompt: str
    continuation_ids: tuple[int, ...] = ()
    chat: bool = True


@dataclass
class NextToken:
    """Final hidden state (the KNN-LM key) and next-token log-probabilities at the last position."""

    hidden: np.ndarray  # float32 [hidden_size]
    logprobs: np.ndarray  # float32 [vocab]
    prompt_tokens: int


@dataclass(frozen=True)
class DenoiseRequest:
    """One denoising step of a masked-diffusion LM (SARDI): the context (the prompt with its
    evidence, as text: the backend tokenises and templates it) and the response window as
    token ids, masked positions holding the model's mask id. The same contract serves a 7B
    diffusion LM (Dream, LLaDA) behind Triton: context text in, per-position outputs back."""

    context: str
    response_ids: tuple[int, ...]
    chat: bool = True  # wrap the context in the model's chat template when it has one

    def __post_init__(self):
        if not self.response_ids:
            raise ValueError("DenoiseRequest: empty response window")


@dataclass
class Denoised:
    """Per response position: the argmax token and its probability c_i = max_v p_i(v)
    (a committed position: its own token, confidence 1)."""

    argmax: list[int]
    confidence: list[float]
    context_tokens: int  # context tokens the model saw
    truncated_tokens: int = 0  # context tokens cut to fit the model's window
