"""Triton Python-backend model: denoiser (settings in ../config.pbtxt)."""
from specrag.inference.triton_serving import DenoiseModel as TritonPythonModel  # noqa: F401
