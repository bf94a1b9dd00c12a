"""Standard RAG: retrieve top-k for the question, put all documents in the prompt, generate."""
from __future__ import annotations

from dataclasses import dataclass

from specrag.inference.capabilities import GENERATE, SCORE
from specrag.methods.base import Method, MethodConfig
from specrag.methods.common import Generate, check_closed_set, Retrieve

PROMPTS = ("default", "aed")


@dataclass(frozen=True)
class StandardConfig(MethodConfig):
    top_k: int = 10  # Speculative RAG / SPS: top-10 documents in the prompt
    max_new_tokens: int | None = None
    closed_set: str = "score"  # multiple choice / true-false: rank the options' log-probabilities, or "generate"
    # decode each query alone: its answer then never depends on what shared its micro-batch
    # (left padding moves logits by float noise), so reruns and runners agree exactly (slower)
    batch_invariant: bool = False
    # "default": the Self-RAG-style prompt of the other methods; "aed": AED-RAG's template
    # (its baselines and AED-RAG share one prompt)
    prompt: str = "default"

    def validate(self) -> None:
        check_closed_set(self.closed_set)
        if self.prompt not in PROMPTS:
            raise ValueError(f"prompt must be one of {PROMPTS}, got {self.prompt!r}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


class StandardRAG(Method):
    name = "standard"
    config_class = StandardConfig
    needs = {"generator": (GENERATE, SCORE)}
    needs_retriever = True

    def stages(self):
        return [Retrieve(self.config.top_k), Generate(self.config.max_new_tokens, self.config.batch_invariant,
                                                      prompt=self.config.prompt, closed_set=self.config.closed_set)]
