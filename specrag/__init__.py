"""specrag: latency-saving RAG methods as Apache Beam pipelines.

The layers live in top-level folders of the repository and install as ``specrag.<layer>``; each
imports only the layers after it (tests/test_layers.py holds the house to it):
pipelines → importers → training → transforms → methods → retrieval → inference → evaluation
→ schemas → jobio → specrag (this package: the registry, redaction).
"""
__version__ = "0.1.0"
