"""What the processor can do fast, and the dtype that follows.

bfloat16 halves the weights a CPU reads per token, but only CPUs with AMX or AVX512-BF16
multiply it natively; elsewhere PyTorch emulates it (measured here, an AVX2 EPYC: ~10x slower
than float32). So ``--dtype auto`` picks bfloat16 only on those CPUs, and an explicit
bfloat16 without them warns. int8 (dynamic quantisation of the linear layers) is the faster
choice without them, offered but not picked by auto: its answers are not float32's
(benchmarks/results/dtype.md measures both).

bfloat16-prefill is a dtype per phase: bfloat16 where the matrix products dominate (a causal
LM's prefill and scoring, every encoder) and float32 for the causal LM's decode steps, whose
attention over the KV cache ran faster in float32 on an AVX512-BF16 core at every batch size
(benchmarks/results/decode_dtype.md). It keeps a second, float32 copy of each causal LM's weights.
It is the local backend's own (a server runs one dtype), offered and not picked by auto.
"""
from __future__ import annotations

import functools
import logging
import platform

log = logging.getLogger(__name__)

# int8: dynamic quantisation of the linear layers; bfloat16-prefill: bfloat16, float32 decode steps
MODEL_DTYPES = ("float32", "bfloat16", "int8", "bfloat16-prefill")
DTYPES = ("auto", *MODEL_DTYPES)
LOCAL_ONLY_DTYPES = ("int8", "bfloat16-prefill")  # what only the local backend's own forwards can do
BF16_COMPUTE = ("bfloat16", "bfloat16-prefill")
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
    from specrag import registry
    takes_dtype = registry.BACKENDS[backend].takes_dtype
    if requested == "auto":
        return "bfloat16" if takes_dtype and has_native_bf16(flags) else "float32"
    if requested in BF16_COMPUTE and takes_dtype and not has_native_bf16(flags):
        log.warning("--dtype %s on a CPU without AMX or AVX512-BF16 (%s): PyTorch emulates bfloat16 "
                    "matmuls there, several times slower than float32; --dtype auto picks float32",
                    requested, cpu_model_and_flags()[0])
    return requested
