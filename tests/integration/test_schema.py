"""The Engine DB schema enforces its own rules (docs/schema.md), the same way on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime
import hashlib
import re
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg2
import pytest

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"

KINDS = ("HUMAN", "SCHEDULE", "ORCHESTRATOR", "WORKER", "SYSTEM")
YES_NO = ("Y", "N")
DEPENDENCY_TYPES = ("SUCCESS", "FAILURE", "ALWAYS", "HAS_DATA")
LIVE_ATTEMPT_STATUSES = ("QUEUED", "CLAIMED", "RUNNING")
ENDED_ATTEMPT_STATUSES = ("SUCCESS", "FAILED", "TIMED_OUT", "CANCELLED", "LOST")
RUN_STATUSES = ("QUEUED", "IN-PROGRESS", "SUCCESS", "FAILED", "SKIPPED", "CANCELLED")
ACTIONS = ("MARK", "NEW_RUN", "CANCEL", "REOPEN", "RESET", "GATE_BYPASS", "IGNORE_DEPENDENCIES", "RERUN")
AUDIT = "CREATED_BY CREATE_DATE UPDATED_BY UPDATED_DATE"
COUNTS = "SOURCE_COUNT TARGET_COUNT INSERT_COUNT UPDATE_COUNT DELETE_COUNT"

# docs/schema.md, table by table.
SCHEMA_COLUMNS: dict[str, set[str]] = {
    table: set(columns.split())
    for table, columns in {
        "CFG_PIPELINES": "PIPELINE_ID PIPELINE_CODE PIPELINE_NAME DESCRIPTION RUN_SCHEDULE SLA_IN_HOURS "
        f"REFRESH_TYPE ACTIVE_FLAG PIPELINE_PARAMETERS {AUDIT}",
        "CFG_PIPELINE_DEPENDENCY": "PIPELINE_DEPENDENCY_ID PIPELINE_ID DEPENDS_ON_PIPELINE_ID DEPENDENCY_TYPE "
        f"CONSUME_REPAIRS ACTIVE_FLAG {AUDIT}",
        "CFG_TASKS": "TASK_ID TASK_CODE TASK_TYPE PIPELINE_ID HANDLER RUN_CONDITION RUN_CONDITION_COUNT "
        f"ACTIVE_FLAG {AUDIT}",
        "CFG_TASK_DEPENDENCY": "TASK_DEPENDENCY_ID PIPELINE_ID TASK_ID DEPENDS_ON_PIPELINE_ID DEPENDS_ON_TASK_ID "
        f"DEPENDENCY_TYPE CONSUME_REPAIRS ACTIVE_FLAG {AUDIT}",
        "CFG_TASK_PARAMETERS": f"TASK_PARAMETER_ID TASK_ID PARAMETER_NAME PARAMETER_VALUE ACTIVE_FLAG {AUDIT}",
        "AUD_PIPELINES_RUN_LOG": "PIPELINE_RUN_ID PIPELINE_ID START_DATE END_DATE STATUS SLA_STATUS RUN_DATE "
        "BACKFILL RUN_KEY TRIGGER_KIND OWNER_ID LEASE_EXPIRES_AT OUTPUT_REVISION STARTED_BY STARTED_BY_KIND "
        "ENDED_BY ENDED_BY_KIND REPAIR_PENDING",
        "AUD_TASK_RUN_LOG": "TASK_RUN_ID TASK_ID PIPELINE_RUN_ID START_DATE END_DATE STATUS ATTEMPT_COUNT "
        f"{COUNTS} ROWS_WRITTEN ERROR_MESSAGE TASK_LOG",
        "AUD_TASK_ATTEMPTS": "ATTEMPT_ID TASK_RUN_ID ATTEMPT_NUMBER MAP_INDEX STATUS OWNER_ID LEASE_EXPIRES_AT "
        f"HEARTBEAT_AT QUEUED_AT CLAIMED_AT STARTED_AT ENDED_AT HOST PID {COUNTS} ROWS_WRITTEN "
        "ERROR_MESSAGE TASK_LOG LOG_PATH REQUESTED_BY REQUESTED_BY_KIND",
        "AUD_GATE_DECISIONS": "DECISION_ID PIPELINE_RUN_ID ATTEMPT_ID PIPELINE_DEPENDENCY_ID TASK_DEPENDENCY_ID "
        "SELECTED_PIPELINE_RUN_ID SELECTED_TASK_RUN_ID SELECTED_REVISION RESULT REASON DECIDED_AT",
        "AUD_DEPENDENCY_CONSUMPTION": "CONSUMPTION_ID PIPELINE_DEPENDENCY_ID TASK_DEPENDENCY_ID PIPELINE_ID "
        "PIPELINE_RUN_ID TASK_ID DEPENDS_ON_PIPELINE_ID CONSUMED_PIPELINE_RUN_ID CONSUMED_TASK_RUN_ID "
        "CONSUMED_AT CONSUMED_REVISION",
        "AUD_PIPELINE_PAUSES": "PIPELINE_PAUSE_ID PIPELINE_ID PAUSED_AT PAUSED_BY PAUSED_BY_KIND REASON "
        "RESUMED_AT RESUMED_BY RESUMED_BY_KIND RESUME_REASON",
        "AUD_RUN_INTERVENTIONS": "INTERVENTION_ID PIPELINE_ID PIPELINE_RUN_ID TASK_ID ACTION FROM_STATUS "
        "TO_STATUS REASON REQUESTED_BY REQUESTED_BY_KIND REQUESTED_AT",
        "SCHEMA_MIGRATIONS": "SOURCE VERSION CHECKSUM APPLIED_AT",
        # ENGINE 0005 (docs/retention.md).
        "AUD_ENGINE_PURGES": "PURGE_ID STATUS REQUESTED_BY REQUESTED_BY_KIND HOST PID STARTED_AT HEARTBEAT_AT "
        "ENDED_AT CUTOFF PIPELINE_CODE BATCH_SIZE ARCHIVE_DIR BATCHES RUNS_DELETED TASK_RUNS_DELETED "
        "ATTEMPTS_DELETED GATE_DECISIONS_DELETED CONSUMPTIONS_DELETED PAUSES_DELETED INTERVENTIONS_DELETED "
        "RESUMED_BY_PURGE_ID MESSAGE BATCH_OPEN",
    }.items()
}

# Every value list of docs/schema.md, keyed by (table, column).
VALUE_LISTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("CFG_PIPELINES", "REFRESH_TYPE"): ("FULL", "INCREMENTAL"),
    ("CFG_PIPELINES", "ACTIVE_FLAG"): YES_NO,
    ("CFG_PIPELINE_DEPENDENCY", "DEPENDENCY_TYPE"): DEPENDENCY_TYPES,
    ("CFG_PIPELINE_DEPENDENCY", "CONSUME_REPAIRS"): YES_NO,
    ("CFG_PIPELINE_DEPENDENCY", "ACTIVE_FLAG"): YES_NO,
    ("CFG_TASKS", "TASK_TYPE"): ("INGESTION", "ETL"),
    ("CFG_TASKS", "HANDLER"): ("PYTHON", "SQL", "BUSINESS_RULES", "EMAIL_ALERT"),
    ("CFG_TASKS", "RUN_CONDITION"): ("ALL", "ANY", "N"),
    ("CFG_TASKS", "ACTIVE_FLAG"): YES_NO,
    ("CFG_TASK_DEPENDENCY", "DEPENDENCY_TYPE"): DEPENDENCY_TYPES,
    ("CFG_TASK_DEPENDENCY", "CONSUME_REPAIRS"): YES_NO,
    ("CFG_TASK_DEPENDENCY", "ACTIVE_FLAG"): YES_NO,
    ("CFG_TASK_PARAMETERS", "ACTIVE_FLAG"): YES_NO,
    ("AUD_PIPELINES_RUN_LOG", "STATUS"): RUN_STATUSES,
    ("AUD_PIPELINES_RUN_LOG", "SLA_STATUS"): ("MET", "BREACHED"),
    ("AUD_PIPELINES_RUN_LOG", "BACKFILL"): YES_NO,
    ("AUD_PIPELINES_RUN_LOG", "TRIGGER_KIND"): ("SCHEDULE", "MANUAL", "BACKFILL", "ORCHESTRATOR", "STAND_IN"),
    ("AUD_PIPELINES_RUN_LOG", "STARTED_BY_KIND"): KINDS,
    ("AUD_PIPELINES_RUN_LOG", "ENDED_BY_KIND"): KINDS,
    ("AUD_PIPELINES_RUN_LOG", "REPAIR_PENDING"): YES_NO,
    ("AUD_TASK_RUN_LOG", "STATUS"): ("IN-PROGRESS", "SUCCESS", "FAILED", "SKIPPED", "CANCELLED"),
    ("AUD_TASK_ATTEMPTS", "STATUS"): LIVE_ATTEMPT_STATUSES + ENDED_ATTEMPT_STATUSES,
    ("AUD_TASK_ATTEMPTS", "REQUESTED_BY_KIND"): KINDS,
    ("AUD_GATE_DECISIONS", "RESULT"): ("SATISFIED", "UNSATISFIED", "BYPASSED"),
    ("AUD_PIPELINE_PAUSES", "PAUSED_BY_KIND"): KINDS,
    ("AUD_PIPELINE_PAUSES", "RESUMED_BY_KIND"): KINDS,
    ("AUD_RUN_INTERVENTIONS", "ACTION"): ACTIONS,
    ("AUD_RUN_INTERVENTIONS", "REQUESTED_BY_KIND"): KINDS,
    ("SCHEMA_MIGRATIONS", "SOURCE"): ("ENGINE", "PROJECT"),
    ("AUD_ENGINE_PURGES", "STATUS"): ("RUNNING", "DONE", "FAILED", "INTERRUPTED"),
    ("AUD_ENGINE_PURGES", "REQUESTED_BY_KIND"): KINDS,
    ("AUD_ENGINE_PURGES", "BATCH_OPEN"): YES_NO,
}

VALUE_LIST_IDS = [f"{table}.{column}" for table, column in VALUE_LISTS]

ID_COLUMNS = {
    "CFG_PIPELINES": "PIPELINE_ID",
    "CFG_PIPELINE_DEPENDENCY": "PIPELINE_DEPENDENCY_ID",
    "CFG_TASKS": "TASK_ID",
    "CFG_TASK_DEPENDENCY": "TASK_DEPENDENCY_ID",
    "CFG_TASK_PARAMETERS": "TASK_PARAMETER_ID",
    "AUD_PIPELINES_RUN_LOG": "PIPELINE_RUN_ID",
    "AUD_TASK_RUN_LOG": "TASK_RUN_ID",
    "AUD_TASK_ATTEMPTS": "ATTEMPT_ID",
    "AUD_GATE_DECISIONS": "DECISION_ID",
    "AUD_DEPENDENCY_CONSUMPTION": "CONSUMPTION_ID",
    "AUD_PIPELINE_PAUSES": "PIPELINE_PAUSE_ID",
    "AUD_RUN_INTERVENTIONS": "INTERVENTION_ID",
    "AUD_ENGINE_PURGES": "PURGE_ID",
}
APPEND_ONLY_TABLES = ("AUD_GATE_DECISIONS", "AUD_DEPENDENCY_CONSUMPTION")


# --------------------------------------------------------------------------- applying the schema


def schema_files(dialect: str) -> list[Path]:
    """The latest schema of a dialect: the baseline schema.sql, then its ENGINE migrations in order."""
    return [SQL_DIR / dialect / "schema.sql", *sorted((SQL_DIR / dialect / "migrations").glob("*.sql"))]


def apply_sqlite_schema(conn: sqlite3.Connection) -> None:
    """Run the SQLite schema files statement by statement in one transaction (foreign keys off while a
    migration rebuilds a table, checked before COMMIT: SQLite's documented procedure)."""
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.execute("BEGIN")
    for path in schema_files("sqlite"):
        statement = ""
        for line in path.read_text().splitlines(keepends=True):
            statement += line
            if sqlite3.complete_statement(statement):
                conn.execute(statement)
                statement = ""
        assert not statement.strip(), f"{path.name} ends with an incomplete statement: {statement!r}"
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    conn.execute("COMMIT")
    conn.execute("PRAGMA foreign_keys=ON")


def apply_postgresql_schema(conn: Any) -> None:
    """Run the PostgreSQL schema files, each as one execute, in one transaction."""
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        for path in schema_files("postgresql"):
            cur.execute(path.read_text())
        cur.execute("COMMIT")


def sqlite_engine_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys=ON")
    apply_sqlite_schema(conn)
    return conn


@dataclass
class EngineDB:
    """A live Engine DB of either dialect; SQL is written with `?` placeholders."""

    dialect: str
    conn: Any
    driver: ModuleType

    @property
    def IntegrityError(self) -> type[Exception]:
        return self.driver.IntegrityError

    @property
    def DataError(self) -> type[Exception]:
        return self.driver.DataError

    def execute(self, sql: str, params: tuple[Any, ...] | None = None) -> Any:
        if self.dialect == "postgresql":
            cur = self.conn.cursor()
            cur.execute(sql.replace("?", "%s"), params)
            return cur
        return self.conn.execute(sql, params or ())

    def scalar(self, sql: str, params: tuple[Any, ...] | None = None) -> Any:
        return self.execute(sql, params).fetchall()[0][0]

    def insert(self, table: str, **values: Any) -> int | None:
        """Insert one row; return its surrogate key (None for SCHEMA_MIGRATIONS)."""
        columns = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        id_column = ID_COLUMNS.get(table)
        returning = f" RETURNING {id_column}" if id_column else ""
        cur = self.execute(
            f"INSERT INTO {table} ({columns}) VALUES ({marks}){returning}", tuple(values.values())
        )
        return cur.fetchall()[0][0] if id_column else None

    def row(self, table: str, row_id: int) -> dict[str, Any]:
        cur = self.execute(f"SELECT * FROM {table} WHERE {ID_COLUMNS[table]} = ?", (row_id,))
        names = [d[0].upper() for d in cur.description]
        return dict(zip(names, cur.fetchall()[0], strict=True))


@dataclass
class Rows:
    """Inserts valid rows; every column not given gets a valid value, and parents are created as needed."""

    db: EngineDB
    _serial: int = 0

    def code(self, prefix: str) -> str:
        self._serial += 1
        return f"{prefix}_{self._serial}"

    def add(self, table: str, **values: Any) -> int | None:
        return getattr(self, table.lower())(**values)

    def cfg_pipelines(self, **v: Any) -> int:
        v.setdefault("PIPELINE_CODE", self.code("PIPE"))
        v.setdefault("PIPELINE_NAME", "Pipeline")
        v.setdefault("REFRESH_TYPE", "FULL")
        return self.db.insert("CFG_PIPELINES", **v)

    def cfg_pipeline_dependency(self, **v: Any) -> int:
        if "PIPELINE_ID" not in v:
            v["PIPELINE_ID"] = self.cfg_pipelines()
        if "DEPENDS_ON_PIPELINE_ID" not in v:
            v["DEPENDS_ON_PIPELINE_ID"] = self.cfg_pipelines()
        v.setdefault("DEPENDENCY_TYPE", "SUCCESS")
        return self.db.insert("CFG_PIPELINE_DEPENDENCY", **v)

    def cfg_tasks(self, **v: Any) -> int:
        if "PIPELINE_ID" not in v:
            v["PIPELINE_ID"] = self.cfg_pipelines()
        v.setdefault("TASK_CODE", self.code("TASK"))
        v.setdefault("TASK_TYPE", "ETL")
        v.setdefault("HANDLER", "PYTHON")
        return self.db.insert("CFG_TASKS", **v)

    def cfg_task_dependency(self, **v: Any) -> int:
        if "PIPELINE_ID" not in v:
            v["PIPELINE_ID"] = self.cfg_pipelines()
        if "TASK_ID" not in v:
            v["TASK_ID"] = self.cfg_tasks(PIPELINE_ID=v["PIPELINE_ID"])
        if "DEPENDS_ON_TASK_ID" not in v:
            upstream_pipeline = v.get("DEPENDS_ON_PIPELINE_ID") or v["PIPELINE_ID"]
            v["DEPENDS_ON_TASK_ID"] = self.cfg_tasks(PIPELINE_ID=upstream_pipeline)
        v.setdefault("DEPENDENCY_TYPE", "SUCCESS")
        return self.db.insert("CFG_TASK_DEPENDENCY", **v)

    def cfg_task_parameters(self, **v: Any) -> int:
        if "TASK_ID" not in v:
            v["TASK_ID"] = self.cfg_tasks()
        v.setdefault("PARAMETER_NAME", "batch_size")
        return self.db.insert("CFG_TASK_PARAMETERS", **v)

    def aud_pipelines_run_log(self, **v: Any) -> int:
        if "PIPELINE_ID" not in v:
            v["PIPELINE_ID"] = self.cfg_pipelines()
        v.setdefault("STATUS", "SUCCESS")
        return self.db.insert("AUD_PIPELINES_RUN_LOG", **v)

    def aud_task_run_log(self, **v: Any) -> int:
        if "TASK_ID" not in v or "PIPELINE_RUN_ID" not in v:
            pipeline_id = self.cfg_pipelines()
            v.setdefault("TASK_ID", self.cfg_tasks(PIPELINE_ID=pipeline_id))
            v.setdefault("PIPELINE_RUN_ID", self.aud_pipelines_run_log(PIPELINE_ID=pipeline_id))
        v.setdefault("STATUS", "SUCCESS")
        return self.db.insert("AUD_TASK_RUN_LOG", **v)

    def aud_task_attempts(self, **v: Any) -> int:
        if "TASK_RUN_ID" not in v:
            v["TASK_RUN_ID"] = self.aud_task_run_log()
        v.setdefault("ATTEMPT_NUMBER", 1)
        v.setdefault("STATUS", "SUCCESS")
        return self.db.insert("AUD_TASK_ATTEMPTS", **v)

    def aud_gate_decisions(self, **v: Any) -> int:
        if "PIPELINE_RUN_ID" not in v:
            v["PIPELINE_RUN_ID"] = self.aud_pipelines_run_log()
        if "PIPELINE_DEPENDENCY_ID" not in v and "TASK_DEPENDENCY_ID" not in v:
            v["PIPELINE_DEPENDENCY_ID"] = self.cfg_pipeline_dependency()
        v.setdefault("RESULT", "SATISFIED")
        return self.db.insert("AUD_GATE_DECISIONS", **v)

    def aud_dependency_consumption(self, **v: Any) -> int:
        downstream, upstream = self.cfg_pipelines(), self.cfg_pipelines()
        if "PIPELINE_DEPENDENCY_ID" not in v and "TASK_DEPENDENCY_ID" not in v:
            v["PIPELINE_DEPENDENCY_ID"] = self.cfg_pipeline_dependency(
                PIPELINE_ID=downstream, DEPENDS_ON_PIPELINE_ID=upstream
            )
        v.setdefault("PIPELINE_ID", downstream)
        v.setdefault("PIPELINE_RUN_ID", self.aud_pipelines_run_log(PIPELINE_ID=downstream))
        v.setdefault("DEPENDS_ON_PIPELINE_ID", upstream)
        v.setdefault("CONSUMED_PIPELINE_RUN_ID", self.aud_pipelines_run_log(PIPELINE_ID=upstream))
        return self.db.insert("AUD_DEPENDENCY_CONSUMPTION", **v)

    def aud_pipeline_pauses(self, **v: Any) -> int:
        if "PIPELINE_ID" not in v:
            v["PIPELINE_ID"] = self.cfg_pipelines()
        return self.db.insert("AUD_PIPELINE_PAUSES", **v)

    def aud_run_interventions(self, **v: Any) -> int:
        if "PIPELINE_ID" not in v:
            v["PIPELINE_ID"] = self.cfg_pipelines()
        v.setdefault("ACTION", "MARK")
        return self.db.insert("AUD_RUN_INTERVENTIONS", **v)

    def aud_engine_purges(self, **v: Any) -> int:
        v.setdefault("STATUS", "DONE")
        v.setdefault("CUTOFF", "2026-01-01T00:00:00.000Z")
        v.setdefault("BATCH_SIZE", 100)
        return self.db.insert("AUD_ENGINE_PURGES", **v)

    def schema_migrations(self, **v: Any) -> None:
        v.setdefault("SOURCE", "ENGINE")
        v.setdefault("VERSION", self.code("0001"))
        v.setdefault("CHECKSUM", hashlib.sha256(v["VERSION"].encode()).hexdigest())
        self.db.insert("SCHEMA_MIGRATIONS", **v)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        engine_db = EngineDB("sqlite", sqlite_engine_db(tmp_path / "engine.db"), sqlite3)
    else:
        conn = request.getfixturevalue("pg_database").connect()
        apply_postgresql_schema(conn)
        engine_db = EngineDB("postgresql", conn, psycopg2)
    yield engine_db
    engine_db.conn.close()


@pytest.fixture
def rows(db: EngineDB) -> Rows:
    return Rows(db)


# --------------------------------------------------------------------------- one active row per code


def test_second_active_pipeline_with_the_same_code_is_refused(db: EngineDB, rows: Rows) -> None:
    rows.cfg_pipelines(PIPELINE_CODE="SALES")
    with pytest.raises(db.IntegrityError):
        rows.cfg_pipelines(PIPELINE_CODE="SALES")


def test_retired_pipeline_code_can_be_reused_but_not_reactivated_beside_it(db: EngineDB, rows: Rows) -> None:
    old = rows.cfg_pipelines(PIPELINE_CODE="SALES")
    db.execute("UPDATE CFG_PIPELINES SET ACTIVE_FLAG = 'N' WHERE PIPELINE_ID = ?", (old,))
    new = rows.cfg_pipelines(PIPELINE_CODE="SALES")

    assert (
        db.scalar("SELECT PIPELINE_ID FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'SALES' AND ACTIVE_FLAG = 'Y'")
        == new
    )
    with pytest.raises(db.IntegrityError):
        db.execute("UPDATE CFG_PIPELINES SET ACTIVE_FLAG = 'Y' WHERE PIPELINE_ID = ?", (old,))


def test_second_active_task_with_the_same_code_in_one_pipeline_is_refused(db: EngineDB, rows: Rows) -> None:
    pipeline = rows.cfg_pipelines()
    rows.cfg_tasks(PIPELINE_ID=pipeline, TASK_CODE="LOAD")
    with pytest.raises(db.IntegrityError):
        rows.cfg_tasks(PIPELINE_ID=pipeline, TASK_CODE="LOAD")


def test_same_task_code_in_another_pipeline_is_allowed(rows: Rows) -> None:
    rows.cfg_tasks(PIPELINE_ID=rows.cfg_pipelines(), TASK_CODE="LOAD")
    rows.cfg_tasks(PIPELINE_ID=rows.cfg_pipelines(), TASK_CODE="LOAD")


def test_retired_task_code_can_be_reused(db: EngineDB, rows: Rows) -> None:
    pipeline = rows.cfg_pipelines()
    old = rows.cfg_tasks(PIPELINE_ID=pipeline, TASK_CODE="LOAD")
    db.execute("UPDATE CFG_TASKS SET ACTIVE_FLAG = 'N' WHERE TASK_ID = ?", (old,))
    new = rows.cfg_tasks(PIPELINE_ID=pipeline, TASK_CODE="LOAD")
    assert new != old


def test_second_active_value_of_a_task_parameter_is_refused(db: EngineDB, rows: Rows) -> None:
    task = rows.cfg_tasks()
    first = rows.cfg_task_parameters(TASK_ID=task, PARAMETER_NAME="batch_size", PARAMETER_VALUE="10")
    with pytest.raises(db.IntegrityError):
        rows.cfg_task_parameters(TASK_ID=task, PARAMETER_NAME="batch_size", PARAMETER_VALUE="20")
    db.execute("UPDATE CFG_TASK_PARAMETERS SET ACTIVE_FLAG = 'N' WHERE TASK_PARAMETER_ID = ?", (first,))
    rows.cfg_task_parameters(TASK_ID=task, PARAMETER_NAME="batch_size", PARAMETER_VALUE="20")


# --------------------------------------------------------------------------- runs, task runs, attempts


def test_second_in_progress_run_of_a_pipeline_is_refused(db: EngineDB, rows: Rows) -> None:
    pipeline = rows.cfg_pipelines()
    rows.aud_pipelines_run_log(PIPELINE_ID=pipeline, STATUS="IN-PROGRESS")
    with pytest.raises(db.IntegrityError):
        rows.aud_pipelines_run_log(PIPELINE_ID=pipeline, STATUS="IN-PROGRESS")


def test_reopening_a_run_beside_an_in_progress_one_is_refused(db: EngineDB, rows: Rows) -> None:
    pipeline = rows.cfg_pipelines()
    ended = rows.aud_pipelines_run_log(PIPELINE_ID=pipeline, STATUS="FAILED")
    rows.aud_pipelines_run_log(PIPELINE_ID=pipeline, STATUS="IN-PROGRESS")
    with pytest.raises(db.IntegrityError):
        db.execute(
            "UPDATE AUD_PIPELINES_RUN_LOG SET STATUS = 'IN-PROGRESS' WHERE PIPELINE_RUN_ID = ?", (ended,)
        )


def test_in_progress_run_of_another_pipeline_does_not_collide(rows: Rows) -> None:
    rows.aud_pipelines_run_log(PIPELINE_ID=rows.cfg_pipelines(), STATUS="IN-PROGRESS")
    rows.aud_pipelines_run_log(PIPELINE_ID=rows.cfg_pipelines(), STATUS="IN-PROGRESS")


def test_ended_runs_do_not_block_a_new_in_progress_run(rows: Rows) -> None:
    pipeline = rows.cfg_pipelines()
    for status in ("QUEUED", "SUCCESS", "FAILED", "SKIPPED", "CANCELLED", "SUCCESS"):
        rows.aud_pipelines_run_log(PIPELINE_ID=pipeline, STATUS=status)
    rows.aud_pipelines_run_log(PIPELINE_ID=pipeline, STATUS="IN-PROGRESS")


def test_duplicate_run_key_of_a_pipeline_is_refused(db: EngineDB, rows: Rows) -> None:
    pipeline = rows.cfg_pipelines()
    rows.aud_pipelines_run_log(PIPELINE_ID=pipeline, RUN_KEY="airflow:sales:manual__1")
    with pytest.raises(db.IntegrityError):
        rows.aud_pipelines_run_log(PIPELINE_ID=pipeline, RUN_KEY="airflow:sales:manual__1")


def test_run_key_is_unique_per_pipeline_and_may_be_null(rows: Rows) -> None:
    first, second = rows.cfg_pipelines(), rows.cfg_pipelines()
    rows.aud_pipelines_run_log(PIPELINE_ID=first, RUN_KEY="airflow:d:r")
    rows.aud_pipelines_run_log(PIPELINE_ID=second, RUN_KEY="airflow:d:r")
    rows.aud_pipelines_run_log(PIPELINE_ID=first, RUN_KEY=None)
    rows.aud_pipelines_run_log(PIPELINE_ID=first, RUN_KEY=None)


def test_second_task_run_row_for_the_same_task_and_run_is_refused(db: EngineDB, rows: Rows) -> None:
    pipeline = rows.cfg_pipelines()
    task = rows.cfg_tasks(PIPELINE_ID=pipeline)
    run = rows.aud_pipelines_run_log(PIPELINE_ID=pipeline)
    rows.aud_task_run_log(TASK_ID=task, PIPELINE_RUN_ID=run)
    with pytest.raises(db.IntegrityError):
        rows.aud_task_run_log(TASK_ID=task, PIPELINE_RUN_ID=run, STATUS="IN-PROGRESS")
    rows.aud_task_run_log(TASK_ID=task, PIPELINE_RUN_ID=rows.aud_pipelines_run_log(PIPELINE_ID=pipeline))


@pytest.mark.parametrize("second", LIVE_ATTEMPT_STATUSES)
@pytest.mark.parametrize("first", LIVE_ATTEMPT_STATUSES)
def test_second_live_attempt_of_a_task_run_is_refused(
    db: EngineDB, rows: Rows, first: str, second: str
) -> None:
    task_run = rows.aud_task_run_log(STATUS="IN-PROGRESS")
    rows.aud_task_attempts(TASK_RUN_ID=task_run, ATTEMPT_NUMBER=1, STATUS=first)
    with pytest.raises(db.IntegrityError):
        rows.aud_task_attempts(TASK_RUN_ID=task_run, ATTEMPT_NUMBER=2, STATUS=second)


@pytest.mark.parametrize("ended", ENDED_ATTEMPT_STATUSES)
def test_new_attempt_after_the_previous_one_ended_is_allowed(rows: Rows, ended: str) -> None:
    task_run = rows.aud_task_run_log(STATUS="IN-PROGRESS")
    rows.aud_task_attempts(TASK_RUN_ID=task_run, ATTEMPT_NUMBER=1, STATUS=ended)
    rows.aud_task_attempts(TASK_RUN_ID=task_run, ATTEMPT_NUMBER=2, STATUS="RUNNING")


def test_reviving_an_ended_attempt_beside_a_live_one_is_refused(db: EngineDB, rows: Rows) -> None:
    task_run = rows.aud_task_run_log(STATUS="IN-PROGRESS")
    ended = rows.aud_task_attempts(TASK_RUN_ID=task_run, ATTEMPT_NUMBER=1, STATUS="LOST")
    rows.aud_task_attempts(TASK_RUN_ID=task_run, ATTEMPT_NUMBER=2, STATUS="RUNNING")
    with pytest.raises(db.IntegrityError):
        db.execute("UPDATE AUD_TASK_ATTEMPTS SET STATUS = 'RUNNING' WHERE ATTEMPT_ID = ?", (ended,))


def test_duplicate_attempt_number_of_a_task_run_is_refused(db: EngineDB, rows: Rows) -> None:
    task_run = rows.aud_task_run_log()
    rows.aud_task_attempts(TASK_RUN_ID=task_run, ATTEMPT_NUMBER=1, STATUS="FAILED")
    with pytest.raises(db.IntegrityError):
        rows.aud_task_attempts(TASK_RUN_ID=task_run, ATTEMPT_NUMBER=1, STATUS="FAILED")


def test_map_indexes_of_one_task_run_each_have_their_own_live_attempt_and_numbers(
    db: EngineDB, rows: Rows
) -> None:
    task_run = rows.aud_task_run_log(STATUS="IN-PROGRESS")
    for index in (0, 1):
        rows.aud_task_attempts(TASK_RUN_ID=task_run, MAP_INDEX=index, ATTEMPT_NUMBER=1, STATUS="RUNNING")
    # The unmapped key (NULL) is one more "index": its own live attempt and numbering.
    rows.aud_task_attempts(TASK_RUN_ID=task_run, ATTEMPT_NUMBER=1, STATUS="RUNNING")
    with pytest.raises(db.IntegrityError):  # a second live attempt of map index 1
        rows.aud_task_attempts(TASK_RUN_ID=task_run, MAP_INDEX=1, ATTEMPT_NUMBER=2, STATUS="QUEUED")
    with pytest.raises(db.IntegrityError):  # try 1 of map index 0 again
        rows.aud_task_attempts(TASK_RUN_ID=task_run, MAP_INDEX=0, ATTEMPT_NUMBER=1, STATUS="FAILED")
    with pytest.raises(db.IntegrityError):  # a second live unmapped attempt
        rows.aud_task_attempts(TASK_RUN_ID=task_run, ATTEMPT_NUMBER=2, STATUS="RUNNING")


def test_a_negative_map_index_is_refused(db: EngineDB, rows: Rows) -> None:
    with pytest.raises(db.IntegrityError):
        rows.aud_task_attempts(MAP_INDEX=-1)


# --------------------------------------------------------------------------- pauses


def test_second_open_pause_of_a_pipeline_is_refused(db: EngineDB, rows: Rows) -> None:
    pipeline = rows.cfg_pipelines()
    rows.aud_pipeline_pauses(PIPELINE_ID=pipeline, PAUSED_BY="ops", PAUSED_BY_KIND="HUMAN")
    with pytest.raises(db.IntegrityError):
        rows.aud_pipeline_pauses(PIPELINE_ID=pipeline, PAUSED_BY="ops", PAUSED_BY_KIND="HUMAN")
    rows.aud_pipeline_pauses(PIPELINE_ID=rows.cfg_pipelines())


def test_pause_after_resume_is_allowed(db: EngineDB, rows: Rows) -> None:
    pipeline = rows.cfg_pipelines()
    pause = rows.aud_pipeline_pauses(PIPELINE_ID=pipeline)
    db.execute(
        "UPDATE AUD_PIPELINE_PAUSES SET RESUMED_AT = CURRENT_TIMESTAMP, RESUMED_BY = 'ops', "
        "RESUMED_BY_KIND = 'HUMAN' WHERE PIPELINE_PAUSE_ID = ?",
        (pause,),
    )
    rows.aud_pipeline_pauses(PIPELINE_ID=pipeline)


# --------------------------------------------------------------------------- value lists and codes


@pytest.mark.parametrize(("table", "column"), VALUE_LISTS, ids=VALUE_LIST_IDS)
def test_value_outside_the_list_is_refused(db: EngineDB, rows: Rows, table: str, column: str) -> None:
    allowed = VALUE_LISTS[table, column]
    for bad in (allowed[0].lower(), "X"):
        with pytest.raises(db.IntegrityError):
            rows.add(table, **{column: bad})


@pytest.mark.parametrize(("table", "column"), VALUE_LISTS, ids=VALUE_LIST_IDS)
def test_every_listed_value_is_accepted(rows: Rows, table: str, column: str) -> None:
    for value in VALUE_LISTS[table, column]:
        extra = {"RUN_CONDITION_COUNT": 1} if (column, value) == ("RUN_CONDITION", "N") else {}
        rows.add(table, **{column: value}, **extra)


BAD_CODES = {
    "leading digit": "1LOAD",
    "leading underscore": "_LOAD",
    "hyphen": "a-b",
    "space": "a b",
    "sql injection": "'; DROP TABLE x; --",
    "129 characters": "A" * 129,
    "empty": "",
    "non-ASCII letter": "é",
    "non-ASCII inside": "cafév",
    "dot": "a.b",
    "trailing newline": "a\n",
}
GOOD_CODES = {
    "one letter": "A",
    "128 characters": "A" + "b_9" * 42 + "x",
    "mixed": "a_1",
    "case": "LoadSales2",
}


@pytest.mark.parametrize("code", BAD_CODES.values(), ids=list(BAD_CODES))
@pytest.mark.parametrize("table", ["CFG_PIPELINES", "CFG_TASKS"])
def test_code_not_matching_the_pattern_is_refused(db: EngineDB, rows: Rows, table: str, code: str) -> None:
    column = "PIPELINE_CODE" if table == "CFG_PIPELINES" else "TASK_CODE"
    with pytest.raises(db.IntegrityError):
        rows.add(table, **{column: code})


@pytest.mark.parametrize("code", GOOD_CODES.values(), ids=list(GOOD_CODES))
@pytest.mark.parametrize("table", ["CFG_PIPELINES", "CFG_TASKS"])
def test_code_matching_the_pattern_is_accepted(db: EngineDB, rows: Rows, table: str, code: str) -> None:
    column = "PIPELINE_CODE" if table == "CFG_PIPELINES" else "TASK_CODE"
    row_id = rows.add(table, **{column: code})
    assert db.row(table, row_id)[column] == code


@pytest.mark.parametrize(
    ("condition", "count", "accepted"),
    [
        (None, None, True),
        ("ALL", None, True),
        ("ANY", None, True),
        ("N", 1, True),
        ("N", 3, True),
        ("N", None, False),
        ("N", 0, False),
        ("N", -2, False),
        ("ALL", 2, False),
        ("ANY", 1, False),
        (None, 1, False),
    ],
)
def test_run_condition_count_is_set_exactly_when_run_condition_is_n(
    db: EngineDB, rows: Rows, condition: str | None, count: int | None, accepted: bool
) -> None:
    if accepted:
        rows.cfg_tasks(RUN_CONDITION=condition, RUN_CONDITION_COUNT=count)
    else:
        with pytest.raises(db.IntegrityError):
            rows.cfg_tasks(RUN_CONDITION=condition, RUN_CONDITION_COUNT=count)


BAD_CHECKSUMS = {
    "upper case": hashlib.sha256(b"x").hexdigest().upper(),
    "63 digits": "a" * 63,
    "65 digits": "a" * 65,
    "not hex": "g" * 64,
    "empty": "",
    "with prefix": "sha256:" + "a" * 57,
}


@pytest.mark.parametrize("checksum", BAD_CHECKSUMS.values(), ids=list(BAD_CHECKSUMS))
def test_checksum_that_is_not_64_lower_case_hex_is_refused(db: EngineDB, rows: Rows, checksum: str) -> None:
    with pytest.raises(db.IntegrityError):
        rows.schema_migrations(CHECKSUM=checksum)


def test_migration_ledger_is_keyed_by_source_and_version(db: EngineDB, rows: Rows) -> None:
    rows.schema_migrations(SOURCE="ENGINE", VERSION="0001_init", CHECKSUM=hashlib.sha256(b"a").hexdigest())
    rows.schema_migrations(SOURCE="PROJECT", VERSION="0001_init", CHECKSUM=hashlib.sha256(b"b").hexdigest())
    with pytest.raises(db.IntegrityError):
        rows.schema_migrations(
            SOURCE="ENGINE", VERSION="0001_init", CHECKSUM=hashlib.sha256(b"c").hexdigest()
        )


def test_pipeline_parameters_must_be_json(db: EngineDB, rows: Rows) -> None:
    rows.cfg_pipelines(PIPELINE_PARAMETERS='{"region": "eu", "days": 3}')
    rows.cfg_pipelines(PIPELINE_PARAMETERS=None)
    with pytest.raises((db.IntegrityError, db.DataError)):
        rows.cfg_pipelines(PIPELINE_PARAMETERS="{region: eu")


# --------------------------------------------------------------------------- dependencies


def test_pipeline_cannot_depend_on_itself(db: EngineDB, rows: Rows) -> None:
    pipeline = rows.cfg_pipelines()
    with pytest.raises(db.IntegrityError):
        rows.cfg_pipeline_dependency(PIPELINE_ID=pipeline, DEPENDS_ON_PIPELINE_ID=pipeline)


def test_task_cannot_depend_on_itself(db: EngineDB, rows: Rows) -> None:
    pipeline = rows.cfg_pipelines()
    task = rows.cfg_tasks(PIPELINE_ID=pipeline)
    with pytest.raises(db.IntegrityError):
        rows.cfg_task_dependency(PIPELINE_ID=pipeline, TASK_ID=task, DEPENDS_ON_TASK_ID=task)


def test_task_dependency_upstream_pipeline_defaults_to_its_own_pipeline(db: EngineDB, rows: Rows) -> None:
    pipeline = rows.cfg_pipelines()
    dependency = rows.cfg_task_dependency(PIPELINE_ID=pipeline)
    assert db.row("CFG_TASK_DEPENDENCY", dependency)["DEPENDS_ON_PIPELINE_ID"] == pipeline


def test_task_dependency_keeps_a_given_upstream_pipeline(db: EngineDB, rows: Rows) -> None:
    upstream = rows.cfg_pipelines()
    dependency = rows.cfg_task_dependency(DEPENDS_ON_PIPELINE_ID=upstream)
    assert db.row("CFG_TASK_DEPENDENCY", dependency)["DEPENDS_ON_PIPELINE_ID"] == upstream


def test_task_dependency_upstream_pipeline_cannot_be_cleared(db: EngineDB, rows: Rows) -> None:
    dependency = rows.cfg_task_dependency()
    with pytest.raises(db.IntegrityError):
        db.execute(
            "UPDATE CFG_TASK_DEPENDENCY SET DEPENDS_ON_PIPELINE_ID = NULL WHERE TASK_DEPENDENCY_ID = ?",
            (dependency,),
        )


def test_cross_pipeline_task_dependency_must_name_the_upstream_pipeline(db: EngineDB, rows: Rows) -> None:
    upstream_task = rows.cfg_tasks(PIPELINE_ID=rows.cfg_pipelines())
    with pytest.raises(db.IntegrityError):
        rows.cfg_task_dependency(DEPENDS_ON_TASK_ID=upstream_task)


def test_task_dependency_task_must_belong_to_its_pipeline(db: EngineDB, rows: Rows) -> None:
    other_pipelines_task = rows.cfg_tasks()
    with pytest.raises(db.IntegrityError):
        rows.cfg_task_dependency(PIPELINE_ID=rows.cfg_pipelines(), TASK_ID=other_pipelines_task)


@pytest.mark.parametrize("table", APPEND_ONLY_TABLES)
@pytest.mark.parametrize("given", ["neither", "both"])
def test_exactly_one_dependency_must_be_set(db: EngineDB, rows: Rows, table: str, given: str) -> None:
    ids = {"PIPELINE_DEPENDENCY_ID": None, "TASK_DEPENDENCY_ID": None}
    if given == "both":
        ids = {
            "PIPELINE_DEPENDENCY_ID": rows.cfg_pipeline_dependency(),
            "TASK_DEPENDENCY_ID": rows.cfg_task_dependency(),
        }
    with pytest.raises(db.IntegrityError):
        rows.add(table, **ids)


@pytest.mark.parametrize("table", APPEND_ONLY_TABLES)
@pytest.mark.parametrize("kind", ["PIPELINE_DEPENDENCY_ID", "TASK_DEPENDENCY_ID"])
def test_either_dependency_alone_is_accepted(rows: Rows, table: str, kind: str) -> None:
    dependency = (
        rows.cfg_pipeline_dependency() if kind == "PIPELINE_DEPENDENCY_ID" else rows.cfg_task_dependency()
    )
    rows.add(table, **{kind: dependency})


@pytest.mark.parametrize("table", APPEND_ONLY_TABLES)
@pytest.mark.parametrize(
    "statement", ["UPDATE {table} SET {id} = {id} WHERE {id} = ?", "DELETE FROM {table} WHERE {id} = ?"]
)
def test_append_only_table_refuses_update_and_delete(
    db: EngineDB, rows: Rows, table: str, statement: str
) -> None:
    row_id = rows.add(table)
    before = db.row(table, row_id)
    with pytest.raises(db.IntegrityError, match="append-only"):
        db.execute(statement.format(table=table, id=ID_COLUMNS[table]), (row_id,))
    assert db.row(table, row_id) == before


def test_foreign_keys_are_enforced(db: EngineDB, rows: Rows) -> None:
    with pytest.raises(db.IntegrityError):
        rows.cfg_tasks(PIPELINE_ID=987654)
    with pytest.raises(db.IntegrityError):
        rows.aud_task_attempts(TASK_RUN_ID=987654)


# --------------------------------------------------------------------------- etl-craft's required columns and edges


def full_row(rows: Rows, table: str) -> dict[str, Any]:
    """Every required column of a valid CFG_ row, with its parents created (nothing left to a default)."""
    if table == "CFG_PIPELINES":
        return {"PIPELINE_CODE": rows.code("P"), "PIPELINE_NAME": "Sales", "REFRESH_TYPE": "FULL"}
    if table == "CFG_TASKS":
        return {
            "PIPELINE_ID": rows.cfg_pipelines(),
            "TASK_CODE": rows.code("T"),
            "TASK_TYPE": "ETL",
            "HANDLER": "SQL",
        }
    if table == "CFG_PIPELINE_DEPENDENCY":
        return {
            "PIPELINE_ID": rows.cfg_pipelines(),
            "DEPENDS_ON_PIPELINE_ID": rows.cfg_pipelines(),
            "DEPENDENCY_TYPE": "SUCCESS",
        }
    pipeline = rows.cfg_pipelines()
    return {
        "PIPELINE_ID": pipeline,
        "TASK_ID": rows.cfg_tasks(PIPELINE_ID=pipeline),
        "DEPENDS_ON_TASK_ID": rows.cfg_tasks(PIPELINE_ID=pipeline),
        "DEPENDENCY_TYPE": "SUCCESS",
    }


REQUIRED = [
    ("CFG_PIPELINES", "PIPELINE_NAME"),
    ("CFG_PIPELINES", "REFRESH_TYPE"),
    ("CFG_TASKS", "TASK_TYPE"),
    ("CFG_TASKS", "HANDLER"),
    ("CFG_PIPELINE_DEPENDENCY", "DEPENDENCY_TYPE"),
    ("CFG_TASK_DEPENDENCY", "DEPENDENCY_TYPE"),
]


@pytest.mark.parametrize(("table", "column"), REQUIRED, ids=[f"{t}.{c}" for t, c in REQUIRED])
def test_a_required_column_omitted_or_null_is_refused(
    db: EngineDB, rows: Rows, table: str, column: str
) -> None:
    values = full_row(rows, table)
    with pytest.raises(db.IntegrityError):
        db.insert(table, **{k: v for k, v in values.items() if k != column})  # no default fills it
    with pytest.raises(db.IntegrityError):
        db.insert(table, **{**values, column: None})
    db.insert(table, **values)


EDGES = ["CFG_PIPELINE_DEPENDENCY", "CFG_TASK_DEPENDENCY"]


@pytest.mark.parametrize("table", EDGES)
def test_a_second_active_row_of_the_same_edge_is_refused(db: EngineDB, rows: Rows, table: str) -> None:
    values = full_row(rows, table)
    first = db.insert(table, **values)
    with pytest.raises(db.IntegrityError):
        db.insert(table, **values)  # e.g. a PROJECT migration's INSERT run twice
    db.insert(
        table, **{**values, "DEPENDENCY_TYPE": "FAILURE"}
    )  # another type of the same pair: another edge
    retire = f"UPDATE {table} SET ACTIVE_FLAG = ? WHERE {ID_COLUMNS[table]} = ?"
    db.execute(retire, ("N", first))
    db.insert(table, **values)  # a retired row frees its edge ...
    with pytest.raises(db.IntegrityError):
        db.execute(retire, ("Y", first))  # ... and may not come back beside the new one
    assert db.scalar(f"SELECT COUNT(*) FROM {table} WHERE ACTIVE_FLAG = 'Y'") == 2


def test_a_task_edge_is_the_same_edge_with_or_without_its_upstream_pipeline_named(
    db: EngineDB, rows: Rows
) -> None:
    values = full_row(rows, "CFG_TASK_DEPENDENCY")
    db.insert("CFG_TASK_DEPENDENCY", **values)  # DEPENDS_ON_PIPELINE_ID filled in by the trigger
    with pytest.raises(db.IntegrityError):
        db.insert("CFG_TASK_DEPENDENCY", **values, DEPENDS_ON_PIPELINE_ID=values["PIPELINE_ID"])


def test_run_date_is_a_calendar_date(db: EngineDB, rows: Rows) -> None:
    run = rows.aud_pipelines_run_log(RUN_DATE="2026-01-02")
    stored = db.row("AUD_PIPELINES_RUN_LOG", run)["RUN_DATE"]
    assert stored == (datetime.date(2026, 1, 2) if db.dialect == "postgresql" else "2026-01-02")
    for bad in ("not a date", "2026-02-30", "2026-13-01"):
        with pytest.raises((db.IntegrityError, db.DataError)):
            rows.aud_pipelines_run_log(RUN_DATE=bad)


# --------------------------------------------------------------------------- defaults


@pytest.mark.parametrize(
    ("table", "column", "expected"),
    [
        ("CFG_PIPELINES", "ACTIVE_FLAG", "Y"),
        ("CFG_TASKS", "ACTIVE_FLAG", "Y"),
        ("CFG_TASK_PARAMETERS", "ACTIVE_FLAG", "Y"),
        ("CFG_PIPELINE_DEPENDENCY", "ACTIVE_FLAG", "Y"),
        ("CFG_PIPELINE_DEPENDENCY", "CONSUME_REPAIRS", "Y"),
        ("CFG_TASK_DEPENDENCY", "ACTIVE_FLAG", "Y"),
        ("CFG_TASK_DEPENDENCY", "CONSUME_REPAIRS", "Y"),
        ("AUD_PIPELINES_RUN_LOG", "BACKFILL", "N"),
        ("AUD_PIPELINES_RUN_LOG", "REPAIR_PENDING", "N"),
        ("AUD_PIPELINES_RUN_LOG", "OUTPUT_REVISION", 1),
        ("AUD_TASK_RUN_LOG", "ATTEMPT_COUNT", 0),
        ("AUD_TASK_RUN_LOG", "SOURCE_COUNT", None),
        ("AUD_TASK_RUN_LOG", "ROWS_WRITTEN", None),
    ],
)
def test_column_default(db: EngineDB, rows: Rows, table: str, column: str, expected: Any) -> None:
    assert db.row(table, rows.add(table))[column] == expected


@pytest.mark.parametrize(
    ("table", "column"),
    [
        ("CFG_PIPELINES", "CREATE_DATE"),
        ("CFG_PIPELINE_DEPENDENCY", "CREATE_DATE"),
        ("CFG_TASKS", "CREATE_DATE"),
        ("CFG_TASK_DEPENDENCY", "CREATE_DATE"),
        ("CFG_TASK_PARAMETERS", "CREATE_DATE"),
        ("AUD_GATE_DECISIONS", "DECIDED_AT"),
        ("AUD_DEPENDENCY_CONSUMPTION", "CONSUMED_AT"),
        ("AUD_PIPELINE_PAUSES", "PAUSED_AT"),
        ("AUD_RUN_INTERVENTIONS", "REQUESTED_AT"),
        ("SCHEMA_MIGRATIONS", "APPLIED_AT"),
    ],
)
def test_creation_timestamp_defaults_to_now_in_utc(db: EngineDB, rows: Rows, table: str, column: str) -> None:
    rows.add(table)
    value = db.scalar(f"SELECT {column} FROM {table}")
    if db.dialect == "sqlite":
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", value), value
        value = datetime.datetime.fromisoformat(value)
    assert value.utcoffset() is not None
    assert abs(datetime.datetime.now(datetime.UTC) - value) < datetime.timedelta(minutes=5)


# --------------------------------------------------------------------------- the files themselves


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_schema_file_can_run_inside_the_callers_transaction_and_schema(dialect: str) -> None:
    """No schema of its own, no transaction control, no quoted or lower-case table names."""
    text = re.sub(r"--[^\n]*", "", (SQL_DIR / dialect / "schema.sql").read_text())
    assert not re.search(
        r"\bCREATE\s+SCHEMA\b|\bIF\s+NOT\s+EXISTS\b|\bCOMMIT\b|\bSET\s+search_path", text, re.I
    )
    assert not re.search(r"^\s*(BEGIN|START\s+TRANSACTION)\s*;", text, re.I | re.M)
    assert '"' not in text
    assert not re.search(r"\.\s*(CFG_|AUD_|SCHEMA_MIGRATIONS)", text, re.I)
    assert set(re.findall(r"CREATE TABLE (\w+)", text)) == set(SCHEMA_COLUMNS) - {
        "AUD_ENGINE_PURGES"
    }  # ENGINE 0005


# --------------------------------------------------------------------------- both files define the same schema


@dataclass
class Catalog:
    """What a live Engine DB declares; names in upper case (PostgreSQL's folded names are upper-cased)."""

    columns: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    not_null: set[tuple[str, str]] = field(default_factory=set)
    value_lists: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    check_counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    primary_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # (table, columns, columns named in the predicate, literals in the predicate); None for a full index
    unique_keys: set[tuple[str, tuple[str, ...], Any]] = field(default_factory=set)
    foreign_keys: set[tuple[str, tuple[str, ...], str, tuple[str, ...]]] = field(default_factory=set)

    def predicate(self, table: str, text: str | None) -> Any:
        if text is None:
            return None
        literals = re.findall(r"'((?:[^']|'')*)'", text)
        words = set(re.findall(r"\w+", re.sub(r"'(?:[^']|'')*'", "", text).upper()))
        return frozenset(words & self.columns[table]), frozenset(literals)


def _literals(text: str) -> set[str]:
    return {m.replace("''", "'") for m in re.findall(r"'((?:[^']|'')*)'", text)}


def sqlite_catalog(conn: sqlite3.Connection) -> Catalog:
    """SQLite keeps names as declared: comparing them unchanged proves they are written in upper case."""
    catalog = Catalog()
    tables = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
    )
    for table, ddl in tables.fetchall():
        info = conn.execute(f"PRAGMA table_info({table})").fetchall()
        for _cid, name, _type, notnull, _default, pk in info:
            catalog.columns[table].add(name)
            if notnull or pk:
                catalog.not_null.add((table, name))
        catalog.primary_keys[table] = tuple(r[1] for r in sorted(info, key=lambda r: r[5]) if r[5])
        for column, values in re.findall(r"CHECK\s*\(\s*(\w+)\s+IN\s*\(([^)]*)\)\s*\)", ddl):
            catalog.value_lists[table, column] = _literals(values)
        catalog.check_counts[table] = len(re.findall(r"\bCHECK\s*\(", ddl))
        _add_sqlite_unique_keys(conn, table, catalog)
        _add_sqlite_foreign_keys(conn, table, catalog)
    return catalog


def _add_sqlite_unique_keys(conn: sqlite3.Connection, table: str, catalog: Catalog) -> None:
    for _seq, index, unique, origin, partial in conn.execute(f"PRAGMA index_list({table})").fetchall():
        if not unique or origin == "pk":
            continue
        # An expression key (COALESCE(MAP_INDEX, -1)) has no column name; both catalogs call it <expr>.
        columns = tuple(r[2] or "<expr>" for r in conn.execute(f"PRAGMA index_info({index})").fetchall())
        predicate = None
        if partial:
            (index_sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (index,)).fetchone()
            predicate = re.split(r"\bWHERE\b", index_sql, maxsplit=1, flags=re.IGNORECASE)[1]
        catalog.unique_keys.add((table, columns, catalog.predicate(table, predicate)))


def _add_sqlite_foreign_keys(conn: sqlite3.Connection, table: str, catalog: Catalog) -> None:
    keys: dict[int, list[tuple[str, str, str]]] = defaultdict(list)
    for key_id, _seq, parent, column, parent_column, *_ in conn.execute(f"PRAGMA foreign_key_list({table})"):
        keys[key_id].append((parent, column, parent_column))
    for parts in keys.values():
        catalog.foreign_keys.add((table, tuple(p[1] for p in parts), parts[0][0], tuple(p[2] for p in parts)))


PG_INDEXES = """
SELECT t.relname,
       ARRAY(SELECT COALESCE(a.attname::text, '<expr>')
               FROM unnest(ix.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
               LEFT JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k.attnum
              ORDER BY k.ord),
       ix.indisprimary,
       pg_get_expr(ix.indpred, ix.indrelid)
  FROM pg_index ix
  JOIN pg_class t ON t.oid = ix.indrelid
  JOIN pg_namespace n ON n.oid = t.relnamespace
 WHERE n.nspname = %s AND ix.indisunique
"""
PG_CONSTRAINTS = """
SELECT t.relname, k.contype, pg_get_constraintdef(k.oid)
  FROM pg_constraint k
  JOIN pg_class t ON t.oid = k.conrelid
  JOIN pg_namespace n ON n.oid = t.relnamespace
 WHERE n.nspname = %s AND k.contype IN ('c', 'f')
"""


def postgresql_catalog(conn: Any, schema: str) -> Catalog:
    catalog = Catalog()
    with conn.cursor() as cur:
        cur.execute(
            "SELECT table_name, column_name, is_nullable FROM information_schema.columns WHERE table_schema = %s",
            (schema,),
        )
        for table, column, nullable in cur.fetchall():
            catalog.columns[table.upper()].add(column.upper())
            if nullable == "NO":
                catalog.not_null.add((table.upper(), column.upper()))
        cur.execute(PG_CONSTRAINTS, (schema,))
        for table, kind, definition in cur.fetchall():
            table = table.upper()
            if kind == "c":
                catalog.check_counts[table] += 1
                match = re.search(r"\(?(\w+)\)?(?:::[\w ]+)? = ANY \(\(?ARRAY\[(.*?)\]", definition)
                if match:
                    catalog.value_lists[table, match[1].upper()] = _literals(match[2])
            else:
                fk = re.fullmatch(r"FOREIGN KEY \((.*?)\) REFERENCES (?:\w+\.)?(\w+)\((.*?)\)", definition)
                assert fk, definition
                child, parent, parent_cols = (
                    tuple(c.strip().upper() for c in fk[1].split(",")),
                    fk[2].upper(),
                    tuple(c.strip().upper() for c in fk[3].split(",")),
                )
                catalog.foreign_keys.add((table, child, parent, parent_cols))
        cur.execute(PG_INDEXES, (schema,))
        for table, columns, primary, predicate in cur.fetchall():
            table, columns = table.upper(), tuple(c if c == "<expr>" else c.upper() for c in columns)
            if primary:
                catalog.primary_keys[table] = columns
            else:
                catalog.unique_keys.add((table, columns, catalog.predicate(table, predicate)))
    return catalog


@pytest.mark.postgres
def test_both_schemas_declare_the_same_tables_columns_and_rules(tmp_path: Path, pg_database: Any) -> None:
    sqlite_conn = sqlite_engine_db(tmp_path / "engine.db")
    pg_conn = pg_database.connect()
    try:
        apply_postgresql_schema(pg_conn)
        lite, pg = sqlite_catalog(sqlite_conn), postgresql_catalog(pg_conn, pg_database.schema)
    finally:
        sqlite_conn.close()
        pg_conn.close()

    expected_lists = {key: set(values) for key, values in VALUE_LISTS.items()}
    assert dict(lite.columns) == SCHEMA_COLUMNS
    assert dict(pg.columns) == SCHEMA_COLUMNS
    assert lite.value_lists == expected_lists
    assert pg.value_lists == expected_lists
    # SQLite checks PIPELINE_PARAMETERS with json_valid() and RUN_DATE with date(); PostgreSQL's JSONB and DATE
    # types check them by themselves.
    assert lite.check_counts == {
        **pg.check_counts,
        "CFG_PIPELINES": pg.check_counts["CFG_PIPELINES"] + 1,
        "AUD_PIPELINES_RUN_LOG": pg.check_counts["AUD_PIPELINES_RUN_LOG"] + 1,
    }
    assert lite.primary_keys == pg.primary_keys
    assert lite.unique_keys == pg.unique_keys
    assert lite.foreign_keys == pg.foreign_keys
    # SQLite cannot declare DEPENDS_ON_PIPELINE_ID NOT NULL: its default is filled by an AFTER INSERT trigger.
    assert pg.not_null - lite.not_null == {("CFG_TASK_DEPENDENCY", "DEPENDS_ON_PIPELINE_ID")}
    assert lite.not_null <= pg.not_null


def test_unique_rules_of_spec_are_declared(db: EngineDB) -> None:
    """The rules docs/schema.md names are unique keys (their predicates are compared across dialects above)."""
    catalog = (
        sqlite_catalog(db.conn)
        if db.dialect == "sqlite"
        else postgresql_catalog(db.conn, db.scalar("SELECT current_schema()"))
    )
    keys = {
        (table, columns, predicate[1] if predicate else None)
        for table, columns, predicate in catalog.unique_keys
    }
    assert {
        ("CFG_PIPELINES", ("PIPELINE_CODE",), frozenset({"Y"})),
        ("CFG_TASKS", ("PIPELINE_ID", "TASK_CODE"), frozenset({"Y"})),
        # One active row per dependency edge (etl-craft's rule).
        (
            "CFG_PIPELINE_DEPENDENCY",
            ("PIPELINE_ID", "DEPENDS_ON_PIPELINE_ID", "DEPENDENCY_TYPE"),
            frozenset({"Y"}),
        ),
        (
            "CFG_TASK_DEPENDENCY",
            ("TASK_ID", "DEPENDS_ON_PIPELINE_ID", "DEPENDS_ON_TASK_ID", "DEPENDENCY_TYPE"),
            frozenset({"Y"}),
        ),
        ("AUD_PIPELINES_RUN_LOG", ("PIPELINE_ID",), frozenset({"IN-PROGRESS"})),
        ("AUD_PIPELINES_RUN_LOG", ("PIPELINE_ID", "RUN_KEY"), None),
        ("AUD_TASK_RUN_LOG", ("TASK_ID", "PIPELINE_RUN_ID"), None),
        # Per task run and map index (the expression: COALESCE(MAP_INDEX, -1)).
        ("AUD_TASK_ATTEMPTS", ("TASK_RUN_ID", "<expr>"), frozenset(LIVE_ATTEMPT_STATUSES)),
        ("AUD_TASK_ATTEMPTS", ("TASK_RUN_ID", "<expr>", "ATTEMPT_NUMBER"), None),
        ("AUD_PIPELINE_PAUSES", ("PIPELINE_ID",), frozenset()),
    } <= keys


@pytest.mark.postgres
def test_init_db_creates_the_tables_in_the_profiles_schema_without_a_session_search_path(make_engine) -> None:
    """The role's default search_path is ``"$user", public`` and it may create in public (it owns the
    database): the tables must still land in the profile's schema, and nothing in public."""
    from contextlib import closing

    from airflow_provider_etl_craft.engine.schema import ENGINE_TABLES

    setup = make_engine("postgresql")
    result = setup.hook().init_db()
    assert result.created and f"schema {setup.database.schema}" in result.message
    admin = setup.database.cluster.admin_connect(setup.database.name)
    with closing(admin), admin.cursor() as cur:
        cur.execute(
            "SELECT schemaname, upper(tablename) FROM pg_tables WHERE schemaname IN ('public', %s)",
            (setup.database.schema,),
        )
        found = cur.fetchall()
    assert {name for schema, name in found if schema == setup.database.schema} == ENGINE_TABLES | {
        "AUD_ENGINE_PURGES"
    }
    assert [name for schema, name in found if schema == "public"] == []
