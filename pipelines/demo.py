"""`specrag demo`: the product on the project's own demo data (no ../shared needed).

Runs the bundled comparison suite (``demo_data/demo.yaml``) through `specrag compare`: the
demo questions answered by no retrieval, standard RAG, Speculative RAG, SPS, RaLMSeq and
RaLMSpec as Beam answer jobs, then the comparison table printed and the HTML report written.
"""
from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

DEMO_SUITE = "demo.yaml"


def demo_suite_path() -> Path:
    """The bundled demo suite (package data, so an installed specrag has it too)."""
    return Path(str(resources.files("specrag.pipelines") / "demo_data" / DEMO_SUITE))


def run_demo(workdir: Path, threads: int = 1, beam_args: tuple[str, ...] = ()) -> int:
    """The demo suite, afresh: the runs the code being shown makes, not an earlier checkout's."""
    from specrag.pipelines.compare import run_compare
    shutil.rmtree(workdir / "runs", ignore_errors=True)
    outcome = run_compare(demo_suite_path(), workdir, extra_flags=[f"--threads={threads}", *beam_args])
    print(Path(outcome.files["markdown"]).read_text())
    print(f"report: {outcome.files['html']} (open it in a browser; it works offline), "
          f"{outcome.files['markdown']} (Markdown)")
    print(f"runs: {workdir}/runs/<dataset>/<method>/results-*.parquet, dead_letters-*.parquet, manifest.json")
    return 1 if any(r.status == "failed" for r in outcome.records) else 0
