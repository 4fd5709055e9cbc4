"""Example DAGs load cleanly and run end to end with dag.test(); `make demo`'s job prints what it wrote."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_provider_etl_craft.example_dags import demo
from airflow_provider_etl_craft.testing import check_dag_against_engine, run_dag_test
from harness.engines import EngineSetup, engine_rows
from tests.fixtures.fix_airflow import dag_bag_class

EXAMPLES = Path(demo.__file__).parent
pytestmark = pytest.mark.e2e


@pytest.mark.smoke
def test_every_example_dag_imports_without_errors() -> None:
    bag = dag_bag_class()(dag_folder=str(EXAMPLES))
    assert not bag.import_errors
    assert "example_etl_craft_init" in bag.dag_ids


@pytest.mark.smoke
def test_demo_runs_the_example_pipeline_and_prints_the_aud_rows_it_wrote(tmp_path: Path) -> None:
    env = {**os.environ, "ETL_CRAFT_DEMO_DIR": str(tmp_path / "demo")}
    for key in ("AIRFLOW_HOME", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-m", "airflow_provider_etl_craft.example_dags.demo"],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "DAG example_etl_craft_init: success" in out
    assert "DAG example_etl_craft_daily_sales: success" in out
    runs = section(out, "AUD_PIPELINES_RUN_LOG")
    assert len(runs) == 1 and " SUCCESS " in runs[0] and "airflow:example_etl_craft_daily_sales:" in runs[0]
    tasks = {line.split()[2]: line.split()[3] for line in section(out, "AUD_TASK_RUN_LOG")}
    assert tasks == {"EXTRACT_ORDERS": "SUCCESS", "LOAD_ORDERS": "SUCCESS", "BUILD_SALES_MART": "SUCCESS",
                     "NOTIFY_FAILURE": "SKIPPED"}  # fmt: skip
    attempts = [line.split() for line in section(out, "AUD_TASK_ATTEMPTS")]
    assert sorted((a[2], a[3], a[4]) for a in attempts) == [
        ("BUILD_SALES_MART", "1", "SUCCESS"),
        ("EXTRACT_ORDERS", "1", "SUCCESS"),
        ("LOAD_ORDERS", "1", "SUCCESS"),
    ]
    decisions = [line.split()[3:5] for line in section(out, "AUD_GATE_DECISIONS")]
    assert decisions == [
        ["LOAD_ORDERS", "SATISFIED"],
        ["BUILD_SALES_MART", "SATISFIED"],
    ]  # its CFG_TASK_DEPENDENCY
    assert (tmp_path / "demo" / "project" / "warehouse" / "warehouse.db").is_file()


def section(out: str, title: str) -> list[str]:
    """The data lines of one printed table (after its title, header and rule; up to the blank line)."""
    lines = out.splitlines()
    start = lines.index(title) + 3
    end = next(i for i in range(start, len(lines) + 1) if i == len(lines) or not lines[i].strip())
    return lines[start:end]


def load_dag(dags_folder: Path, source: Path):  # noqa: ANN201 - a DAG
    target = dags_folder / source.name
    shutil.copy(source, target)
    spec = importlib.util.spec_from_file_location(f"dags_{source.stem}", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


@pytest.mark.smoke
def test_init_db_operator_prepares_the_engine_db_in_a_dag(
    engine: EngineSetup, airflow_db: Path, monkeypatch
) -> None:
    shutil.copytree(EXAMPLES / "project" / "migrations", engine.config_path.parent / "migrations")
    conn = f'{{"conn_type": "etl_craft", "extra": {{"config_path": "{engine.config_path}"}}}}'
    monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_DEFAULT", conn)
    dag = load_dag(airflow_db / "dags", EXAMPLES / "example_etl_craft_init.py")
    run = run_dag_test(dag)
    assert run.state == "success"
    hook = engine.hook()
    assert engine_rows(hook, "SELECT PIPELINE_CODE FROM CFG_PIPELINES") == [("DAILY_SALES",)]
    assert engine_rows(hook, "SELECT COUNT(*) FROM CFG_TASKS") == [(4,)]
    assert run_dag_test(dag).state == "success"  # a second run: nothing pending, nothing changed
    ledger = engine_rows(hook, "SELECT SOURCE, VERSION FROM SCHEMA_MIGRATIONS ORDER BY SOURCE, VERSION")
    assert [tuple(r) for r in ledger] == [
        ("ENGINE", "0001_schema"),
        ("ENGINE", "0002_map_index.sql"),
        ("ENGINE", "0003_claim_finish_functions.sql"),
        ("ENGINE", "0004_cfg_semantics.sql"),
        ("ENGINE", "0005_purge.sql"),
        ("ENGINE", "0006_history_indexes.sql"),
        ("ENGINE", "0007_config_indexes.sql"),
        ("PROJECT", "0001_example_pipeline.sql"),
        ("PROJECT", "0002_notify_failure_dependencies.sql"),
    ]


@pytest.mark.smoke
def test_the_example_pipeline_runs_end_to_end_on_each_engine(engine: EngineSetup, airflow_db: Path, tmp_path: Path,
                                                             monkeypatch) -> None:  # fmt: skip
    shutil.copytree(EXAMPLES / "project" / "migrations", engine.config_path.parent / "migrations")
    engine.hook().migrate()
    conn = {"conn_type": "etl_craft", "extra": {"config_path": str(engine.config_path)}}
    monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_DEFAULT", json.dumps(conn))
    warehouse = tmp_path / "warehouse.db"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ETL_CRAFT_WAREHOUSE", json.dumps({"conn_type": "sqlite", "host": str(warehouse)})
    )
    dag = load_dag(airflow_db / "dags", EXAMPLES / "example_etl_craft_daily_sales.py")
    assert check_dag_against_engine(dag) == []  # the DAG draws the edges its CFG_ rows declare
    run = run_dag_test(dag)
    assert run.state == "success"
    hook = engine.hook()
    assert engine_rows(hook, "SELECT STATUS FROM AUD_PIPELINES_RUN_LOG") == [("SUCCESS",)]
    rows = dict(engine_rows(hook,
        "SELECT t.TASK_CODE, tr.ROWS_WRITTEN FROM AUD_TASK_RUN_LOG tr JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID"))  # fmt: skip
    with sqlite3.connect(warehouse) as db:
        (orders,) = db.execute("SELECT COUNT(*) FROM orders").fetchone()
        (mart,) = db.execute("SELECT COUNT(*) FROM sales_mart").fetchone()
    assert rows == {
        "EXTRACT_ORDERS": orders,
        "LOAD_ORDERS": orders,
        "BUILD_SALES_MART": mart,
        "NOTIFY_FAILURE": None,
    }
    assert orders > 0 and mart == 3


def test_the_purge_example_deletes_old_history_in_a_dag(
    engine: EngineSetup, airflow_db: Path, monkeypatch
) -> None:
    shutil.copytree(EXAMPLES / "project" / "migrations", engine.config_path.parent / "migrations")
    hook = engine.hook()
    hook.migrate()
    old = hook.engine.to_db_time(hook.engine.now() - timedelta(days=200))
    for key in ("old:1", "old:2"):  # two finished runs 200 days old: the newer one is the pipeline's latest
        engine_rows(
            hook,
            "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, START_DATE, END_DATE, STATUS, RUN_KEY) SELECT PIPELINE_ID, "
            "?, ?, 'SUCCESS', ? FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'DAILY_SALES'",
            (old, old, key),
        )
    conn = {"conn_type": "etl_craft", "extra": {"config_path": str(engine.config_path)}}
    monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_DEFAULT", json.dumps(conn))
    run = run_dag_test(load_dag(airflow_db / "dags", EXAMPLES / "example_etl_craft_purge.py"))
    assert run.state == "success"
    assert engine_rows(hook, "SELECT RUN_KEY FROM AUD_PIPELINES_RUN_LOG") == [("old:2",)]
    assert engine_rows(
        hook, "SELECT STATUS, REQUESTED_BY, REQUESTED_BY_KIND, RUNS_DELETED FROM AUD_ENGINE_PURGES"
    ) == [("DONE", "airflow:example_etl_craft_purge.purge_engine_history", "SCHEDULE", 1)]
