"""The house's structure as a test: one folder per layer, imports only downward, no cycles, and
no import with side effects. Any import counts, at module level or inside a function."""
import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# top to bottom: a layer imports only layers below it (the package root ``specrag`` is the floor)
ORDER = ["pipelines", "importers", "training", "transforms", "methods", "retrieval", "inference", "evaluation",
         "schemas", "jobio", "specrag"]


def _modules() -> dict[str, Path]:
    out = {}
    for layer in ORDER:
        for path in sorted((REPO / layer).rglob("*.py")):
            parts = path.relative_to(REPO / layer).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out[".".join(["specrag", *([] if layer == "specrag" else [layer]), *parts])] = path
    return out


def _imports(modules: dict[str, Path]) -> dict[str, set[tuple[str, int]]]:
    """module → {(imported specrag module, line)}."""
    out = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specrag"):
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target in modules and target != name:
                    out[name].add((target, node.lineno))
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ORDER else "specrag"


def test_setup_installs_every_layer_and_only_those():
    import re
    declared = re.search(r"LAYERS = \[(.*?)\]", (REPO / "setup.py").read_text(), re.S).group(1)
    assert sorted(re.findall(r'"(\w+)"', declared)) == sorted(ORDER[:-1])


def test_no_layer_imports_a_layer_above_it():
    modules = _modules()
    upward = [f"{modules[m].relative_to(REPO)}:{line} imports {t}"
              for m, targets in _imports(modules).items() for t, line in sorted(targets)
              if ORDER.index(_layer(t)) < ORDER.index(_layer(m))]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycle_between_modules():
    modules = _modules()
    graph = {m: {t for t, _ in ts} for m, ts in _imports(modules).items()}
    index, low, stack, on, cycles = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))
    for m in sorted(modules):
        if m not in index:
            visit(m)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("module", ["specrag.jobio.files", "specrag.jobio.run_folder", "specrag.pipelines.cli"])
def test_importing_job_io_patches_nothing(module):
    """The S3 client set-up is shared before the first s3:// operation, never on import."""
    code = (f"import {module}, botocore.session; "
            "assert not hasattr(botocore.session.create_loader, 'cache_info'), 'patched on import'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_job_holds_its_output_folder_through_the_one_lifecycle_call():
    """One job lifecycle (jobio/job_run.py): no job drives RunFolder's transaction, its resume
    checks or the identity and inputs files itself, so the rules cannot drift apart per job."""
    lifecycle = {"writing", "check_resumable", "check_inputs", "IDENTITY_FILE", "INPUTS_FILE"}
    own = {REPO / "jobio" / "run_folder.py", REPO / "jobio" / "job_run.py"}
    found = []
    for name, path in _modules().items():
        if path in own:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            used = (node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name)
                    else None)
            if used in lifecycle:
                found.append(f"{name}:{node.lineno} {used}")
    assert not found, found
    callers = {name for name, path in _modules().items() if "job_run(" in path.read_text() and path not in own}
    assert {"specrag.pipelines.answer", "specrag.pipelines.streaming", "specrag.pipelines.extract_triplets",
            "specrag.pipelines.build_index", "specrag.pipelines.build_datastore",
            "specrag.pipelines.training_inputs"} <= callers
