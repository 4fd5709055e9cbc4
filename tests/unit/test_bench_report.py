"""The generated block of docs/benchmarks.md: ``python -m bench.report --page`` rewrites it between its markers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

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
    """Part 10's figures (a plain and a recorded task, the OpenLineage listener on and off) are a section of the
    report and one target: what the recorded task's lineage costs beyond the plain one's."""
    results = json.loads(RESULTS.read_text(encoding="utf-8"))
    keys = ("listener_ms", "facets_ms", "outside_ms", "try_ms", "process_ms")
    figures = {
        "plain": {"off": (0.1, 0.0, 0.0, 900.0, 2000.0), "on": (55.1, 0.0, 0.0, 950.0, 2100.0)},
        "recorded": {"off": (0.1, 0.0, 0.0, 910.0, 2010.0), "on": (60.1, 9.5, 2.0, 955.0, 2110.0)},
    }
    lineage: dict[str, Any] = {"repeats": 2, "facet_events": 6, "samples": {}}
    for kind, modes in figures.items():
        rows = {mode: dict(zip(keys, values, strict=True)) for mode, values in modes.items()}
        lineage[kind] = {**rows, "extra_ms": {key: rows["on"][key] - rows["off"][key] for key in keys}}
    results["lineage"] = lineage
    [target] = [t for t in report.targets(results) if t["target"].startswith("OpenLineage")]
    assert target["value"] == pytest.approx(62.0 - 55.0) and target["met"] is True  # (60.0 + 2.0) - 55.0
    assert "the provider's facets 9.5 ms" in target["measured"] and "plain 55.0 ms" in target["measured"]
    lineage["recorded"]["extra_ms"]["listener_ms"] = 110.0
    [target] = [t for t in report.targets(results) if t["target"].startswith("OpenLineage")]
    assert target["value"] == pytest.approx(57.0) and target["met"] is False
    lineage["recorded"]["extra_ms"]["listener_ms"] = 60.0
    text = report.render({**results, "targets": report.targets(results)})
    assert "10. OpenLineage: a plain and a recorded task with Airflow's listener off and on" in text
    assert "   recorded on - off              60.0           9.5           2.0" in text
    assert "the provider adds 7.0 ms per task" in text
