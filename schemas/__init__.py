"""Arrow schemas of specrag's tables and the validation of their rows."""
from specrag.schemas.tables import (  # noqa: F401
    DEAD_LETTERS, PASSAGES, QUERIES, RESULTS, TASK_TYPES, COUNT_FIELDS, TIMING_FIELDS,
)
from specrag.schemas.validation import RowError, validate_passage, validate_query  # noqa: F401
