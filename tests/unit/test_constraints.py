"""The pinned sets agree with each other and with pyproject's floors (the pip checks run in make check-constraints)."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("constraints_tool", ROOT / "tools" / "constraints.py")
assert _spec is not None and _spec.loader is not None
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def pins(path: Path) -> dict[str, str]:
    return tool.pin_map(path.read_text())


@pytest.mark.parametrize("python", tool.PYTHONS)
@pytest.mark.parametrize("line", sorted(tool.LINES))
def test_each_line_pins_its_release_on_top_of_its_managed_image(line: str, python: str) -> None:
    release, image = tool.LINES[line]
    pinned = pins(tool.line_path(line, python))
    assert pinned["apache-airflow"] == release
    if image:
        image_pins = pins(tool.image_path(image, python))
        changed = {n: (v, pinned.get(n)) for n, v in image_pins.items() if pinned.get(n) != v}
        assert not changed, f"line {line} moved packages its image pins: {changed}"


def test_the_makefile_and_ci_know_every_line() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert f"AIRFLOW_LINES := {' '.join(sorted(tool.LINES))}" in makefile
    ci = (ROOT / ".ci" / "run").read_text()
    newest = max(tool.LINES, key=Version)
    assert f"NEWEST := {newest}" in makefile
    assert f"for line in {' '.join(sorted(set(tool.LINES) - {newest}))}; do" in ci


@pytest.mark.parametrize("release", tool.IMAGE_RELEASES)
def test_every_declared_floor_admits_every_managed_image(release: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for python in tool.PYTHONS:
        image = pins(tool.image_path(release, python))
        for requirement in map(Requirement, project["dependencies"]):
            version = image.get(canonicalize_name(requirement.name))
            if version is not None:
                assert requirement.specifier.contains(version), f"{requirement} refuses {version} ({release})"
