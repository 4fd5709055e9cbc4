"""The generated block of docs/benchmarks.md: ``python -m bench.report --page`` rewrites it between its markers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import report

RESULTS = Path(report.__file__).with_name("results.json")


def test_the_docs_page_holds_the_block_of_the_recorded_results(tmp_path: Path) -> None:
    """The committed page says exactly what ``bench/results.json`` holds: rewriting it changes nothing."""
    page = tmp_path / "benchmarks.md"
    shutil.copyfile(report.REPORT_PAGE, page)
    assert report.main(["--results", str(RESULTS), "--page", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == report.REPORT_PAGE.read_text(encoding="utf-8")


def test_only_the_text_between_the_markers_is_replaced(tmp_path: Path) -> None:
    results = json.loads(RESULTS.read_text(encoding="utf-8"))
    page = tmp_path / "page.md"
    page.write_text(
        f"# Before\n\n{report.REPORT_BEGIN}\nstale\n{report.REPORT_END}\n\nAfter.\n", encoding="utf-8"
    )
    report.rewrite_page(page, results)
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Before\n\n" + report.REPORT_BEGIN) and text.endswith(
        report.REPORT_END + "\n\nAfter.\n"
    )
    assert "stale" not in text and "| target | measured | verdict |" in text


def test_a_page_without_the_markers_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# No block here\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="has no"):
        report.rewrite_page(page, json.loads(RESULTS.read_text(encoding="utf-8")))
    assert page.read_text(encoding="utf-8") == "# No block here\n"
