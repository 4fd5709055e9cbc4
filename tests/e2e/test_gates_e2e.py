"""Dependencies, run conditions and pauses under real Airflow: dag.test() on SQLite and PostgreSQL (docs/gates.md)."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.cli.main import main as cli_main
from airflow_provider_etl_craft.runs import RunIdentity, TaskCounts
from airflow_provider_etl_craft.testing import run_dag_test
from harness.engines import EngineSetup, engine_rows
from tests.e2e import pipeline_dags
from tests.e2e.pipeline_dags import load_dag, write_dag
from tests.e2e.test_pipeline_lifecycle import wait_for

pytestmark = pytest.mark.e2e

MIGRATION = """
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) VALUES ('COND_E2E', 'c', 'FULL', 't');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) VALUES ('UP_E2E', 'u', 'FULL', 't');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) VALUES ('DOWN_E2E', 'd', 'FULL', 't');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) VALUES ('TWAIT_E2E', 'w', 'FULL', 't');
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, RUN_CONDITION, RUN_CONDITION_COUNT, CREATED_BY)
SELECT v.code, 'ETL', p.PIPELINE_ID, 'PYTHON', v.cond, v.n, 't' FROM CFG_PIPELINES p JOIN (
    SELECT 'COND_E2E' AS pipe, 'A' AS code, CAST(NULL AS TEXT) AS cond, CAST(NULL AS INTEGER) AS n
    UNION ALL SELECT 'COND_E2E', 'B', NULL, NULL
    UNION ALL SELECT 'COND_E2E', 'C', NULL, NULL
    UNION ALL SELECT 'COND_E2E', 'ANY_T', 'ANY', NULL
    UNION ALL SELECT 'COND_E2E', 'TWO_T', 'N', 2
    UNION ALL SELECT 'COND_E2E', 'THREE_T', 'N', 3
    UNION ALL SELECT 'COND_E2E', 'DATA_A', NULL, NULL
    UNION ALL SELECT 'COND_E2E', 'DATA_C', NULL, NULL
    UNION ALL SELECT 'COND_E2E', 'ON_FAIL', NULL, NULL
    UNION ALL SELECT 'COND_E2E', 'NEVER', NULL, NULL
    UNION ALL SELECT 'COND_E2E', 'AFTER_NEVER', NULL, NULL
    UNION ALL SELECT 'UP_E2E', 'U1', NULL, NULL
    UNION ALL SELECT 'DOWN_E2E', 'D1', NULL, NULL
    UNION ALL SELECT 'TWAIT_E2E', 'W1', NULL, NULL
) v ON v.pipe = p.PIPELINE_CODE;
INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_PIPELINE_ID, DEPENDS_ON_TASK_ID, DEPENDENCY_TYPE,
                                 CREATED_BY)
SELECT t.PIPELINE_ID, t.TASK_ID, u.PIPELINE_ID, u.TASK_ID, v.kind, 't'
FROM (
    SELECT 'ANY_T' AS task, 'COND_E2E' AS up_pipe, 'A' AS up, 'SUCCESS' AS kind
    UNION ALL SELECT 'ANY_T', 'COND_E2E', 'B', 'SUCCESS'
    UNION ALL SELECT 'TWO_T', 'COND_E2E', 'A', 'SUCCESS'
    UNION ALL SELECT 'TWO_T', 'COND_E2E', 'B', 'SUCCESS'
    UNION ALL SELECT 'TWO_T', 'COND_E2E', 'C', 'SUCCESS'
    UNION ALL SELECT 'THREE_T', 'COND_E2E', 'A', 'SUCCESS'
    UNION ALL SELECT 'THREE_T', 'COND_E2E', 'B', 'SUCCESS'
    UNION ALL SELECT 'THREE_T', 'COND_E2E', 'C', 'SUCCESS'
    UNION ALL SELECT 'DATA_A', 'COND_E2E', 'A', 'HAS_DATA'
    UNION ALL SELECT 'DATA_C', 'COND_E2E', 'C', 'HAS_DATA'
    UNION ALL SELECT 'ON_FAIL', 'COND_E2E', 'B', 'FAILURE'
    UNION ALL SELECT 'AFTER_NEVER', 'COND_E2E', 'NEVER', 'ALWAYS'
    UNION ALL SELECT 'W1', 'UP_E2E', 'U1', 'SUCCESS'
) v
JOIN CFG_TASKS t ON t.TASK_CODE = v.task
JOIN CFG_PIPELINES up ON up.PIPELINE_CODE = v.up_pipe
JOIN CFG_TASKS u ON u.PIPELINE_ID = up.PIPELINE_ID AND u.TASK_CODE = v.up;
INSERT INTO CFG_PIPELINE_DEPENDENCY (PIPELINE_ID, DEPENDS_ON_PIPELINE_ID, DEPENDENCY_TYPE, CREATED_BY)
SELECT d.PIPELINE_ID, u.PIPELINE_ID, 'SUCCESS', 't' FROM CFG_PIPELINES d, CFG_PIPELINES u
WHERE d.PIPELINE_CODE = 'DOWN_E2E' AND u.PIPELINE_CODE = 'UP_E2E';
"""

_HEADER = """
from datetime import datetime, timedelta

from airflow_provider_etl_craft._compat import DAG

from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline

FAST = {"retries": 0, "retry_delay": timedelta(seconds=1)}
GATE = {"trigger_rule": "all_done", "etl_craft_gate_poke_interval": 1, "etl_craft_gate_timeout": __GATE_TIMEOUT__}
"""

# A with rows, B failing, C without rows; gated tasks decide with ANY, N=2, N=3, HAS_DATA and FAILURE.
CONDITIONS_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=FAST) as dag:
    with etl_craft_pipeline("COND_E2E", claim_kwargs={"poke_interval": 1, "timeout": 60}):
        @etl_craft_task
        def a():
            return {"insert_count": 4}

        @etl_craft_task
        def b():
            raise RuntimeError("b broke")

        @etl_craft_task
        def c():
            return {"insert_count": 0}

        @etl_craft_task(**GATE)
        def any_t():
            return 1

        @etl_craft_task(**GATE)
        def two_t():
            return 1

        @etl_craft_task(**GATE)
        def three_t():
            return 1

        @etl_craft_task(**GATE)
        def data_a():
            return 1

        @etl_craft_task(**GATE)
        def data_c():
            return 1

        @etl_craft_task(**GATE)
        def on_fail():
            return 1

        # NEVER is skipped by Airflow (nothing failed upstream of it), so it records no row: AFTER_NEVER's
        # ALWAYS edge reads Airflow's state of it (skipped) and runs.
        @etl_craft_task(trigger_rule="one_failed")
        def never():
            return 1

        @etl_craft_task(**GATE)
        def after_never():
            return 1

        ups = [a(), b(), c()]
        for gated in (any_t(), two_t(), three_t(), data_a(), data_c(), on_fail()):
            ups >> gated
        ups[0] >> never() >> after_never()
"""
)

DOWN_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=FAST) as dag:
    with etl_craft_pipeline("DOWN_E2E", claim_kwargs={"poke_interval": 1, "timeout": __CLAIM_TIMEOUT__}):
        @etl_craft_task
        def d1():
            return 2

        d1()
"""
)

TASK_WAIT_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=FAST) as dag:
    with etl_craft_pipeline("TWAIT_E2E", claim_kwargs={"poke_interval": 1, "timeout": 60}):
        # A root of the pipeline follows the claim (a setup task), so it keeps trigger_rule all_success.
        @etl_craft_task(etl_craft_gate_poke_interval=1, etl_craft_gate_timeout=__GATE_TIMEOUT__)
        def w1():
            return 3

        w1()
"""
)


class Gates:
    def __init__(self, engine: EngineSetup, airflow_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.engine = engine
        self.dags = airflow_db / "dags"
        self.airflow_db = airflow_db / "airflow.db"
        migrations = engine.config_path.parent / "migrations"
        migrations.mkdir(exist_ok=True)
        (migrations / "0001_gates.sql").write_text(MIGRATION)
        engine.hook().migrate()
        conn = {"conn_type": "etl_craft", "extra": {"config_path": str(engine.config_path)}}
        self.env = {"AIRFLOW_CONN_ETL_CRAFT_DEFAULT": json.dumps(conn)}
        monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_DEFAULT", self.env["AIRFLOW_CONN_ETL_CRAFT_DEFAULT"])

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return engine_rows(self.engine.hook(), sql, params)

    def runs(self, pipeline: str) -> list[tuple[Any, ...]]:
        return self.rows("SELECT r.PIPELINE_RUN_ID, r.STATUS, r.ENDED_BY FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p "
                         "ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ? ORDER BY 1", pipeline)  # fmt: skip

    def task_runs(self, run_id: int) -> dict[str, str]:
        return dict(self.rows("SELECT t.TASK_CODE, tr.STATUS FROM AUD_TASK_RUN_LOG tr JOIN CFG_TASKS t "
                              "ON t.TASK_ID = tr.TASK_ID WHERE tr.PIPELINE_RUN_ID = ?", run_id))  # fmt: skip

    def ti_states(self, dag_id: str) -> dict[str, str]:
        with sqlite3.connect(self.airflow_db, timeout=30) as db:
            return dict(
                db.execute("SELECT task_id, state FROM task_instance WHERE dag_id = ?", (dag_id,)).fetchall()
            )

    def rescheduled(self, dag_id: str, task_id: str) -> int:
        with sqlite3.connect(self.airflow_db, timeout=30) as db:
            return db.execute(
                "SELECT COUNT(*) FROM task_reschedule r JOIN task_instance ti ON ti.id = r.ti_id "
                "WHERE ti.dag_id = ? AND ti.task_id = ?", (dag_id, task_id)).fetchone()[0]  # fmt: skip

    def start_upstream(self) -> tuple[RunIdentity, int]:
        """An UP_E2E run IN-PROGRESS that etl-craft itself drives (not an Airflow key)."""
        who = RunIdentity(dag_id="etl_craft_cli", run_id="manual_1", run_date=None, backfill=False)
        with self.engine.hook().lifecycle() as lc:
            return who, lc.claim("UP_E2E", who).pipeline_run_id

    def finish_upstream(self, who: RunIdentity) -> None:
        with self.engine.hook().lifecycle() as lc:
            lc.finish_task(lc.start_task("UP_E2E", "U1", who, 1), "SUCCESS", TaskCounts(rows_written=7))
            assert lc.finish_run("UP_E2E", who, {"U1": "success"}).status == "SUCCESS"


@pytest.fixture
def gates(engine: EngineSetup, airflow_db: Path, monkeypatch: pytest.MonkeyPatch) -> Gates:
    return Gates(engine, airflow_db, monkeypatch)


def _dag_path(gates: Gates, request: pytest.FixtureRequest, template: str, name: str, gate_timeout: float = 60,
              claim_timeout: float = 60) -> Path:  # fmt: skip
    dag_id = f"e2e_gate_{name}_{request.node.callspec.id}"
    path = write_dag(gates.dags, template.replace("__GATE_TIMEOUT__", str(gate_timeout)), dag_id,
                     claim_timeout=claim_timeout)  # fmt: skip
    return path


@pytest.mark.smoke
def test_any_n_has_data_and_failure_conditions_inside_one_pipeline_dag(gates: Gates, request) -> None:
    dag = load_dag(_dag_path(gates, request, CONDITIONS_DAG, "conditions"))
    run = run_dag_test(dag)
    assert run.state == "failed"  # b failed, so the pipeline run is FAILED and the finish task says so
    [(run_id, status, _)] = gates.runs("COND_E2E")
    assert status == "FAILED"
    assert gates.task_runs(run_id) == {
        "A": "SUCCESS", "B": "FAILED", "C": "SUCCESS",
        "ANY_T": "SUCCESS",     # ANY of A, B: A succeeded
        "TWO_T": "SUCCESS",     # N=2 of A, B, C: A and C succeeded
        "THREE_T": "SKIPPED",   # N=3: only two succeeded
        "DATA_A": "SUCCESS",    # HAS_DATA on A: 4 rows
        "DATA_C": "SKIPPED",    # HAS_DATA on C: 0 rows
        "ON_FAIL": "SUCCESS",   # FAILURE on B: B failed
        "NEVER": "SKIPPED",     # skipped by Airflow, recorded by the finish
        "AFTER_NEVER": "SUCCESS",  # ALWAYS on NEVER, read from Airflow before NEVER had a row
    }  # fmt: skip
    states = gates.ti_states(dag.dag_id)
    prefix = "cond_e2e."
    assert {t: states[prefix + t] for t in ("any_t", "two_t", "three_t", "data_a", "data_c", "on_fail")} == {
        "any_t": "success", "two_t": "success", "three_t": "skipped", "data_a": "success", "data_c": "skipped",
        "on_fail": "success"}  # fmt: skip
    decisions = gates.rows("SELECT t.TASK_CODE, g.RESULT, g.REASON FROM AUD_GATE_DECISIONS g JOIN AUD_TASK_ATTEMPTS a "
                           "ON a.ATTEMPT_ID = g.ATTEMPT_ID JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "
                           "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID WHERE g.PIPELINE_RUN_ID = ?", run_id)  # fmt: skip
    assert len(decisions) == 2 + 3 + 3 + 1 + 1 + 1 + 1
    assert [d for d in decisions if d[0] == "AFTER_NEVER"][0][2].endswith(
        "(not recorded; Airflow state skipped)"
    )
    assert ("DATA_C", "UNSATISFIED") in {d[:2] for d in decisions}
    skipped_log = gates.rows("SELECT tr.TASK_LOG FROM AUD_TASK_RUN_LOG tr JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
                             "WHERE t.TASK_CODE = 'THREE_T'")[0][0]  # fmt: skip
    assert "N=3: 2 of 3 dependencies satisfied, 3 needed" in skipped_log


def _start_dag(gates: Gates, path: Path, day: int) -> subprocess.Popen:
    env = {**os.environ, **gates.engine.env, **gates.env}
    return subprocess.Popen([sys.executable, pipeline_dags.__file__, str(path), f"2026-05-0{day}T00:00:00+00:00"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def test_a_claim_waits_for_an_in_progress_upstream_without_a_worker_slot_then_runs(
    gates: Gates, request
) -> None:
    who, up_run = gates.start_upstream()
    path = _dag_path(gates, request, DOWN_DAG, "claim_wait")
    proc = _start_dag(gates, path, 1)
    try:
        wait_for(lambda: gates.rescheduled(path.stem, "down_e2e.claim") >= 1, "the claim to be rescheduled")
        assert gates.runs("DOWN_E2E") == []  # nothing written while waiting
        gates.finish_upstream(who)
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert "STATE=success" in out, out[-3000:]
    [(down_run, status, _)] = gates.runs("DOWN_E2E")
    assert status == "SUCCESS"
    assert gates.rows("SELECT CONSUMED_PIPELINE_RUN_ID, CONSUMED_REVISION FROM AUD_DEPENDENCY_CONSUMPTION WHERE "
                      "PIPELINE_RUN_ID = ?", down_run) == [(up_run, 1)]  # fmt: skip


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_a_claim_that_waits_too_long_for_an_upstream_fails_naming_it(gates: Gates, request, capfd,
                                                                     caplog) -> None:  # fmt: skip
    _, up_run = gates.start_upstream()
    dag = load_dag(_dag_path(gates, request, DOWN_DAG, "claim_timeout", claim_timeout=3))
    run = run_dag_test(dag)
    assert run.state == "failed"
    assert gates.ti_states(dag.dag_id)["down_e2e.claim"] == "failed"
    assert gates.runs("DOWN_E2E") == []
    logged = capfd.readouterr()
    text = logged.out + logged.err + caplog.text
    assert (
        f"SUCCESS on UP_E2E waiting for run {up_run} of UP_E2E (airflow:etl_craft_cli:manual_1, IN-PROGRESS)"
        in text
    )
    assert "still IN-PROGRESS after 3s" in text


@pytest.mark.smoke
def test_a_task_gate_waits_for_an_in_progress_upstream_by_rescheduling_then_runs(
    gates: Gates, request
) -> None:
    who, up_run = gates.start_upstream()
    path = _dag_path(gates, request, TASK_WAIT_DAG, "task_wait")
    proc = _start_dag(gates, path, 2)
    try:
        wait_for(lambda: gates.rescheduled(path.stem, "twait_e2e.w1") >= 1, "the task to be rescheduled")
        [(run_id, _, _)] = gates.runs("TWAIT_E2E")
        assert gates.task_runs(run_id) == {}  # no task run, no attempt while waiting
        gates.finish_upstream(who)
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert "STATE=success" in out, out[-3000:]
    assert gates.task_runs(run_id) == {"W1": "SUCCESS"}
    assert gates.rows("SELECT CONSUMED_PIPELINE_RUN_ID FROM AUD_DEPENDENCY_CONSUMPTION WHERE TASK_DEPENDENCY_ID "
                      "IS NOT NULL") == [(up_run,)]  # fmt: skip


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_a_task_gate_that_waits_too_long_fails_naming_the_upstream_run(gates: Gates, request, capfd,
                                                                       caplog) -> None:  # fmt: skip
    _, up_run = gates.start_upstream()
    dag = load_dag(_dag_path(gates, request, TASK_WAIT_DAG, "task_timeout", gate_timeout=3))
    run = run_dag_test(dag)
    assert run.state == "failed"
    assert gates.ti_states(dag.dag_id)["twait_e2e.w1"] == "failed"
    logged = capfd.readouterr()
    text = logged.out + logged.err + caplog.text
    assert "[GATE_TIMEOUT] task W1" in text and f"run {up_run} of UP_E2E" in text


@pytest.mark.smoke
def test_a_paused_pipelines_dag_run_is_skipped_and_recorded_and_resume_lets_the_next_run(gates: Gates,
                                                                                        request) -> None:  # fmt: skip
    config = ["--config", str(gates.engine.config_path)]
    assert cli_main(["pause", *config, "--pipeline", "TWAIT_E2E", "--reason", "source outage", "--by", "ops"],
                    out=io.StringIO()) == 0  # fmt: skip
    dag = load_dag(_dag_path(gates, request, TASK_WAIT_DAG, "paused"))
    from datetime import UTC, datetime

    run = run_dag_test(dag, logical_date=datetime(2026, 6, 1, tzinfo=UTC))
    states = gates.ti_states(dag.dag_id)
    assert states["twait_e2e.claim"] == "skipped" and states["twait_e2e.w1"] == "skipped"
    assert states["twait_e2e.finish"] == "skipped" and run.state == "success"
    [(skipped_run, status, ended_by)] = gates.runs("TWAIT_E2E")
    assert (status, ended_by) == ("SKIPPED", "ops")
    assert cli_main(["resume", *config, "--pipeline", "TWAIT_E2E", "--reason", "back", "--by", "ops"],
                    out=io.StringIO()) == 0  # fmt: skip
    # W1 depends on UP_E2E.U1: give it a finished upstream run so the next DAG run really runs W1.
    who, _ = gates.start_upstream()
    gates.finish_upstream(who)
    run = run_dag_test(dag, logical_date=datetime(2026, 6, 2, tzinfo=UTC))
    assert run.state == "success"
    runs = gates.runs("TWAIT_E2E")
    assert [r[1] for r in runs] == ["SKIPPED", "SUCCESS"]
    assert gates.task_runs(runs[1][0]) == {"W1": "SUCCESS"}
    # Only the SUCCESS run emitted the pipeline's Asset event (the skipped one did not).
    with sqlite3.connect(gates.airflow_db, timeout=30) as db:
        events = db.execute("SELECT e.source_run_id FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE "
                            "a.uri = 'etl-craft://etl_craft_default/TWAIT_E2E' AND e.source_dag_id = ?",
                            (dag.dag_id,)).fetchall()  # fmt: skip
    assert [e[0] for e in events] == [run.run_id]
