#!/usr/bin/env python3
"""Write the GPU variant of model_repo/: same models and code, KIND_GPU instances per overrides.json.

    python deploy/triton/gpu/make_gpu_repo.py OUT_DIR [--overrides deploy/triton/gpu/overrides.json]

The CPU repository stays the single source of the models' inputs, outputs and code; this
rewrites only instance groups, dtype and batching limits (used by the GPU Dockerfile).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def gpu_config(text: str, o: dict) -> str:
    text = re.sub(r"instance_group \[.*?\]", f"instance_group [ {{ kind: {o['kind']} count: {o['count']} }} ]",
                  text, flags=re.S)
    text = re.sub(r'(key: "dtype" value: \{ string_value: )"[^"]*"', rf'\1"{o["dtype"]}"', text)
    text = re.sub(r"max_batch_size: \d+", f"max_batch_size: {o['max_batch_size']}", text)
    return re.sub(r"max_queue_delay_microseconds: \d+", f"max_queue_delay_microseconds: {o['max_queue_delay_microseconds']}",
                  text)


def make_gpu_repo(out: Path, overrides: dict, source: Path = ROOT / "model_repo") -> list[str]:
    written = []
    for config in sorted(source.glob("*/config.pbtxt")):
        name = config.parent.name
        if name not in overrides:
            raise SystemExit(f"{name}: no GPU settings in overrides.json")
        shutil.copytree(config.parent, out / name, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        (out / name / "config.pbtxt").write_text(gpu_config(config.read_text(), overrides[name]))
        written.append(name)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--overrides", type=Path, default=Path(__file__).with_name("overrides.json"))
    args = ap.parse_args()
    overrides = {k: v for k, v in json.loads(args.overrides.read_text()).items() if not k.startswith("_")}
    print("GPU model repository:", ", ".join(make_gpu_repo(args.out, overrides)), "->", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
