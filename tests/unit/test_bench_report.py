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


def test_part_10_shows_the_listener_cost_and_its_target() -> None:
    """Part 10's figures (the OpenLineage listener on and off) are a section of the report and one target."""
    results = json.loads(RESULTS.read_text(encoding="utf-8"))
    figures = {"off": (0.1, 0.0, 900.0, 2000.0), "on": (60.1, 9.5, 950.0, 2100.0)}
    rows = {mode: dict(zip(("listener_ms", "facets_ms", "try_ms", "process_ms"), values, strict=True))
            for mode, values in figures.items()}  # fmt: skip
    extra = {key: rows["on"][key] - rows["off"][key] for key in rows["on"]}
    results["lineage"] = {"repeats": 2, **rows, "extra_ms": extra, "facet_events": 6, "samples": {}}
    [target] = [t for t in report.targets(results) if t["target"].startswith("OpenLineage")]
    assert target["value"] == pytest.approx(60.0) and target["met"] is False
    assert "the provider's facets 9.5 ms" in target["measured"]
    text = report.render({**results, "targets": report.targets(results)})
    assert "10. OpenLineage: a recorded task with Airflow's listener off and on" in text
    assert "   on - off              60.0           9.5" in text
