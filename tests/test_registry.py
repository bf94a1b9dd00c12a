"""Every registered method imports, validates its defaults and declares named stages."""
import pytest

from specrag.methods import REGISTRY, create_method


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_registered_methods_build_with_paper_defaults(name):
    method = create_method(name)
    stages = method.stages()
    assert stages and all(s.name for s in stages)
    assert len({s.name for s in stages}) == len(stages)
    assert len(method.fingerprint()) == 16
