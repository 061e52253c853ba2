"""The documentation's references hold: every relative link in the project's Markdown files names a file that
exists, and every citation of a section (`README, "Soak"`, `docs/benchmarks.md, "Four GPUs"`) in the sources and docs
names a heading or a paragraph that the cited file has. Sections move (the benchmark record moved out of the README),
and a citation left behind points at nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")
CITATION = re.compile(r"\b(README|docs/[a-z0-9_]+\.md)(?:'s)?,? \"([^\"]+)\"")
# The project's own folders (not a git listing: CI's checkout need not be a repository), without installed packages.
FOLDERS = ("benchmarks", "deploy", "docs", "engine", "scripts", "tests", "web_demo", "wsserver")


def _files(*suffixes: str) -> list[Path]:
    found = [p for p in ROOT.iterdir() if p.is_file()]
    found += [p for folder in FOLDERS for p in (ROOT / folder).rglob("*") if p.is_file()]
    return [p for p in found if "node_modules" not in p.parts and (p.suffix in suffixes or p.name in suffixes)]


def test_relative_links_name_files_that_exist() -> None:
    broken = []
    for doc in _files(".md"):
        for target in LINK.findall(doc.read_text()):
            if not target.startswith(("http://", "https://", "mailto:")) and not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert broken == []


def _starts_a_section(text: str, section: str) -> bool:
    """A Markdown heading, a bold lead (`**Four GPUs**:`) or a paragraph that begins with the cited words."""
    return any(line.lstrip("#* ").startswith(section) for line in text.splitlines())


def test_section_citations_name_sections_that_exist() -> None:
    # The results folders are records of their day: the README they cite is the one of that day.
    sources = [p for p in _files(".py", ".md", ".yaml", "Dockerfile") if "results" not in p.relative_to(ROOT).parts[:2]]
    cited = 0
    missing = []
    for source in sources:
        for name, wrapped in CITATION.findall(source.read_text()):
            cited += 1
            section = re.sub(r"\s*\n\s*(?:#\s*)?", " ", wrapped)  # a citation wrapped over comment lines
            target = ROOT / ("README.md" if name == "README" else name)
            if not _starts_a_section(target.read_text(), section):
                missing.append(f"{source.relative_to(ROOT)}: {name}, {section!r}")
    assert cited > 10 and missing == []
