"""Example DAGs load cleanly and run end to end with dag.test(); `make demo`'s job prints what it wrote."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_etl_craft.example_dags import demo
from tests.conftest import EngineSetup

EXAMPLES = Path(demo.__file__).parent
pytestmark = pytest.mark.e2e


def test_every_example_dag_imports_without_errors() -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(EXAMPLES))
    assert not bag.import_errors
    assert "example_etl_craft_init" in bag.dag_ids


def test_demo_runs_the_example_dag_and_prints_the_engine_tables(tmp_path: Path) -> None:
    env = {**os.environ, "ETL_CRAFT_DEMO_DIR": str(tmp_path / "demo")}
    for key in ("AIRFLOW_HOME", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-m", "airflow_provider_etl_craft.example_dags.demo"],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "DAG example_etl_craft_init: success" in out
    for table in ("CFG_PIPELINES               1", "CFG_TASKS                   4", "SCHEMA_MIGRATIONS           2"):
        assert table in out
    assert "DAILY_SALES" in out and "BUILD_SALES_MART" in out
    assert (tmp_path / "demo" / "project" / "engine" / "etl-craft.db").is_file()


def load_dag(dags_folder: Path, source: Path):  # noqa: ANN201 - a DAG
    target = dags_folder / source.name
    shutil.copy(source, target)
    spec = importlib.util.spec_from_file_location(f"dags_{source.stem}", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def test_init_db_operator_prepares_the_engine_db_in_a_dag(engine: EngineSetup, airflow_db: Path, monkeypatch) -> None:
    shutil.copytree(EXAMPLES / "project" / "migrations", engine.config_path.parent / "migrations")
    conn = f'{{"conn_type": "etl_craft", "extra": {{"config_path": "{engine.config_path}"}}}}'
    monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_DEFAULT", conn)
    dag = load_dag(airflow_db / "dags", EXAMPLES / "example_etl_craft_init.py")
    run = dag.test()
    assert run.state == "success"
    hook = engine.hook()
    assert hook.get_records("SELECT PIPELINE_CODE FROM CFG_PIPELINES") == [("DAILY_SALES",)]
    assert hook.get_records("SELECT COUNT(*) FROM CFG_TASKS") == [(4,)]
    assert dag.test().state == "success"  # a second run: nothing pending, nothing changed
    assert hook.get_records("SELECT COUNT(*) FROM SCHEMA_MIGRATIONS") == [(2,)]
