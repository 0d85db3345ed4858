"""The README is a door and the docs hold together: the README stays short, every relative link
in it and in docs/ resolves, and no page, module or preset cites a file that is not in the
repository or an issue number."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
DEAD = re.compile(r"DESIGN\.md|published-systems\.md|\b[Ii]ssues? #?\d+|runtime/README\.md|measure/README\.md")


def test_the_readme_is_at_most_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_the_docs_pages_the_readme_promises_exist():
    for name in ("architecture", "planning", "schedules", "simulator", "runtime", "training", "variability",
                 "asynchronous", "layouts", "failures"):
        assert (ROOT / "docs" / f"{name}.md").is_file(), name


def test_every_relative_link_resolves():
    bad = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                bad.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not bad, "links to nothing:\n" + "\n".join(bad)


def test_nothing_cites_a_missing_file_or_an_issue_number():
    files = [*PAGES, *(ROOT / "octopipe").rglob("*.py"), *(ROOT / "solvers").rglob("*.py"),
             *(ROOT / "conf").rglob("*.yaml"), *(ROOT / "examples").rglob("*.py")]
    bad = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
           for i, line in enumerate(p.read_text().splitlines(), 1) if DEAD.search(line)]
    assert not bad, "dead references:\n" + "\n".join(bad)
