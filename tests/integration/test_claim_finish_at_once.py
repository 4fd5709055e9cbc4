"""Claims and finishes in one call on PostgreSQL (ENGINE migration 0003), compared with their transaction forms.

On PostgreSQL the common claim (a new run, a resume, a block) and the common finish (every task recorded,
nothing live, nothing marked by hand) are one call of ``ETL_CRAFT_CLAIM`` / ``ETL_CRAFT_FINISH``: one round trip (a claim
first reads its pipeline's dependency graph, one statement: runs/graph.py).
A spy around the real driver connection counts them: each execute on an autocommit connection is one round
trip. The same scenarios also run on a second Engine schema with the one-call forms switched off
(``at_once_forms = False``) and the same clock, and every outcome and every AUD_ row must be the same on both.
The cases the functions leave to the transaction form (a reopen, a pause, dependencies, unrecorded tasks,
live attempts, marks, mapped tasks, errors) still reach it.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.engine.schema import (
    SCHEMA_VERSION,
    checksum,
    latest_version,
    packaged_migrations,
    schema_text,
)
from airflow_provider_etl_craft.errors import EngineDBError, EtlCraftError, LockTimeoutError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import RunIdentity, RunLifecycle, TaskCounts
from airflow_provider_etl_craft.runs.gates import GateSkipped
from harness.engines import EngineSetup, engine_rows, pg_profile_yaml, write_config
from harness.postgres import SSO_ROLE, PgCluster, PgDatabase

FUNCTIONS_VERSION = "0003_claim_finish_functions.sql"

# SALES: EXTRACT, LOAD (SUCCESS on EXTRACT), NOTIFY (an EMAIL_ALERT task, ALWAYS on LOAD: lenient) and a retired
# task; a 24 h SLA. TINY_SLA, NO_SLA: one task, an SLA nobody meets / none. DOWN depends on UP. RETIRED: inactive.
MIGRATION = """
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY)
VALUES ('SALES', 'Sales', 24, 'FULL', 'test');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY)
VALUES ('TINY_SLA', 'Tiny SLA', 0.0000001, 'FULL', 'test');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY)
VALUES ('NO_SLA', 'No SLA', NULL, 'FULL', 'test');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY)
VALUES ('UP', 'Upstream', NULL, 'FULL', 'test');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY)
VALUES ('DOWN', 'Downstream', 1, 'FULL', 'test');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, ACTIVE_FLAG, CREATED_BY)
VALUES ('RETIRED', 'Retired', 1, 'FULL', 'N', 'test');

INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'EXTRACT', 'INGESTION', PIPELINE_ID, 'PYTHON', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'SALES';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'LOAD', 'ETL', PIPELINE_ID, 'SQL', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'SALES';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'NOTIFY', 'ETL', PIPELINE_ID, 'EMAIL_ALERT', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'SALES';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, ACTIVE_FLAG, CREATED_BY)
SELECT 'OLD_STEP', 'ETL', PIPELINE_ID, 'SQL', 'N', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'SALES';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'ONLY', 'ETL', PIPELINE_ID, 'PYTHON', 'test' FROM CFG_PIPELINES
WHERE PIPELINE_CODE IN ('TINY_SLA', 'NO_SLA', 'UP', 'DOWN', 'RETIRED');

INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_TASK_ID, DEPENDENCY_TYPE, CREATED_BY)
SELECT t.PIPELINE_ID, t.TASK_ID, u.TASK_ID, 'SUCCESS', 'test' FROM CFG_TASKS t JOIN CFG_TASKS u
ON u.PIPELINE_ID = t.PIPELINE_ID AND u.TASK_CODE = 'EXTRACT' WHERE t.TASK_CODE = 'LOAD';
INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_TASK_ID, DEPENDENCY_TYPE, CREATED_BY)
SELECT t.PIPELINE_ID, t.TASK_ID, u.TASK_ID, 'ALWAYS', 'test' FROM CFG_TASKS t JOIN CFG_TASKS u
ON u.PIPELINE_ID = t.PIPELINE_ID AND u.TASK_CODE = 'LOAD' WHERE t.TASK_CODE = 'NOTIFY';
INSERT INTO CFG_PIPELINE_DEPENDENCY (PIPELINE_ID, DEPENDS_ON_PIPELINE_ID, DEPENDENCY_TYPE, CREATED_BY)
SELECT d.PIPELINE_ID, u.PIPELINE_ID, 'SUCCESS', 'test' FROM CFG_PIPELINES d, CFG_PIPELINES u
WHERE d.PIPELINE_CODE = 'DOWN' AND u.PIPELINE_CODE = 'UP';
"""
SALES = ("EXTRACT", "LOAD", "NOTIFY")
ALL_SUCCESS = dict.fromkeys(SALES, "success")
RUN_DATE = datetime(2026, 3, 1, 6, 0, tzinfo=UTC)
#: The clock of step i is CLOCK + i minutes on both schemas (both forms read the time once per transition). It
#: runs ahead of the server's, so the one call records it as it is (the later of the caller's reading and the
#: server's clock after the lock; a caller's clock that is behind is tested apart).
CLOCK = datetime(2099, 3, 1, 6, 0, 0, 123456, tzinfo=UTC)
AUD_TABLES = {
    "AUD_PIPELINES_RUN_LOG": "PIPELINE_RUN_ID", "AUD_TASK_RUN_LOG": "TASK_RUN_ID", "AUD_TASK_ATTEMPTS": "ATTEMPT_ID",
    "AUD_GATE_DECISIONS": "DECISION_ID", "AUD_DEPENDENCY_CONSUMPTION": "CONSUMPTION_ID",
    "AUD_PIPELINE_PAUSES": "PIPELINE_PAUSE_ID", "AUD_RUN_INTERVENTIONS": "INTERVENTION_ID",
}  # fmt: skip
#: A random lease token per attempt (host, pid, uuid): the one column that differs between two runs by design.
RANDOM_COLUMNS = {("AUD_TASK_ATTEMPTS", "OWNER_ID")}


# -- a spy on the real connection ---------------------------------------------------------------------------


class SpyCursor:
    """The driver's cursor; every execute is recorded (the text sent), everything else is the cursor's own."""

    def __init__(self, raw: Any, sent: list[str]) -> None:
        self._raw, self._sent = raw, sent

    def execute(self, query: Any, *params: Any) -> Any:
        self._sent.append(str(query))
        return self._raw.execute(query, *params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def __enter__(self) -> SpyCursor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._raw.close()


class SpyConnection:
    """A real autocommit connection (psycopg2 or psycopg 3) whose cursors record what they send: one execute is
    one round trip (one simple-query message with psycopg2, one extended-protocol exchange with psycopg 3)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.sent: list[str] = []

    def cursor(self, *args: Any, **kwargs: Any) -> SpyCursor:
        return SpyCursor(self.raw.cursor(*args, **kwargs), self.sent)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def take(self) -> list[str]:
        sent, self.sent = self.sent, []
        return sent


def called_at_once(sent: list[str]) -> bool:
    return bool(sent) and "ETL_CRAFT_" in sent[0]


def after_graph_read(sent: list[str], claim: bool = True) -> list[str]:
    """What a claim sent after its first statement, the read of its pipeline's graph (one statement, refusing an
    invalid graph before anything else); a finish sends no such read."""
    assert bool(sent) and sent[0].startswith("WITH RECURSIVE target") == claim, sent
    return sent[1:] if claim else sent


# -- two Engine schemas: one-call forms on, and off ---------------------------------------------------------


@dataclass
class Side:
    """One Engine schema, its hook, and a lifecycle on a spied connection whose dialect reads a test clock."""

    hook: EngineDBHook
    spy: SpyConnection
    lc: RunLifecycle
    now: list[datetime] = field(default_factory=lambda: [CLOCK])

    def dump(self) -> dict[str, list[dict[str, Any]]]:
        found = {}
        with closing(self.hook.get_conn()) as conn:
            for table, key in AUD_TABLES.items():
                cur = conn.cursor()
                cur.execute(f'SET search_path TO "{self.hook.engine_profile.schema}"')
                cur.execute(f"SELECT * FROM {table} ORDER BY {key}")
                names = [d[0].upper() for d in cur.description]
                found[table] = [
                    {n: v for n, v in zip(names, row, strict=True) if (table, n) not in RANDOM_COLUMNS}
                    for row in cur.fetchall()
                ]
                cur.close()
        return found


def open_side(hook: EngineDBHook, folder: Path, at_once: bool) -> Iterator[Side]:
    assert hook.migrate(folder).applied == ["PROJECT 0001_pipelines.sql"]
    engine = hook.engine
    engine.at_once_forms = at_once
    side = Side(hook, SpyConnection(engine.connect()), None)  # type: ignore[arg-type]
    engine.now = lambda: side.now[0]  # type: ignore[method-assign]
    side.lc = RunLifecycle(engine, side.spy, lock_timeout=30)
    try:
        yield side
    finally:
        side.spy.raw.close()


def project_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "project-migrations"
    folder.mkdir(exist_ok=True)
    (folder / "0001_pipelines.sql").write_text(MIGRATION, encoding="utf-8")
    return folder


@pytest.fixture
def fast(pg_database: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Side]:
    monkeypatch.setenv("ENGINE_SECRET", pg_database.password)
    hook = EngineDBHook.from_config(write_config(tmp_path / "fast", pg_profile_yaml(pg_database)))
    yield from open_side(hook, project_folder(tmp_path), at_once=True)


@pytest.fixture
def full(pg_database: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Side]:
    """The same database, a second Engine schema, the one-call forms off."""
    monkeypatch.setenv("ENGINE_SECRET", pg_database.password)
    admin = pg_database.cluster.admin_connect(pg_database.name)
    with closing(admin), admin.cursor() as cur:
        cur.execute(f"CREATE SCHEMA etl_craft_full AUTHORIZATION {pg_database.user}")
    text = pg_profile_yaml(pg_database, schema="etl_craft_full")
    hook = EngineDBHook.from_config(write_config(tmp_path / "full", text))
    yield from open_side(hook, project_folder(tmp_path), at_once=False)


# -- the scenarios ------------------------------------------------------------------------------------------

Step = Callable[[RunLifecycle], Any]


def ident(run_id: str, dag_id: str = "sales_dag", run_date: datetime | None = RUN_DATE,
          backfill: bool = False) -> RunIdentity:  # fmt: skip
    return RunIdentity(dag_id=dag_id, run_id=run_id, run_date=run_date, backfill=backfill)


def claim(code: str, run_id: str, tasks: tuple[str, ...] | None = SALES, **identity: Any) -> Step:
    return lambda lc: lc.claim(code, ident(run_id, **identity), tasks)


def finish(code: str, run_id: str, states: dict[str, str | None], maps: dict[str, dict[int, str]] | None = None,
           not_deciding: tuple[str, ...] = ()) -> Step:  # fmt: skip
    return lambda lc: lc.finish_run(code, ident(run_id), states, maps, not_deciding=not_deciding)


def tasks(code: str, run_id: str, results: dict[str, str], live: bool = False, **identity: Any) -> Step:
    """Start each task's attempt 1 and end it as ``results`` says (a gate may skip it first); ``live`` leaves
    the last attempt open, as a killed worker does."""

    def run(lc: RunLifecycle) -> list[str]:
        done = []
        for task, result in results.items():
            try:
                handle = lc.start_task(code, task, ident(run_id, **identity), 1)
            except GateSkipped:
                done.append(f"{task}: gate skipped")
                continue
            if live and task == list(results)[-1]:
                done.append(f"{task}: left live")
                continue
            counts = TaskCounts(rows_written=3) if result == "SUCCESS" else None
            lc.finish_task(handle, result, counts, error=None if result == "SUCCESS" else f"{task} {result}")
            done.append(f"{task}: {result}")
        return done

    return run


def mapped_load(run_id: str) -> Step:
    def run(lc: RunLifecycle) -> None:
        identity = ident(run_id)
        lc.finish_task(lc.start_task("SALES", "EXTRACT", identity, 1), "SUCCESS", TaskCounts(rows_written=1))
        for index in (0, 1):
            handle = lc.start_task("SALES", "LOAD", identity, 1, map_index=index)
            lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=index + 1), map_count=2)
        lc.finish_task(lc.start_task("SALES", "NOTIFY", identity, 1), "SUCCESS")

    return run


def pause(lc: RunLifecycle) -> int:
    return lc.pause("SALES", "maintenance window", by="ops")


def resume(lc: RunLifecycle) -> Any:
    return lc.resume("SALES", "done", by="ops")


ONE, FULL = "one call", "transaction"
#: (what, expected path of a claim or finish on PostgreSQL, step); None: tasks and pauses, not counted.
SCENARIO: list[tuple[str, str | None, Step]] = [
    ("claim creates r1", ONE, claim("SALES", "r1")),
    ("claim again resumes r1", ONE, claim("SALES", "r1")),
    ("claim of r2 is blocked by r1", ONE, claim("SALES", "r2")),
    ("tasks of r1", None, tasks("SALES", "r1", {"EXTRACT": "SUCCESS", "LOAD": "SUCCESS", "NOTIFY": "SUCCESS"})),
    ("finish r1: SUCCESS, SLA MET", ONE, finish("SALES", "r1", ALL_SUCCESS)),
    ("finish r1 again: ended already", ONE, finish("SALES", "r1", ALL_SUCCESS)),
    ("claim r1 again: reopened", FULL, claim("SALES", "r1")),
    ("finish the repair: revision 2, SLA kept", ONE, finish("SALES", "r1", ALL_SUCCESS)),
    ("claim r3", ONE, claim("SALES", "r3")),
    ("tasks of r3: LOAD fails", None, tasks("SALES", "r3", {"EXTRACT": "SUCCESS", "LOAD": "FAILED", "NOTIFY": "SUCCESS"})),
    ("finish r3: FAILED", ONE, finish("SALES", "r3", {**ALL_SUCCESS, "LOAD": "failed"})),
    ("claim r4", ONE, claim("SALES", "r4")),
    ("tasks of r4: the alert fails", None, tasks("SALES", "r4", {"EXTRACT": "SUCCESS", "LOAD": "SUCCESS", "NOTIFY": "FAILED"})),
    ("finish r4: SUCCESS, NOTIFY failed", ONE, finish("SALES", "r4", {**ALL_SUCCESS, "NOTIFY": "failed"})),
    ("claim r5", ONE, claim("SALES", "r5")),
    ("tasks of r5: LOAD cancelled, NOTIFY skipped", None, tasks("SALES", "r5", {"EXTRACT": "SUCCESS", "LOAD": "CANCELLED", "NOTIFY": "SKIPPED"})),
    ("finish r5: LOAD does not decide", ONE, finish("SALES", "r5", {**ALL_SUCCESS, "LOAD": "failed", "NOTIFY": "skipped"}, not_deciding=("LOAD",))),
    ("claim r6", ONE, claim("SALES", "r6")),
    ("tasks of r6: everything skips", None, tasks("SALES", "r6", {"EXTRACT": "SKIPPED", "LOAD": "SUCCESS", "NOTIFY": "SKIPPED"})),
    ("finish r6: SKIPPED", ONE, finish("SALES", "r6", {"EXTRACT": "skipped", "LOAD": "skipped", "NOTIFY": "skipped"})),
    ("claim r7", ONE, claim("SALES", "r7")),
    ("tasks of r7: only EXTRACT", None, tasks("SALES", "r7", {"EXTRACT": "SUCCESS"})),
    ("finish r7: tasks Airflow never ran", FULL, finish("SALES", "r7", {"EXTRACT": "success", "LOAD": "upstream_failed", "NOTIFY": None})),
    ("claim r8", ONE, claim("SALES", "r8")),
    ("tasks of r8: a killed worker", None, tasks("SALES", "r8", {"EXTRACT": "SUCCESS", "LOAD": "SUCCESS"}, live=True)),
    ("finish r8: a live attempt is lost", FULL, finish("SALES", "r8", {**ALL_SUCCESS, "NOTIFY": "skipped"})),
    ("claim r9", ONE, claim("SALES", "r9")),
    ("tasks of r9", None, tasks("SALES", "r9", {"EXTRACT": "SUCCESS", "LOAD": "SUCCESS", "NOTIFY": "SUCCESS"})),
    ("finish r9: LOAD marked failed by hand", FULL, finish("SALES", "r9", {**ALL_SUCCESS, "LOAD": "failed"})),
    ("claim r10", ONE, claim("SALES", "r10")),
    ("tasks of r10: LOAD mapped", None, mapped_load("r10")),
    ("finish r10: mapped tasks", FULL, finish("SALES", "r10", {"EXTRACT": "success", "NOTIFY": "success"}, {"LOAD": {0: "success", 1: "success"}})),
    ("claim on a tiny SLA", ONE, claim("TINY_SLA", "t1", ("ONLY",))),
    ("its task", None, tasks("TINY_SLA", "t1", {"ONLY": "SUCCESS"})),
    ("finish: SLA BREACHED", ONE, finish("TINY_SLA", "t1", {"ONLY": "success"})),
    ("claim a backfill without a run date", ONE, claim("NO_SLA", "b1", None, run_date=None, backfill=True)),
    ("its task", None, tasks("NO_SLA", "b1", {"ONLY": "SUCCESS"}, run_date=None, backfill=True)),
    ("finish: no SLA", ONE, finish("NO_SLA", "b1", {"ONLY": "success"})),
    ("claim UP", ONE, claim("UP", "u1", ("ONLY",))),
    ("its task", None, tasks("UP", "u1", {"ONLY": "SUCCESS"})),
    ("finish UP", ONE, finish("UP", "u1", {"ONLY": "success"})),
    ("claim DOWN: its dependency is judged", FULL, claim("DOWN", "d1", ("ONLY",))),
    ("its task", None, tasks("DOWN", "d1", {"ONLY": "SUCCESS"})),
    ("finish DOWN: consumes UP's run", ONE, finish("DOWN", "d1", {"ONLY": "success"})),
    ("claim DOWN again: nothing new upstream, SKIPPED", FULL, claim("DOWN", "d2", ("ONLY",))),
    ("pause SALES", None, pause),
    ("claim while paused: SKIPPED", FULL, claim("SALES", "r11")),
    ("resume SALES", None, resume),
    ("claim a retired pipeline: METADATA", FULL, claim("RETIRED", "x1", ("ONLY",))),
    ("claim with other task codes: METADATA", FULL, claim("SALES", "x2", ("EXTRACT", "LOAD", "SPARE"))),
    ("finish a run nobody claimed: RUN_STATE", FULL, finish("SALES", "x3", ALL_SUCCESS)),
]  # fmt: skip


def play(side: Side) -> list[tuple[str, Any, list[str]]]:
    """Run the scenario on one side: each step's outcome (or error) and the statements it sent."""
    played = []
    for step, (what, _, call) in enumerate(SCENARIO):
        side.now[0] = CLOCK + timedelta(minutes=step)
        side.spy.take()
        try:
            outcome = call(side.lc)
        except EtlCraftError as exc:
            outcome = (type(exc).__name__, str(exc))
        played.append((what, outcome, side.spy.take()))
    return played


@pytest.mark.postgres
def test_claims_and_finishes_write_the_same_rows_in_one_call_as_in_their_transactions(
    fast: Side, full: Side
) -> None:
    at_once, in_transactions = play(fast), play(full)

    for (what, outcome, _), (_, expected, _) in zip(at_once, in_transactions, strict=True):
        assert outcome == expected, what
    assert fast.dump() == full.dump()

    # The common cases took one round trip; everything else reached the transaction form after the call said so
    # (a mapped finish does not call at all). With the one-call forms off, nothing calls a function.
    for (what, _, sent), (_, path, _) in zip(at_once, SCENARIO, strict=True):
        rest = after_graph_read(sent, what.startswith("claim"))
        if path == ONE:
            assert len(rest) == 1 and called_at_once(rest), (what, sent)
        elif path == FULL:
            transaction = [s for s in rest if s.startswith("BEGIN")]
            assert transaction and len(rest) > 2, (what, sent)
            assert called_at_once(rest) == (what != "finish r10: mapped tasks"), (what, sent)
    assert not any("ETL_CRAFT_" in s for _, _, sent in in_transactions for s in sent)
    # Task starts and ends took their one-statement forms (runs/start.py START_AT_ONCE, runs/attempts.py
    # END_AT_ONCE) on the one-call side only, so the rows compared above cover them too.
    for played, used in ((at_once, True), (in_transactions, False)):
        sent_by_tasks = [s for what, _, sent in played if what.startswith("tasks of") for s in sent]
        assert any("WITH info AS" in s for s in sent_by_tasks) == used
        assert any("WITH a AS (UPDATE AUD_TASK_ATTEMPTS" in s for s in sent_by_tasks) == used
    one_call_steps = [
        sent for (_, _, sent), (_, path, _) in zip(in_transactions, SCENARIO, strict=True) if path == ONE
    ]
    assert min(len(sent) for sent in one_call_steps) >= 3  # BEGIN (with the lock), a read, COMMIT at least

    # What the scenario was meant to exercise, as the one-call side recorded it.
    outcomes = {what: outcome for what, outcome, _ in at_once}
    assert outcomes["claim creates r1"].lenient_tasks == ("NOTIFY",)
    assert outcomes["claim again resumes r1"].action == "RESUMED"
    assert outcomes["claim of r2 is blocked by r1"].blocking.run_key == "airflow:sales_dag:r1"
    assert outcomes["finish r1: SUCCESS, SLA MET"].sla_status == "MET"
    assert outcomes["finish r1 again: ended already"].already_ended
    assert outcomes["claim r1 again: reopened"].action == "REOPENED"
    assert [outcomes[w].status for w in ("finish r3: FAILED", "finish r4: SUCCESS, NOTIFY failed",
            "finish r5: LOAD does not decide", "finish r6: SKIPPED")] == ["FAILED", "SUCCESS", "SUCCESS", "SKIPPED"]  # fmt: skip
    assert outcomes["finish r3: FAILED"].failed == ("LOAD",)
    assert outcomes["finish r4: SUCCESS, NOTIFY failed"].failed == ("NOTIFY",)
    assert outcomes["finish: SLA BREACHED"].sla_status == "BREACHED"
    assert outcomes["claim DOWN again: nothing new upstream, SKIPPED"].action == "SKIPPED"
    assert outcomes["claim while paused: SKIPPED"].action == "SKIPPED"
    assert outcomes["claim a retired pipeline: METADATA"][0] == "MetadataError"
    assert outcomes["finish a run nobody claimed: RUN_STATE"][0] == "RunStateError"
    rows = fast.dump()
    revision = [r for r in rows["AUD_PIPELINES_RUN_LOG"] if r["RUN_KEY"] == "airflow:sales_dag:r1"]
    assert [(r["OUTPUT_REVISION"], r["SLA_STATUS"], r["REPAIR_PENDING"]) for r in revision] == [
        (2, "MET", "N")
    ]
    assert [r["CONSUMED_PIPELINE_RUN_ID"] for r in rows["AUD_DEPENDENCY_CONSUMPTION"]] == [
        next(
            r["PIPELINE_RUN_ID"]
            for r in rows["AUD_PIPELINES_RUN_LOG"]
            if r["RUN_KEY"] == "airflow:sales_dag:u1"
        )
    ]


@pytest.mark.postgres
def test_a_one_call_claim_and_a_locked_transaction_exclude_each_other(fast: Side) -> None:
    """The function takes the same advisory transaction lock as the transaction form (the key engine/locks.py
    computes): while a transaction holds ``pipeline:SALES`` the call waits, times out naming the lock, writes
    nothing and leaves the session as it was."""
    engine = fast.hook.engine
    impatient = RunLifecycle(engine, fast.spy, lock_timeout=0.3)
    with closing(fast.hook.get_conn()) as other, engine.transaction(other, lock="pipeline:SALES"):
        with pytest.raises(LockTimeoutError, match=r"lock 'pipeline:SALES' \(advisory key"):
            impatient.claim("SALES", ident("r1"), SALES)
        assert called_at_once(after_graph_read(fast.spy.take()))
        with pytest.raises(LockTimeoutError, match=r"lock 'pipeline:SALES'"):
            impatient.finish_run("SALES", ident("r1"), ALL_SUCCESS)
        assert called_at_once(fast.spy.take())
    assert fast.dump()["AUD_PIPELINES_RUN_LOG"] == []
    session = engine.query(fast.spy.raw, "SELECT current_setting('lock_timeout'), (SELECT COUNT(*) FROM pg_locks "
                                         "WHERE locktype = 'advisory' AND pid = pg_backend_pid())")  # fmt: skip
    assert session == [("0", 0)]
    assert impatient.claim("SALES", ident("r1"), SALES).action == "CREATED"
    assert len(after_graph_read(fast.spy.take())) == 1


@pytest.mark.postgres
def test_a_one_call_transition_records_a_time_after_its_lock_wait(fast: Side) -> None:
    """The transaction form reads the clock once it holds the lock, so a run never starts before the one it
    waited for ended. The one call cannot read the caller's clock after its wait; it takes the server's then.
    Here the caller's clock is far behind, and the test holds the lock while the call waits."""
    engine = fast.hook.engine
    fast.now[0] = datetime(2000, 1, 1, tzinfo=UTC)
    identity = ident("r1")

    def waiting(call: Callable[[RunLifecycle], Any], claim: bool) -> tuple[datetime, Any]:
        """Run ``call`` on a connection of its own while the test holds ``pipeline:SALES`` for 0.3 s; returns
        when the lock was released, and the call's outcome. The call must be one round trip (after a claim's
        graph read, which takes no lock)."""
        done: list[Any] = []
        with closing(fast.hook.get_conn()) as other, closing(engine.connect()) as own:
            spy = SpyConnection(own)
            with engine.transaction(other, lock="pipeline:SALES"):
                waiter = threading.Thread(target=lambda: done.append(call(RunLifecycle(engine, spy, 30))))
                waiter.start()
                time.sleep(0.3)
                released = datetime.now(UTC)
            waiter.join(30)
        assert done, "the call did not return"
        rest = after_graph_read(spy.sent, claim)
        assert len(rest) == 1 and called_at_once(rest), spy.sent
        return released, done[0]

    released, claimed = waiting(lambda lc: lc.claim("SALES", identity, SALES), claim=True)
    assert claimed.action == "CREATED"
    (start,) = engine_rows(fast.hook, "SELECT START_DATE FROM AUD_PIPELINES_RUN_LOG")[0]
    assert released <= start <= datetime.now(UTC)
    fast.lc.finish_task(fast.lc.start_task("SALES", "EXTRACT", identity, 1), "SUCCESS")
    fast.lc.finish_task(fast.lc.start_task("SALES", "LOAD", identity, 1), "SUCCESS")
    fast.lc.finish_task(fast.lc.start_task("SALES", "NOTIFY", identity, 1), "SUCCESS")
    released, finished = waiting(lambda lc: lc.finish_run("SALES", identity, ALL_SUCCESS), claim=False)
    assert (finished.status, finished.sla_status) == ("SUCCESS", "MET")
    (end,) = engine_rows(fast.hook, "SELECT END_DATE FROM AUD_PIPELINES_RUN_LOG")[0]
    assert released <= end <= datetime.now(UTC)


@pytest.fixture
def los_angeles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions opened after this run in America/Los_Angeles (libpq sends PGTZ as the session's TimeZone)."""
    monkeypatch.setenv("PGTZ", "America/Los_Angeles")


@pytest.mark.postgres
def test_both_forms_store_the_utc_date_of_the_run_date_whatever_the_session_time_zone(
    los_angeles: None, fast: Side, full: Side
) -> None:
    """RUN_DATE is a DATE (ENGINE 0004): the UTC date of the logical date. 03:00 UTC on 1 March is still
    28 February in Los Angeles, where a plain cast in the session's time zone would land."""
    identity = ident("tz", run_date=datetime(2026, 3, 1, 3, 0, tzinfo=UTC))
    for side in (fast, full):
        with side.spy.raw.cursor() as cur:
            cur.execute("SHOW TimeZone")
            assert cur.fetchone()[0] == "America/Los_Angeles"
        side.spy.take()
        assert side.lc.claim("NO_SLA", identity).action == "CREATED"
        assert called_at_once(after_graph_read(side.spy.take())) == (side is fast)
        [(run_date, revision)] = engine_rows(
            side.hook, "SELECT RUN_DATE, OUTPUT_REVISION FROM AUD_PIPELINES_RUN_LOG"
        )
        assert (type(run_date), run_date, revision) == (date, date(2026, 3, 1), 1)


# -- psycopg 3 (auth_mode sso): one round trip as well -------------------------------------------------------


@pytest.fixture
def sso_hook(pg_cluster: PgCluster, tmp_path: Path) -> Iterator[EngineDBHook]:
    psycopg = pytest.importorskip("psycopg", reason="auth_mode sso needs psycopg 3 (the [sso] extra)")
    if psycopg.pq.version() < 180000:
        pytest.skip(f"psycopg 3 here uses libpq {psycopg.pq.version()}; sso needs libpq >= 18")
    database = pg_cluster.create_database(owner=SSO_ROLE)
    url = (f"jdbc:postgresql://{pg_cluster.host}:{pg_cluster.port}/{database}?sslmode=verify-full"
           f"&sslrootcert={pg_cluster.ca_cert}")  # fmt: skip
    text = (f"Engine:\n  sso:\n    jdbc_url: {url}\n    schema: etl_craft\n    auth_mode: sso\n    user: {SSO_ROLE}\n"
            "    issuer: https://issuer.example.com\n    client_id: etl-craft-airflow-cli\n")  # fmt: skip
    try:
        yield EngineDBHook.from_config(write_config(tmp_path / "sso", text))
    finally:
        pg_cluster.drop_database(database)


@pytest.mark.postgres
def test_with_psycopg_3_a_claim_and_a_finish_are_one_round_trip_each(
    sso_hook: EngineDBHook, tmp_path: Path
) -> None:
    assert sso_hook.migrate(project_folder(tmp_path)).applied == ["PROJECT 0001_pipelines.sql"]
    with closing(sso_hook.get_conn()) as raw:
        assert type(raw).__module__.split(".")[0] == "psycopg"
        spy = SpyConnection(raw)
        lc = RunLifecycle(sso_hook.engine, spy, lock_timeout=30)
        identity = ident("p3")
        assert lc.claim("UP", identity, ("ONLY",)).action == "CREATED"
        assert len(after_graph_read(spy.take())) == 1  # the graph read too is one round trip with psycopg 3
        assert lc.claim("UP", identity, ("ONLY",)).action == "RESUMED"
        assert len(after_graph_read(spy.take())) == 1
        lc.finish_task(lc.start_task("UP", "ONLY", identity, 1), "SUCCESS", TaskCounts(rows_written=1))
        spy.take()
        outcome = lc.finish_run("UP", identity, {"ONLY": "success"})
        assert (outcome.status, len(spy.take())) == ("SUCCESS", 1)
        assert lc.claim("DOWN", identity, ("ONLY",)).action == "CREATED"  # a dependency: the transaction form
        assert len(spy.take()) > 2
    assert engine_rows(sso_hook, "SELECT COUNT(*) FROM AUD_DEPENDENCY_CONSUMPTION") == [(0,)]


# -- upgrading an Engine DB at ENGINE 0002 ---------------------------------------------------------------------

# Rows as the release before 0003 wrote them: a finished run with a mapped task (two map indexes) and a gate
# decision on an attempt, and a run still IN-PROGRESS with a live attempt.
SEED = [
    "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, SLA_IN_HOURS) VALUES ('UP', 'u', 'FULL', 2)",
    "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE) VALUES ('OTHER', 'o', 'FULL')",
    "INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER) SELECT 'LOAD', 'ETL', PIPELINE_ID, 'PYTHON' "
    "FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'UP'",
    "INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER) SELECT 'FILES', 'ETL', PIPELINE_ID, 'PYTHON' "
    "FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'OTHER'",
    "INSERT INTO CFG_PIPELINE_DEPENDENCY (PIPELINE_ID, DEPENDS_ON_PIPELINE_ID, DEPENDENCY_TYPE) SELECT d.PIPELINE_ID, "
    "u.PIPELINE_ID, 'SUCCESS' FROM CFG_PIPELINES d, CFG_PIPELINES u WHERE d.PIPELINE_CODE = 'OTHER' AND u.PIPELINE_CODE = 'UP'",
    "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, STATUS, RUN_KEY, TRIGGER_KIND, SLA_STATUS) SELECT PIPELINE_ID, "
    "'SUCCESS', 'airflow:d:r1', 'ORCHESTRATOR', 'MET' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'UP'",
    "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, STATUS, ATTEMPT_COUNT, ROWS_WRITTEN) "
    "SELECT TASK_ID, 1, 'SUCCESS', 2, 5 FROM CFG_TASKS WHERE TASK_CODE = 'LOAD'",
    "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, MAP_INDEX, STATUS, OWNER_ID, ROWS_WRITTEN) "
    "VALUES (1, 1, 0, 'SUCCESS', 'h:1:a', 2)",
    "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, MAP_INDEX, STATUS, OWNER_ID, ROWS_WRITTEN) "
    "VALUES (1, 1, 1, 'SUCCESS', 'h:2:b', 3)",
    "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, STATUS, RUN_KEY, TRIGGER_KIND) SELECT PIPELINE_ID, "
    "'IN-PROGRESS', 'airflow:o:r1', 'ORCHESTRATOR' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'OTHER'",
    "INSERT INTO AUD_GATE_DECISIONS (PIPELINE_RUN_ID, ATTEMPT_ID, PIPELINE_DEPENDENCY_ID, SELECTED_PIPELINE_RUN_ID, "
    "RESULT, REASON) VALUES (2, 2, 1, 1, 'SATISFIED', 'upstream succeeded')",
    "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, STATUS, ATTEMPT_COUNT) "
    "SELECT TASK_ID, 2, 'IN-PROGRESS', 1 FROM CFG_TASKS WHERE TASK_CODE = 'FILES'",
    "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, STATUS, OWNER_ID) VALUES (2, 1, 'RUNNING', 'h:3:c')",
]
ALL_TABLES = {"CFG_PIPELINES": "PIPELINE_ID", "CFG_TASKS": "TASK_ID", "CFG_PIPELINE_DEPENDENCY": "PIPELINE_DEPENDENCY_ID",
              **AUD_TABLES}  # fmt: skip


def at_0002(engine: EngineSetup) -> None:
    """An Engine DB as the release before ENGINE 0003 left it: the baseline and 0002 ledgered, with runs."""
    dialect = engine.hook().engine
    ledger = dialect.sql("INSERT INTO SCHEMA_MIGRATIONS (SOURCE, VERSION, CHECKSUM) VALUES ('ENGINE', ?, ?)")
    earlier = [(v, text) for v, text in packaged_migrations(dialect.name) if v < FUNCTIONS_VERSION]
    assert [v for v, _ in earlier] == ["0002_map_index.sql"]
    with closing(dialect.connect(create=True)) as conn, dialect.schema_transaction(conn) as cur:
        for version, text in [(SCHEMA_VERSION, schema_text(dialect.name)), *earlier]:
            dialect.execute_script(cur, text)
            cur.execute(ledger, (version, checksum(text)))
        for statement in SEED:
            cur.execute(statement)


def everything(engine: EngineSetup) -> dict[str, list[tuple[Any, ...]]]:
    hook = engine.hook()
    return {
        table: engine_rows(hook, f"SELECT * FROM {table} ORDER BY {key}") for table, key in ALL_TABLES.items()
    }


def engine_functions(engine: EngineSetup) -> dict[str, tuple[bool, list[str] | None]]:
    """The Engine schema's functions: whether SECURITY DEFINER, and their settings (PostgreSQL)."""
    found = engine_rows(engine.hook(), "SELECT upper(p.proname), p.prosecdef, p.proconfig FROM pg_proc p JOIN "
                        "pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = current_schema()")  # fmt: skip
    return {name: (definer, config) for name, definer, config in found}


def test_an_engine_db_at_0002_is_migrated_to_0003_keeping_every_row(engine: EngineSetup) -> None:
    at_0002(engine)
    before = everything(engine)
    postgres = engine.dialect == "postgresql"
    if postgres:
        assert "ETL_CRAFT_CLAIM" not in engine_functions(engine)

    # Until migrate runs, a claim stops with what to do (on PostgreSQL its one call finds no function).
    with engine.hook().lifecycle() as lifecycle, pytest.raises(EngineDBError) as refused:
        lifecycle.claim("UP", ident("r2", dag_id="d"))
    assert f"needs ENGINE migration {FUNCTIONS_VERSION}" in str(refused.value)

    out, err = io.StringIO(), io.StringIO()
    assert main(["migrate", "--config", str(engine.config_path)], out, err) == 0, err.getvalue()
    assert f"applied ENGINE {FUNCTIONS_VERSION}" in out.getvalue()
    assert everything(engine) == before
    ledger = engine_rows(
        engine.hook(), "SELECT VERSION FROM SCHEMA_MIGRATIONS WHERE SOURCE = 'ENGINE' ORDER BY 1"
    )
    assert ledger == [
        (SCHEMA_VERSION,),
        ("0002_map_index.sql",),
        (FUNCTIONS_VERSION,),
        ("0004_cfg_semantics.sql",),
        ("0005_purge.sql",),
        ("0006_history_indexes.sql",),
        ("0007_config_indexes.sql",),
    ]
    assert latest_version(engine.hook().engine.name) == "0007_config_indexes.sql"
    if postgres:
        schema = engine.hook().engine_profile.schema
        functions = engine_functions(engine)
        for name in ("ETL_CRAFT_SCHEMA_IS_CURRENT", "ETL_CRAFT_CLAIM", "ETL_CRAFT_FINISH"):
            assert functions[name] == (False, [f"search_path={schema}"]), name

    # The migrated Engine DB is used as it is: on PostgreSQL a claim and a finish are one call each.
    hook = engine.hook()
    identity = ident("r2", dag_id="d")
    with closing(hook.get_conn()) as raw:
        spy = SpyConnection(raw)
        lc = RunLifecycle(hook.engine, spy)
        assert lc.claim("UP", identity, ["LOAD"]).action == "CREATED"
        rest = after_graph_read(spy.take())
        assert called_at_once(rest) == postgres and (len(rest) == 1) == postgres
        lc.finish_task(lc.start_task("UP", "LOAD", identity, 1), "SUCCESS", TaskCounts(rows_written=1))
        spy.take()
        outcome = lc.finish_run("UP", identity, {"LOAD": "success"})
        assert (outcome.status, outcome.sla_status) == ("SUCCESS", "MET")
        assert called_at_once(spy.sent) == postgres and (len(spy.take()) == 1) == postgres
    after = everything(engine)
    assert {t: rows[: len(before[t])] for t, rows in after.items()} == before  # the old rows are untouched

    out = io.StringIO()
    assert main(["migrate", "--config", str(engine.config_path)], out, io.StringIO()) == 0
    assert "applied ENGINE" not in out.getvalue()
