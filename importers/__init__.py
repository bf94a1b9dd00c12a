"""Converters from native benchmark formats (HotpotQA, PopQA, NQ, ...) to specrag's tables."""
from specrag.importers.formats import FORMATS  # noqa: F401
from specrag.importers.importer import import_datasets  # noqa: F401
