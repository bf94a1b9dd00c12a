"""RAG methods as named stages, registered by name (runner-agnostic: no Beam here)."""
from specrag.methods.base import (REGISTRY, Method, MethodConfig, QueryState, Stage,  # noqa: F401
                                  create_method, method_class)
