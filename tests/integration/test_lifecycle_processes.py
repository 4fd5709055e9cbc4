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
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import RunIdentity
from tests.conftest import EngineSetup

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
    return [tuple(r) for r in setup.hook().get_records(sql)]


# -- children (module level, so the spawn start method can import them) -------------------------------------


def _child_hook(config: str, env: dict[str, str]) -> EngineDBHook:
    os.environ.update(env)
    return EngineDBHook.from_config(config)


def start_same_try_child(config: str, env: dict[str, str], barrier: Any, results: Any, index: int) -> None:
    """Open a connection, wait for every sibling, then start try 1 of EXTRACT: a duplicate delivery."""
    from airflow_provider_etl_craft.errors import StaleTransitionError

    try:
        with _child_hook(config, env).lifecycle(lock_timeout=TIMEOUT) as lc:
            barrier.wait(timeout=TIMEOUT)
            try:
                handle = lc.start_task("SALES", "EXTRACT", ident("dup"), 1)
            except StaleTransitionError as exc:
                results.put((index, "STALE", str(exc)))
            else:
                results.put((index, "OK", (handle.attempt_id, handle.attempt_number, os.getpid())))
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
        results.put((index, "ERROR", repr(exc)))


def claim_race_child(config: str, env: dict[str, str], start: Any, go_on: Any, results: Any, index: int,
                     runs_each: int) -> None:  # fmt: skip
    """Phase 1: claim key ``first_<index>`` together with every sibling. Phase 2: claim, run and finish
    ``runs_each`` runs of its own, retrying while BLOCKED."""
    from airflow_provider_etl_craft.runs import TaskCounts

    try:
        with _child_hook(config, env).lifecycle(lock_timeout=TIMEOUT) as lc:
            start.wait(timeout=TIMEOUT)
            first = ident(f"first_{index}")
            outcome = lc.claim("SALES", first)
            blocking = outcome.blocking.pipeline_run_id if outcome.blocking else None
            results.put((index, "FIRST", (outcome.action, outcome.pipeline_run_id, blocking)))
            go_on.wait(timeout=TIMEOUT)  # the test inspects the Engine DB meanwhile
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
                results.put((index, "RUN", (identity.run_key, outcome.pipeline_run_id, [r[0] for r in live],
                                            finished.status)))  # fmt: skip
        results.put((index, "DONE", None))
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
        results.put((index, "ERROR", repr(exc)))


def collect(results: Any, procs: list[Any], expected: int) -> list[tuple[int, str, Any]]:
    got: list[tuple[int, str, Any]] = []
    deadline = time.monotonic() + TIMEOUT
    while len(got) < expected:
        try:
            got.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            raise AssertionError(f"only {len(got)} of {expected} reports: {got}; "
                                 f"exit codes {[p.exitcode for p in procs]}") from None  # fmt: skip
        assert got[-1][1] != "ERROR", got[-1]
    return got


@pytest.fixture
def processes() -> Iterator[list[Any]]:
    """Started children, joined (or killed) at the end of the test."""
    procs: list[Any] = []
    yield procs
    for proc in procs:
        proc.join(timeout=TIMEOUT)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)


# -- (a) duplicate delivery ------------------------------------------------------------------------------


def test_duplicate_delivery_of_one_try_opens_exactly_one_attempt(setup: EngineSetup, processes: list[Any]) -> None:
    with setup.hook().lifecycle() as lc:
        run_id = lc.claim("SALES", ident("dup")).pipeline_run_id
    n = 6
    barrier, results = SPAWN.Barrier(n), SPAWN.Queue()
    for i in range(n):
        proc = SPAWN.Process(target=start_same_try_child, args=(str(setup.config_path), setup.env, barrier, results, i))
        proc.start()
        processes.append(proc)
    reports = collect(results, processes, n)
    ok = [r for r in reports if r[1] == "OK"]
    stale = [r for r in reports if r[1] == "STALE"]
    assert len(ok) == 1 and len(stale) == n - 1, reports
    attempt_id, number, pid = ok[0][2]
    assert number == 1
    assert all("second delivery" in r[2] for r in stale), stale
    rows = records(setup, "SELECT ATTEMPT_ID, ATTEMPT_NUMBER, STATUS, PID FROM AUD_TASK_ATTEMPTS")
    assert rows == [(attempt_id, 1, "RUNNING", pid)]
    rows = records(setup, "SELECT PIPELINE_RUN_ID, STATUS, ATTEMPT_COUNT FROM AUD_TASK_RUN_LOG")
    assert rows == [(run_id, "IN-PROGRESS", 1)]  # the losers' increments were rolled back
    for proc in processes:
        proc.join(timeout=TIMEOUT)
        assert proc.exitcode == 0


# -- (b) claim race -----------------------------------------------------------------------------------------


def test_concurrent_claims_create_exactly_one_run_and_never_two_in_progress(
    setup: EngineSetup, processes: list[Any]
) -> None:
    n, runs_each = 8, 3
    start, go_on, results = SPAWN.Barrier(n), SPAWN.Barrier(n + 1), SPAWN.Queue()
    for i in range(n):
        proc = SPAWN.Process(target=claim_race_child, args=(str(setup.config_path), setup.env, start, go_on, results,
                                                            i, runs_each))  # fmt: skip
        proc.start()
        processes.append(proc)

    # Phase 1: everyone claims a different key of SALES at once.
    first = collect(results, processes, n)
    actions = sorted(r[2][0] for r in first)
    assert actions == ["BLOCKED"] * (n - 1) + ["CREATED"], first
    (created,) = [r for r in first if r[2][0] == "CREATED"]
    winner, created_id = created[0], created[2][1]
    assert all(r[2] == ("BLOCKED", None, created_id) for r in first if r is not created), first
    rows = records(setup, "SELECT PIPELINE_RUN_ID, STATUS, RUN_KEY FROM AUD_PIPELINES_RUN_LOG")
    assert rows == [(created_id, "IN-PROGRESS", f"airflow:sales_dag:first_{winner}")]

    # Phase 2: everyone claims, runs and finishes runs_each runs; watch the IN-PROGRESS count meanwhile.
    go_on.wait(timeout=TIMEOUT)
    hook = setup.hook()
    most, samples = 0, 0
    with closing(hook.get_conn()) as conn:
        while any(p.is_alive() for p in processes):
            (count,) = hook.engine.query(conn, "SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG WHERE STATUS = 'IN-PROGRESS'")[0]
            most, samples = max(most, count), samples + 1
            time.sleep(0.002)
    assert most <= 1 and samples > 0
    reports = collect(results, processes, n * runs_each + n)
    assert sorted(r[0] for r in reports if r[1] == "DONE") == list(range(n))
    runs = [r[2] for r in reports if r[1] == "RUN"]
    assert len(runs) == n * runs_each
    for key, run_id, live, status in runs:
        assert live == [run_id], (key, run_id, live)  # while it ran, it was the only IN-PROGRESS run
        assert status == "SUCCESS"
    # No run row is lost or doubled: every reported run is there, once, SUCCESS, with its task row.
    rows = records(setup, "SELECT RUN_KEY, PIPELINE_RUN_ID, STATUS FROM AUD_PIPELINES_RUN_LOG ORDER BY PIPELINE_RUN_ID")
    assert rows[0] == (f"airflow:sales_dag:first_{winner}", created_id, "SKIPPED")
    assert sorted(rows[1:]) == sorted((key, run_id, "SUCCESS") for key, run_id, _, _ in runs)
    assert len({r[0] for r in rows}) == len(rows) == n * runs_each + 1
    tasks = records(setup, "SELECT COUNT(*), MIN(STATUS), MAX(STATUS), SUM(ROWS_WRITTEN) FROM AUD_TASK_RUN_LOG t "
                           "JOIN CFG_TASKS c ON c.TASK_ID = t.TASK_ID WHERE c.TASK_CODE = 'EXTRACT'")  # fmt: skip
    assert tasks == [(n * runs_each, "SUCCESS", "SUCCESS", sum(i * 100 + j for i in range(n) for j in range(runs_each)))]
    for proc in processes:
        proc.join(timeout=TIMEOUT)
        assert proc.exitcode == 0


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
        assert rows == [(started["EXTRACT"][0], "RUNNING", proc.pid), (started["LOAD"][0], "RUNNING", proc.pid)]
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
        outcome = lc.finish_run("SALES", identity, {"EXTRACT": "failed", "LOAD": "success", "NOTIFY": "skipped"})
    assert (outcome.status, outcome.lost, outcome.failed, outcome.skipped) == (
        "FAILED", ("EXTRACT",), ("EXTRACT",), ("NOTIFY",))
    rows = records(setup, "SELECT ATTEMPT_ID, ATTEMPT_NUMBER, STATUS, ERROR_MESSAGE FROM AUD_TASK_ATTEMPTS "
                          "ORDER BY ATTEMPT_ID")  # fmt: skip
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (started["EXTRACT"][0], 1, "LOST"), (started["LOAD"][0], 1, "LOST"), (retry.attempt_id, 2, "SUCCESS")]
    assert rows[0][3].startswith("lost: the attempt was still live when the DAG run finished")
    assert rows[1][3].startswith("lost: Airflow started try 2 while this attempt was still live")
    rows = records(setup, "SELECT c.TASK_CODE, t.STATUS, t.ATTEMPT_COUNT FROM AUD_TASK_RUN_LOG t "
                          "JOIN CFG_TASKS c ON c.TASK_ID = t.TASK_ID ORDER BY c.TASK_CODE")  # fmt: skip
    assert rows == [("EXTRACT", "FAILED", 1), ("LOAD", "SUCCESS", 2), ("NOTIFY", "SKIPPED", 0)]
    assert records(setup, "SELECT PIPELINE_RUN_ID, STATUS FROM AUD_PIPELINES_RUN_LOG") == [(run_id, "FAILED")]
