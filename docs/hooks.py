"""MkDocs hooks: the recorded benchmark results become pages of the site, read from
``benchmarks/results/*.md`` at build time, so a number in the docs is always a results file's own
(the docs link to it, never copy it). Links inside a results file that point at run folders,
plots or code (not pages of the site) become plain paths: ``--strict`` still fails on a broken
link between pages."""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MARKER = "<!-- results-table -->"
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
CLAIM = re.compile(r"^[a-z][a-z_0-9]*=\S+( [a-z][a-z_0-9]*=\S+)*$")


def _results() -> list[Path]:
    return sorted(RESULTS.glob("*.md"))


def _plain_links(text: str, pages: set[str]) -> str:
    def fix(m: re.Match) -> str:
        image, label, target = m.groups()
        if target.startswith(("http://", "https://", "#")) or target.split("#")[0] in pages:
            return m.group(0)
        return f"{label} (`benchmarks/results/{target}`)" if label else f"`benchmarks/results/{target}`"
    return LINK.sub(fix, text)


def on_files(files, config):
    pages = {p.name for p in _results()}
    for path in _results():
        files.append(File.generated(config, f"results/{path.name}",
                                    content=_plain_links(path.read_text(), pages)))
    return files


def summary(path: Path) -> tuple[str, str, str]:
    """(title, command, claim line) of one results file."""
    lines = path.read_text().splitlines()
    title = next((ln.lstrip("# ").strip() for ln in lines if ln.startswith("# ")), path.stem)
    command = next((ln for ln in lines if ln.lower().startswith(("command", "made by"))), "")
    found = re.search(r"`([^`]+)`", command)
    claims = [ln.strip() for ln in lines if CLAIM.match(ln.strip())]
    return title, found.group(1) if found else "", claims[-1] if claims else ""


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    rows = ["| results | reproduce with | claim line |", "|---|---|---|"]
    for path in _results():
        title, command, claim = summary(path)
        cell = lambda s: s.replace("|", "\\|")  # noqa: E731
        rows.append(f"| [{cell(title)}](results/{path.name}) | {f'`{cell(command)}`' if command else '(see the file)'}"
                    f" | {f'`{cell(claim)}`' if claim else '—'} |")
    return markdown.replace(MARKER, "\n".join(rows))
