"""The repository stands on its own: every document the README, the docs and the code cite is in
it. Relative links resolve to files; "MECHANISMS §N" and "DESIGN §N" name sections that exist
in docs/; every "paper 00N" is listed in docs/REFERENCES.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: Where citations live: the README, the docs, and every module (docstrings and --help texts).
SOURCES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")),
           *(path for folder in ("api", "common", "client", "server", "benchmarks", "examples")
             for path in sorted((ROOT / folder).rglob("*.py"))
             if "pb" not in path.relative_to(ROOT).parts and "out" not in path.relative_to(ROOT).parts)]


def headings(doc: Path) -> set[str]:
    """Section numbers of ``doc``: its headings ("## 1. ..." → "1", "### 1.9 ..." → "1.9") and the
    numbered items of a section's list ("18. ..." under "## 10." → "10.18")."""
    found, section = set(), None
    for line in doc.read_text().splitlines():
        if heading := re.match(r"#+ (\d+(?:\.\d+)*)\.? ", line):
            found.add(section := heading.group(1))
        elif section is not None and (item := re.match(r"(\d+)\. ", line)):
            found.add(f"{section.split('.')[0]}.{item.group(1)}")
    return found


def citations(pattern: str) -> list[tuple[str, str]]:
    """(file, captured group) for every match of ``pattern`` in SOURCES."""
    return [(str(path.relative_to(ROOT)), match)
            for path in SOURCES for match in re.findall(pattern, path.read_text())]


@pytest.mark.parametrize("doc, name", [("MECHANISMS.md", "MECHANISMS"), ("DESIGN.md", "DESIGN")])
def test_cited_sections_exist(doc, name):
    sections = headings(DOCS / doc)
    cited = citations(rf"{name}(?:\.md)? ?§ ?(\d+(?:\.\d+)*)")
    assert cited, f"no {name} citation found: the pattern is wrong"
    assert [(where, n) for where, n in cited if n not in sections] == []


def test_cited_papers_are_listed():
    listed = set(re.findall(r"^\| (\d{3}) \|", (DOCS / "REFERENCES.md").read_text(), flags=re.M))
    cited = citations(r"[Pp]apers? (\d{3})\b")
    assert cited and listed >= {"000", "001", "002", "003", "004"}
    assert [(where, n) for where, n in cited if n not in listed] == []


def test_relative_links_resolve():
    broken = []
    for path in [ROOT / "README.md", *DOCS.glob("*.md"), ROOT / "benchmarks" / "RESULTS.md"]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" not in target and not (path.parent / target).exists():
                broken.append((str(path.relative_to(ROOT)), target))
    assert broken == []


def test_the_checks_catch_a_bad_citation(tmp_path):
    """The patterns find what they must: a missing section and an unlisted paper."""
    sections = headings(DOCS / "MECHANISMS.md")
    assert {"1.9", "10.18"} <= sections and not {"99.1", "10.99"} & sections
    text = "see MECHANISMS §99.1 and paper 007"
    assert re.findall(r"MECHANISMS(?:\.md)? ?§ ?(\d+(?:\.\d+)*)", text) == ["99.1"]
    assert re.findall(r"[Pp]apers? (\d{3})\b", text) == ["007"]
