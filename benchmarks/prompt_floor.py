"""The prompt-token floor of Speculative RAG against standard RAG: the latency ratio if a forward
pass cost its model's parameters times the tokens it reads, and nothing else.

Prefill is the part of a query's work that grows with the prompt; on these CPUs it is most of
standard RAG's time (ten documents, a short answer). Speculative RAG trades it for m drafts over
k documents each on the smaller drafter, and m verifier passes over [question, draft] on the
verifier. This counts the tokens of both from recorded runs — the documents each draft read
(its trace), the drafts' text, the passages standard RAG read — with each model's own tokenizer
and chat template, as the engine feeds them, and weighs them by parameter count:

    floor = (P_drafter · drafter tokens + P_verifier · verifier tokens) / (P_verifier · standard tokens)

with P a model's non-embedding parameters (Qwen2.5-Coder 0.5B: 0.36 B, 1.5B: 1.31 B; SmolLM2-135M: 0.11 B).

Tokens a prefix cache would not recompute are counted once (a perfect cache: vLLM's works in
blocks of 16 tokens): the instruction the drafts' prompts share, the rationale call's prompt
after the answer call's, the question before each draft in the verifier's passes (the options of
a closed-set question, scored after the same prompt, are left out: a few tokens). Generated tokens
are left out: on a CPU a decode step reads every weight whatever the batch, so its cost is not
proportional to tokens and sits on top of this floor, not in it.

    python benchmarks/prompt_floor.py --runs benchmarks/results/compare-drafter/runs --set popqa \\
        --specrag speculative-rag-tuned-drafter --standard standard-rag-qwen-1-5b \\
        --drafter runs/full/drafter/drafter-150 --verifier qwen2.5-coder-1.5b-instruct
"""
from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

WORK = Path("runs/full")  # as the suites and speculative_rag_pays.py name it, from where they run


def _source(model: str) -> dict:
    """from_pretrained's arguments for the model's files: a folder, or a GGUF file read in place
    (the tokenizer and the config only: no weights are converted or loaded)."""
    from specrag.inference.models import model_spec
    path = model_spec(model).locate()
    return {"pretrained_model_name_or_path": str(path)} if path.is_dir() else \
        {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}


@functools.cache
def tokenizer(model: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(**_source(model))


@functools.cache
def parameters(model: str) -> int:
    """The model's non-embedding parameters, from its config on the meta device (no weights loaded):
    what a prompt token's forward pass multiplies by. The embedding is a lookup, and a prefill
    computes the output head for its last position only (GGUF configs also untie it)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    with torch.device("meta"):
        model_ = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(**_source(model)))
    return sum(p.numel() for name, p in model_.named_parameters() if "embed_tokens" not in name
               and not name.startswith("lm_head"))


def prompt_ids(model: str, prompt: str, chat: bool = True) -> list[int]:
    from specrag.inference.local_base import prompt_token_ids
    return list(prompt_token_ids(tokenizer(model), prompt, chat))


def text_ids(model: str, text: str) -> list[int]:
    return list(tokenizer(model)(text, add_special_tokens=False)["input_ids"])


def cached_count(sequences: list[list[int]]) -> int:
    """Tokens a perfect prefix cache computes for ``sequences`` in turn: each one's tokens after
    the longest prefix it shares with an earlier one (the drafts' common instruction, the
    verifier's question before each draft, a continuation after its own prompt)."""
    total, seen = 0, []
    for seq in sequences:
        shared = max((next((i for i, (a, b) in enumerate(zip(seq, old)) if a != b), min(len(seq), len(old)))
                      for old in seen), default=0)
        total += len(seq) - shared
        seen.append(seq)
    return total


def standard_tokens(query: dict, docs: list, generator: str) -> int:
    """Standard RAG's prompt: every retrieved document and the question, in the chat template."""
    from specrag.methods.prompts import build_prompt
    return len(prompt_ids(generator, build_prompt(query, docs)))


def specrag_tokens(query: dict, drafts: list[dict], docs_by_id: dict, drafter: str, verifier: str,
                   reflection: str | None = None) -> tuple[int, int]:
    """(drafter tokens, verifier tokens) of one query through a prefix cache: each draft's prompt
    over its documents, then the answer and marker it feeds back before the rationale, and the
    verifier's [question, draft, reflection, "Yes"] for each draft the verifier scored."""
    from specrag.methods.prompts import build_prompt, task_input
    from specrag.methods.speculative_rag import RATIONALE_PREFIX, REFLECTION, draft_text
    reflection = reflection or REFLECTION
    drafter_seqs, verifier_seqs = [], []
    for d in drafts:
        prompt = prompt_ids(drafter, build_prompt(query, [docs_by_id[i] for i in d["doc_ids"]]))
        drafter_seqs.append(prompt)
        if d["rationale"]:  # the rationale call continues the same prompt after the answer and the marker
            drafter_seqs.append(prompt + text_ids(drafter, d["answer"]) + text_ids(drafter, RATIONALE_PREFIX))
        if d.get("rho_sc") is not None or d.get("rho_sr") is not None:
            segments = (f"Answer:{draft_text(d['answer'], d['rationale'])}", f"\n{reflection}\nAnswer:", " Yes")
            verifier_seqs.append(prompt_ids(verifier, task_input(query) + "\n", chat=False)
                                 + [t for seg in segments for t in text_ids(verifier, seg)])
    return cached_count(drafter_seqs), cached_count(verifier_seqs)


def run_rows(folder: Path) -> list[dict]:
    import pyarrow.parquet as pq
    rows = []
    for f in sorted(folder.glob("results-*.parquet")):
        names = pq.read_schema(f).names  # a method without a typed trace has no trace column
        rows += pq.read_table(f, columns=[c for c in ("id", "error", "retrieved", "trace") if c in names]).to_pylist()
    if not rows:
        raise SystemExit(f"{folder}: no results-*.parquet")
    return rows


def floor(runs: Path, dataset: str, specrag: str, standard: str, drafter: str, verifier: str,
          queries: Path | None = None, index: Path | None = None) -> dict:
    """The floor over the questions both runs answered: tokens per query of each model, and the ratio."""
    import pyarrow.parquet as pq
    from specrag.evaluation.compare_report import _passages
    from specrag.retrieval.base import Hit
    queries = queries or WORK / "data" / dataset.replace("-", "_") / "queries.parquet"
    by_id = {q["id"]: q for q in pq.read_table(queries).to_pylist()}
    spec = {r["id"]: r for r in run_rows(runs / dataset / specrag) if not r["error"]}
    std = {r["id"]: r for r in run_rows(runs / dataset / standard) if not r["error"]}
    ids = sorted(spec.keys() & std.keys())
    wanted = {i for q in ids for step in std[q]["retrieved"] for i in step["doc_ids"]}
    wanted |= {i for q in ids for d in spec[q]["trace"]["drafts"] for i in d["doc_ids"]}
    docs = {k: Hit(k, 0.0, v.get("title") or "", v["text"])  # a passage as the methods hold it
            for k, v in _passages(str(index or WORK / "index"), wanted).items()}
    d_n = v_n = s_n = 0
    for q in ids:
        d, v = specrag_tokens(by_id[q], spec[q]["trace"]["drafts"], docs, drafter, verifier)
        d_n, v_n = d_n + d, v_n + v
        s_n += standard_tokens(by_id[q], [docs[i] for i in std[q]["retrieved"][0]["doc_ids"]], verifier)
    p_d, p_v = parameters(drafter), parameters(verifier)
    n = max(len(ids), 1)
    return {"dataset": dataset, "questions": len(ids), "drafter_tokens": d_n / n, "verifier_tokens": v_n / n,
            "standard_tokens": s_n / n, "drafter_params": p_d, "verifier_params": p_v,
            "floor": (p_d * d_n + p_v * v_n) / (p_v * s_n) if s_n else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, required=True, help="a compare report's runs folder: <set>/<method slug>/")
    ap.add_argument("--set", dest="sets", action="append", required=True, help="dataset slug; repeatable")
    ap.add_argument("--specrag", required=True, help="the Speculative RAG run's folder name")
    ap.add_argument("--standard", required=True, help="standard RAG's run folder name (the verifier's model)")
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--verifier", required=True)
    args = ap.parse_args()
    for s in args.sets:
        print(json.dumps(floor(args.runs, s, args.specrag, args.standard, args.drafter, args.verifier)))


if __name__ == "__main__":
    main()
