"""Triton Python-backend model: generator_scorer (settings in ../config.pbtxt)."""
from specrag.inference.triton_serving import ScoreModel as TritonPythonModel  # noqa: F401
