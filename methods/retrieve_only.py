"""Retrieval only: the top-k documents per question, no generation (retriever evaluation)."""
from __future__ import annotations

from dataclasses import dataclass

from specrag.methods.base import Method, MethodConfig
from specrag.methods.common import Retrieve


@dataclass(frozen=True)
class RetrieveOnlyConfig(MethodConfig):
    top_k: int = 10

    def validate(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")


class RetrieveOnly(Method):
    name = "retrieve-only"
    config_class = RetrieveOnlyConfig
    needs = {}
    needs_retriever = True

    def stages(self):
        return [Retrieve(self.config.top_k)]
