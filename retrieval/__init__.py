"""Retrievers (BM25, dense), the document store and index folders."""
from specrag.retrieval.base import DocStore, Hit, Retriever, passage_text  # noqa: F401
from specrag.retrieval.index import KINDS, finish_index, open_retriever, read_manifest  # noqa: F401
