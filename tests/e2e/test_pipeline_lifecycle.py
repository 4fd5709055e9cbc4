"""The run lifecycle under real Airflow: dag.test() on SQLite and PostgreSQL Engine DBs (docs/lifecycle.md, issue 3)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from airflow_provider_etl_craft.testing import run_dag_test
from harness.engines import EngineSetup, engine_rows
from tests.e2e import pipeline_dags
from tests.e2e.pipeline_dags import NO_FINISH_DAG, PIPELINE_DAG, UNKNOWN_TASK_DAG, load_dag, write_dag

pytestmark = pytest.mark.e2e


class Pipeline:
    """An Engine DB with the E2E_PIPE pipeline, the Airflow connection to it, and the task control file."""

    def __init__(self, engine: EngineSetup, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 migration: str = pipeline_dags.PIPELINE_MIGRATION):  # fmt: skip
        self.engine = engine
        self.dags = airflow_db / "dags"
        self.airflow_db = airflow_db / "airflow.db"
        migrations = engine.config_path.parent / "migrations"
        migrations.mkdir(exist_ok=True)
        (migrations / "0001_e2e_pipeline.sql").write_text(migration)
        engine.hook().migrate()
        self.control = tmp_path / "control.json"
        self.probes = tmp_path / "probes"
        self.probes.mkdir()
        self.set(flaky="ok")
        conn = {"conn_type": "etl_craft", "extra": {"config_path": str(engine.config_path)}}
        self.env = {"AIRFLOW_CONN_ETL_CRAFT_DEFAULT": json.dumps(conn), "E2E_CONTROL": str(self.control),
                    "E2E_PROBE_DIR": str(self.probes)}  # fmt: skip
        for key, value in self.env.items():
            monkeypatch.setenv(key, value)

    def set(self, **control: object) -> None:
        self.control.write_text(json.dumps(control))

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Rows of ``sql`` (``?`` placeholders, rewritten for the dialect)."""
        return engine_rows(self.engine.hook(), sql, params)

    def runs(self) -> list[tuple]:
        return self.rows("SELECT PIPELINE_RUN_ID, STATUS, RUN_KEY, TRIGGER_KIND, STARTED_BY_KIND, REPAIR_PENDING, "
                         "OUTPUT_REVISION FROM AUD_PIPELINES_RUN_LOG ORDER BY PIPELINE_RUN_ID")  # fmt: skip

    def task_runs(self, run_id: int) -> dict[str, tuple]:
        rows = self.rows(
            "SELECT t.TASK_CODE, tr.STATUS, tr.ATTEMPT_COUNT, tr.ROWS_WRITTEN, tr.INSERT_COUNT FROM AUD_TASK_RUN_LOG tr "
            "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID WHERE tr.PIPELINE_RUN_ID = ?", (run_id,))  # fmt: skip
        return {r[0]: r[1:] for r in rows}

    def attempts(self, run_id: int, task_code: str) -> list[tuple]:
        return self.rows(
            "SELECT a.ATTEMPT_NUMBER, a.STATUS FROM AUD_TASK_ATTEMPTS a "
            "JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
            "WHERE tr.PIPELINE_RUN_ID = ? AND t.TASK_CODE = ? ORDER BY a.ATTEMPT_NUMBER", (run_id, task_code))  # fmt: skip

    def interventions(self) -> list[tuple]:
        return self.rows("SELECT PIPELINE_RUN_ID, ACTION, FROM_STATUS, TO_STATUS, REQUESTED_BY_KIND "
                         "FROM AUD_RUN_INTERVENTIONS ORDER BY INTERVENTION_ID")  # fmt: skip

    def rescheduled(self, dag_id: str, task_id: str) -> int:
        """How many times Airflow rescheduled ``task_id`` in ``dag_id`` (its ``task_reschedule`` rows)."""
        with sqlite3.connect(self.airflow_db, timeout=30) as db:
            return db.execute(
                "SELECT COUNT(*) FROM task_reschedule r JOIN task_instance ti ON ti.id = r.ti_id "
                "WHERE ti.dag_id = ? AND ti.task_id = ?",
                (dag_id, task_id),
            ).fetchone()[0]

    def ti(self, dag_id: str, run_id: str, task_id: str) -> tuple[str, int]:
        with sqlite3.connect(self.airflow_db) as db:
            state, tries = db.execute(
                "SELECT state, try_number FROM task_instance WHERE dag_id = ? AND run_id = ? AND task_id = ?",
                (dag_id, run_id, task_id),
            ).fetchone()
        return state, tries


@pytest.fixture
def pipeline(
    engine: EngineSetup, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Pipeline:
    return Pipeline(engine, airflow_db, tmp_path, monkeypatch)


def dag_id(request: pytest.FixtureRequest, name: str) -> str:
    return f"e2e_{name}_{request.node.callspec.id}"


@pytest.mark.smoke
def test_success_path_records_one_run_with_every_task_and_attempt(pipeline: Pipeline, request) -> None:
    dag = load_dag(write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "success")))
    run = run_dag_test(dag)
    assert run.state == "success"
    key = f"airflow:{dag.dag_id}:{run.run_id}"
    [(run_id, status, run_key, trigger, started_kind, repair, revision)] = pipeline.runs()
    assert (status, run_key, trigger, started_kind, repair, revision) == ("SUCCESS", key, "ORCHESTRATOR",
                                                                          "ORCHESTRATOR", "N", 1)  # fmt: skip
    # While the DAG ran, exactly one IN-PROGRESS run existed: this one.
    seen = json.loads((pipeline.probes / (run.run_id.replace(":", "_") + ".json")).read_text())
    assert seen == [[key, "IN-PROGRESS"]]
    (end, sla) = pipeline.rows("SELECT END_DATE, SLA_STATUS FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = ?",
                               (run_id,))[0]  # fmt: skip
    assert end is not None and sla == "MET"
    assert pipeline.task_runs(run_id) == {
        "PREPARE": ("SUCCESS", 1, 3, None),
        "FLAKY": ("SUCCESS", 1, 5, None),
        "LOAD": ("SUCCESS", 1, 2, 2),
        "ALERT": ("SKIPPED", 0, None, None),
    }
    for code in ("PREPARE", "FLAKY", "LOAD"):
        assert pipeline.attempts(run_id, code) == [(1, "SUCCESS")]
    assert pipeline.attempts(run_id, "ALERT") == []
    assert pipeline.ti(dag.dag_id, run.run_id, "e2e_pipe.claim")[0] == "success"


@pytest.mark.smoke
def test_a_task_that_fails_once_has_two_attempts_on_one_task_run(pipeline: Pipeline, request) -> None:
    pipeline.set(flaky="fail_once")
    dag = load_dag(write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "retry")))
    run = run_dag_test(dag)
    assert run.state == "success"
    [(run_id, status, *_)] = pipeline.runs()
    assert status == "SUCCESS"
    assert pipeline.task_runs(run_id)["FLAKY"] == ("SUCCESS", 2, 5, None)
    assert pipeline.attempts(run_id, "FLAKY") == [(1, "FAILED"), (2, "SUCCESS")]
    (error,) = pipeline.rows("SELECT a.ERROR_MESSAGE FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr "
                             "ON tr.TASK_RUN_ID = a.TASK_RUN_ID WHERE tr.PIPELINE_RUN_ID = ? AND a.STATUS = 'FAILED'",
                             (run_id,))[0]  # fmt: skip
    assert error == "RuntimeError: flaky failed on its first try"


def test_a_task_that_fails_for_good_fails_the_run_and_the_finish_task(pipeline: Pipeline, request) -> None:
    pipeline.set(flaky="fail_always")
    dag = load_dag(write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "fail")))
    run = run_dag_test(dag)
    assert run.state == "failed"
    [(run_id, status, *_)] = pipeline.runs()
    assert status == "FAILED"
    tasks = pipeline.task_runs(run_id)
    assert tasks["FLAKY"][:2] == ("FAILED", 2)
    assert tasks["LOAD"][0] == "SKIPPED"  # never ran: upstream failed
    assert tasks["ALERT"][0] == "SUCCESS"  # the alert ran, and its success does not save the run
    assert pipeline.attempts(run_id, "FLAKY") == [(1, "FAILED"), (2, "FAILED")]
    assert pipeline.ti(dag.dag_id, run.run_id, "e2e_pipe.finish") == ("failed", 1)


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_an_execution_timeout_records_a_timed_out_attempt(pipeline: Pipeline, request) -> None:
    pipeline.set(flaky="timeout_once")
    dag = load_dag(write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "timeout")))
    assert run_dag_test(dag).state == "success"
    [(run_id, status, *_)] = pipeline.runs()
    assert status == "SUCCESS"
    assert pipeline.attempts(run_id, "FLAKY") == [(1, "TIMED_OUT"), (2, "SUCCESS")]


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_a_killed_task_records_its_attempt_cancelled_through_on_kill(pipeline: Pipeline, request) -> None:
    pipeline.set(flaky="sigterm_once")
    previous = signal.getsignal(signal.SIGTERM)
    try:
        dag = load_dag(write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "killed")))
        assert run_dag_test(dag).state == "success"
    finally:
        signal.signal(signal.SIGTERM, previous)  # Airflow's task runner installed its handler in this process
    [(run_id, status, *_)] = pipeline.runs()
    assert status == "SUCCESS"
    assert pipeline.attempts(run_id, "FLAKY") == [(1, "CANCELLED"), (2, "SUCCESS")]
    (error,) = pipeline.rows("SELECT a.ERROR_MESSAGE FROM AUD_TASK_ATTEMPTS a WHERE a.STATUS = 'CANCELLED'")[
        0
    ]
    assert "on_kill" in error


def test_clearing_an_ended_dag_run_reopens_the_same_engine_run(pipeline: Pipeline, request) -> None:
    dag = load_dag(write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "clear")))
    run = run_dag_test(dag)
    assert run.state == "success"
    assert pipeline_dags.clear_and_rerun(dag, run.run_id) == "success"
    [(run_id, status, _, _, _, repair, revision)] = pipeline.runs()
    assert (status, repair, revision) == ("SUCCESS", "N", 2)
    assert pipeline.interventions() == [(run_id, "REOPEN", "SUCCESS", "IN-PROGRESS", "ORCHESTRATOR")]
    assert pipeline.attempts(run_id, "PREPARE") == [(1, "SUCCESS"), (2, "SUCCESS")]  # try 2 after the clear
    assert pipeline.task_runs(run_id)["PREPARE"][:2] == ("SUCCESS", 2)
    assert pipeline.ti(dag.dag_id, run.run_id, "e2e_pipe.finish") == ("success", 2)


def test_a_dag_run_created_again_under_its_run_id_reopens_and_continues_numbering(pipeline: Pipeline,
                                                                                   request) -> None:  # fmt: skip
    """dag.test() deletes and re-creates a DAG run with the same run id: Airflow's try numbers restart at 1."""
    dag = load_dag(write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "recreate")))
    when = datetime(2026, 3, 1, tzinfo=UTC)
    first = run_dag_test(dag, logical_date=when, run_after=when)
    second = run_dag_test(dag, logical_date=when, run_after=when)
    assert first.run_id == second.run_id and second.state == "success"
    [(run_id, status, _, _, _, repair, revision)] = pipeline.runs()
    assert (status, repair, revision) == ("SUCCESS", "N", 2)
    assert [i[1] for i in pipeline.interventions()] == ["REOPEN"]
    assert pipeline.attempts(run_id, "PREPARE") == [(1, "SUCCESS"), (2, "SUCCESS")]
    (note,) = pipeline.rows("SELECT a.TASK_LOG FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID "
                            "= a.TASK_RUN_ID JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID WHERE t.TASK_CODE = 'PREPARE' "
                            "AND a.ATTEMPT_NUMBER = 2")[0]  # fmt: skip
    assert "Airflow try 1" in note and "restarted" in note


def test_a_blocking_run_whose_dag_run_ended_is_closed_as_abandoned(pipeline: Pipeline, request) -> None:
    stray = load_dag(write_dag(pipeline.dags, NO_FINISH_DAG, dag_id(request, "stray")))
    assert run_dag_test(stray).state == "success"  # its Engine run stays IN-PROGRESS: nothing finished it
    [(stray_id, status, *_)] = pipeline.runs()
    assert status == "IN-PROGRESS"
    dag = load_dag(write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "after_stray")))
    run = run_dag_test(dag)
    assert run.state == "success"
    runs = pipeline.runs()
    assert [(r[0], r[1]) for r in runs] == [(stray_id, "CANCELLED"), (stray_id + 1, "SUCCESS")]
    [(_, action, from_status, to_status, kind)] = pipeline.interventions()
    assert (action, from_status, to_status, kind) == ("CANCEL", "IN-PROGRESS", "CANCELLED", "ORCHESTRATOR")
    (reason,) = pipeline.rows("SELECT REASON FROM AUD_RUN_INTERVENTIONS")[0]
    assert stray.dag_id in reason and "success" in reason


def test_a_task_code_missing_from_cfg_tasks_fails_the_claim_without_retries(
    pipeline: Pipeline, request
) -> None:
    dag = load_dag(write_dag(pipeline.dags, UNKNOWN_TASK_DAG, dag_id(request, "unknown")))
    run = run_dag_test(dag)
    assert run.state == "failed"
    assert pipeline.ti(dag.dag_id, run.run_id, "e2e_pipe.claim") == ("failed", 1)
    assert pipeline.runs() == []


def test_an_inactive_pipeline_fails_the_claim_without_retries(pipeline: Pipeline, request) -> None:
    engine_rows(
        pipeline.engine.hook(), "UPDATE CFG_PIPELINES SET ACTIVE_FLAG = 'N' WHERE PIPELINE_CODE = 'E2E_PIPE'"
    )
    dag = load_dag(write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "inactive")))
    run = run_dag_test(dag)
    assert run.state == "failed"
    assert pipeline.ti(dag.dag_id, run.run_id, "e2e_pipe.claim") == ("failed", 1)
    assert pipeline.runs() == []


@pytest.mark.smoke
def test_a_sqlite_engine_db_is_refused_under_an_executor_on_other_machines(
    pipeline: Pipeline, request, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    dag = load_dag(write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "celery")))
    run = run_dag_test(dag)
    if pipeline.engine.dialect == "postgresql":  # a server every machine reaches: nothing to refuse
        assert run.state == "success"
        return
    assert run.state == "failed"
    assert pipeline.ti(dag.dag_id, run.run_id, "e2e_pipe.claim") == ("failed", 1)
    assert pipeline.runs() == []
    assert "CeleryExecutor runs tasks on other machines" in capfd.readouterr().out


def test_two_dag_runs_at_once_the_second_claim_waits_without_a_worker_slot(pipeline: Pipeline, request,
                                                                            tmp_path: Path) -> None:  # fmt: skip
    release = tmp_path / "release"
    pipeline.set(flaky="ok", hold=str(release))
    path = write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "pair"))
    env = {**os.environ, **pipeline.engine.env, **pipeline.env}
    runner = [sys.executable, pipeline_dags.__file__, str(path)]

    def start(day: int) -> subprocess.Popen:
        return subprocess.Popen([*runner, f"2026-04-0{day}T00:00:00+00:00"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip

    first = start(1)
    try:
        wait_for(lambda: len(pipeline.runs()) == 1, "the first DAG run's claim")
        second = start(2)
        try:
            # The second claim is rescheduled (no worker slot held) while the first run holds the pipeline.
            wait_for(lambda: rescheduled(pipeline, path.stem) > 0, "the second claim to be rescheduled")
            assert [r[1] for r in pipeline.runs()] == ["IN-PROGRESS"]
            release.touch()
            out_first, _ = first.communicate(timeout=240)
            out_second, _ = second.communicate(timeout=240)
        finally:
            second.kill()
    finally:
        first.kill()
    assert "STATE=success" in out_first, out_first[-3000:]
    assert "STATE=success" in out_second, out_second[-3000:]
    runs = pipeline.runs()
    assert [r[1] for r in runs] == ["SUCCESS", "SUCCESS"]
    first_end, second_start = pipeline.rows(
        "SELECT (SELECT END_DATE FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = 1), "
        "(SELECT START_DATE FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = 2)")[0]  # fmt: skip
    assert str(second_start) >= str(first_end)
    probes = sorted(json.loads(p.read_text()) for p in pipeline.probes.iterdir())
    assert all(len(seen) == 1 for seen in probes)  # each DAG run saw only itself IN-PROGRESS


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_a_claim_that_waits_too_long_fails_naming_the_blocking_run(pipeline: Pipeline, request, capfd,
                                                                   caplog) -> None:  # fmt: skip
    # A run etl-craft itself started (not an Airflow key): the claim must wait for it, never close it.
    engine_rows(pipeline.engine.hook(),
        "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, START_DATE, STATUS, RUN_KEY, TRIGGER_KIND) "
        "SELECT PIPELINE_ID, '2026-01-01T00:00:00.000Z', 'IN-PROGRESS', 'etl-craft:manual:7', 'MANUAL' "
        "FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'E2E_PIPE'")  # fmt: skip
    dag = load_dag(write_dag(pipeline.dags, PIPELINE_DAG, dag_id(request, "claim_timeout"), claim_timeout=3))
    run = run_dag_test(dag)
    assert run.state == "failed"
    assert pipeline.ti(dag.dag_id, run.run_id, "e2e_pipe.claim")[0] == "failed"
    assert rescheduled(pipeline, dag.dag_id) >= 1
    assert [r[1:3] for r in pipeline.runs()] == [("IN-PROGRESS", "etl-craft:manual:7")]
    logged = capfd.readouterr().out + capfd.readouterr().err + caplog.text
    assert (
        "run 1 (etl-craft:manual:7, IN-PROGRESS since 2026-01-01 00:00:00Z) was still IN-PROGRESS" in logged
    )


def rescheduled(pipeline: Pipeline, dag: str) -> int:
    return pipeline.rescheduled(dag, "e2e_pipe.claim")


def wait_for(check, what: str, timeout: float = 120) -> None:  # noqa: ANN001 - a predicate
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")
