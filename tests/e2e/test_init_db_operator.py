"""EngineInitDbOperator under dag.test(): permanent Engine DB problems fail the task without retries."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from airflow_provider_etl_craft.testing import run_dag_test
from harness.engines import EngineSetup, engine_rows

pytestmark = pytest.mark.e2e

DAG_FILE = """
from datetime import datetime, timedelta
from airflow_provider_etl_craft._compat import DAG
from airflow_provider_etl_craft.operators.init_db import EngineInitDbOperator

with DAG("etl_craft_init_db_retries", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    EngineInitDbOperator(task_id="init_engine_db", etl_craft_conn_id="etl_craft_retry_test",
                         retries=3, retry_delay=timedelta(seconds=1))
"""


def load(dags_folder: Path):  # noqa: ANN201 - a DAG
    path = dags_folder / "etl_craft_init_db_retries.py"
    path.write_text(DAG_FILE)
    spec = importlib.util.spec_from_file_location("etl_craft_init_db_retries", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def task_tries(run) -> tuple[str, int]:  # noqa: ANN001 - a DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = run.get_task_instance("init_engine_db", session=session)
        return str(ti.state), ti.try_number


def test_a_partial_engine_schema_fails_the_task_once_without_retries(engine: EngineSetup, airflow_db: Path,
                                                                      monkeypatch) -> None:  # fmt: skip
    engine.hook().engine.connect(create=True).close()  # on SQLite: a file someone made by hand
    engine_rows(engine.hook(), "CREATE TABLE CFG_PIPELINES (PIPELINE_ID INTEGER)")
    conn = {"conn_type": "etl_craft", "extra": {"config_path": str(engine.config_path)}}
    monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_RETRY_TEST", json.dumps(conn))
    run = run_dag_test(load(airflow_db / "dags"))
    assert run.state == "failed"
    assert task_tries(run) == ("failed", 1)


def test_init_db_operator_succeeds_and_returns_what_it_did(
    engine: EngineSetup, airflow_db: Path, monkeypatch
) -> None:
    conn = {"conn_type": "etl_craft", "extra": {"config_path": str(engine.config_path)}}
    monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_RETRY_TEST", json.dumps(conn))
    run = run_dag_test(load(airflow_db / "dags"))
    assert run.state == "success"
    assert task_tries(run) == ("success", 1)
    assert engine_rows(engine.hook(), "SELECT SOURCE, VERSION FROM SCHEMA_MIGRATIONS ORDER BY VERSION") == [
        ("ENGINE", "0001_schema"),
        ("ENGINE", "0002_map_index.sql"),
        ("ENGINE", "0003_claim_finish_functions.sql"),
        ("ENGINE", "0004_cfg_semantics.sql"),
        ("ENGINE", "0005_purge.sql"),
        ("ENGINE", "0006_history_indexes.sql"),
        ("ENGINE", "0007_config_indexes.sql"),
    ]
