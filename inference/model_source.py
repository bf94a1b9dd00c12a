"""Where a user's model is and what kind it is, read from the model itself.

``--model ROLE=SPEC`` takes, besides a registered name, a local transformers folder, a GGUF
file, or a Hugging Face id already in the local hub cache. Nothing is downloaded at run time:
an id that is not cached is an error saying how to cache it. The kind (causal LM, encoder,
cross-encoder, masked LM) comes from the folder's ``config.json`` architectures or the GGUF
header's ``general.architecture``, so a model that cannot serve a role fails at start.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from specrag.registry import UnknownEntry

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# GGUF architectures transformers converts (transformers.integrations.ggml) that are decoder-only
_GGUF_SEQ2SEQ = {"t5", "umt5", "t5encoder"}


class ModelNotFound(UnknownEntry):
    """A --model SPEC that names no registered model, local model or cached hub model."""


def resolve_model(spec: str, known: list[str]) -> Path:
    """The local file or folder ``spec`` names (a path first, then a cached hub id)."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if HUB_ID.fullmatch(spec) and not spec.startswith((".", "/", "~")):
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
        try:
            return Path(snapshot_download(spec, local_files_only=True))
        except LocalEntryNotFoundError:
            raise ModelNotFound(f"model {spec!r} is not in the local Hugging Face cache and specrag never downloads "
                                "at run time: cache it first (`hf download " + spec + "`, with HF_HOME as at run "
                                "time) or pass its folder") from None
    raise ModelNotFound(f"unknown model {spec!r}: not a registered name ({', '.join(known)}), nor an existing "
                        "transformers folder or GGUF file, nor a Hugging Face id (ORG/NAME) in the local cache")


def gguf_architecture(path: Path) -> str:
    """``general.architecture`` from a GGUF file's header. Read by hand: the key comes first,
    while the gguf package's reader parses every field (a 150k-token vocabulary: seconds)."""
    import struct

    def take(fh, n: int) -> bytes:
        data = fh.read(n)
        if len(data) != n:
            raise ValueError("truncated header")
        return data

    def text(fh) -> str:
        return take(fh, struct.unpack("<Q", take(fh, 8))[0]).decode("utf-8", "replace")

    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType sizes

    def skip(fh, kind: int) -> None:
        if kind == 8:
            text(fh)
        elif kind == 9:
            item, count = struct.unpack("<IQ", take(fh, 12))
            for _ in range(count):
                skip(fh, item)
        else:
            take(fh, scalar[kind])
    try:
        with open(path, "rb") as fh:
            magic, _version, _tensors, count = struct.unpack("<4sIQQ", take(fh, 24))
            if magic != b"GGUF":
                raise ValueError("no GGUF magic")
            for _ in range(count):
                key, kind = text(fh), struct.unpack("<I", take(fh, 4))[0]
                if key == "general.architecture" and kind == 8:
                    return text(fh)
                skip(fh, kind)
    except (ValueError, KeyError, struct.error, OSError) as e:
        raise ValueError(f"{path} is not a readable GGUF model file ({e})") from None
    raise ValueError(f"{path} has no general.architecture in its GGUF header")


def kind_of(name: str, path: Path) -> tuple[str, str]:
    """(kind, what it is) of a GGUF file or transformers folder; a ValueError naming what it
    found where the model is of no kind specrag serves."""
    if path.is_file():
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                raise ValueError(f"model {name!r}: {path} is a file but not GGUF (pass a GGUF file or a "
                                 "transformers folder)")
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
        arch = gguf_architecture(path)
        convertible = {a.replace("_", "") for a in GGUF_CONFIG_MAPPING} - {"general", "tokenizer"}
        if arch.replace("_", "") not in convertible or arch in _GGUF_SEQ2SEQ:
            raise ValueError(f"model {name!r}: GGUF architecture {arch!r} is not a causal LM transformers can "
                             f"convert (it converts {', '.join(sorted(convertible - _GGUF_SEQ2SEQ))})")
        return "causal-lm", f"GGUF {arch}"
    config = path / "config.json"
    if not config.is_file():
        raise ValueError(f"model {name!r}: {path} has no config.json (not a transformers model folder)")
    meta = json.loads(config.read_text())
    arch = (meta.get("architectures") or [""])[0]
    if arch.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal-lm", arch
    if arch.endswith("ForSequenceClassification"):
        labels = meta.get("num_labels") or len(meta.get("id2label") or {0: ""})
        if labels != 1:
            raise ValueError(f"model {name!r}: {arch} with {labels} labels; a cross-encoder (reranker) gives one "
                             "score per (query, passage) pair")
        return "cross-encoder", arch
    if arch.endswith("ForMaskedLM"):
        return "masked-lm", arch
    if arch.endswith("Model") or (path / "modules.json").is_file():
        return "encoder", arch or "sentence-transformers encoder"
    raise ValueError(f"model {name!r}: architecture {arch or '(none)'!r} in {config} is none of the kinds "
                     "specrag serves (causal LM, encoder, cross-encoder, masked LM)")
