"""Triton Python-backend model: generate() through vLLM's engine (settings in ../config.pbtxt)."""
from specrag.inference.triton_serving import GenerateModel as TritonPythonModel  # noqa: F401
