"""Triton Python-backend model: fused_decoder (settings in ../config.pbtxt)."""
from specrag.inference.triton_serving import FusedDecodeModel as TritonPythonModel  # noqa: F401
