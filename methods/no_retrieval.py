"""No retrieval: the generator answers from its parameters alone (the lower baseline)."""
from __future__ import annotations

from dataclasses import dataclass

from specrag.methods.base import Method, MethodConfig
from specrag.methods.common import Generate


@dataclass(frozen=True)
class NoRetrievalConfig(MethodConfig):
    max_new_tokens: int | None = None

    def validate(self) -> None:
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


class NoRetrieval(Method):
    name = "no-retrieval"
    config_class = NoRetrievalConfig

    def stages(self):
        return [Generate(self.config.max_new_tokens)]
