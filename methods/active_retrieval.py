"""SARDI's autoregressive baselines: the generator with retrieval static, every N tokens, or
FLARE-style (Table 1's AR w/ ret@static, ret@10, ret@1, ret@adaptive).

All share SARDI's prompt, evidence format, retriever and query construction (question + the
response so far, whitespace collapsed, repeated words dropped), so only the retrieval
schedule differs:

- ``every=0``: static — K passages for the question, fixed for the whole answer;
- ``every=N``: after every N generated tokens the query is rebuilt and the K passages it
  retrieves replace the context; generation continues from the tokens so far (an unchanged
  query reuses the last result);
- ``flare=true`` (Jiang et al., 2023): look ahead one sentence; if any of its tokens has
  probability < ``flare_threshold``, retrieve with the question + that sentence without its
  low-probability tokens (FLARE's masked query), and regenerate the sentence with the new
  evidence; otherwise keep it.

The trace holds the evidence every generated token saw (``steps``): the trajectory
``specrag evaluate`` turns into recall at 25/50/100% of the generation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from specrag.inference.types import GenerateRequest
from specrag.methods.base import Method, MethodConfig, QueryState, Stage
from specrag.methods.prompts import sardi_prompt
from specrag.methods.sardi import evidence, finalise_response, normalise_proxy, prompt_question, retrieval_query


@dataclass(frozen=True)
class ARRetrievalConfig(MethodConfig):
    every: int = 0  # retrieve every N generated tokens (0: static, the question only; SARDI's Table 1: 1, 10)
    flare: bool = False  # FLARE-style confidence-triggered retrieval, one sentence at a time
    flare_threshold: float = 0.4  # a look-ahead token below this probability triggers retrieval
    sentence_tokens: int = 32  # FLARE's look-ahead: at most this many tokens, cut at the sentence end
    top_k: int = 7  # K, as SARDI
    max_new_tokens: int = 100  # as SARDI
    passage_words: int = 0  # > 0: cut each passage (the same evidence as a SARDI run with it)
    deduplicate_query: bool = True

    def validate(self) -> None:
        if self.every < 0:
            raise ValueError(f"every must be >= 0 (0: static retrieval), got {self.every}")
        if self.flare and self.every:
            raise ValueError("flare and every are two schedules: set one")
        if not 0.0 < self.flare_threshold < 1.0:
            raise ValueError(f"flare_threshold must be in (0, 1), got {self.flare_threshold}")
        if self.top_k < 1 or self.max_new_tokens < 1 or self.sentence_tokens < 1 or self.passage_words < 0:
            raise ValueError("top_k, max_new_tokens and sentence_tokens must be >= 1, passage_words >= 0")

    @property
    def schedule(self) -> str:
        return "flare" if self.flare else ("static" if self.every == 0 else f"every-{self.every}")


@dataclass
class TokenEvidence:
    """A generated token's evidence (the passages in its prompt)."""

    doc_ids: list[str] = field(default_factory=list)


@dataclass
class ARRetrievalTrace:
    schedule: str = ""
    steps: list[TokenEvidence] = field(default_factory=list)  # one per generated token
    queries: list[str] = field(default_factory=list)  # every retrieval query, the question's first
    retrievals: int = 0  # index searches run (unchanged queries reused)
    flare_triggers: int = 0  # look-ahead sentences that triggered retrieval
    response: str = ""


def sentence_end(pieces: list[str]) -> int:
    """Tokens up to and including the first that ends a sentence (or a line); all if none."""
    for i, piece in enumerate(pieces):
        if "\n" in piece or piece.rstrip().endswith((".", "?", "!")):
            return i + 1
    return len(pieces)


@dataclass
class ActiveRetrievalLoop(Stage):
    config: ARRetrievalConfig
    name: str = "Generate"

    async def run(self, item: QueryState, ctx) -> QueryState:
        c = self.config
        trace = item.trace.of(ARRetrievalTrace)
        trace.schedule = c.schedule
        question = item.query["question"]
        state = {"query": retrieval_query(question, "", "question"), "docs": None}

        async def retrieve(query: str):
            if query != state["query"] or state["docs"] is None:
                state["docs"] = await ctx.retrieve(query, c.top_k, stage=f"token-{len(out)}")
                state["query"] = query
                trace.retrievals += 1
                trace.queries.append(query)
            return state["docs"]

        async def generate(n: int):
            prompt = sardi_prompt(prompt_question(item.query), evidence(state["docs"], c.passage_words))
            return await ctx.generate(GenerateRequest(prompt, max_new_tokens=n, continuation_ids=tuple(out)))

        def accept(ids: list[int]) -> None:
            trace.steps.extend(TokenEvidence([d.doc_id for d in state["docs"]]) for _ in ids)
            out.extend(ids)

        out: list[int] = []
        await retrieve(state["query"])
        while len(out) < c.max_new_tokens:
            ctx.next_step()
            left = c.max_new_tokens - len(out)
            if not c.flare:
                gen = await generate(left if c.every == 0 else min(c.every, left))
                accept(gen.token_ids)
                if gen.finish_reason == "stop" or not gen.token_ids:
                    break
                await retrieve(self._query(ctx, question, out))
                continue
            look = await generate(min(c.sentence_tokens, left))
            cut = sentence_end([ctx.detokenize([t]) for t in look.token_ids])
            ids, logprobs = look.token_ids[:cut], look.token_logprobs[:cut]
            floor = math.log(c.flare_threshold)
            if any(lp < floor for lp in logprobs):
                trace.flare_triggers += 1
                confident = [t for t, lp in zip(ids, logprobs) if lp >= floor]
                masked_sentence = normalise_proxy(ctx.detokenize(confident), c.deduplicate_query)
                await retrieve(retrieval_query(question, masked_sentence, "question_reasoning"))
                look = await generate(min(c.sentence_tokens, left))
                cut = sentence_end([ctx.detokenize([t]) for t in look.token_ids])
                ids = look.token_ids[:cut]
            accept(ids)
            if (look.finish_reason == "stop" and cut == len(look.token_ids)) or not ids:
                break
        trace.response = ctx.detokenize(out).strip()
        item.docs = list(state["docs"] or [])
        return finalise_response(item, trace.response)

    def _query(self, ctx, question: str, out: list[int]) -> str:
        proxy = normalise_proxy(ctx.detokenize(out), self.config.deduplicate_query)
        return retrieval_query(question, proxy, "question_reasoning")


class ARRetrieval(Method):
    """The generator with a retrieval schedule: SARDI's autoregressive baselines."""

    name = "ar-retrieval"
    config_class = ARRetrievalConfig
    trace_class = ARRetrievalTrace
    needs_retriever = True

    def stages(self):
        return [ActiveRetrievalLoop(self.config)]
