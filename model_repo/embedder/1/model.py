"""Triton Python-backend model: embedder (settings in ../config.pbtxt)."""
from specrag.inference.triton_serving import EmbedModel as TritonPythonModel  # noqa: F401
