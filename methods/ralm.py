"""Document-level iterative RaLM (RaLMSeq, the RaLMSpec paper's baseline) and its step machinery.

Every ``stride`` generated tokens the query becomes the last ``query_tokens`` tokens of
question + output, the index's top-1 document for it replaces the previous one at the head
of the prompt, and generation continues from the tokens so far, until EOS or the length
limit (paper: stride 4, 32-token queries, 256-token chunks, 128 new tokens).

Exactness: RaLMSpec must reproduce RaLMSeq token for token. Both use the same ``RaLMSteps``:
the same query text, the same index search (``search_k`` candidates, top-1 used — one
search function for both, whatever the extras), and generation steps that are
batch-invariant (each row decoded alone), so a step's tokens depend only on its document
and the tokens before it, not on which other queries share the engine's batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specrag.inference.types import GenerateRequest, Generation
from specrag.methods.base import Method, MethodConfig, QueryState, Stage
from specrag.methods.common import StepReuse, finalise_tokens
from specrag.methods.prompts import build_prompt
from specrag.retrieval.base import Hit


@dataclass(frozen=True)
class RaLMConfig(MethodConfig):
    stride: int = 4  # generated tokens between retrievals (paper's code)
    query_tokens: int = 32  # retrieval query: the last 32 tokens of question + output
    doc_max_tokens: int = 256  # retrieved chunk length (Ram et al., 2023)
    max_new_tokens: int = 128  # generation limit (paper)
    search_k: int = 20  # candidates per index search; the document is the top-1 (and P's prefetch)

    def validate(self) -> None:
        for name in ("stride", "query_tokens", "doc_max_tokens", "max_new_tokens", "search_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class RaLMSteps:
    """One request's view of the RaLM loop: queries, documents, generation steps."""

    def __init__(self, item: QueryState, ctx: Any, config: RaLMConfig, stage: str):
        self.item, self.ctx, self.config, self.stage = item, ctx, config, stage
        self.question_ids = ctx.tokenize(item.query["question"])
        self._chunks: dict[str, Hit] = {}
        self.reuse: list[StepReuse] = []  # every generation step's prefix-cache use, in order
        self._last_doc: str | None = None

    def query_text(self, out: list[int]) -> str:
        return self.ctx.detokenize((self.question_ids + out)[-self.config.query_tokens:])

    async def search(self, query: str, first: bool = False) -> list[Hit]:
        """The index's candidates for a query; the first is the document (ground truth). Empty
        when no indexed term is in the query (degenerate generated text): the step then keeps
        the previous step's document (``document_after``); only the question itself must find one."""
        hits = await self.ctx.retrieve(query, self.config.search_k, stage=self.stage)
        if first and not hits:
            raise ValueError(f"the index returned no document for {query!r}")
        return hits

    async def search_many(self, queries: list[str]) -> list[list[Hit]]:
        """A verification: the queries of a round as one batched index retrieval."""
        return await self.ctx.retrieve_many(queries, self.config.search_k, stage=self.stage)

    @staticmethod
    def document_after(previous: Hit, hits: list[Hit]) -> Hit:
        """A step's document: the index's top-1, or the previous step's when the index found none."""
        return hits[0] if hits else previous

    def chunk(self, hit: Hit) -> Hit:
        """The document cut to ``doc_max_tokens`` tokens of the generator (once per document)."""
        if hit.doc_id not in self._chunks:
            ids = self.ctx.tokenize(hit.text)
            text = hit.text if len(ids) <= self.config.doc_max_tokens else \
                self.ctx.detokenize(ids[: self.config.doc_max_tokens])
            self._chunks[hit.doc_id] = Hit(hit.doc_id, hit.score, hit.title, text)
        return self._chunks[hit.doc_id]

    async def step(self, doc: Hit, out: list[int]) -> Generation:
        """Up to ``stride`` tokens with ``doc`` at the head of the prompt, continuing ``out``."""
        request = GenerateRequest(build_prompt(self.item.query, [self.chunk(doc)]),
                                  max_new_tokens=min(self.config.stride, self.config.max_new_tokens - len(out)),
                                  continuation_ids=tuple(out), batch_invariant=True)
        gen = await self.ctx.generate(request)
        new = doc.doc_id != self._last_doc
        self.reuse.append(StepReuse(gen.prompt_tokens, gen.cached_tokens, new))
        self._last_doc = doc.doc_id
        return gen

    def finished(self, gen: Generation, out: list[int]) -> bool:
        return gen.finish_reason == "stop" or len(out) >= self.config.max_new_tokens

    def finalise(self, out: list[int], record) -> QueryState:
        record.step_reuse = self.reuse
        return finalise_tokens(self.item, self.ctx, out, record)


@dataclass
class RaLMTrace:
    """The answer's token ids and the document each generation step used."""

    output_ids: list[int] = field(default_factory=list)
    step_docs: list[str] = field(default_factory=list)
    step_reuse: list[StepReuse] = field(default_factory=list)  # every generation step, in order


@dataclass
class RaLMSeqLoop(Stage):
    """The baseline: one index retrieval per generation step."""

    config: RaLMConfig
    name: str = "RaLMSeq"

    async def run(self, item: QueryState, ctx) -> QueryState:
        steps = RaLMSteps(item, ctx, self.config, self.name)
        out: list[int] = []
        docs: list[str] = []
        doc = None
        while True:
            ctx.next_step()
            hits = await steps.search(steps.query_text(out), first=doc is None)
            doc = steps.document_after(doc, hits)
            docs.append(doc.doc_id)
            gen = await steps.step(doc, out)
            out += gen.token_ids
            if steps.finished(gen, out):
                return steps.finalise(out, RaLMTrace(step_docs=docs))


class RaLMSeq(Method):
    name = "ralmseq"
    config_class = RaLMConfig
    trace_class = RaLMTrace
    needs_retriever = True

    def stages(self):
        return [RaLMSeqLoop(self.config)]
