"""The run lifecycle (docs/lifecycle.md) on real Engine DBs, both dialects: the exact AUD_ rows each step writes.

Every test sets up the Engine DB with a project migration (written below into ``tmp_path``) and reads the
rows back through the dialect (``harness.engines.engine_rows``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.engine.schema import ENGINE_TABLES
from airflow_provider_etl_craft.errors import (
    LockTimeoutError,
    MetadataError,
    RunStateError,
    StaleTransitionError,
    TaskFailedError,
)
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import AttemptHandle, RunIdentity, RunLifecycle, RunRow, TaskCounts
from harness.engines import EngineSetup, engine_rows

# -- the project migration -------------------------------------------------------------------------------

# SALES: three active tasks (one EMAIL_ALERT handler) and a retired one; a generous SLA.
# TINY_SLA / NO_SLA: one task each, an SLA nobody can meet / no SLA. RETIRED: an inactive pipeline.
MIGRATION = """
-- Pipelines and tasks the lifecycle tests run (plain INSERTs: valid on SQLite and PostgreSQL).
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY)
VALUES ('SALES', 'Sales', 24, 'FULL', 'test');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY)
VALUES ('TINY_SLA', 'Tiny SLA', 0.0000001, 'FULL', 'test');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY)
VALUES ('NO_SLA', 'No SLA', NULL, 'FULL', 'test');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, ACTIVE_FLAG, CREATED_BY)
VALUES ('RETIRED', 'Retired', 1, 'FULL', 'N', 'test');

INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'EXTRACT', 'INGESTION', PIPELINE_ID, 'PYTHON', 'test' FROM CFG_PIPELINES
WHERE PIPELINE_CODE = 'SALES' AND ACTIVE_FLAG = 'Y';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'LOAD', 'ETL', PIPELINE_ID, 'SQL', 'test' FROM CFG_PIPELINES
WHERE PIPELINE_CODE = 'SALES' AND ACTIVE_FLAG = 'Y';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'NOTIFY', 'ETL', PIPELINE_ID, 'EMAIL_ALERT', 'test' FROM CFG_PIPELINES
WHERE PIPELINE_CODE = 'SALES' AND ACTIVE_FLAG = 'Y';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, ACTIVE_FLAG, CREATED_BY)
SELECT 'OLD_STEP', 'ETL', PIPELINE_ID, 'SQL', 'N', 'test' FROM CFG_PIPELINES
WHERE PIPELINE_CODE = 'SALES' AND ACTIVE_FLAG = 'Y';

INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'ONLY', 'ETL', PIPELINE_ID, 'PYTHON', 'test' FROM CFG_PIPELINES
WHERE PIPELINE_CODE IN ('TINY_SLA', 'NO_SLA', 'RETIRED');
"""

SALES_TASKS = ("EXTRACT", "LOAD", "NOTIFY")
RUN_DATE = datetime(2026, 1, 2, 6, 0, tzinfo=UTC)
RUN_COLS = ("PIPELINE_RUN_ID", "PIPELINE_ID", "START_DATE", "END_DATE", "STATUS", "SLA_STATUS", "RUN_DATE",
            "BACKFILL", "RUN_KEY", "TRIGGER_KIND", "OWNER_ID", "OUTPUT_REVISION", "STARTED_BY", "STARTED_BY_KIND",
            "ENDED_BY", "ENDED_BY_KIND", "REPAIR_PENDING")  # fmt: skip
TASK_RUN_COLS = ("TASK_RUN_ID", "TASK_ID", "PIPELINE_RUN_ID", "START_DATE", "END_DATE", "STATUS", "ATTEMPT_COUNT",
                 "SOURCE_COUNT", "TARGET_COUNT", "INSERT_COUNT", "UPDATE_COUNT", "DELETE_COUNT", "ROWS_WRITTEN",
                 "ERROR_MESSAGE", "TASK_LOG")  # fmt: skip
ATTEMPT_COLS = ("ATTEMPT_ID", "TASK_RUN_ID", "ATTEMPT_NUMBER", "STATUS", "OWNER_ID", "HEARTBEAT_AT", "CLAIMED_AT",
                "STARTED_AT", "ENDED_AT", "HOST", "PID", "SOURCE_COUNT", "TARGET_COUNT", "INSERT_COUNT",
                "UPDATE_COUNT", "DELETE_COUNT", "ROWS_WRITTEN", "ERROR_MESSAGE", "LOG_PATH", "REQUESTED_BY",
                "REQUESTED_BY_KIND")  # fmt: skip
INTERVENTION_COLS = ("PIPELINE_ID", "PIPELINE_RUN_ID", "TASK_ID", "ACTION", "FROM_STATUS", "TO_STATUS", "REASON",
                     "REQUESTED_BY", "REQUESTED_BY_KIND", "REQUESTED_AT")  # fmt: skip


def ident(run_id: str = "manual__2026-01-02T06:00:00+00:00", dag_id: str = "sales_dag",
          run_date: datetime | None = RUN_DATE, backfill: bool = False) -> RunIdentity:  # fmt: skip
    return RunIdentity(dag_id=dag_id, run_id=run_id, run_date=run_date, backfill=backfill)


ALL_SUCCESS = {"EXTRACT": "success", "LOAD": "success", "NOTIFY": "skipped"}


@dataclass
class Db:
    """One migrated Engine DB, a hook to read it back, and a RunLifecycle on an open connection."""

    setup: EngineSetup
    hook: EngineDBHook
    lc: RunLifecycle

    def records(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return engine_rows(self.hook, sql, params)

    def execute(self, sql: str, *params: Any) -> None:
        engine_rows(self.hook, sql, params)

    def scalar(self, sql: str, *params: Any) -> Any:
        rows = self.records(sql, *params)
        assert len(rows) == 1 and len(rows[0]) == 1, rows
        return rows[0][0]

    def dicts(self, table: str, cols: tuple[str, ...], where: str = "1 = 1", *params: Any,
              order: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
        sql = f"SELECT {', '.join(cols)} FROM {table} WHERE {where} ORDER BY {order or cols[0]}"
        return [dict(zip(cols, r, strict=True)) for r in self.records(sql, *params)]

    def run(self, run_id: int) -> dict[str, Any]:
        (row,) = self.dicts("AUD_PIPELINES_RUN_LOG", RUN_COLS, "PIPELINE_RUN_ID = ?", run_id)
        return row

    def runs(self) -> list[dict[str, Any]]:
        return self.dicts("AUD_PIPELINES_RUN_LOG", RUN_COLS)

    def task_run(self, run_id: int, task_code: str) -> dict[str, Any]:
        rows = self.dicts(
            "AUD_TASK_RUN_LOG", TASK_RUN_COLS,
            "PIPELINE_RUN_ID = ? AND TASK_ID IN (SELECT TASK_ID FROM CFG_TASKS WHERE TASK_CODE = ?)", run_id, task_code,
        )  # fmt: skip
        assert len(rows) == 1, rows
        return rows[0]

    def task_runs(self, run_id: int) -> dict[str, dict[str, Any]]:
        rows = self.records(
            "SELECT t.TASK_CODE, tr.TASK_RUN_ID FROM AUD_TASK_RUN_LOG tr JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
            "WHERE tr.PIPELINE_RUN_ID = ?", run_id,
        )  # fmt: skip
        return {code: self.task_run(run_id, code) for code, _ in rows}

    def attempts(self, task_run_id: int) -> list[dict[str, Any]]:
        return self.dicts(
            "AUD_TASK_ATTEMPTS", ATTEMPT_COLS, "TASK_RUN_ID = ?", task_run_id, order="ATTEMPT_NUMBER"
        )

    def interventions(self) -> list[dict[str, Any]]:
        return self.dicts("AUD_RUN_INTERVENTIONS", INTERVENTION_COLS, order="INTERVENTION_ID")

    def pipeline_id(self, code: str) -> int:
        return int(self.scalar("SELECT PIPELINE_ID FROM CFG_PIPELINES WHERE PIPELINE_CODE = ?", code))

    def task_id(self, pipeline: str, task: str) -> int:
        return int(self.scalar(
            "SELECT t.TASK_ID FROM CFG_TASKS t JOIN CFG_PIPELINES p ON p.PIPELINE_ID = t.PIPELINE_ID "
            "WHERE p.PIPELINE_CODE = ? AND t.TASK_CODE = ?", pipeline, task,
        ))  # fmt: skip

    def t(self, value: Any) -> datetime | None:
        return self.hook.engine.from_db_time(value)

    def aud_counts(self) -> tuple[int, int, int, int]:
        return tuple(
            self.scalar(f"SELECT COUNT(*) FROM {table}")
            for table in (  # type: ignore[return-value]
                "AUD_PIPELINES_RUN_LOG",
                "AUD_TASK_RUN_LOG",
                "AUD_TASK_ATTEMPTS",
                "AUD_RUN_INTERVENTIONS",
            )
        )


@pytest.fixture
def db(engine: EngineSetup, tmp_path: Path) -> Iterator[Db]:
    folder = tmp_path / "project-migrations"
    folder.mkdir()
    (folder / "0001_lifecycle_pipelines.sql").write_text(MIGRATION, encoding="utf-8")
    hook = engine.hook()
    assert hook.migrate(folder).applied == ["PROJECT 0001_lifecycle_pipelines.sql"]
    with hook.lifecycle(lock_timeout=30) as lc:
        yield Db(engine, hook, lc)


def within(db: Db, value: Any, before: datetime, after: datetime) -> bool:
    """A stored timestamp lies in [before, after] (SQLite keeps milliseconds: allow the truncation)."""
    stamp = db.t(value)
    assert stamp is not None and stamp.tzinfo is not None
    return before - timedelta(milliseconds=1) <= stamp <= after


def claim_and_finish(db: Db, identity: RunIdentity, pipeline: str = "SALES",
                     states: dict[str, str | None] | None = None) -> int:  # fmt: skip
    """Claim a new run, record the tasks whose Airflow state is "success" as succeeded, finish the run."""
    states = ALL_SUCCESS if states is None else states
    outcome = db.lc.claim(pipeline, identity)
    assert outcome.action == "CREATED", outcome
    assert outcome.pipeline_run_id is not None
    for code, state in states.items():
        if state == "success":
            db.lc.finish_task(
                db.lc.start_task(pipeline, code, identity, 1), "SUCCESS", TaskCounts(rows_written=1)
            )
    finished = db.lc.finish_run(pipeline, identity, states)
    assert not finished.already_ended
    return outcome.pipeline_run_id


# -- claim ---------------------------------------------------------------------------------------------


def test_claim_creates_one_in_progress_row_keyed_by_the_airflow_run(db: Db) -> None:
    identity = ident()
    before = datetime.now(UTC)
    outcome = db.lc.claim("SALES", identity)
    after = datetime.now(UTC)
    assert outcome.action == "CREATED" and outcome.blocking is None
    key = "airflow:sales_dag:manual__2026-01-02T06:00:00+00:00"
    (row,) = db.runs()
    assert row["PIPELINE_RUN_ID"] == outcome.pipeline_run_id
    assert within(db, row.pop("START_DATE"), before, after)
    assert db.hook.engine.from_db_date(row.pop("RUN_DATE")) == RUN_DATE.date()  # a DATE: its UTC date
    assert row == {
        "PIPELINE_RUN_ID": outcome.pipeline_run_id, "PIPELINE_ID": db.pipeline_id("SALES"), "END_DATE": None,
        "STATUS": "IN-PROGRESS", "SLA_STATUS": None, "BACKFILL": "N", "RUN_KEY": key,
        "TRIGGER_KIND": "ORCHESTRATOR", "OWNER_ID": key, "OUTPUT_REVISION": 1, "STARTED_BY": key,
        "STARTED_BY_KIND": "ORCHESTRATOR", "ENDED_BY": None, "ENDED_BY_KIND": None, "REPAIR_PENDING": "N",
    }  # fmt: skip
    assert db.aud_counts() == (1, 0, 0, 0)


def test_claim_of_a_backfill_run_stores_backfill_y_and_the_run_date_in_utc(db: Db) -> None:
    local = datetime(2025, 12, 31, 23, 30, tzinfo=timezone(timedelta(hours=-5)))  # 2026-01-01T04:30Z
    outcome = db.lc.claim(
        "SALES", ident("backfill__2025-12-31T23:30:00-05:00", run_date=local, backfill=True)
    )
    row = db.run(outcome.pipeline_run_id)
    assert (outcome.action, row["BACKFILL"], row["TRIGGER_KIND"]) == ("CREATED", "Y", "ORCHESTRATOR")
    assert db.hook.engine.from_db_date(row["RUN_DATE"]) == date(2026, 1, 1)  # the UTC date of 04:30Z
    assert row["RUN_KEY"] == "airflow:sales_dag:backfill__2025-12-31T23:30:00-05:00"


def test_claim_without_a_run_date_stores_null(db: Db) -> None:
    outcome = db.lc.claim("NO_SLA", ident("asset_triggered__x", run_date=None))
    assert db.run(outcome.pipeline_run_id)["RUN_DATE"] is None


def test_a_second_claim_with_the_same_key_resumes_the_same_run(db: Db) -> None:
    first = db.lc.claim("SALES", ident())
    before = db.runs()
    second = db.lc.claim("SALES", ident())
    assert (second.action, second.pipeline_run_id, second.blocking) == (
        "RESUMED",
        first.pipeline_run_id,
        None,
    )
    assert db.runs() == before
    assert db.aud_counts() == (1, 0, 0, 0)


def test_a_claim_with_another_key_is_blocked_by_the_in_progress_run(db: Db) -> None:
    first = db.lc.claim("SALES", ident("run_a"))
    stored = db.run(first.pipeline_run_id)
    outcome = db.lc.claim("SALES", ident("run_b"))
    assert outcome.action == "BLOCKED" and outcome.pipeline_run_id is None
    blocking = outcome.blocking
    assert isinstance(blocking, RunRow)
    assert blocking == RunRow(
        pipeline_run_id=first.pipeline_run_id, pipeline_id=db.pipeline_id("SALES"), status="IN-PROGRESS",
        run_key="airflow:sales_dag:run_a", start_date=db.t(stored["START_DATE"]), end_date=None,
        repair_pending="N", output_revision=1,
    )  # fmt: skip
    assert f"run {first.pipeline_run_id} (airflow:sales_dag:run_a, IN-PROGRESS since " in blocking.describe()
    assert db.aud_counts() == (1, 0, 0, 0)
    # Another pipeline is not blocked by it.
    assert db.lc.claim("NO_SLA", ident("run_b")).action == "CREATED"


@pytest.mark.parametrize(
    ("states", "ended"), [(ALL_SUCCESS, "SUCCESS"), ({**ALL_SUCCESS, "LOAD": "failed"}, "FAILED")]
)
def test_a_claim_after_the_run_ended_reopens_the_same_row(db: Db, states: dict[str, str], ended: str) -> None:
    identity = ident()
    run_id = claim_and_finish(db, identity, states=states)
    assert db.run(run_id)["STATUS"] == ended
    sla = db.run(run_id)["SLA_STATUS"]
    assert sla == "MET"
    before = datetime.now(UTC)
    outcome = db.lc.claim("SALES", identity)
    after = datetime.now(UTC)
    assert (outcome.action, outcome.pipeline_run_id) == ("REOPENED", run_id)
    row = db.run(run_id)
    assert (row["STATUS"], row["END_DATE"], row["ENDED_BY"], row["ENDED_BY_KIND"]) == (
        "IN-PROGRESS",
        None,
        None,
        None,
    )
    assert (row["REPAIR_PENDING"], row["OUTPUT_REVISION"], row["SLA_STATUS"]) == ("Y", 1, "MET")
    (reopen,) = db.interventions()
    assert within(db, reopen.pop("REQUESTED_AT"), before, after)
    assert reopen == {
        "PIPELINE_ID": db.pipeline_id("SALES"), "PIPELINE_RUN_ID": run_id, "TASK_ID": None, "ACTION": "REOPEN",
        "FROM_STATUS": ended, "TO_STATUS": "IN-PROGRESS",
        "REASON": "Airflow DAG run manual__2026-01-02T06:00:00+00:00 of sales_dag ran again (cleared)",
        "REQUESTED_BY": identity.run_key, "REQUESTED_BY_KIND": "ORCHESTRATOR",
    }  # fmt: skip
    assert len(db.runs()) == 1
    # A retry of the reopening claim resumes; finishing the repair raises the revision once.
    assert db.lc.claim("SALES", identity).action == "RESUMED"
    # LOAD was not run again: its FAILED row stands, and Airflow still says what it said.
    assert db.lc.finish_run("SALES", identity, states).status == ended
    row = db.run(run_id)
    assert (row["STATUS"], row["OUTPUT_REVISION"], row["REPAIR_PENDING"]) == (ended, 2, "N")
    assert row["ENDED_BY"] == identity.run_key and row["END_DATE"] is not None
    # A second repair: revision 3, a second REOPEN intervention, still one run row.
    assert db.lc.claim("SALES", identity).action == "REOPENED"
    db.lc.finish_run("SALES", identity, states)
    assert db.run(run_id)["OUTPUT_REVISION"] == 3
    assert [i["ACTION"] for i in db.interventions()] == ["REOPEN", "REOPEN"]
    assert len(db.runs()) == 1


def test_reopening_is_blocked_while_another_run_of_the_pipeline_is_in_progress(db: Db) -> None:
    first = claim_and_finish(db, ident("run_a"))
    second = db.lc.claim("SALES", ident("run_b"))
    assert second.action == "CREATED"
    outcome = db.lc.claim("SALES", ident("run_a"))
    assert outcome.action == "BLOCKED" and outcome.blocking is not None
    assert outcome.blocking.pipeline_run_id == second.pipeline_run_id
    assert db.run(first)["STATUS"] == "SUCCESS" and db.run(first)["REPAIR_PENDING"] == "N"
    assert db.interventions() == []


# -- claim errors -------------------------------------------------------------------------------------------


def test_claim_refuses_a_retired_and_an_unknown_pipeline(db: Db) -> None:
    with pytest.raises(
        MetadataError, match=r"pipeline RETIRED is retired \(ACTIVE_FLAG='N'\) in CFG_PIPELINES"
    ):
        db.lc.claim("RETIRED", ident())
    with pytest.raises(MetadataError, match=r"pipeline NO_SUCH_PIPELINE does not exist in CFG_PIPELINES"):
        db.lc.claim("NO_SUCH_PIPELINE", ident())
    assert MetadataError.exit_code == 4
    assert db.aud_counts() == (0, 0, 0, 0)


def test_claim_refuses_task_codes_that_differ_from_the_active_tasks(db: Db) -> None:
    with pytest.raises(MetadataError) as extra:
        db.lc.claim("SALES", ident(), [*SALES_TASKS, "EXTRA_STEP"], where="DAG sales_dag")
    message = str(extra.value)
    assert "DAG sales_dag records task codes that are not active tasks of SALES: EXTRA_STEP" in message
    assert "does not run" not in message
    with pytest.raises(MetadataError) as missing:
        db.lc.claim("SALES", ident(), ["EXTRACT"], where="DAG sales_dag")
    message = str(missing.value)
    assert "active CFG_TASKS of SALES that DAG sales_dag does not run: LOAD, NOTIFY" in message
    assert "not active tasks" not in message
    with pytest.raises(
        MetadataError, match=r"not active tasks of SALES: OLD_STEP; active CFG_TASKS of SALES .*: NOTIFY"
    ):
        db.lc.claim("SALES", ident(), ["EXTRACT", "LOAD", "OLD_STEP"])  # a retired task counts as unknown
    assert db.aud_counts() == (0, 0, 0, 0)
    # The same codes in another order (and duplicated) are fine.
    assert db.lc.claim("SALES", ident(), ["NOTIFY", "LOAD", "EXTRACT", "LOAD"]).action == "CREATED"


# -- close_abandoned -------------------------------------------------------------------------------------


def test_close_abandoned_cancels_the_run_and_loses_its_live_attempts(db: Db) -> None:
    owner, closer = ident("run_a"), ident("run_b")
    run_id = db.lc.claim("SALES", owner).pipeline_run_id
    live = db.lc.start_task("SALES", "EXTRACT", owner, 1)
    done = db.lc.start_task("SALES", "LOAD", owner, 1)
    db.lc.finish_task(done, "SUCCESS", TaskCounts(rows_written=7))
    before = datetime.now(UTC)
    assert db.lc.close_abandoned("SALES", run_id, closer, "its DAG run is failed") is True
    after = datetime.now(UTC)
    row = db.run(run_id)
    assert within(db, row["END_DATE"], before, after)
    assert (row["STATUS"], row["ENDED_BY"], row["ENDED_BY_KIND"], row["REPAIR_PENDING"]) == (
        "CANCELLED",
        closer.run_key,
        "ORCHESTRATOR",
        "N",
    )
    tasks = db.task_runs(run_id)
    assert (tasks["EXTRACT"]["STATUS"], tasks["EXTRACT"]["ERROR_MESSAGE"]) == (
        "CANCELLED",
        "abandoned: its DAG run is failed",
    )
    assert tasks["EXTRACT"]["END_DATE"] is not None
    assert (tasks["LOAD"]["STATUS"], tasks["LOAD"]["ROWS_WRITTEN"], tasks["LOAD"]["ERROR_MESSAGE"]) == (
        "SUCCESS",
        7,
        None,
    )
    (lost,) = db.attempts(live.task_run_id)
    assert (lost["STATUS"], lost["ERROR_MESSAGE"]) == ("LOST", "abandoned: its DAG run is failed")
    assert within(db, lost["ENDED_AT"], before, after)
    assert [a["STATUS"] for a in db.attempts(done.task_run_id)] == ["SUCCESS"]
    (cancel,) = db.interventions()
    del cancel["REQUESTED_AT"]
    assert cancel == {
        "PIPELINE_ID": db.pipeline_id("SALES"), "PIPELINE_RUN_ID": run_id, "TASK_ID": None, "ACTION": "CANCEL",
        "FROM_STATUS": "IN-PROGRESS", "TO_STATUS": "CANCELLED", "REASON": "abandoned: its DAG run is failed",
        "REQUESTED_BY": closer.run_key, "REQUESTED_BY_KIND": "ORCHESTRATOR",
    }  # fmt: skip
    # The abandoned worker can no longer record its result.
    with pytest.raises(StaleTransitionError, match="was closed by someone else"):
        db.lc.finish_task(live, "SUCCESS")
    # Closing again (someone else was first) or closing a run that does not exist: False, nothing changes.
    snapshot = (db.runs(), db.interventions())
    assert db.lc.close_abandoned("SALES", run_id, closer, "again") is False
    assert db.lc.close_abandoned("SALES", 999_999, closer, "missing") is False
    assert (db.runs(), db.interventions()) == snapshot
    # The pipeline is free: the other key is CREATED.
    outcome = db.lc.claim("SALES", closer)
    assert outcome.action == "CREATED" and outcome.pipeline_run_id != run_id
    # finish_run of the abandoned run reports it already ended.
    finished = db.lc.finish_run("SALES", owner, ALL_SUCCESS)
    assert (finished.status, finished.already_ended) == ("CANCELLED", True)


# -- task attempts -------------------------------------------------------------------------------------------


def test_attempt_number_is_the_try_number_and_one_task_run_row_spans_the_tries(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    before = datetime.now(UTC)
    first = db.lc.start_task("SALES", "EXTRACT", identity, 1, log_path="/logs/extract/1.log")
    assert isinstance(first, AttemptHandle)
    assert (first.pipeline_run_id, first.attempt_number, first.task_code) == (run_id, 1, "EXTRACT")
    row = db.task_run(run_id, "EXTRACT")
    assert (row["TASK_RUN_ID"], row["TASK_ID"], row["STATUS"], row["ATTEMPT_COUNT"], row["END_DATE"]) == (
        first.task_run_id,
        db.task_id("SALES", "EXTRACT"),
        "IN-PROGRESS",
        1,
        None,
    )
    (attempt,) = db.attempts(first.task_run_id)
    for col in ("CLAIMED_AT", "STARTED_AT", "HEARTBEAT_AT"):
        assert within(db, attempt.pop(col), before, datetime.now(UTC))
    assert attempt == {
        "ATTEMPT_ID": first.attempt_id, "TASK_RUN_ID": first.task_run_id, "ATTEMPT_NUMBER": 1, "STATUS": "RUNNING",
        "OWNER_ID": first.owner_id, "ENDED_AT": None, "HOST": socket.gethostname(), "PID": os.getpid(),
        "SOURCE_COUNT": None, "TARGET_COUNT": None, "INSERT_COUNT": None, "UPDATE_COUNT": None,
        "DELETE_COUNT": None, "ROWS_WRITTEN": None, "ERROR_MESSAGE": None, "LOG_PATH": "/logs/extract/1.log",
        "REQUESTED_BY": identity.run_key, "REQUESTED_BY_KIND": "ORCHESTRATOR",
    }  # fmt: skip
    assert first.owner_id.startswith(f"{socket.gethostname()}:{os.getpid()}:")

    db.lc.finish_task(first, "FAILED", error="ValueError: source file missing")
    row = db.task_run(run_id, "EXTRACT")
    assert (row["STATUS"], row["ATTEMPT_COUNT"], row["ERROR_MESSAGE"]) == (
        "FAILED",
        1,
        "ValueError: source file missing",
    )
    assert row["END_DATE"] is not None

    second = db.lc.start_task("SALES", "EXTRACT", identity, 2)
    assert (second.task_run_id, second.attempt_number) == (first.task_run_id, 2)
    assert second.attempt_id != first.attempt_id and second.owner_id != first.owner_id
    row = db.task_run(run_id, "EXTRACT")
    assert (row["STATUS"], row["ATTEMPT_COUNT"], row["ERROR_MESSAGE"], row["END_DATE"]) == (
        "IN-PROGRESS",
        2,
        None,
        None,
    )

    db.lc.finish_task(
        second, "SUCCESS", TaskCounts.from_result({"source_count": 10, "INSERT_COUNT": 3, "update_count": 2})
    )
    counts = ("SOURCE_COUNT", "TARGET_COUNT", "INSERT_COUNT", "UPDATE_COUNT", "DELETE_COUNT", "ROWS_WRITTEN")
    row = db.task_run(run_id, "EXTRACT")
    assert (row["STATUS"], row["ATTEMPT_COUNT"], row["ERROR_MESSAGE"]) == ("SUCCESS", 2, None)
    assert tuple(row[c] for c in counts) == (10, None, 3, 2, None, 5)
    attempts = db.attempts(first.task_run_id)
    assert [(a["ATTEMPT_NUMBER"], a["STATUS"], a["ERROR_MESSAGE"]) for a in attempts] == [
        (1, "FAILED", "ValueError: source file missing"),
        (2, "SUCCESS", None),
    ]
    assert tuple(attempts[1][c] for c in counts) == (10, None, 3, 2, None, 5)
    assert tuple(attempts[0][c] for c in counts) == (None,) * 6
    assert all(a["ENDED_AT"] is not None for a in attempts)
    assert db.scalar("SELECT COUNT(*) FROM AUD_TASK_RUN_LOG") == 1


def test_a_long_error_message_is_stored_trimmed_on_attempt_and_task_run(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    handle = db.lc.start_task("SALES", "LOAD", identity, 1)
    db.lc.finish_task(handle, "FAILED", error="E" * 10_000)
    expected = "E" * 4000 + "… [6000 more characters trimmed]"
    assert db.task_run(run_id, "LOAD")["ERROR_MESSAGE"] == expected
    assert db.attempts(handle.task_run_id)[0]["ERROR_MESSAGE"] == expected


def test_nul_bytes_and_invalid_surrogates_in_an_error_are_stored_without_error(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    handle = db.lc.start_task("SALES", "LOAD", identity, 1)
    undecodable = b"caf\xe9 \xff".decode("utf-8", "surrogateescape")  # non-UTF-8 bytes from a driver or file
    db.lc.finish_task(handle, "FAILED", error=f"bad\x00byte {undecodable} \ud800 end ✓")
    expected = "bad\\0byte caf? ? ? end ✓"
    assert db.task_run(run_id, "LOAD")["ERROR_MESSAGE"] == expected
    assert db.attempts(handle.task_run_id)[0]["ERROR_MESSAGE"] == expected


def test_a_second_start_of_the_same_try_is_refused_and_rolled_back(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    handle = db.lc.start_task("SALES", "EXTRACT", identity, 1)
    before = (db.task_run(run_id, "EXTRACT"), db.attempts(handle.task_run_id))
    with pytest.raises(StaleTransitionError, match=r"EXTRACT in airflow:sales_dag:manual__.*second delivery"):
        db.lc.start_task("SALES", "EXTRACT", identity, 1)
    assert (db.task_run(run_id, "EXTRACT"), db.attempts(handle.task_run_id)) == before
    assert db.task_run(run_id, "EXTRACT")["ATTEMPT_COUNT"] == 1
    assert StaleTransitionError.exit_code == 20 and StaleTransitionError.retryable
    # The first delivery still owns its attempt, and the connection is usable after the rollback.
    db.lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=1))
    row = db.task_run(run_id, "EXTRACT")
    assert (row["STATUS"], row["ATTEMPT_COUNT"], row["ROWS_WRITTEN"]) == ("SUCCESS", 1, 1)


def test_a_try_number_taken_by_an_ended_attempt_continues_the_numbering(db: Db) -> None:
    """Airflow restarted its try numbering (DAG run re-created under the same run id): the next number is used."""
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    first = db.lc.finish_task(db.lc.start_task("SALES", "EXTRACT", identity, 1), "FAILED", error="boom")
    assert first is None
    again = db.lc.start_task("SALES", "EXTRACT", identity, 1)
    assert again.attempt_number == 2
    attempts = db.attempts(again.task_run_id)
    assert [(a["ATTEMPT_NUMBER"], a["STATUS"]) for a in attempts] == [(1, "FAILED"), (2, "RUNNING")]
    note = db.scalar("SELECT TASK_LOG FROM AUD_TASK_ATTEMPTS WHERE ATTEMPT_ID = ?", again.attempt_id)
    assert "Airflow try 1" in note
    assert db.task_run(run_id, "EXTRACT")["ATTEMPT_COUNT"] == 2


def test_a_higher_try_closes_the_live_lower_one_lost(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    first = db.lc.start_task("SALES", "EXTRACT", identity, 1)
    third = db.lc.start_task("SALES", "EXTRACT", identity, 3)
    attempts = db.attempts(first.task_run_id)
    assert [(a["ATTEMPT_NUMBER"], a["STATUS"]) for a in attempts] == [(1, "LOST"), (3, "RUNNING")]
    assert attempts[0]["ERROR_MESSAGE"] == (
        "lost: Airflow started try 3 while this attempt was still live (its worker ended without recording)"
    )
    assert attempts[0]["ENDED_AT"] is not None and attempts[1]["ENDED_AT"] is None
    assert db.task_run(run_id, "EXTRACT")["ATTEMPT_COUNT"] == 2
    # The lost worker's late result is refused; the live try records normally.
    with pytest.raises(StaleTransitionError, match="attempt 1 of task EXTRACT .*closed by someone else"):
        db.lc.finish_task(first, "SUCCESS", TaskCounts(rows_written=99))
    db.lc.finish_task(third, "SUCCESS", TaskCounts(rows_written=3))
    row = db.task_run(run_id, "EXTRACT")
    assert (row["STATUS"], row["ROWS_WRITTEN"]) == ("SUCCESS", 3)
    assert [a["STATUS"] for a in db.attempts(first.task_run_id)] == ["LOST", "SUCCESS"]


def test_a_lower_try_arriving_after_a_live_higher_one_is_refused(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    second = db.lc.start_task("SALES", "EXTRACT", identity, 2)
    with pytest.raises(StaleTransitionError):
        db.lc.start_task("SALES", "EXTRACT", identity, 1)
    assert [(a["ATTEMPT_NUMBER"], a["STATUS"]) for a in db.attempts(second.task_run_id)] == [(2, "RUNNING")]
    assert db.task_run(run_id, "EXTRACT")["ATTEMPT_COUNT"] == 1


def test_finish_task_on_an_attempt_closed_by_finish_run_is_stale(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    handle = db.lc.start_task("SALES", "EXTRACT", identity, 1)
    db.lc.finish_run("SALES", identity, {**ALL_SUCCESS, "EXTRACT": "failed"})  # its worker died
    with pytest.raises(StaleTransitionError, match=r"ATTEMPT_ID \d+\) was closed by someone else"):
        db.lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=5))
    assert db.attempts(handle.task_run_id)[0]["STATUS"] == "LOST"
    row = db.task_run(run_id, "EXTRACT")
    assert (row["STATUS"], row["ROWS_WRITTEN"]) == ("FAILED", None)


def test_start_task_refuses_unknown_and_retired_tasks_and_a_missing_run(db: Db) -> None:
    identity = ident()
    with pytest.raises(MetadataError, match="task NO_SUCH_TASK is not an active task of pipeline SALES"):
        db.lc.start_task("SALES", "NO_SUCH_TASK", identity, 1)
    with pytest.raises(
        RunStateError, match=r"no Engine run of pipeline SALES has the run key airflow:sales_dag:"
    ):
        db.lc.start_task("SALES", "EXTRACT", identity, 1)
    with pytest.raises(MetadataError, match="pipeline RETIRED is retired"):
        db.lc.start_task("RETIRED", "ONLY", identity, 1)
    db.lc.claim("SALES", identity)
    with pytest.raises(MetadataError, match="task OLD_STEP is not an active task of pipeline SALES"):
        db.lc.start_task("SALES", "OLD_STEP", identity, 1)
    with pytest.raises(MetadataError, match="task ONLY is not an active task of pipeline SALES"):
        db.lc.start_task("SALES", "ONLY", identity, 1)  # a task of another pipeline
    with pytest.raises(RunStateError):
        db.lc.start_task("SALES", "EXTRACT", ident("another_run"), 1)
    assert RunStateError.exit_code == 9
    assert db.aud_counts() == (1, 0, 0, 0)


def test_a_task_started_on_an_ended_run_reopens_it(db: Db) -> None:
    identity = ident()
    run_id = claim_and_finish(
        db, identity, states={"EXTRACT": "success", "LOAD": "failed", "NOTIFY": "skipped"}
    )
    assert db.run(run_id)["STATUS"] == "FAILED"
    handle = db.lc.start_task("SALES", "LOAD", identity, 2)  # LOAD cleared in Airflow
    row = db.run(run_id)
    assert (row["STATUS"], row["END_DATE"], row["ENDED_BY"], row["REPAIR_PENDING"]) == (
        "IN-PROGRESS",
        None,
        None,
        "Y",
    )
    (reopen,) = db.interventions()
    assert (reopen["ACTION"], reopen["FROM_STATUS"], reopen["TO_STATUS"], reopen["PIPELINE_RUN_ID"]) == (
        "REOPEN",
        "FAILED",
        "IN-PROGRESS",
        run_id,
    )
    assert reopen["REASON"] == "task LOAD ran again in Airflow (cleared)"
    assert reopen["REQUESTED_BY"] == identity.run_key
    load = db.task_run(run_id, "LOAD")
    assert (load["STATUS"], load["ATTEMPT_COUNT"], load["ERROR_MESSAGE"]) == ("IN-PROGRESS", 1, None)
    db.lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=4))
    outcome = db.lc.finish_run(
        "SALES", identity, {"EXTRACT": "success", "LOAD": "success", "NOTIFY": "skipped"}
    )
    assert outcome.status == "SUCCESS"
    row = db.run(run_id)
    assert (row["STATUS"], row["OUTPUT_REVISION"], row["REPAIR_PENDING"]) == ("SUCCESS", 2, "N")
    assert len(db.runs()) == 1


def test_a_task_on_an_ended_run_is_refused_while_another_run_is_in_progress(db: Db) -> None:
    old = ident("run_a")
    run_id = claim_and_finish(db, old)
    other = db.lc.claim("SALES", ident("run_b")).pipeline_run_id
    before = db.aud_counts()
    with pytest.raises(
        StaleTransitionError, match=rf"task LOAD was cleared in airflow:sales_dag:run_a.* run {other} "
    ):
        db.lc.start_task("SALES", "LOAD", old, 2)
    assert db.run(run_id)["STATUS"] == "SUCCESS"
    assert db.aud_counts() == before
    assert db.interventions() == []


# -- finish_run --------------------------------------------------------------------------------------------


def test_finish_run_records_tasks_airflow_never_ran(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    db.lc.finish_task(
        db.lc.start_task("SALES", "EXTRACT", identity, 1), "SUCCESS", TaskCounts(rows_written=2)
    )
    before = datetime.now(UTC)
    outcome = db.lc.finish_run("SALES", identity, {"EXTRACT": "success", "LOAD": "upstream_failed", "NOTIFY": None,
                                                   "NOT_A_TASK": "success"})  # fmt: skip
    after = datetime.now(UTC)
    assert (outcome.pipeline_run_id, outcome.status, outcome.already_ended) == (run_id, "SUCCESS", False)
    assert (outcome.skipped, outcome.lost, outcome.failed, outcome.sla_status) == (
        ("LOAD", "NOTIFY"),
        (),
        (),
        "MET",
    )
    tasks = db.task_runs(run_id)
    assert sorted(tasks) == ["EXTRACT", "LOAD", "NOTIFY"]
    for code, state in (("LOAD", "upstream_failed"), ("NOTIFY", "none")):
        row = tasks[code]
        assert within(db, row["START_DATE"], before, after) and row["END_DATE"] == row["START_DATE"]
        assert (row["STATUS"], row["ATTEMPT_COUNT"], row["ERROR_MESSAGE"], row["TASK_LOG"]) == (
            "SKIPPED",
            0,
            None,
            f"not run by Airflow (Airflow state: {state})",
        )
        assert db.attempts(row["TASK_RUN_ID"]) == []
    run = db.run(run_id)
    assert within(db, run["END_DATE"], before, after)
    assert (
        run["STATUS"],
        run["ENDED_BY"],
        run["ENDED_BY_KIND"],
        run["SLA_STATUS"],
        run["OUTPUT_REVISION"],
    ) == ("SUCCESS", identity.run_key, "ORCHESTRATOR", "MET", 1)


def test_finish_run_records_a_task_failed_in_airflow_before_it_started(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    outcome = db.lc.finish_run(
        "SALES", identity, {"EXTRACT": "failed", "LOAD": "upstream_failed", "NOTIFY": "skipped"}
    )
    assert (outcome.status, outcome.failed, outcome.skipped) == ("FAILED", ("EXTRACT",), ("LOAD", "NOTIFY"))
    row = db.task_run(run_id, "EXTRACT")
    why = "failed in Airflow before it recorded an attempt (Airflow state: failed)"
    assert (row["STATUS"], row["ATTEMPT_COUNT"], row["ERROR_MESSAGE"], row["TASK_LOG"]) == (
        "FAILED",
        0,
        why,
        why,
    )
    assert db.run(run_id)["STATUS"] == "FAILED"


def test_finish_run_closes_live_attempts_lost_and_their_task_runs_failed(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    live = db.lc.start_task("SALES", "EXTRACT", identity, 1)
    alert = db.lc.start_task("SALES", "NOTIFY", identity, 1)
    outcome = db.lc.finish_run(
        "SALES", identity, {"EXTRACT": "running", "LOAD": "upstream_failed", "NOTIFY": "running"}
    )
    assert (outcome.status, outcome.lost, outcome.failed, outcome.skipped) == (
        "FAILED",
        ("EXTRACT", "NOTIFY"),
        ("EXTRACT", "NOTIFY"),
        ("LOAD",),
    )
    for handle, code in ((live, "EXTRACT"), (alert, "NOTIFY")):
        (attempt,) = db.attempts(handle.task_run_id)
        assert (attempt["STATUS"], attempt["ERROR_MESSAGE"]) == (
            "LOST",
            "lost: the attempt was still live when the DAG run finished (its worker ended without recording, or the "
            "task was marked by hand while it ran)",
        )
        assert attempt["ENDED_AT"] is not None
        row = db.task_run(run_id, code)
        assert (row["STATUS"], row["ERROR_MESSAGE"], row["ATTEMPT_COUNT"]) == (
            "FAILED",
            "failed: its attempt was lost (the worker ended without recording)",
            1,
        )
        assert row["END_DATE"] is not None
    assert db.run(run_id)["STATUS"] == "FAILED"


@pytest.mark.parametrize(
    ("results", "final"),
    [
        ({"EXTRACT": "SUCCESS", "LOAD": "FAILED", "NOTIFY": "SUCCESS"}, "FAILED"),
        ({"EXTRACT": "SUCCESS", "LOAD": "CANCELLED"}, "FAILED"),
        ({"EXTRACT": "SUCCESS", "LOAD": "SUCCESS", "NOTIFY": "FAILED"}, "SUCCESS"),
        ({"EXTRACT": "SUCCESS", "NOTIFY": "CANCELLED"}, "SUCCESS"),
        ({}, "SKIPPED"),
    ],
    ids=[
        "data-task-failed",
        "data-task-cancelled",
        "only-alert-failed",
        "only-alert-cancelled",
        "all-skipped",
    ],
)
def test_finish_run_decides_the_run_status(db: Db, results: dict[str, str], final: str) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    for code, status in results.items():
        db.lc.finish_task(db.lc.start_task("SALES", code, identity, 1), status, error=None if status == "SUCCESS"
                          else f"{code} {status.lower()}")  # fmt: skip
    states = {code: {"SUCCESS": "success", "FAILED": "failed", "CANCELLED": "failed"}.get(results.get(code, ""),
              "skipped") for code in SALES_TASKS}  # fmt: skip
    outcome = db.lc.finish_run("SALES", identity, states)
    assert outcome.status == final
    assert db.run(run_id)["STATUS"] == final
    failing = tuple(sorted(c for c, s in results.items() if s in ("FAILED", "CANCELLED")))
    assert outcome.failed == failing
    assert outcome.skipped == tuple(c for c in SALES_TASKS if c not in results)
    assert {c: r["STATUS"] for c, r in db.task_runs(run_id).items()} == {
        c: results.get(c, "SKIPPED") for c in SALES_TASKS
    }


@pytest.mark.parametrize(("pipeline", "sla"), [("SALES", "MET"), ("TINY_SLA", "BREACHED"), ("NO_SLA", None)])
def test_sla_status_is_set_once_from_sla_in_hours(db: Db, pipeline: str, sla: str | None) -> None:
    identity = ident()
    run_id = db.lc.claim(pipeline, identity).pipeline_run_id
    time.sleep(0.01)  # 0.0000001 hours is 0.36 ms: make sure the run took longer
    outcome = db.lc.finish_run(
        pipeline, identity, {"ONLY": "success"} if pipeline != "SALES" else ALL_SUCCESS
    )
    assert outcome.sla_status == sla
    assert db.run(run_id)["SLA_STATUS"] == sla
    # The SLA flips in CFG (generous <-> tiny); a reopen and a second finish never change SLA_STATUS.
    new_hours = {"SALES": 0.0000001, "TINY_SLA": 1000, "NO_SLA": None}[pipeline]
    db.execute("UPDATE CFG_PIPELINES SET SLA_IN_HOURS = ? WHERE PIPELINE_CODE = ?", new_hours, pipeline)
    assert db.lc.claim(pipeline, identity).action == "REOPENED"
    assert db.run(run_id)["SLA_STATUS"] == sla
    time.sleep(0.01)
    again = db.lc.finish_run(pipeline, identity, {"ONLY": "success"} if pipeline != "SALES" else ALL_SUCCESS)
    assert again.sla_status == sla
    row = db.run(run_id)
    assert (row["SLA_STATUS"], row["OUTPUT_REVISION"]) == (sla, 2)


def test_finishing_an_ended_run_changes_nothing(db: Db) -> None:
    identity = ident()
    run_id = claim_and_finish(
        db, identity, states={"EXTRACT": "failed", "LOAD": "skipped", "NOTIFY": "skipped"}
    )
    snapshot = (db.runs(), db.task_runs(run_id), db.interventions())
    outcome = db.lc.finish_run("SALES", identity, ALL_SUCCESS)
    assert (outcome.pipeline_run_id, outcome.status, outcome.already_ended, outcome.sla_status) == (
        run_id,
        "FAILED",
        True,
        "MET",
    )
    assert (outcome.skipped, outcome.lost, outcome.failed) == ((), (), ())
    assert (db.runs(), db.task_runs(run_id), db.interventions()) == snapshot


def test_finish_run_without_a_run_is_a_run_state_error(db: Db) -> None:
    with pytest.raises(
        RunStateError, match=r"no Engine run of pipeline SALES has the run key airflow:sales_dag:nope"
    ):
        db.lc.finish_run("SALES", ident("nope"), ALL_SUCCESS)
    db.lc.claim("NO_SLA", ident("nope"))  # the key belongs to another pipeline's run
    with pytest.raises(RunStateError):
        db.lc.finish_run("SALES", ident("nope"), ALL_SUCCESS)
    assert db.aud_counts() == (1, 0, 0, 0)


# -- hostile values -----------------------------------------------------------------------------------------


def test_quotes_and_sql_in_dag_and_run_ids_are_stored_verbatim(db: Db) -> None:
    dag_id = "d'; DROP TABLE CFG_TASKS; --"
    run_id = 'manual__x\'); DELETE FROM AUD_PIPELINES_RUN_LOG; --:2026-01-01T00:00:00+00:00 "q" %s ?'
    identity = ident(run_id, dag_id=dag_id)
    key = f"airflow:{dag_id}:{run_id}"
    assert identity.run_key == key and RunIdentity.parse_run_key(key) == (dag_id, run_id)
    outcome = db.lc.claim("SALES", identity, list(SALES_TASKS))
    assert outcome.action == "CREATED"
    handle = db.lc.start_task("SALES", "EXTRACT", identity, 1, log_path="/logs/'; DROP TABLE X; --")
    db.lc.finish_task(handle, "FAILED", error="syntax error near '; DROP TABLE AUD_TASK_ATTEMPTS; --")
    finished = db.lc.finish_run(
        "SALES",
        identity,
        {
            "EXTRACT": "failed",
            "LOAD": "upstream_failed",
            "NOTIFY": "skipped",
            "x'); DROP TABLE CFG_PIPELINES; --": "failed",
        },
    )
    assert finished.status == "FAILED"
    run = db.run(outcome.pipeline_run_id)
    assert (run["RUN_KEY"], run["STARTED_BY"], run["OWNER_ID"], run["ENDED_BY"]) == (key, key, key, key)
    (attempt,) = db.attempts(handle.task_run_id)
    assert (attempt["REQUESTED_BY"], attempt["LOG_PATH"], attempt["ERROR_MESSAGE"]) == (
        key,
        "/logs/'; DROP TABLE X; --",
        "syntax error near '; DROP TABLE AUD_TASK_ATTEMPTS; --",
    )
    # The run key is found again by value: resume, reopen.
    assert db.lc.claim("SALES", identity).action == "REOPENED"
    assert db.interventions()[0]["REASON"] == f"Airflow DAG run {run_id} of {dag_id} ran again (cleared)"
    # Hostile task codes are looked up as values and refused; hostile pipeline codes never reach SQL.
    with pytest.raises(MetadataError, match="task X'; DROP TABLE CFG_TASKS; -- is not an active task"):
        db.lc.start_task("SALES", "X'; DROP TABLE CFG_TASKS; --", identity, 1)
    with pytest.raises(ValueError, match="lock name"):
        db.lc.claim("S'; DROP TABLE CFG_PIPELINES; --", identity)
    # Everything survived.
    assert db.hook.engine.table_names(db.lc.conn) >= ENGINE_TABLES
    assert db.scalar("SELECT COUNT(*) FROM CFG_TASKS") == 7
    assert db.scalar("SELECT COUNT(*) FROM CFG_PIPELINES") == 4
    assert db.aud_counts() == (1, 3, 1, 1)


def test_a_count_beyond_64_bits_fails_the_task_cleanly(db: Db) -> None:
    identity = ident()
    db.lc.claim("SALES", identity)
    handle = db.lc.start_task("SALES", "EXTRACT", identity, 1)
    try:
        with pytest.raises(TaskFailedError, match="rows_written"):
            db.lc.finish_task(handle, "SUCCESS", TaskCounts.from_result({"rows_written": 2**63}))
    finally:
        print("attempt after the failed recording:", db.attempts(handle.task_run_id)[0]["STATUS"])


def test_a_repair_finish_does_not_evaluate_an_sla_the_first_finish_did_not_have(db: Db) -> None:
    identity = ident()
    run_id = claim_and_finish(db, identity, "NO_SLA", {"ONLY": "success"})
    assert db.run(run_id)["SLA_STATUS"] is None
    db.execute("UPDATE CFG_PIPELINES SET SLA_IN_HOURS = ? WHERE PIPELINE_CODE = ?", 0.0000001, "NO_SLA")
    assert db.lc.claim("NO_SLA", identity).action == "REOPENED"
    time.sleep(0.01)
    db.lc.finish_run("NO_SLA", identity, {"ONLY": "success"})
    assert db.run(run_id)["SLA_STATUS"] is None


def test_one_dag_run_drives_two_pipelines_with_the_same_run_key(db: Db) -> None:
    identity = ident()
    sales = db.lc.claim("SALES", identity).pipeline_run_id
    other = db.lc.claim("NO_SLA", identity).pipeline_run_id
    assert sales != other
    a = db.lc.start_task("SALES", "EXTRACT", identity, 1)
    b = db.lc.start_task("NO_SLA", "ONLY", identity, 1)
    assert (a.pipeline_run_id, b.pipeline_run_id) == (sales, other)
    db.lc.finish_task(b, "FAILED", error="x")
    assert db.lc.finish_run("NO_SLA", identity, {"ONLY": "failed"}).status == "FAILED"
    assert db.run(sales)["STATUS"] == "IN-PROGRESS"  # the other pipeline's run is untouched
    db.lc.finish_task(a, "SUCCESS")
    assert db.lc.finish_run("SALES", identity, ALL_SUCCESS).status == "SUCCESS"
    assert {r["RUN_KEY"] for r in db.runs()} == {identity.run_key}


def test_claim_and_finish_wait_for_the_pipeline_lock_and_time_out(db: Db) -> None:
    identity = ident()
    with db.hook.lifecycle(lock_timeout=0.3) as impatient:
        with db.hook.lock("pipeline:SALES", timeout=5):
            with pytest.raises(LockTimeoutError, match=r"lock 'pipeline:SALES'"):
                impatient.claim("SALES", identity)
            assert db.aud_counts() == (0, 0, 0, 0)
            assert impatient.claim("NO_SLA", identity).action == "CREATED"  # other pipelines are not held up
        assert impatient.claim("SALES", identity).action == "CREATED"
        with db.hook.lock("pipeline:SALES", timeout=5):
            with pytest.raises(LockTimeoutError):
                impatient.finish_run("SALES", identity, ALL_SUCCESS)
            # Task attempts take no pipeline lock: a running pipeline's tasks are not serialised.
            impatient.finish_task(impatient.start_task("SALES", "EXTRACT", identity, 1), "SUCCESS")
        assert (
            db.run(db.scalar("SELECT MAX(PIPELINE_RUN_ID) FROM AUD_PIPELINES_RUN_LOG"))["STATUS"]
            == "IN-PROGRESS"
        )
        assert impatient.finish_run("SALES", identity, ALL_SUCCESS).status == "SUCCESS"


def test_a_late_duplicate_of_an_ended_try_does_not_kill_the_live_later_try(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    db.lc.finish_task(db.lc.start_task("SALES", "EXTRACT", identity, 1), "FAILED", error="boom")
    second = db.lc.start_task("SALES", "EXTRACT", identity, 2)
    try:
        with pytest.raises(StaleTransitionError):
            db.lc.start_task("SALES", "EXTRACT", identity, 1)  # a redelivered message of the failed try 1
    finally:
        attempts = db.attempts(second.task_run_id)
        assert [(a["ATTEMPT_NUMBER"], a["STATUS"]) for a in attempts] == [(1, "FAILED"), (2, "RUNNING")]
        assert db.task_run(run_id, "EXTRACT")["ATTEMPT_COUNT"] == 2
    db.lc.finish_task(second, "SUCCESS")  # the live try still records its result


# -- Airflow execution paths: skips, reschedules and deferrals, map indexes, marks --------------------------


def test_a_skipped_attempt_is_cancelled_and_its_task_run_skipped_with_the_reason(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    handle = db.lc.start_task("SALES", "EXTRACT", identity, 1)
    db.lc.finish_task(handle, "SKIPPED", error="nothing to do today")
    (attempt,) = db.attempts(handle.task_run_id)
    assert (attempt["STATUS"], attempt["ERROR_MESSAGE"]) == ("CANCELLED", None)
    assert db.scalar("SELECT TASK_LOG FROM AUD_TASK_ATTEMPTS WHERE ATTEMPT_ID = ?", handle.attempt_id) == (
        "skipped: nothing to do today"
    )
    row = db.task_run(run_id, "EXTRACT")
    assert (row["STATUS"], row["ERROR_MESSAGE"], row["TASK_LOG"]) == (
        "SKIPPED",
        None,
        "skipped: nothing to do today",
    )
    outcome = db.lc.finish_run(
        "SALES", identity, {"EXTRACT": "skipped", "LOAD": "skipped", "NOTIFY": "skipped"}
    )
    assert outcome.status == "SKIPPED"


def test_a_parked_attempt_is_taken_over_by_its_try_once_and_counts_once(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    first = db.lc.start_task("SALES", "EXTRACT", identity, 1)
    db.lc.park_task(first, "rescheduled by Airflow: the next poke is due at 2026-01-02T06:01:00Z")
    (parked,) = db.attempts(first.task_run_id)
    assert parked["STATUS"] == "QUEUED"
    # A second delivery of the same try while it is parked cannot open another attempt.
    with pytest.raises(StaleTransitionError, match="already has a live attempt"):
        db.lc.start_task("SALES", "EXTRACT", identity, 1)
    poke = db.lc.start_task("SALES", "EXTRACT", identity, 1, resume=True)
    assert (poke.attempt_id, poke.attempt_number) == (first.attempt_id, 1) and poke.owner_id != first.owner_id
    assert db.scalar("SELECT TASK_LOG FROM AUD_TASK_ATTEMPTS WHERE ATTEMPT_ID = ?", poke.attempt_id) is None
    with pytest.raises(StaleTransitionError, match="closed by someone else"):  # the old owner lost it
        db.lc.park_task(first, "again")
    # Taken over once: a duplicate resume finds nothing parked and is refused as a duplicate delivery.
    with pytest.raises(StaleTransitionError, match="already has a live attempt"):
        db.lc.start_task("SALES", "EXTRACT", identity, 1, resume=True)
    db.lc.finish_task(poke, "SUCCESS", TaskCounts(rows_written=4))
    (attempt,) = db.attempts(first.task_run_id)
    assert (attempt["ATTEMPT_ID"], attempt["STATUS"], attempt["ROWS_WRITTEN"]) == (
        first.attempt_id,
        "SUCCESS",
        4,
    )
    assert (db.task_run(run_id, "EXTRACT")["STATUS"], db.task_run(run_id, "EXTRACT")["ATTEMPT_COUNT"]) == (
        "SUCCESS",
        1,
    )


def test_a_resume_with_nothing_parked_opens_the_attempt(db: Db) -> None:
    """start_from_trigger: the try's first code on a worker is the resumed method."""
    identity = ident()
    db.lc.claim("SALES", identity)
    handle = db.lc.start_task("SALES", "EXTRACT", identity, 1, resume=True)
    assert [a["STATUS"] for a in db.attempts(handle.task_run_id)] == ["RUNNING"]


def test_map_indexes_are_attempts_of_one_task_run_settled_over_every_index(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    handles = [db.lc.start_task("SALES", "LOAD", identity, 1, map_index=i) for i in range(3)]
    assert len({h.task_run_id for h in handles}) == 1
    with pytest.raises(StaleTransitionError):  # a duplicate delivery of map index 1, try 1
        db.lc.start_task("SALES", "LOAD", identity, 1, map_index=1)
    db.lc.finish_task(handles[0], "SUCCESS", TaskCounts(rows_written=2), map_count=3)
    assert db.task_run(run_id, "LOAD")["STATUS"] == "IN-PROGRESS"  # two indexes still live
    db.lc.finish_task(handles[1], "SKIPPED", error="no file today", map_count=3)
    db.lc.finish_task(handles[2], "FAILED", error="ValueError: bad file", map_count=3)
    row = db.task_run(run_id, "LOAD")
    assert (row["STATUS"], row["ERROR_MESSAGE"], row["ROWS_WRITTEN"]) == (
        "FAILED", "map index 2 FAILED: ValueError: bad file", 2,
    )  # fmt: skip
    retry = db.lc.start_task("SALES", "LOAD", identity, 2, map_index=2)  # the failed index's retry
    assert db.task_run(run_id, "LOAD")["STATUS"] == "IN-PROGRESS"
    db.lc.finish_task(retry, "SUCCESS", TaskCounts(rows_written=5), map_count=3)
    row = db.task_run(run_id, "LOAD")
    assert (row["STATUS"], row["ATTEMPT_COUNT"], row["ROWS_WRITTEN"], row["ERROR_MESSAGE"], row["TASK_LOG"]) == (
        "SUCCESS", 4, 7, None, "3 map indexes: 2 SUCCESS, 1 SKIPPED, 0 FAILED",
    )  # fmt: skip
    assert db.records(
        "SELECT MAP_INDEX, ATTEMPT_NUMBER, STATUS FROM AUD_TASK_ATTEMPTS WHERE TASK_RUN_ID = ? "
        "ORDER BY MAP_INDEX, ATTEMPT_NUMBER", retry.task_run_id,
    ) == [(0, 1, "SUCCESS"), (1, 1, "CANCELLED"), (2, 1, "FAILED"), (2, 2, "SUCCESS")]  # fmt: skip


def test_finish_settles_a_mapped_task_with_airflows_view_of_indexes_that_never_recorded(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    handle = db.lc.start_task("SALES", "LOAD", identity, 1, map_index=0)
    db.lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=1), map_count=2)
    # Map index 1 failed in Airflow before it recorded anything (e.g. its worker could not start it).
    outcome = db.lc.finish_run(
        "SALES", identity, {"EXTRACT": "success", "NOTIFY": "skipped"}, {"LOAD": {0: "success", 1: "failed"}}
    )
    assert outcome.status == "FAILED" and outcome.failed == ("LOAD",)
    row = db.task_run(run_id, "LOAD")
    assert (row["STATUS"], row["ROWS_WRITTEN"]) == ("FAILED", 1)
    assert (
        row["ERROR_MESSAGE"] == "map index 1 FAILED: failed in Airflow before it recorded an attempt (failed)"
    )


@pytest.mark.parametrize(
    ("recorded", "marked", "expected"),
    [("FAILED", "success", "SUCCESS"), ("SUCCESS", "failed", "FAILED"), ("CANCELLED", "success", "SUCCESS")],
)
def test_finish_follows_a_task_marked_by_hand_and_records_a_mark(db: Db, recorded: str, marked: str,
                                                                 expected: str) -> None:  # fmt: skip
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    db.lc.finish_task(db.lc.start_task("SALES", "EXTRACT", identity, 1), recorded, error=None)
    db.lc.finish_task(db.lc.start_task("SALES", "LOAD", identity, 1), "SUCCESS")
    outcome = db.lc.finish_run("SALES", identity, {"EXTRACT": marked, "LOAD": "success", "NOTIFY": "skipped"})
    assert db.task_run(run_id, "EXTRACT")["STATUS"] == expected
    assert outcome.status == ("SUCCESS" if expected == "SUCCESS" else "FAILED")
    (mark,) = db.interventions()
    assert (mark["ACTION"], mark["FROM_STATUS"], mark["TO_STATUS"], mark["TASK_ID"]) == (
        "MARK", recorded, expected, db.scalar("SELECT TASK_ID FROM CFG_TASKS WHERE TASK_CODE = 'EXTRACT'"),
    )  # fmt: skip
    assert mark["REASON"].startswith(f"marked {marked} in Airflow (by hand in the UI or API)")


def test_finish_records_a_task_marked_success_before_it_ran_with_a_mark(db: Db) -> None:
    identity = ident()
    run_id = db.lc.claim("SALES", identity).pipeline_run_id
    db.lc.finish_task(db.lc.start_task("SALES", "EXTRACT", identity, 1), "SUCCESS")
    outcome = db.lc.finish_run("SALES", identity, ALL_SUCCESS)
    assert outcome.status == "SUCCESS"
    row = db.task_run(run_id, "LOAD")
    assert (row["STATUS"], row["ATTEMPT_COUNT"]) == ("SUCCESS", 0)
    assert [(i["ACTION"], i["FROM_STATUS"], i["TO_STATUS"]) for i in db.interventions()] == [
        ("MARK", None, "SUCCESS")
    ]
