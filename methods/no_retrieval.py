"""No retrieval: the generator answers from its parameters alone (the lower baseline)."""
from __future__ import annotations

from dataclasses import dataclass

from specrag.inference.capabilities import GENERATE, SCORE
from specrag.methods.base import Method, MethodConfig
from specrag.methods.common import Generate, check_closed_set


@dataclass(frozen=True)
class NoRetrievalConfig(MethodConfig):
    max_new_tokens: int | None = None
    closed_set: str = "score"  # multiple choice / true-false: rank the options' log-probabilities, or "generate"

    def validate(self) -> None:
        check_closed_set(self.closed_set)
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


class NoRetrieval(Method):
    name = "no-retrieval"
    config_class = NoRetrievalConfig
    needs = {"generator": (GENERATE, SCORE)}

    def stages(self):
        return [Generate(self.config.max_new_tokens, closed_set=self.config.closed_set)]
