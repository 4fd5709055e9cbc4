"""Holders killed with ``kill -9`` (docs/locks.md: a lock is released when its holder ends, also when killed;
docs/lifecycle.md: a killed worker's attempt is closed LOST by the finish task or by the next try).

Every child is a real process (``children.py``) that takes hold of something, says READY, and sleeps; the test
makes sure it really holds it, SIGKILLs it, and measures how soon the Engine DB is usable again.
"""

from __future__ import annotations

import signal
import sqlite3
import time

import pytest

from airflow_provider_etl_craft.errors import LockTimeoutError
from airflow_provider_etl_craft.runs import RunIdentity, TaskCounts
from harness.engines import EngineSetup
from tests.reliability.conftest import Child, rows, scalar, seed

PIPELINE, TASK = "KILLED", "STEP"
#: The timeout the test process waits with after the kill; "at once" means well under it.
WAIT = 20.0
AT_ONCE = 5.0


def identity(run_id: str) -> RunIdentity:
    return RunIdentity("killed_dag", run_id)  # the same dag id children.py uses


def kill(child: Child) -> None:
    child.kill()
    assert child.proc.returncode == -signal.SIGKILL


def test_a_lock_whose_holder_is_killed_is_free_at_once(engine: EngineSetup, children: list[Child]) -> None:
    seed(engine, {PIPELINE: [TASK]})
    name = f"pipeline:{PIPELINE}"
    child = Child(engine, "lock", name)
    children.append(child)
    child.ready()
    hook = engine.hook()
    with pytest.raises(LockTimeoutError, match=PIPELINE), hook.lock(name, timeout=0.5):
        pass  # the child really holds it
    with hook.lifecycle(lock_timeout=0.5) as lc, pytest.raises(LockTimeoutError):
        lc.claim(PIPELINE, identity("while_held"))  # and so the pipeline's claims wait for it

    kill(child)
    started = time.monotonic()
    with hook.lock(name, timeout=WAIT):
        waited = time.monotonic() - started
    assert waited < AT_ONCE, f"the lock of a killed holder took {waited:.2f}s to free (timeout {WAIT}s)"
    started = time.monotonic()
    with hook.lifecycle(lock_timeout=WAIT) as lc:
        outcome = lc.claim(PIPELINE, identity("after_kill"))
    claimed = time.monotonic() - started
    assert outcome.action == "CREATED" and claimed < AT_ONCE, (outcome, claimed)


def test_a_killed_attempt_is_closed_lost_by_the_finish_task(
    engine: EngineSetup, children: list[Child]
) -> None:
    seed(engine, {PIPELINE: [TASK, "AFTER"]})
    run = identity("finish_closes")
    with engine.hook().lifecycle(lock_timeout=WAIT) as lc:
        run_id = lc.claim(PIPELINE, run).pipeline_run_id
    child = Child(engine, "attempt", PIPELINE, TASK, run.run_id, 1)
    children.append(child)
    attempt_id, task_run_id = map(int, child.ready())
    assert rows(engine, "SELECT STATUS, PID FROM AUD_TASK_ATTEMPTS WHERE ATTEMPT_ID = ?", attempt_id) == [
        ("RUNNING", child.proc.pid)
    ]
    kill(child)

    # Airflow's zombie detection fails the task; AFTER never ran (upstream failed); finish closes the run.
    with engine.hook().lifecycle(lock_timeout=WAIT) as lc:
        outcome = lc.finish_run(PIPELINE, run, {TASK: "failed", "AFTER": "upstream_failed"})
    assert (outcome.status, outcome.lost, outcome.failed, outcome.skipped) == (
        "FAILED",
        (TASK,),
        (TASK,),
        ("AFTER",),
    )
    (status, ended, error) = rows(engine, "SELECT STATUS, ENDED_AT, ERROR_MESSAGE FROM AUD_TASK_ATTEMPTS "
                                          "WHERE ATTEMPT_ID = ?", attempt_id)[0]  # fmt: skip
    assert status == "LOST" and ended is not None and error.startswith("lost:"), (status, ended, error)
    task_runs = rows(engine, "SELECT tr.TASK_RUN_ID, t.TASK_CODE, tr.STATUS, tr.ATTEMPT_COUNT FROM AUD_TASK_RUN_LOG tr "
                             "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID ORDER BY t.TASK_CODE")  # fmt: skip
    assert [r[1:] for r in task_runs] == [("AFTER", "SKIPPED", 0), (TASK, "FAILED", 1)]
    assert task_runs[1][0] == task_run_id
    assert rows(engine, "SELECT PIPELINE_RUN_ID, STATUS FROM AUD_PIPELINES_RUN_LOG") == [(run_id, "FAILED")]
    assert scalar(engine, "SELECT COUNT(*) FROM AUD_TASK_ATTEMPTS") == 1


def test_the_next_try_closes_a_killed_attempt_lost(engine: EngineSetup, children: list[Child]) -> None:
    seed(engine, {PIPELINE: [TASK]})
    run = identity("retry_closes")
    with engine.hook().lifecycle(lock_timeout=WAIT) as lc:
        run_id = lc.claim(PIPELINE, run).pipeline_run_id
    child = Child(engine, "attempt", PIPELINE, TASK, run.run_id, 1)
    children.append(child)
    dead_attempt, _ = map(int, child.ready())
    kill(child)

    with engine.hook().lifecycle(lock_timeout=WAIT) as lc:  # Airflow retries the task: try 2
        retry = lc.start_task(PIPELINE, TASK, run, 2)
        lc.finish_task(retry, "SUCCESS", TaskCounts(rows_written=5))
        outcome = lc.finish_run(PIPELINE, run, {TASK: "success"})
    assert (outcome.status, outcome.lost) == ("SUCCESS", ())
    found = rows(
        engine,
        "SELECT ATTEMPT_ID, ATTEMPT_NUMBER, STATUS, ERROR_MESSAGE FROM AUD_TASK_ATTEMPTS ORDER BY ATTEMPT_ID",
    )
    assert [r[:3] for r in found] == [(dead_attempt, 1, "LOST"), (retry.attempt_id, 2, "SUCCESS")]
    assert found[0][3].startswith("lost: Airflow started try 2"), found[0][3]
    assert rows(engine, "SELECT STATUS, ATTEMPT_COUNT, ROWS_WRITTEN FROM AUD_TASK_RUN_LOG") == [
        ("SUCCESS", 2, 5)
    ]
    assert rows(engine, "SELECT PIPELINE_RUN_ID, STATUS FROM AUD_PIPELINES_RUN_LOG") == [(run_id, "SUCCESS")]


def test_a_process_killed_inside_a_write_transaction_blocks_nobody(engine: EngineSetup,
                                                                   children: list[Child]) -> None:  # fmt: skip
    """The child dies holding the database's write lock (SQLite) / the run's row lock (PostgreSQL) with an
    uncommitted change: the change is rolled back and the next writer goes ahead at once."""
    seed(engine, {PIPELINE: [TASK]})
    run = identity("txn")
    hook = engine.hook()
    with hook.lifecycle(lock_timeout=WAIT) as lc:
        run_id = lc.claim(PIPELINE, run).pipeline_run_id
    child = Child(engine, "txn", run.run_key)
    children.append(child)
    assert child.ready() == ["1"]  # it changed the run row, uncommitted

    conn = hook.get_conn()  # proof that the child holds the lock a writer needs
    try:
        if engine.dialect == "sqlite":
            conn.execute("PRAGMA busy_timeout = 200")
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                conn.execute("BEGIN IMMEDIATE")
        else:
            import psycopg2.errors

            cur = conn.cursor()
            cur.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg2.errors.LockNotAvailable):
                cur.execute(
                    f"SELECT 1 FROM {hook.engine_profile.schema}.AUD_PIPELINES_RUN_LOG WHERE RUN_KEY = %s FOR UPDATE",
                    (run.run_key,),
                )
    finally:
        conn.close()

    kill(child)
    started = time.monotonic()
    assert rows(engine, "SELECT STATUS FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = ?", run_id) == [
        ("IN-PROGRESS",)
    ]  # the child's uncommitted FAILED is gone
    with hook.lifecycle(lock_timeout=WAIT) as lc:
        handle = lc.start_task(PIPELINE, TASK, run, 1)
        lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=1))
        outcome = lc.finish_run(PIPELINE, run, {TASK: "success"})
    took = time.monotonic() - started
    assert outcome.status == "SUCCESS"
    assert took < AT_ONCE, (
        f"writers waited {took:.2f}s after the killed transaction (SQLite busy timeout is 60s)"
    )
