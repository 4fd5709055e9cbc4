"""Every design reference in the code resolves: ``docs/<page>.md`` exists, and a section it names is a heading there.

Code, tests, the bench and the packaged SQL cite the design as ``docs/<page>.md`` (docs/index.md), optionally with a
section, written ``docs/<page>.md, *Section*`` or ``docs/<page>.md, "Section"``; a renamed page or heading fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CITING = ["airflow_provider_etl_craft", "tests", "bench", "harness", "tools", "sql"]
REFERENCE = re.compile(r"docs/([a-z0-9_-]+\.md)(?:#([a-z0-9_-]+))?(?:,? (?:\*([^*\n]+)\*|\"([^\"\n]+)\"))?")


def headings(page: Path) -> set[str]:
    """The page's headings as written (without the ``#`` marks, code fences skipped)."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {h.strip().strip("`") for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def references() -> list[tuple[str, str, str | None]]:
    """``(where, page, section)`` of every reference in the citing folders."""
    found = []
    for folder in CITING:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in {".py", ".sql", ".md", ".yml", ".html", ".js"} or "vendor" in path.parts:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for page, anchor, italic, quoted in REFERENCE.findall(line):
                    where = f"{path.relative_to(ROOT)}:{number}"
                    found.append((where, page, italic or quoted or None))
                    if anchor:
                        found.append((where, page, "#" + anchor))
    return found


def test_the_code_cites_design_pages() -> None:
    assert len(references()) > 100


@pytest.mark.parametrize("where", ["page", "section"])
def test_every_reference_resolves(where: str) -> None:
    missing = []
    for place, page, section in references():
        path = ROOT / "docs" / page
        if where == "page" and not path.is_file():
            missing.append(f"{place}: docs/{page} does not exist")
        elif where == "section" and section and path.is_file():
            names = headings(path)
            slugs = {re.sub(r"[^\w\- ]", "", n.lower().replace("`", "")).replace(" ", "-") for n in names}
            wanted = section.lstrip("#")
            if not any(n == wanted or n.startswith(wanted) for n in names) and wanted not in slugs:
                missing.append(f"{place}: docs/{page} has no section {section!r}")
    assert not missing, "\n".join(missing)
