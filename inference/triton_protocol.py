"""The tensors of each inference operation on the wire to Triton, for both sides.

The server models (``triton_serving``) and the client backend (``triton``) both encode and
decode through these functions, so the two cannot drift apart; numpy only, no Triton
import. Every tensor has a leading batch dimension (the models set ``max_batch_size``).
Variable-length outputs are padded per batch and come with their true lengths.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from specrag.inference.types import (Denoised, DenoiseRequest, FusedDecodeRequest, GenerateRequest, Generation,
                                     RerankRequest, ScoreRequest, Scored)


@dataclass(frozen=True)
class OpSpec:
    """Names and Triton data types of one operation's inputs and outputs."""

    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]


OPS: dict[str, OpSpec] = {
    "generate": OpSpec(
        inputs=(("PROMPT", "BYTES"), ("MAX_NEW_TOKENS", "INT32"), ("STOP", "BYTES"),
                ("TEMPERATURE", "FP64"), ("TOP_P", "FP64"), ("SEED", "INT64"), ("CHAT", "BOOL"),
                ("CONTINUATION_IDS", "BYTES"), ("BATCH_INVARIANT", "BOOL")),
        outputs=(("TEXT", "BYTES"), ("TOKEN_IDS", "INT64"), ("TOKEN_LOGPROBS", "FP32"),
                 ("NUM_TOKENS", "INT32"), ("PROMPT_TOKENS", "INT32"), ("FINISH_REASON", "BYTES"))),
    "score": OpSpec(
        inputs=(("PROMPT", "BYTES"), ("CONTINUATION", "BYTES"), ("SEGMENTS", "BYTES"),
                ("CONTRAST_PROMPT", "BYTES"), ("ALPHA", "FP64"), ("CHAT", "BOOL")),
        outputs=(("TOKEN_LOGPROBS", "FP32"), ("TOKENS", "BYTES"), ("NUM_TOKENS", "INT32"),
                 ("PROMPT_TOKENS", "INT32"), ("SEGMENT_LENGTHS", "BYTES"))),
    "embed": OpSpec(inputs=(("TEXT", "BYTES"),), outputs=(("EMBEDDING", "FP32"),)),
    "fused_decode": OpSpec(
        inputs=(("PROMPTS", "BYTES"), ("WEIGHTS", "BYTES"), ("MAX_NEW_TOKENS", "INT32"), ("STOP", "BYTES"),
                ("CHAT", "BOOL")),
        outputs=(("TEXT", "BYTES"), ("TOKEN_IDS", "INT64"), ("TOKEN_LOGPROBS", "FP32"),
                 ("NUM_TOKENS", "INT32"), ("PROMPT_TOKENS", "INT32"), ("FINISH_REASON", "BYTES"))),
    "rerank": OpSpec(inputs=(("QUERY", "BYTES"), ("TEXT", "BYTES")), outputs=(("SCORE", "FP32"),)),
    # one denoising step of a masked-diffusion LM (SARDI): the response window as token ids
    # (JSON text: any length, masks included); per position the argmax and its probability
    "denoise": OpSpec(
        inputs=(("CONTEXT", "BYTES"), ("RESPONSE_IDS", "BYTES"), ("CHAT", "BOOL")),
        outputs=(("ARGMAX", "INT64"), ("CONFIDENCE", "FP32"), ("NUM_TOKENS", "INT32"),
                 ("CONTEXT_TOKENS", "INT32"), ("TRUNCATED_TOKENS", "INT32"))),
}

# (sampling settings travel as FP64: 0.7 in FP32 is 0.699999988 and would sample differently)
# parameters in each config.pbtxt that say what a served model is
PARAM_OP = "specrag_op"
PARAM_MODEL = "specrag_model"

_NUMPY = {"BYTES": np.object_, "INT32": np.int32, "INT64": np.int64, "FP32": np.float32, "FP64": np.float64, "BOOL": np.bool_}


def numpy_dtype(triton_type: str):
    return _NUMPY[triton_type]


def _column(values, triton_type: str) -> np.ndarray:
    if triton_type == "BYTES":
        return np.array([[v.encode("utf-8")] for v in values], dtype=np.object_)
    return np.array([[v] for v in values], dtype=_NUMPY[triton_type])


def _text(cell) -> str:
    return cell.decode("utf-8") if isinstance(cell, (bytes, np.bytes_)) else str(cell)


def _padded(rows: list[list], dtype, fill) -> tuple[np.ndarray, np.ndarray]:
    width = max([len(r) for r in rows] + [1])  # never a zero-width tensor
    out = np.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out, np.array([[len(r)] for r in rows], dtype=np.int32)


# -- requests: client encodes, server decodes ---------------------------------------------
def encode_requests(op: str, requests: list) -> dict[str, np.ndarray]:
    """Input tensors for a batch of requests of ``op`` (rows in request order)."""
    if op == "generate":
        return {"PROMPT": _column([r.prompt for r in requests], "BYTES"),
                "MAX_NEW_TOKENS": _column([r.max_new_tokens for r in requests], "INT32"),
                "STOP": _column([json.dumps(list(r.stop)) for r in requests], "BYTES"),
                "TEMPERATURE": _column([r.temperature for r in requests], "FP64"),
                "TOP_P": _column([r.top_p for r in requests], "FP64"),
                "SEED": _column([r.seed for r in requests], "INT64"),
                "CHAT": _column([r.chat for r in requests], "BOOL"),
                "CONTINUATION_IDS": _column([json.dumps(list(r.continuation_ids)) for r in requests], "BYTES"),
                "BATCH_INVARIANT": _column([r.batch_invariant for r in requests], "BOOL")}
    if op == "score":
        return {"PROMPT": _column([r.prompt for r in requests], "BYTES"),
                "CONTINUATION": _column([r.continuation for r in requests], "BYTES"),
                "SEGMENTS": _column([json.dumps(list(r.segments)) for r in requests], "BYTES"),
                # JSON: null (no contrast) stays apart from an empty contrast prompt
                "CONTRAST_PROMPT": _column([json.dumps(r.contrast_prompt) for r in requests], "BYTES"),
                "ALPHA": _column([r.alpha for r in requests], "FP64"),
                "CHAT": _column([r.chat for r in requests], "BOOL")}
    if op == "embed":
        return {"TEXT": _column(list(requests), "BYTES")}
    if op == "fused_decode":  # weights as JSON text: FP64 exactly, any number of streams
        return {"PROMPTS": _column([json.dumps(list(r.prompts)) for r in requests], "BYTES"),
                "WEIGHTS": _column([json.dumps(list(r.weights)) for r in requests], "BYTES"),
                "MAX_NEW_TOKENS": _column([r.max_new_tokens for r in requests], "INT32"),
                "STOP": _column([json.dumps(list(r.stop)) for r in requests], "BYTES"),
                "CHAT": _column([r.chat for r in requests], "BOOL")}
    if op == "rerank":
        return {"QUERY": _column([r.query for r in requests], "BYTES"),
                "TEXT": _column([r.text for r in requests], "BYTES")}
    if op == "denoise":
        return {"CONTEXT": _column([r.context for r in requests], "BYTES"),
                "RESPONSE_IDS": _column([json.dumps(list(r.response_ids)) for r in requests], "BYTES"),
                "CHAT": _column([r.chat for r in requests], "BOOL")}
    raise ValueError(f"unknown operation {op!r}; known: {', '.join(OPS)}")


def decode_requests(op: str, tensors: dict[str, np.ndarray]) -> list:
    """The requests a batch of input tensors carries (inverse of ``encode_requests``)."""
    if op == "generate":
        rows = len(tensors["PROMPT"])
        return [GenerateRequest(prompt=_text(tensors["PROMPT"][i][0]),
                                max_new_tokens=int(tensors["MAX_NEW_TOKENS"][i][0]),
                                stop=tuple(json.loads(_text(tensors["STOP"][i][0]))),
                                temperature=float(tensors["TEMPERATURE"][i][0]),
                                top_p=float(tensors["TOP_P"][i][0]),
                                seed=int(tensors["SEED"][i][0]),
                                chat=bool(tensors["CHAT"][i][0]),
                                continuation_ids=tuple(json.loads(_text(tensors["CONTINUATION_IDS"][i][0]))),
                                batch_invariant=bool(tensors["BATCH_INVARIANT"][i][0])) for i in range(rows)]
    if op == "score":
        return [ScoreRequest(_text(p[0]), _text(c[0]), tuple(json.loads(_text(s[0]))),
                             contrast_prompt=json.loads(_text(cp[0])), alpha=float(a[0]), chat=bool(ch[0]))
                for p, c, s, cp, a, ch in zip(tensors["PROMPT"], tensors["CONTINUATION"], tensors["SEGMENTS"],
                                              tensors["CONTRAST_PROMPT"], tensors["ALPHA"], tensors["CHAT"])]
    if op == "embed":
        return [_text(t[0]) for t in tensors["TEXT"]]
    if op == "fused_decode":
        return [FusedDecodeRequest(tuple(json.loads(_text(p[0]))), tuple(float(x) for x in json.loads(_text(w[0]))),
                                   max_new_tokens=int(n[0]), stop=tuple(json.loads(_text(st[0]))), chat=bool(ch[0]))
                for p, w, n, st, ch in zip(tensors["PROMPTS"], tensors["WEIGHTS"], tensors["MAX_NEW_TOKENS"],
                                           tensors["STOP"], tensors["CHAT"])]
    if op == "rerank":
        return [RerankRequest(_text(q[0]), _text(t[0])) for q, t in zip(tensors["QUERY"], tensors["TEXT"])]
    if op == "denoise":
        return [DenoiseRequest(_text(c[0]), tuple(int(x) for x in json.loads(_text(r[0]))), chat=bool(ch[0]))
                for c, r, ch in zip(tensors["CONTEXT"], tensors["RESPONSE_IDS"], tensors["CHAT"])]
    raise ValueError(f"unknown operation {op!r}; known: {', '.join(OPS)}")


# -- results: server encodes, client decodes ----------------------------------------------
def encode_results(op: str, results) -> dict[str, np.ndarray]:
    if op in ("generate", "fused_decode"):
        ids, n = _padded([g.token_ids for g in results], np.int64, -1)
        lps, _ = _padded([g.token_logprobs for g in results], np.float32, 0.0)
        return {"TEXT": _column([g.text for g in results], "BYTES"), "TOKEN_IDS": ids,
                "TOKEN_LOGPROBS": lps, "NUM_TOKENS": n,
                "PROMPT_TOKENS": _column([g.prompt_tokens for g in results], "INT32"),
                "FINISH_REASON": _column([g.finish_reason for g in results], "BYTES")}
    if op == "score":
        lps, n = _padded([s.token_logprobs for s in results], np.float32, 0.0)
        toks, _ = _padded([[t.encode("utf-8") for t in s.tokens] for s in results], np.object_, b"")
        return {"TOKEN_LOGPROBS": lps, "TOKENS": toks, "NUM_TOKENS": n,
                "PROMPT_TOKENS": _column([s.prompt_tokens for s in results], "INT32"),
                "SEGMENT_LENGTHS": _column([json.dumps(s.segment_lengths) for s in results], "BYTES")}
    if op == "embed":
        return {"EMBEDDING": np.asarray(results, dtype=np.float32)}
    if op == "rerank":
        return {"SCORE": np.array([[float(x)] for x in results], dtype=np.float32)}
    if op == "denoise":
        ids, n = _padded([d.argmax for d in results], np.int64, -1)
        conf, _ = _padded([d.confidence for d in results], np.float32, 0.0)
        return {"ARGMAX": ids, "CONFIDENCE": conf, "NUM_TOKENS": n,
                "CONTEXT_TOKENS": _column([d.context_tokens for d in results], "INT32"),
                "TRUNCATED_TOKENS": _column([d.truncated_tokens for d in results], "INT32")}
    raise ValueError(f"unknown operation {op!r}; known: {', '.join(OPS)}")


def decode_results(op: str, tensors: dict[str, np.ndarray]) -> list:
    """One result per row of the output tensors."""
    if op in ("generate", "fused_decode"):
        out = []
        for i in range(len(tensors["TEXT"])):
            n = int(tensors["NUM_TOKENS"][i][0])
            out.append(Generation(text=_text(tensors["TEXT"][i][0]),
                                  token_ids=[int(x) for x in tensors["TOKEN_IDS"][i][:n]],
                                  token_logprobs=[float(x) for x in tensors["TOKEN_LOGPROBS"][i][:n]],
                                  prompt_tokens=int(tensors["PROMPT_TOKENS"][i][0]),
                                  finish_reason=_text(tensors["FINISH_REASON"][i][0])))
        return out
    if op == "score":
        out = []
        for i in range(len(tensors["NUM_TOKENS"])):
            n = int(tensors["NUM_TOKENS"][i][0])
            out.append(Scored(token_logprobs=[float(x) for x in tensors["TOKEN_LOGPROBS"][i][:n]],
                              prompt_tokens=int(tensors["PROMPT_TOKENS"][i][0]),
                              tokens=[_text(t) for t in tensors["TOKENS"][i][:n]],
                              segment_lengths=json.loads(_text(tensors["SEGMENT_LENGTHS"][i][0]))))
        return out
    if op == "embed":
        return list(np.asarray(tensors["EMBEDDING"], dtype=np.float32))
    if op == "rerank":
        return [float(x[0]) for x in tensors["SCORE"]]
    if op == "denoise":
        out = []
        for i in range(len(tensors["NUM_TOKENS"])):
            n = int(tensors["NUM_TOKENS"][i][0])
            # FP32 on the wire: the local backend's confidences are FP32 values too (softmax in float32)
            out.append(Denoised([int(x) for x in tensors["ARGMAX"][i][:n]],
                                [float(x) for x in tensors["CONFIDENCE"][i][:n]],
                                context_tokens=int(tensors["CONTEXT_TOKENS"][i][0]),
                                truncated_tokens=int(tensors["TRUNCATED_TOKENS"][i][0])))
        return out
    raise ValueError(f"unknown operation {op!r}; known: {', '.join(OPS)}")
