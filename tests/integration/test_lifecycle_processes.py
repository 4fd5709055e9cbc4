"""The run lifecycle under real concurrency: separate OS processes (spawn, subprocess), never threads.

Each child builds its own hook from the craft-connector.yml (``EngineDBHook.from_config``), as an Airflow
worker on another machine would, and reports what happened through a multiprocessing queue.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import RunIdentity
from harness.engines import EngineSetup, engine_rows

SPAWN = multiprocessing.get_context("spawn")
TIMEOUT = 120.0

MIGRATION = """
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY)
VALUES ('SALES', 'Sales', 24, 'FULL', 'test');
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'EXTRACT', 'INGESTION', PIPELINE_ID, 'PYTHON', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'SALES';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'LOAD', 'ETL', PIPELINE_ID, 'SQL', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'SALES';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'NOTIFY', 'ETL', PIPELINE_ID, 'EMAIL_ALERT', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'SALES';
"""
STATES = {"EXTRACT": "success", "LOAD": "skipped", "NOTIFY": "skipped"}


def ident(run_id: str) -> RunIdentity:
    return RunIdentity("sales_dag", run_id)


@pytest.fixture
def setup(engine: EngineSetup, tmp_path: Path) -> EngineSetup:
    folder = tmp_path / "project-migrations"
    folder.mkdir()
    (folder / "0001_sales.sql").write_text(MIGRATION, encoding="utf-8")
    assert engine.hook().migrate(folder).applied == ["PROJECT 0001_sales.sql"]
    return engine


def records(setup: EngineSetup, sql: str) -> list[tuple[Any, ...]]:
    return engine_rows(setup.hook(), sql)


# -- a pool of spawned worker processes ---------------------------------------------------------------------
#
# Importing Airflow (which EngineDBHook needs) takes seconds per process, so the workers are spawned once for
# this module and then run one command at a time for each test and dialect. A command is a module-level
# function; each builds its own hook from the test's craft-connector.yml and closes its connection at the end.

WORKERS = 8


def worker_main(index: int, inbox: Any, outbox: Any, together: Any, with_test: Any) -> None:
    """Run commands ``(function, config, env, kwargs)`` until ``None``; report ERROR instead of dying."""
    while True:
        message = inbox.get()
        if message is None:
            return
        function, config, env, kwargs = message
        os.environ.update(env)
        try:
            function(EngineDBHook.from_config(config), index, together, with_test, outbox, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
            outbox.put((index, "ERROR", repr(exc)))


@dataclass
class Pool:
    procs: list[Any]
    inboxes: list[Any]
    outbox: Any
    #: All workers (the moment they act together) / all workers and the test (a checkpoint).
    together: Any
    with_test: Any

    def run(self, function: Any, setup: EngineSetup, **kwargs: Any) -> None:
        while True:  # reports a failed earlier test left behind
            try:
                self.outbox.get_nowait()
            except queue.Empty:
                break
        self.together.reset()
        self.with_test.reset()
        for inbox in self.inboxes:
            inbox.put((function, str(setup.config_path), setup.env, kwargs))

    def collect(self, expected: int) -> list[tuple[int, str, Any]]:
        got: list[tuple[int, str, Any]] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < expected:
            try:
                got.append(self.outbox.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"only {len(got)} of {expected} reports: {got}; "
                                     f"workers alive: {[p.is_alive() for p in self.procs]}") from None  # fmt: skip
            assert got[-1][1] != "ERROR", got[-1]
        return got


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    outbox, inboxes = SPAWN.Queue(), [SPAWN.Queue() for _ in range(WORKERS)]
    together, with_test = SPAWN.Barrier(WORKERS), SPAWN.Barrier(WORKERS + 1)
    procs = [SPAWN.Process(target=worker_main, args=(i, inboxes[i], outbox, together, with_test), daemon=True)
             for i in range(WORKERS)]  # fmt: skip
    for proc in procs:
        proc.start()
    yield Pool(procs, inboxes, outbox, together, with_test)
    for inbox in inboxes:
        inbox.put(None)
    for proc in procs:
        proc.join(timeout=2)
        if proc.is_alive():  # finished its work; only interpreter shutdown is left
            proc.kill()
            proc.join(timeout=10)


# -- (a) duplicate delivery ------------------------------------------------------------------------------


def start_same_try(hook: EngineDBHook, index: int, together: Any, with_test: Any, outbox: Any) -> None:
    """Open a connection, wait for every sibling, then start try 1 of EXTRACT: a duplicate delivery."""
    from airflow_provider_etl_craft.errors import StaleTransitionError

    with hook.lifecycle(lock_timeout=TIMEOUT) as lc:
        together.wait(timeout=TIMEOUT)
        try:
            handle = lc.start_task("SALES", "EXTRACT", ident("dup"), 1)
        except StaleTransitionError as exc:
            outbox.put((index, "STALE", str(exc)))
        else:
            outbox.put((index, "OK", (handle.attempt_id, handle.attempt_number, os.getpid())))


def test_duplicate_delivery_of_one_try_opens_exactly_one_attempt(setup: EngineSetup, pool: Pool) -> None:
    with setup.hook().lifecycle() as lc:
        run_id = lc.claim("SALES", ident("dup")).pipeline_run_id
    pool.run(start_same_try, setup)
    reports = pool.collect(WORKERS)
    ok = [r for r in reports if r[1] == "OK"]
    stale = [r for r in reports if r[1] == "STALE"]
    assert len(ok) == 1 and len(stale) == WORKERS - 1, reports
    attempt_id, number, pid = ok[0][2]
    assert number == 1 and pid in {p.pid for p in pool.procs}
    assert all("second delivery" in r[2] for r in stale), stale
    rows = records(setup, "SELECT ATTEMPT_ID, ATTEMPT_NUMBER, STATUS, PID FROM AUD_TASK_ATTEMPTS")
    assert rows == [(attempt_id, 1, "RUNNING", pid)]
    rows = records(setup, "SELECT PIPELINE_RUN_ID, STATUS, ATTEMPT_COUNT FROM AUD_TASK_RUN_LOG")
    assert rows == [(run_id, "IN-PROGRESS", 1)]  # the losers' increments were rolled back


# -- (b) claim race -----------------------------------------------------------------------------------------


def claim_and_run(hook: EngineDBHook, index: int, together: Any, with_test: Any, outbox: Any,
                  runs_each: int) -> None:  # fmt: skip
    """Phase 1: claim key ``first_<index>`` at the same moment as every sibling. Phase 2 (after the test's
    checkpoint): claim, run and finish ``runs_each`` runs of its own, retrying while BLOCKED."""
    from airflow_provider_etl_craft.runs import TaskCounts

    with hook.lifecycle(lock_timeout=TIMEOUT) as lc:
        together.wait(timeout=TIMEOUT)
        first = ident(f"first_{index}")
        outcome = lc.claim("SALES", first)
        blocking = outcome.blocking.pipeline_run_id if outcome.blocking else None
        outbox.put((index, "FIRST", (outcome.action, outcome.pipeline_run_id, blocking)))
        with_test.wait(timeout=TIMEOUT)  # the test inspects the Engine DB meanwhile
        if outcome.action == "CREATED":
            lc.finish_run("SALES", first, {})
        deadline = time.monotonic() + TIMEOUT
        for j in range(runs_each):
            identity = ident(f"w{index}_r{j}")
            while True:
                outcome = lc.claim("SALES", identity)
                if outcome.action != "BLOCKED":
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"still blocked by {outcome.blocking}")
                time.sleep(0.002 * (1 + index % 3))
            assert outcome.action == "CREATED", outcome
            live = lc.engine.query(lc.conn, "SELECT PIPELINE_RUN_ID FROM AUD_PIPELINES_RUN_LOG "
                                            "WHERE STATUS = 'IN-PROGRESS'")  # fmt: skip
            handle = lc.start_task("SALES", "EXTRACT", identity, 1)
            lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=index * 100 + j))
            finished = lc.finish_run("SALES", identity, STATES)
            outbox.put((index, "RUN", (identity.run_key, outcome.pipeline_run_id, [r[0] for r in live],
                                       finished.status)))  # fmt: skip
    with_test.wait(timeout=TIMEOUT)  # everyone is done
    outbox.put((index, "DONE", None))


def test_concurrent_claims_create_exactly_one_run_and_never_two_in_progress(
    setup: EngineSetup, pool: Pool
) -> None:
    n, runs_each = WORKERS, 5
    pool.run(claim_and_run, setup, runs_each=runs_each)

    # Phase 1: every worker claims a different key of SALES at once.
    first = pool.collect(n)
    actions = sorted(r[2][0] for r in first)
    assert actions == ["BLOCKED"] * (n - 1) + ["CREATED"], first
    (created,) = [r for r in first if r[2][0] == "CREATED"]
    winner, created_id = created[0], created[2][1]
    assert all(r[2] == ("BLOCKED", None, created_id) for r in first if r is not created), first
    rows = records(setup, "SELECT PIPELINE_RUN_ID, STATUS, RUN_KEY FROM AUD_PIPELINES_RUN_LOG")
    assert rows == [(created_id, "IN-PROGRESS", f"airflow:sales_dag:first_{winner}")]

    # Phase 2: every worker claims, runs and finishes runs_each runs; the test watches the IN-PROGRESS count.
    pool.with_test.wait(timeout=TIMEOUT)
    hook = setup.hook()
    most, samples, reports = 0, 0, []
    deadline = time.monotonic() + TIMEOUT
    with closing(hook.get_conn()) as conn:
        while len(reports) < n * runs_each:
            assert time.monotonic() < deadline, f"only {len(reports)} runs reported: {reports}"
            sql = "SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG WHERE STATUS = 'IN-PROGRESS'"
            (count,) = hook.engine.query(conn, sql)[0]
            most, samples = max(most, count), samples + 1
            with suppress(queue.Empty):
                reports.append(pool.outbox.get(timeout=0.002))
            assert reports == [] or reports[-1][1] == "RUN", reports[-1]
    assert most <= 1 and samples > 0
    pool.with_test.wait(timeout=TIMEOUT)
    assert sorted(r[0] for r in pool.collect(n)) == list(range(n))
    runs = [r[2] for r in reports]
    for key, run_id, live, status in runs:
        assert live == [run_id], (key, run_id, live)  # while it ran, it was the only IN-PROGRESS run
        assert status == "SUCCESS"
    # No run row is lost or doubled: every reported run is there, once, SUCCESS, with its task row.
    rows = records(
        setup, "SELECT RUN_KEY, PIPELINE_RUN_ID, STATUS FROM AUD_PIPELINES_RUN_LOG ORDER BY PIPELINE_RUN_ID"
    )
    assert rows[0] == (f"airflow:sales_dag:first_{winner}", created_id, "SKIPPED")
    assert sorted(rows[1:]) == sorted((key, run_id, "SUCCESS") for key, run_id, _, _ in runs)
    assert len({r[0] for r in rows}) == len(rows) == n * runs_each + 1
    tasks = records(setup, "SELECT COUNT(*), MIN(t.STATUS), MAX(t.STATUS), SUM(t.ROWS_WRITTEN) FROM AUD_TASK_RUN_LOG t "
                           "JOIN CFG_TASKS c ON c.TASK_ID = t.TASK_ID WHERE c.TASK_CODE = 'EXTRACT'")  # fmt: skip
    assert tasks == [
        (n * runs_each, "SUCCESS", "SUCCESS", sum(i * 100 + j for i in range(n) for j in range(runs_each)))
    ]


# -- (c) a worker killed with SIGKILL ----------------------------------------------------------------------

HOLDER = """
import sys, time
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import RunIdentity
with EngineDBHook.from_config(sys.argv[1]).lifecycle() as lc:
    identity = RunIdentity("sales_dag", sys.argv[2])
    for code in ("EXTRACT", "LOAD"):
        handle = lc.start_task("SALES", code, identity, 1)
        print(code, handle.attempt_id, handle.task_run_id, flush=True)
    time.sleep(600)                  # the work "runs" until the worker is killed
"""


def test_a_killed_worker_leaves_its_attempt_to_be_closed_lost(setup: EngineSetup) -> None:
    identity = ident("killed")
    with setup.hook().lifecycle() as lc:
        run_id = lc.claim("SALES", identity).pipeline_run_id
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(setup.config_path), "killed"],
                            env=setup.subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        started = {}
        for _ in range(2):
            line = proc.stdout.readline().split()
            assert len(line) == 3, proc.stderr.read() if proc.stderr else line
            started[line[0]] = (int(line[1]), int(line[2]))
        rows = records(setup, "SELECT ATTEMPT_ID, STATUS, PID FROM AUD_TASK_ATTEMPTS ORDER BY ATTEMPT_ID")
        assert rows == [
            (started["EXTRACT"][0], "RUNNING", proc.pid),
            (started["LOAD"][0], "RUNNING", proc.pid),
        ]
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)

    with setup.hook().lifecycle(lock_timeout=10) as lc:
        # Airflow retries LOAD: try 2 closes the dead try 1 LOST and records normally.
        retry = lc.start_task("SALES", "LOAD", identity, 2)
        lc.finish_task(retry, "SUCCESS")
        # Nobody retries EXTRACT: the finish task closes its attempt LOST and the task run FAILED.
        outcome = lc.finish_run(
            "SALES", identity, {"EXTRACT": "failed", "LOAD": "success", "NOTIFY": "skipped"}
        )
    assert (outcome.status, outcome.lost, outcome.failed, outcome.skipped) == (
        "FAILED",
        ("EXTRACT",),
        ("EXTRACT",),
        ("NOTIFY",),
    )
    rows = records(setup, "SELECT ATTEMPT_ID, ATTEMPT_NUMBER, STATUS, ERROR_MESSAGE FROM AUD_TASK_ATTEMPTS "
                          "ORDER BY ATTEMPT_ID")  # fmt: skip
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (started["EXTRACT"][0], 1, "LOST"),
        (started["LOAD"][0], 1, "LOST"),
        (retry.attempt_id, 2, "SUCCESS"),
    ]
    assert rows[0][3].startswith("lost: the attempt was still live when the DAG run finished")
    assert rows[1][3].startswith("lost: Airflow started try 2 while this attempt was still live")
    rows = records(setup, "SELECT c.TASK_CODE, t.STATUS, t.ATTEMPT_COUNT FROM AUD_TASK_RUN_LOG t "
                          "JOIN CFG_TASKS c ON c.TASK_ID = t.TASK_ID ORDER BY c.TASK_CODE")  # fmt: skip
    assert rows == [("EXTRACT", "FAILED", 1), ("LOAD", "SUCCESS", 2), ("NOTIFY", "SKIPPED", 0)]
    assert records(setup, "SELECT PIPELINE_RUN_ID, STATUS FROM AUD_PIPELINES_RUN_LOG") == [(run_id, "FAILED")]
