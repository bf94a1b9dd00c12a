"""benchmarks/peers.py's accounting of the same-work peer: the prompt tokens a prefix cache could
serve across a RAG batch, and the peer script's prompt matching specrag's (it may not import it)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import load_script

from specrag.methods.prompts import DOCUMENT_CHARS, format_documents
from specrag.retrieval.base import Hit

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def scripts():
    saved = dict(os.environ)  # peers.py sets its threads and offline mode for its own process
    try:
        return (load_script(BENCHMARKS / "peers.py", "peers"),
                load_script(BENCHMARKS / "vllm_same_work.py", "vllm_same_work"))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_shared_prefix_tokens_counts_each_prompts_longest_prefix_with_another(scripts):
    peers, _ = scripts
    prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 7], [8, 8]]
    # sorted: [1,2,3,4,5] [1,2,3,9] [1,2,7] [8,8]: neighbours share 3, 2 and 0 tokens
    assert peers.shared_prefix_tokens(prompts) == 5
    assert peers.shared_prefix_tokens(prompts, block=2) == 2 + 2  # whole blocks only: 3 -> 2, 2 -> 2
    assert peers.shared_prefix_tokens(prompts, block=4) == 0
    assert peers.shared_prefix_tokens([[1, 2], [1, 2]]) == 2  # equal prompts share all
    assert peers.shared_prefix_tokens([[1, 2]]) == 0


def test_the_same_work_peer_formats_documents_as_specrag(scripts):
    _, peer = scripts
    long = "word " * (DOCUMENT_CHARS // 4)
    hits = [Hit("a", 1.0, "Title", "short text"), Hit("b", 0.5, "", "no title"), Hit("c", 0.1, "Long", long)]
    assert peer.format_documents([h.title for h in hits], [h.text for h in hits], DOCUMENT_CHARS) \
        == format_documents(hits)
