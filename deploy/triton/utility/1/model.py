"""Triton Python-backend model: utility (settings in ../config.pbtxt)."""
from specrag.inference.triton_serving import RerankModel as TritonPythonModel  # noqa: F401
