"""Methods as named stages over one query's state, and the registry of methods.

A method is a config (its paper's defaults, validated at start) plus an ordered list of
stages. A stage is an async function over a QueryState; returning a list fans the query
out into parts (each carries ``part``/``parts`` so a join can gather them again). Methods
never import Beam: the same stages run in the pipeline, in tests and in benchmarks.

What a method carries from one stage to the next is a dataclass it declares
(``state_class``, reached with ``item.state_of(cls)``); what it reports per query is another
(``trace_class``, reached with ``item.trace.of(cls)``), which becomes the results table's
typed ``trace`` column.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence, TypeVar

from specrag.inference.capabilities import GENERATE
from specrag.inference.trace import Trace
from specrag.registry import METHODS

S = TypeVar("S")


@dataclass
class QueryState:
    query: dict[str, Any]
    docs: list[Any] = field(default_factory=list)
    raw_output: str = ""
    answer: str = ""
    choice: str | None = None
    trace: Trace = field(default_factory=Trace)
    part: int = 0
    parts: int = 1
    method_state: Any = None  # the method's typed state (its ``state_class``), see ``state_of``
    gathered: list["QueryState"] | None = field(default=None, repr=False)  # a join's parts, in order

    @property
    def id(self) -> str:
        return self.query["id"]

    def state_of(self, cls: type[S]) -> S:
        """The method's state of type ``cls``, created on first use."""
        if self.method_state is None:
            self.method_state = cls()
        elif not isinstance(self.method_state, cls):
            raise TypeError(f"query {self.id} holds a {type(self.method_state).__name__}, not a {cls.__name__}")
        return self.method_state

    def fork(self, part: int, parts: int) -> "QueryState":
        """A fanned-out part: it shares the query and the documents (references, not copies:
        parts only read them) and has a method state of its own (a shallow copy). Part 0 keeps
        the accounting so far, the others start empty, so summing the parts' traces at the
        join counts pre-fork work once."""
        own = copy.copy(self.method_state)
        return dataclasses.replace(self, part=part, parts=parts, method_state=own, gathered=None,
                                   trace=self.trace if part == 0 else Trace())


class Stage:
    """Base of a method's stages: a named async step over one query's state (a list fans it out).

    ``gather`` declares a stage that first re-joins the query's fanned-out parts (a keyed join in
    the Beam graph; ``item.gathered`` holds the parts, in order).

    Example usage::

        @dataclass
        class Shout(Stage):
            name: str = "Shout"

            async def run(self, item, ctx):
                item.answer = (await ctx.generate(GenerateRequest(item.question))).text.upper()
                return item
    """

    name: str
    gather: ClassVar[bool] = False

    async def run(self, item: QueryState, ctx: Any) -> QueryState | list[QueryState]:
        raise NotImplementedError


@dataclass(frozen=True)
class MethodConfig:
    """Base for method configs: subclasses add fields with the paper's defaults."""

    def validate(self) -> None:
        """Raise ValueError on a setting that cannot work."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Method:
    """A named RAG method: config + stages + which services it needs."""

    name: ClassVar[str]
    config_class: ClassVar[type[MethodConfig]] = MethodConfig
    # model role -> the operations the method calls on it (inference.capabilities), checked
    # against the configured backends at start; ``model_roles`` follows from it
    needs: ClassVar[dict[str, tuple[str, ...]]] = {"generator": (GENERATE,)}
    model_roles: ClassVar[tuple[str, ...]] = ("generator",)
    state_class: ClassVar[type | None] = None  # carried between stages (a dataclass)
    trace_class: ClassVar[type | None] = None  # reported per query: the results' ``trace`` column
    needs_retriever: ClassVar[bool] = False
    # what it reads beside its models and retriever (names in registry.RESOURCES, each a folder the
    # run gives and a stage asks for with ctx.resource): KNN-LM's ("datastore",), AED-RAG's ("triplets",)
    resources: ClassVar[tuple[str, ...]] = ()
    # the task types the method answers (None: every one); a query of another type is a dead
    # letter at validation, and `specrag compare` skips a dataset with none it answers
    task_types: ClassVar[tuple[str, ...] | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.model_roles = tuple(cls.needs)

    def __init__(self, config: MethodConfig | None = None, **overrides: Any):
        if config is None:
            config = self.config_class(**overrides)
        elif overrides:
            config = dataclasses.replace(config, **overrides)
        config.validate()
        self.config = config

    def stages(self) -> list[Stage]:
        raise NotImplementedError

    def results_schema(self):
        """Core result columns + this method's typed trace struct."""
        from specrag.schemas.tables import results_schema
        return results_schema(self.trace_class)

    def departures(self) -> list[dict]:
        """Settings that differ from the paper's published ones (the run manifest records them)."""
        return []

    def warn_departures(self) -> None:
        """Log the departures once, where a run starts (not in every worker that builds the method)."""
        off = self.departures()
        if off:
            logging.getLogger(type(self).__module__).warning(
                "%s: %d setting(s) differ from the published configuration: %s; this run does not reproduce "
                "the paper's results", self.name, len(off),
                ", ".join(f"{d['setting']}={d['value']!r} (paper: {d['paper']})" for d in off))

    def fingerprint(self) -> str:
        """Short hash of method name + config: results of different settings never mix."""
        blob = json.dumps({"method": self.name, "config": self.config.to_dict()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


REGISTRY = METHODS  # name -> Method class (specrag.registry: imported on first use)


def method_class(name: str) -> type[Method]:
    return METHODS[name]  # an unknown name: UnknownEntry (a ValueError) listing the known ones


def create_method(name: str, **config: Any) -> Method:
    """Build a registered method; unknown config keys are an error naming the valid ones."""
    cls = method_class(name)
    valid = {f.name for f in dataclasses.fields(cls.config_class)}
    bad = set(config) - valid
    if bad:
        raise ValueError(f"method {name!r} has no setting(s) {sorted(bad)}; valid: {sorted(valid)}")
    return cls(**config)


def _convert(raw: str, typ: Any, key: str) -> Any:
    """One --set value to its field's type, or a ValueError that says what was expected."""
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):
        if raw.strip().lower() in ("none", "null") and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(raw, inner[0], key) if len(inner) == 1 else raw
    if typ is bool:
        low = raw.strip().lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"--set {key}={raw}: {key} expects true or false")
    if typ in (int, float):
        try:
            return typ(raw)
        except ValueError:
            raise ValueError(f"--set {key}={raw}: {key} expects {'an integer' if typ is int else 'a number'}, "
                             f"got {raw!r}") from None
    if origin is tuple:
        items = json.loads(raw) if raw.strip().startswith("[") else [x.strip() for x in raw.split(",") if x.strip()]
        return tuple(_convert(str(x), args[0], key) for x in items)
    return raw


def parse_settings(name: str, pairs: list[str]) -> dict[str, Any]:
    """``key=value`` strings → a method's config overrides, each parsed to its field's type."""
    cls = method_class(name).config_class
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        if key not in fields:
            raise ValueError(f"method {name!r} has no setting {key!r}; valid: {sorted(fields)}")
        out[key] = _convert(raw, hints[key], key)
    return out


def describe_methods() -> str:
    """Every registered method with its settings and their (papers') defaults, for --help."""
    lines = ["methods and their settings (--method NAME --set KEY=VALUE; defaults follow the papers):"]
    for name in sorted(REGISTRY):
        cls = method_class(name)
        defaults = dataclasses.asdict(cls.config_class())
        settings = ", ".join(f"{k}={v}" for k, v in defaults.items()) or "(none)"
        lines.append(f"  {name}: {settings}")
    return "\n".join(lines)


def method_segments(stages: Sequence[Any]) -> list[list[Any]]:
    """Stages cut before every gathering stage (a keyed join of fanned-out parts): each
    segment runs fused, as one engine submission (one ParDo in the Beam graph)."""
    segments: list[list[Any]] = []
    for stage in stages:
        if not segments or stage.gather:
            segments.append([])
        segments[-1].append(stage)
    return segments


def merge_parts(parts: list[QueryState]) -> QueryState:
    """Re-join a query's fanned-out parts: part order, traces merged, the parts in ``gathered``."""
    if not parts:
        raise ValueError("merge_parts needs at least one part")
    parts = sorted(parts, key=lambda p: p.part)
    expected = parts[0].parts
    if [p.part for p in parts] != list(range(expected)):
        raise ValueError(f"query {parts[0].id}: have parts {[p.part for p in parts]} of {expected}")
    merged = dataclasses.replace(parts[0], part=0, parts=1, trace=Trace(), gathered=parts)
    for p in parts:
        merged.trace.merge(p.trace)
    return merged
