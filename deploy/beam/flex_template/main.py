"""Dataflow Flex Template entry point: ``specrag answer`` with the template's parameters.

Dataflow passes each parameter as ``--name=value``. A template parameter holds one value, so the
repeatable flags come as comma-separated lists: ``settings`` (``top_k=10,max_new_tokens=64``,
each a ``--set``) and ``models`` (``generator=NAME,embedder=NAME``, each a ``--model``); switches
take ``true``/``false`` (``resume=true`` is ``--resume``, ``streaming=true`` Beam's ``--streaming``).
"""
import sys

from specrag.pipelines.cli import main

REPEATED = {"--settings": "--set", "--models": "--model"}
SWITCHES = {"--resume", "--overwrite", "--streaming"}


def answer_argv(argv: list[str]) -> list[str]:
    out = ["answer"]
    for arg in argv:
        name, sep, value = arg.partition("=")
        if sep and name in SWITCHES:
            if value.strip().lower() not in ("true", "false"):
                raise SystemExit(f"{name} takes true or false, not {value!r}")
            out += [name] if value.strip().lower() == "true" else []
        elif sep and name in REPEATED:
            out += [f"{REPEATED[name]}={item.strip()}" for item in value.split(",") if item.strip()]
        else:
            out.append(arg)
    if not any(a.startswith("--runner") for a in out):
        out.append("--runner=DataflowRunner")
    return out


if __name__ == "__main__":
    sys.exit(main(answer_argv(sys.argv[1:])))
