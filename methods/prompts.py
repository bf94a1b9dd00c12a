"""Prompt templates per task type and answer extraction for closed-set tasks.

Instructions follow the Self-RAG evaluation setting that Speculative RAG and SPS adopt
(Asai et al., 2024, Table 6 of SPS): PopQA/TriviaQA get the bare question, ARC the
four-candidates instruction, PubHealth the true/false instruction, ASQA the long-form
instruction. The short-form instruction is AED-RAG's (Table 6), which small models follow.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

INSTRUCTIONS = {
    "short_form": "Answer the question below concisely in a few words.",
    "multiple_choice": "Given four answer candidates, A, B, C and D, choose the best answer choice. "
                       "Reply with the letter of the best choice first.",
    "claim_verification": "Is the following statement correct or not? Say true if it's correct; "
                          "otherwise say false.",
    "long_form": "Answer the following question. The question may be ambiguous and have multiple "
                 "correct answers, and in that case, you have to provide a long-form answer "
                 "including all correct answers.",
}

MAX_NEW_TOKENS = {"short_form": 32, "multiple_choice": 24, "claim_verification": 16, "long_form": 200}


DOCUMENT_CHARS = 1200  # a document longer than this is clipped at a word in the prompt


def format_documents(docs: Sequence[Any], max_chars: int = DOCUMENT_CHARS) -> str:
    """Numbered documents with titles; long passages are clipped so prompts stay bounded."""
    lines = []
    for i, d in enumerate(docs, 1):
        text = d.text if len(d.text) <= max_chars else d.text[:max_chars].rsplit(" ", 1)[0] + " ..."
        lines.append(f"[{i}] {d.title}: {text}" if d.title else f"[{i}] {text}")
    return "\n".join(lines)


def task_input(query: dict) -> str:
    """The question as the task presents it (with its options for multiple choice)."""
    if query["task_type"] == "multiple_choice":
        opts = "\n".join(f"{lab}. {txt}" for lab, txt in zip(query["choice_labels"], query["choices"]))
        return f"Question: {query['question']}\n{opts}"
    if query["task_type"] == "claim_verification":
        return f"Statement: {query['question']}"
    return f"Question: {query['question']}"


def build_prompt(query: dict, docs: Sequence[Any] = (), question_first: bool = False) -> str:
    """Instruction, then the documents (if any), then the input; plain text for chat models.
    ``question_first``: the input before the documents, as SPS's prompt (its Appendix A), so the
    prompts of one question over different documents share the instruction and question as a
    prefix that an engine's prefix cache computes once."""
    documents = ["Documents:\n" + format_documents(docs)] if docs else []
    rest = [task_input(query), *documents] if question_first else [*documents, task_input(query)]
    return "\n\n".join([INSTRUCTIONS[query["task_type"]], *rest]) + "\nAnswer:"


# short outputs end at the first line break; long-form answers run to EOS or the limit
STOP = {"short_form": ("\n",), "multiple_choice": ("\n\n",), "claim_verification": ("\n",), "long_form": ()}


_PREFIX = re.compile(r"^\s*(?:the\s+)?(?:final\s+)?(?:answer|response)\s*(?:is)?\s*[:\-]?\s*", re.I)
# a markdown section header a model echoes from an instruction-style prompt ("### Output:")
_HEADER = re.compile(r"^\s*#+\s*(?:output|response|answer)\s*:?\s*", re.I)


def extract_short_answer(output: str) -> str:
    """First non-empty line, without an 'Answer:' prefix or a final full stop."""
    for line in output.strip().splitlines():
        line = _PREFIX.sub("", _HEADER.sub("", line.strip())).strip()
        if line:
            return line[:-1] if line.endswith(".") else line
    return ""


def extract_choice(output: str, labels: Sequence[str], choices: Sequence[str]) -> str | None:
    """The chosen label. Small models often echo "A: <text>" with the text of another option:
    an option's full text in the first line outranks a letter whose text is absent."""
    text = output.strip()
    first = text.splitlines()[0] if text else ""
    low_first = first.lower()
    by_text = [lab for lab, c in zip(labels, choices) if c and c.lower() in low_first]
    alts = "|".join(re.escape(l) for l in labels)
    patterns = [rf"^\(?({alts})\)?(?:[\s:.)]|$)", rf"(?i:answer|choice|option)\s*(?:is|:)?\s*\(?({alts})\b",
                rf"\b({alts})\s*[:.)]"]
    letter = None
    for p in patterns:
        m = re.search(p, text, flags=re.M)
        if m:
            letter = next(l for l in labels if l.upper() == m.group(1).upper())
            break
    if len(by_text) == 1 and (letter is None or by_text[0] != letter):
        return by_text[0]
    if letter is not None:
        return letter
    low = text.lower()
    mentioned = [lab for lab, c in zip(labels, choices) if c and c.lower() in low]
    return mentioned[0] if len(mentioned) == 1 else None


def extract_label(output: str, labels: Sequence[str] = ("true", "false")) -> str | None:
    """The first label word in the output (claim verification)."""
    words = "|".join(re.escape(l) for l in labels)
    m = re.search(rf"\b({words})\b", output.lower())
    return m.group(1) if m else None


# AED-RAG (Zhou et al., Table 6): the generation prompt, identical for AED-RAG and its
# baselines, and the self-sufficiency passage's prompt (after GainRAG).
AED_ANSWER = "{context}\n ### Instruction: \n Answer the question below concisely in a few words.\n\n ### Input: \n {query}"
AED_SELF_SUFFICIENCY = ("Please provide background for the question below in 100 words. Do not respond with anything "
                        "other than background. If you do not know or are unsure, please generate \"N/A\" directly. "
                        "Question: {query}")
AED_MAX_CONTEXT_CHARS = 1200  # per passage, as format_documents clips


def aed_context(texts: Sequence[str]) -> str:
    """Several units as one context block (passages clipped like ``format_documents``)."""
    clipped = [t if len(t) <= AED_MAX_CONTEXT_CHARS else t[:AED_MAX_CONTEXT_CHARS].rsplit(" ", 1)[0] + " ..."
               for t in texts]
    return "\n".join(clipped)


def aed_prompt(context: str, question: str) -> str:
    return AED_ANSWER.format(context=context, query=question)


# SARDI (App. B.1; the authors' sardi/rag/prompts.py): the question first, then the numbered
# facts, refilled at every retrieval step. The denoiser is trained on this exact wording.
SARDI_RAG = ("Use ONLY the provided facts to answer the question.\n"
             "Think step-by-step, then provide the final answer after the \"###\" marker.\n\n"
             "Question:\n{question}\n\nFacts:\n{facts}")


def sardi_prompt(question: str, passages: Sequence[str]) -> str:
    """The question and the passages as numbered facts ``[i] passage``."""
    facts = "\n".join(f"[{i + 1}] {p}" for i, p in enumerate(passages))
    return SARDI_RAG.replace("{question}", question).replace("{facts}", facts)
