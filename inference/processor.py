"""What the processor can do fast, and the dtype that follows.

bfloat16 halves the weights a CPU reads per token, but only CPUs with AMX or AVX512-BF16
multiply it natively; elsewhere PyTorch emulates it (measured here, an AVX2 EPYC: ~10x slower
than float32). So ``--dtype auto`` picks bfloat16 only on those CPUs, and an explicit
bfloat16 without them warns. int8 (dynamic quantisation of the linear layers) is the faster
choice without them, offered but not picked by auto: its answers are not float32's
(benchmarks/results/dtype.md measures both).
"""
from __future__ import annotations

import functools
import logging
import platform

log = logging.getLogger(__name__)

MODEL_DTYPES = ("float32", "bfloat16", "int8")  # int8: dynamic quantisation of the linear layers
DTYPES = ("auto", *MODEL_DTYPES)
NATIVE_BF16 = frozenset({"amx_bf16", "avx512_bf16"})
REPORTED_FLAGS = frozenset({"amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512f",
                            "avx_vnni", "avx2"})


@functools.lru_cache(maxsize=1)
def cpu_model_and_flags() -> tuple[str, frozenset[str]]:
    """(model name, ISA flags) of this machine's first processor (Linux /proc/cpuinfo)."""
    cpu, flags = platform.processor() or platform.machine(), frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n")[0].splitlines()
        info = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in first if ":" in line)}
        cpu, flags = info.get("model name", cpu), frozenset(info.get("flags", "").split())
    except OSError:
        pass
    return cpu, flags


def has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    return bool(NATIVE_BF16 & (cpu_model_and_flags()[1] if flags is None else flags))


def resolve_dtype(requested: str, backend: str = "local", flags: frozenset[str] | None = None) -> str:
    """The dtype a run uses for ``--dtype requested``: auto is bfloat16 where the CPU multiplies
    it natively, else float32 (and float32 on Triton, whose models set their own in config.pbtxt)."""
    if requested not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {requested!r}")
    if requested == "auto":
        return "bfloat16" if backend in ("local", "vllm") and has_native_bf16(flags) else "float32"
    if requested == "bfloat16" and backend in ("local", "vllm") and not has_native_bf16(flags):
        log.warning("--dtype bfloat16 on a CPU without AMX or AVX512-BF16 (%s): PyTorch emulates bfloat16 "
                    "matmuls there, several times slower than float32; --dtype auto picks float32",
                    cpu_model_and_flags()[0])
    return requested
