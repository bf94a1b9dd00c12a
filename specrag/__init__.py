"""specrag: latency-saving RAG methods as Apache Beam pipelines.

The layers live in top-level folders of the repository and install as ``specrag.<layer>``:
pipelines → transforms → methods → (retrieval, inference) → schemas.
"""
__version__ = "0.1.0"
