"""The models specrag ships inside the package (inference/shipped/): each folder is registered under
its name, its adapter is the file its card's sha256 names, stored in float16, over a registered
base, with the training manifest that made it. No model is loaded: tests/models/test_drafter.py
serves an adapter merged over its base."""
from __future__ import annotations

import hashlib
import json

import pytest

from specrag.inference.models import ADAPTER_WEIGHTS, CARD, MODELS, SHIPPED

FOLDERS = sorted(p for p in SHIPPED.iterdir() if p.is_dir()) if SHIPPED.is_dir() else []


def test_the_drafter_ships():
    assert "qwen2.5-coder-0.5b-rag-drafter" in [f.name for f in FOLDERS]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_a_shipped_adapter_is_the_file_its_card_names(folder):
    from safetensors import safe_open
    card = json.loads((folder / CARD).read_text())
    assert hashlib.sha256((folder / ADAPTER_WEIGHTS).read_bytes()).hexdigest() == card["adapter_sha256"]
    assert card["adapter_of"] in MODELS and card["base_model"].startswith(card["adapter_of"] + "@sha256:")
    with safe_open(str(folder / ADAPTER_WEIGHTS), "pt") as weights:
        assert {str(weights.get_slice(k).get_dtype()) for k in weights.keys()} == {"F16"}
    manifest = json.loads((folder / card["training_manifest"]).read_text())
    assert manifest["report"]["held_out_loss_trained"] < manifest["report"]["held_out_loss_untrained"]
    spec = MODELS[folder.name]
    assert spec.kind == "causal-lm" and spec.identity_source() == folder
    assert (folder / ADAPTER_WEIGHTS).stat().st_size < 10 * 2 ** 20  # small enough for the repository
