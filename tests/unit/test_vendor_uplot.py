"""The plugin UI's charting library is vendored reproducibly: the files in the package are the pinned uPlot
release's (``tools/vendor_uplot.py``), the page loads them from the plugin itself, and the plugin serves them."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from airflow_provider_etl_craft.plugins.api import UI_FILES

ROOT = Path(__file__).resolve().parents[2]
UI = ROOT / "airflow_provider_etl_craft" / "plugins" / "ui"
_spec = importlib.util.spec_from_file_location("vendor_uplot", ROOT / "tools" / "vendor_uplot.py")
assert _spec is not None and _spec.loader is not None
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def test_the_vendored_files_are_the_pinned_release() -> None:
    assert tool.VENDOR == UI / "vendor" / "uplot"
    assert tool.check() == []
    assert f"(v{tool.VERSION})" in (tool.VENDOR / "uPlot.iife.min.js").read_text()[:200]
    assert (tool.VENDOR / "LICENSE").read_text().startswith("The MIT License")


def test_a_changed_or_missing_file_is_reported(tmp_path: Path) -> None:
    copy = tmp_path / "uplot"
    shutil.copytree(tool.VENDOR, copy)
    assert tool.check(copy) == []
    (copy / "uPlot.min.css").write_text("/* changed */", encoding="utf-8")
    (copy / "LICENSE").unlink()
    problems = tool.check(copy)
    assert len(problems) == 2
    assert any("uPlot.min.css has SHA-256" in p for p in problems) and any(
        "LICENSE is missing" in p for p in problems
    )


def test_the_page_loads_the_library_from_the_plugin_and_the_plugin_serves_it() -> None:
    page = (UI / "index.html").read_text(encoding="utf-8")
    for name in tool.FILES:
        assert f"vendor/uplot/{name}" in UI_FILES
    assert '<script src="vendor/uplot/uPlot.iife.min.js" defer></script>' in page
    assert '<link rel="stylesheet" href="vendor/uplot/uPlot.min.css">' in page
    assert "http://" not in page and "https://" not in page  # nothing from a CDN: the UI works offline


def test_the_integrity_check_uses_npms_sha512_form() -> None:
    assert tool.sri(b"") == (
        "sha512-z4PhNX7vuL3xVChQ1m2AB9Yg5AULVxXcg/SpIdNs6c5H0NE8XYXysP+DGNKHfuwvY7kxvUdBeoGlODJ6+SfaPg=="
    )
