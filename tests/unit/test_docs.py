"""The front door: a short README, and the docs site built with `mkdocs build --strict` (a broken
link between pages fails) whose benchmarks page lists every recorded results file, rendered in
headless Chromium."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_is_a_front_page_that_starts_with_the_two_commands():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    quick = text[text.index("## Quick start"):]
    assert quick.index("make demo") < quick.index("make test") < quick.index("\n## ", 5)
    for target in re.findall(r"\]\(((?:docs|benchmarks)/[^)#]*)\)", text):  # its links lead somewhere
        assert (REPO / target).exists(), target


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_the_site_builds_strict_with_a_page_per_results_file(site):
    results = sorted(p.stem for p in (REPO / "benchmarks" / "results").glob("*.md"))
    assert results and all((site / "results" / name / "index.html").exists() for name in results)
    page = (site / "benchmarks" / "index.html").read_text()
    assert page.count('href="../results/') >= len(results)  # the generated table links each file
    ralmspec = (REPO / "benchmarks" / "results" / "ralmspec.md").read_text().splitlines()
    claim = [ln for ln in ralmspec if re.fullmatch(r"[a-z][a-z_0-9]*=\S+( [a-z][a-z_0-9]*=\S+)*", ln.strip())][-1]
    assert claim.split()[0] in page  # the claim line is the file's own, read at build time


@pytest.mark.slow
def test_a_docs_page_renders_in_headless_chromium(site, chromium, tmp_path):
    from PIL import Image
    page = site / "methods" / "ralmspec" / "index.html"
    dom = subprocess.run([*chromium, "--dump-dom", page.as_uri()], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    assert "RaLMSpec" in dom and "Speculative RAG and SPS" in dom  # the page and the site's navigation
    shot = tmp_path / "shot.png"
    subprocess.run([*chromium, f"--screenshot={shot}", page.as_uri()], check=True, capture_output=True, timeout=120)
    pixels = list(Image.open(shot).convert("RGB").getdata())
    assert sum(1 for p in pixels if sum(p) < 200) > 3000  # text was drawn
    assert len(set(pixels[::97])) > 20  # a styled page (header colour, code blocks), not a blank or bare one
