"""The wheel ships what the package reads at run time (schema files, example project, the plugin's page), its entry
points and py.typed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contains_schema_files_examples_and_entry_points(tmp_path: Path) -> None:
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("airflow_provider_etl_craft-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    for dialect in ("sqlite", "postgresql"):
        packaged = zf_text(wheel, f"airflow_provider_etl_craft/sql/{dialect}/schema.sql")
        assert packaged == (ROOT / "sql" / dialect / "schema.sql").read_text()
    assert "airflow_provider_etl_craft/example_dags/project/craft-connector.yml" in names
    assert "airflow_provider_etl_craft/example_dags/project/migrations/0001_example_pipeline.sql" in names
    assert "provider_info = airflow_provider_etl_craft.get_provider_info:get_provider_info" in entry_points
    assert "etl-craft-airflow = airflow_provider_etl_craft.cli.main:run" in entry_points
    assert "airflow_provider_etl_craft/py.typed" in names  # type checkers read the annotations (PEP 561)
    for name in ("index.html", "app.js", "app.css"):  # the plugin's page, served from the package
        assert f"airflow_provider_etl_craft/plugins/ui/{name}" in names
    assert "etl_craft = airflow_provider_etl_craft.plugins.plugin:EtlCraftPlugin" in entry_points
    # Only the package: the test and benchmark helpers (harness/, tests/, bench/) run from a checkout.
    assert {name.split("/")[0] for name in names if "/" in name} == {
        "airflow_provider_etl_craft",
        *(n.split("/")[0] for n in names if ".dist-info/" in n),
    }


def zf_text(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name).decode()
