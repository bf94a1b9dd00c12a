"""Model backends (local transformers, Triton) and the engine that batches their calls."""
from specrag.inference.engine import (Context, Engine, EngineConfig, ModelBackend, QueryOutcome,  # noqa: F401
                                      Services, StageOutcome, StageTimeout)
from specrag.inference.trace import Trace  # noqa: F401
from specrag.inference.types import GenerateRequest, Generation, ScoreRequest, Scored  # noqa: F401
