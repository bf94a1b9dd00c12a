"""Converters from native benchmark formats (HotpotQA, PopQA, NQ, ...) to specrag's tables."""
from specrag.datasets.formats import FORMATS  # noqa: F401
from specrag.datasets.importer import import_datasets  # noqa: F401
