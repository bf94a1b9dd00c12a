"""Arrow types derived from dataclasses.

A method declares its per-query trace as a dataclass; the results table gets one typed
struct column for it, so any Parquet engine can query drafts, speculation steps or stages
without parsing JSON. Only types with one obvious Arrow form are allowed (a field of another
type is an error when the schema is built, i.e. at start, not in the middle of a run).
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

import pyarrow as pa

_SCALARS = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


def arrow_type(tp: Any, where: str = "") -> pa.DataType:
    """The Arrow type of one annotation: int/float/str/bool, X | None, list[X], tuple[X, ...],
    or a dataclass (a struct of its fields)."""
    if tp in _SCALARS:
        return _SCALARS[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return arrow_type(inner[0], where)
    elif origin in (list, tuple) and args and (origin is list or len(args) == 1 or args[1] is Ellipsis):
        return pa.list_(arrow_type(args[0], where))
    elif dataclasses.is_dataclass(tp):
        return arrow_struct(tp)
    raise TypeError(f"{where or tp}: no Arrow type for {tp!r} (use int, float, str, bool, "
                    "X | None, list[X] or a dataclass)")


@functools.cache
def arrow_struct(cls: type) -> pa.StructType:
    """A dataclass as an Arrow struct, field by field, in declaration order."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = [pa.field(f.name, arrow_type(hints[f.name], f"{cls.__name__}.{f.name}"))
              for f in dataclasses.fields(cls)]
    if not fields:
        raise TypeError(f"{cls.__name__} has no fields (Parquet cannot store an empty struct)")
    return pa.struct(fields)


def to_record(obj: Any) -> Any:
    """A dataclass instance (nested ones too) as plain dicts and lists, ready for Arrow."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_record(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_record(x) for x in obj]
    return obj
