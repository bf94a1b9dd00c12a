"""Every registry entry imports; every method validates its defaults, declares named stages,
what it needs from its backends and typed state/trace, and has tests of its own."""
import dataclasses
import re
from pathlib import Path

import pyarrow as pa
import pytest

from specrag.inference.capabilities import OPERATIONS
from specrag.methods import REGISTRY, create_method
from specrag.registry import REGISTRIES, UnknownEntry
from specrag.schemas.tables import RESULT_CORE

ENTRIES = [(kind, name) for kind, reg in sorted(REGISTRIES.items()) for name in sorted(reg)]


@pytest.mark.parametrize("kind, name", ENTRIES, ids=[f"{k}:{n}" for k, n in ENTRIES])
def test_every_entry_imports(kind, name):
    assert REGISTRIES[kind][name] is not None


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownEntry, match="unknown method 'ralm-spec'; known: .*ralmspec"):
        create_method("ralm-spec")
    with pytest.raises(ValueError, match="unknown backend"):  # UnknownEntry is a ValueError too
        REGISTRIES["backends"]["tpu"]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_registered_methods_build_with_paper_defaults(name):
    method = create_method(name)
    stages = method.stages()
    assert stages and all(s.name for s in stages)
    assert len({s.name for s in stages}) == len(stages)
    assert len(method.fingerprint()) == 16
    assert method.model_roles == tuple(method.needs)
    assert all(op in OPERATIONS for ops in method.needs.values() for op in ops)
    for declared in (method.state_class, method.trace_class):
        assert declared is None or dataclasses.is_dataclass(declared)
    schema = method.results_schema()  # the trace struct is derived at start: a bad field type fails here
    assert schema.names[:len(RESULT_CORE)] == [f.name for f in RESULT_CORE]
    if method.trace_class is not None:
        assert pa.types.is_struct(schema.field("trace").type)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_method_has_tests_of_its_own(name):
    """A test that runs the method (create_method / --method with its name) beyond this file."""
    pattern = re.compile(rf"""(create_method\(|--method["',= ]+|method=)["']{re.escape(name)}["']""")
    tests = Path(__file__).parents[1]
    users = [p.name for p in sorted(tests.rglob("test_*.py")) if p.name != Path(__file__).name
             and pattern.search(p.read_text())]
    assert users, f"no test runs method {name!r}"
