"""Answer-quality metrics and run reports."""
from specrag.evaluation.metrics import TASK_METRICS, score_row  # noqa: F401
from specrag.evaluation.report import evaluate_run, format_table  # noqa: F401
