"""Every pluggable part of specrag, by name: methods, models, backends, method resources,
retrievers, dataset triplet extractors, formats and metrics, in one mechanism.

An entry is ``name -> "module:object"`` and is imported on first use, so listing names
(``--help``, validation at start) costs no heavy import, and a new part is one line here.
``tests/test_registry.py`` imports every entry of every registry.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Iterator


class UnknownEntry(KeyError, ValueError):
    """A name no registry entry has (a KeyError for Mapping callers, a ValueError for users)."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Mapping):
    """A read-only mapping ``name -> object`` whose objects are imported when first looked up."""

    def __init__(self, kind: str, entries: dict[str, str]):
        self.kind = kind
        self.targets = dict(entries)
        self._loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self.targets:
            raise UnknownEntry(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self.targets))}")
        if name not in self._loaded:
            module, _, attr = self.targets[name].partition(":")
            self._loaded[name] = getattr(importlib.import_module(module), attr)
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.targets)

    def __len__(self) -> int:
        return len(self.targets)

    def __contains__(self, name: object) -> bool:
        return name in self.targets

    def check(self, name: str) -> str:
        """The name, or UnknownEntry listing the known ones (nothing is imported)."""
        if name not in self.targets:
            raise UnknownEntry(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self.targets))}")
        return name


METHODS = Registry("method", {
    "no-retrieval": "specrag.methods.no_retrieval:NoRetrieval",
    "standard": "specrag.methods.standard:StandardRAG",
    "retrieve-only": "specrag.methods.retrieve_only:RetrieveOnly",
    "ralmseq": "specrag.methods.ralm:RaLMSeq",
    "ralmspec": "specrag.methods.ralmspec:RaLMSpec",
    "knnlm": "specrag.methods.knnlm:KNNLM",
    "knnlm-spec": "specrag.methods.knnlm:KNNLMSpec",
    "speculative-rag": "specrag.methods.speculative_rag:SpeculativeRAG",
    "sps": "specrag.methods.sps:SPS",
    "aed-rag": "specrag.methods.aed_rag:AEDRAG",
    "aed-label": "specrag.methods.aed_rag:AEDLabel",
    "rationale-synthesis": "specrag.methods.rationale_synthesis:RationaleSynthesis",
    "sardi": "specrag.methods.sardi:SARDI",
    "ar-retrieval": "specrag.methods.active_retrieval:ARRetrieval",
})

# model name -> its ModelSpec (where the weights are, what kind of model it is)
MODELS = Registry("model", {
    "smollm2-135m-instruct": "specrag.inference.models:SMOLLM2_135M_INSTRUCT",
    "gemma3-270m": "specrag.inference.models:GEMMA3_270M",
    "all-minilm-l6-v2": "specrag.inference.models:ALL_MINILM_L6_V2",
    "ms-marco-minilm-l12-v2": "specrag.inference.models:MS_MARCO_RERANKER",
    "qwen2.5-coder-1.5b-instruct": "specrag.inference.models:QWEN25_CODER_15B",
    "qwen2.5-coder-0.5b-instruct": "specrag.inference.models:QWEN25_CODER_05B",
    "qwen2.5-coder-0.5b-rag-drafter": "specrag.inference.models:QWEN25_CODER_05B_RAG_DRAFTER",
})

# what methods read beside their models and retriever, by the name a stage asks for (ctx.resource);
# each class (inference.engine.MethodResource) checks, opens and identifies its folder
RESOURCES = Registry("method resource", {
    "datastore": "specrag.retrieval.datastore:DatastoreResource",
    "triplets": "specrag.retrieval.triplets:TripletResource",
})

# where model calls run; each backend class declares the operations it serves per model kind
BACKENDS = Registry("backend", {
    "local": "specrag.inference.local:LocalBackend",
    "triton": "specrag.inference.triton:TritonBackend",
    "vllm": "specrag.inference.vllm:VllmBackend",
})

# a local model's kind (inference/models.py) -> the class that runs it, one module per kind
LOCAL_KINDS = Registry("local model kind", {
    "causal-lm": "specrag.inference.local_causal_lm:LocalCausalLM",
    "encoder": "specrag.inference.local_encoder:LocalEncoder",
    "cross-encoder": "specrag.inference.local_cross_encoder:LocalCrossEncoder",
    "masked-diffusion": "specrag.inference.local_denoiser:LocalDenoiser",
})

# index kind (an index folder may hold several) -> the retriever class that opens it
RETRIEVERS = Registry("retriever", {
    "bm25": "specrag.retrieval.bm25:BM25Retriever",
    "lucene": "specrag.retrieval.lucene:LuceneRetriever",
    "dense": "specrag.retrieval.dense:DenseRetriever",
    "hnsw": "specrag.retrieval.dense:DenseRetriever",
    "ivf": "specrag.retrieval.dense:DenseRetriever",
})

# `specrag extract-triplets --extractor NAME` -> the extractor class (retrieval/triplets.py)
EXTRACTORS = Registry("triplet extractor", {
    "spacy-rules": "specrag.retrieval.triplet_rules:RuleTripletExtractor",
    "generator": "specrag.retrieval.triplets:GeneratorTripletExtractor",
})

# `specrag import` dataset name -> its Format (source folder under ../shared/data, row parser)
FORMATS = Registry("dataset format", {
    name: f"specrag.importers.formats:{name.upper()}"
    for name in ("hotpotqa", "popqa", "nq", "webquestions", "arc_challenge", "arc_challenge_selfrag",
                 "pubhealth", "asqa")
})

# metric name (as reported) -> its function
METRICS = Registry("metric", {
    "contains": "specrag.evaluation.metrics:contains",
    "em": "specrag.evaluation.metrics:exact_match",
    "f1": "specrag.evaluation.metrics:f1",
    "accuracy": "specrag.evaluation.metrics:choice_accuracy",
    "str_em": "specrag.evaluation.metrics:str_em",
    "rouge_l": "specrag.evaluation.metrics:rouge_l",
    "recall": "specrag.evaluation.metrics:recall_at",
})

REGISTRIES: dict[str, Registry] = {"methods": METHODS, "models": MODELS, "backends": BACKENDS,
                                   "resources": RESOURCES, "local_kinds": LOCAL_KINDS, "retrievers": RETRIEVERS,
                                   "extractors": EXTRACTORS, "formats": FORMATS, "metrics": METRICS}
