"""Triton Python-backend model: generator (settings in ../config.pbtxt)."""
from specrag.inference.triton_serving import GenerateModel as TritonPythonModel  # noqa: F401
