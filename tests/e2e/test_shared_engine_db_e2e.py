"""A pipeline DAG under dag.test() on an Engine DB that etl-craft made, adopted by ``migrate`` (docs/etl-craft-parity.md,
"Sharing an Engine DB"), on SQLite and PostgreSQL: every write passes etl-craft's guards, as the DAG run's actor."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_etl_craft.testing import run_dag_test
from harness.engines import EngineSetup
from tests.e2e.pipeline_dags import PIPELINE_DAG, load_dag, write_dag
from tests.e2e.test_pipeline_lifecycle import Pipeline, dag_id
from tests.fixtures.etl_craft_made import build, counts

pytestmark = pytest.mark.e2e


def test_a_pipeline_dag_runs_on_an_adopted_etl_craft_engine_db(
    engine: EngineSetup, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request
) -> None:
    build(engine)
    before = counts(engine)
    pipeline = Pipeline(engine, airflow_db, tmp_path, monkeypatch)  # migrate: adopts, then the PROJECT file
    dag = load_dag(write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "shared")))
    run = run_dag_test(dag)
    assert run.state == "success"
    key = f"airflow:{dag.dag_id}:{run.run_id}"
    [(run_id, started_by, kind, ended_by)] = pipeline.rows(
        "SELECT PIPELINE_RUN_ID, STARTED_BY, STARTED_BY_KIND, ENDED_BY FROM AUD_PIPELINES_RUN_LOG WHERE RUN_KEY = ?",
        (key,),
    )
    assert (started_by, kind, ended_by) == (key, "ORCHESTRATOR", key)
    assert {code: row[0] for code, row in pipeline.task_runs(run_id).items()} == {
        "PREPARE": "SUCCESS", "FLAKY": "SUCCESS", "LOAD": "SUCCESS", "ALERT": "SKIPPED",
    }  # fmt: skip
    requested = pipeline.rows(
        "SELECT DISTINCT a.REQUESTED_BY FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr "
        "ON tr.TASK_RUN_ID = a.TASK_RUN_ID WHERE tr.PIPELINE_RUN_ID = ?",
        (run_id,),
    )
    assert requested == [(key,)]
    after = counts(engine)
    # etl-craft's history is all still there; what was added is this run, the project's rows and their log.
    assert after["AUD_PIPELINES_RUN_LOG"] == before["AUD_PIPELINES_RUN_LOG"] + 1
    assert after["AUD_GATE_DECISIONS"] == before["AUD_GATE_DECISIONS"]
    assert after["AUD_DEPENDENCY_CONSUMPTION"] == before["AUD_DEPENDENCY_CONSUMPTION"]
    assert after["CFG_TASKS"] == before["CFG_TASKS"] + 4
    assert after["AUD_METADATA_CHANGES"] == before["AUD_METADATA_CHANGES"] + 5  # 1 pipeline + 4 tasks, logged
