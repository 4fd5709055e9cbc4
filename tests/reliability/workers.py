"""What the reliability tests' spawned worker processes run (imported in the children, referenced by the tests).

A worker is a real OS process started with the ``spawn`` method: it shares nothing with the test process but
the craft-connector.yml path and the environment it is sent. Every command is a module-level function
``command(hook, report, **kwargs)``: ``hook`` is a fresh ``EngineDBHook.from_config(...)`` built in the worker,
as an Airflow worker on another machine would build it, and ``report(kind, payload)`` sends a message to the
test. A command that raises is reported as ``ERROR`` with its traceback; the worker then waits for the next.
"""

from __future__ import annotations

import os
import pickle
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from typing import Any

from airflow_provider_etl_craft.errors import EtlCraftError, LockTimeoutError, StaleTransitionError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import RunIdentity, TaskCounts

Report = Callable[[str, Any], None]
#: How long a worker waits at a barrier before it gives up (the test fails on the BrokenBarrierError).
BARRIER_TIMEOUT = 120.0


def worker_main(index: int, inbox: Any, outbox: Any) -> None:
    """Announce readiness, then run ``(token, pickled (function, config, env, kwargs))`` commands until ``None``."""
    outbox.put((None, index, "READY", os.getpid()))
    while True:
        message = inbox.get()
        if message is None:
            return
        token, command = message

        def report(kind: str, payload: Any, token: str = token) -> None:
            outbox.put((token, index, kind, payload))

        try:
            function, config, env, kwargs = pickle.loads(command)
            os.environ.update(env)
            function(EngineDBHook.from_config(config), report, index=index, **kwargs)
        except BaseException:  # noqa: BLE001 - everything is reported; the test fails on it
            report("ERROR", traceback.format_exc())
        else:
            report("DONE", None)


def _in_progress(hook: EngineDBHook, conn: Any, pipeline_code: str) -> list[int]:
    """The pipeline's IN-PROGRESS run ids, read on ``conn`` (autocommit: the latest committed state)."""
    rows = hook.engine.query(
        conn,
        "SELECT r.PIPELINE_RUN_ID FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID "
        "WHERE p.PIPELINE_CODE = ? AND r.STATUS = 'IN-PROGRESS'",
        (pipeline_code,),
    )
    return [int(r[0]) for r in rows]


# -- 1. claim race ------------------------------------------------------------------------------------------


def claim_race(hook: EngineDBHook, report: Report, *, index: int, pipeline: str, task: str, rounds: int,
               lock_timeout: float, short_lock_timeout: float, deadline_s: float, start: Any, hold: Any,
               hold_index: int) -> None:  # fmt: skip
    """Claim ``rounds`` runs of ``pipeline`` with keys of our own, retrying while BLOCKED or refused; run each
    one's task and finish it. Reports ``RUN`` per run, then ``TALLY`` with every claim outcome seen.

    Odd workers wait only ``short_lock_timeout`` for the pipeline lock, so some of their claims and finishes
    may be refused with LOCK_TIMEOUT (and retried, as Airflow would).

    Two reports let the test force the race instead of hoping for it: ``FIRST_BLOCKED`` (the run that blocked
    our first claim) the first time a claim comes back BLOCKED, and ``HOLDING`` (our run id) from worker
    ``hold_index`` once its first run is created: it keeps that run IN-PROGRESS until the test sets ``hold``."""
    rng = random.Random(index)
    tally: Counter[str] = Counter()
    refusals: list[str] = []
    probe = hook.get_conn()
    with closing(probe), hook.lifecycle(lock_timeout=short_lock_timeout if index % 2 else lock_timeout) as lc:
        start.wait(timeout=BARRIER_TIMEOUT)  # every worker and the test: go
        deadline = time.monotonic() + deadline_s
        for j in range(rounds):
            identity = RunIdentity("race_dag", f"w{index:02d}_r{j}")
            blocked = refused = 0
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{identity.run_key} not claimed after {deadline_s}s: {dict(tally)}")
                try:
                    outcome = lc.claim(pipeline, identity)
                except (LockTimeoutError, StaleTransitionError) as exc:
                    tally[f"REFUSED:{type(exc).__name__}"] += 1
                    refusals.append(f"{type(exc).__name__}: {exc}"[:300])
                    refused += 1
                    time.sleep(rng.uniform(0.005, 0.03))
                    continue
                tally[outcome.action] += 1
                if outcome.action == "BLOCKED":
                    blocked += 1
                    if tally["BLOCKED"] == 1:
                        report("FIRST_BLOCKED", outcome.blocking and outcome.blocking.pipeline_run_id)
                    time.sleep(rng.uniform(0.002, 0.02))
                    continue
                break
            if outcome.action != "CREATED":  # RESUMED / REOPENED / anything new: nobody reuses our keys
                report("UNEXPECTED", (identity.run_key, outcome.action, outcome.pipeline_run_id))
                continue
            live = _in_progress(hook, probe, pipeline)
            if index == hold_index and j == 0:  # the test's watcher must see this run live: wait until it has
                report("HOLDING", outcome.pipeline_run_id)
                if not hold.wait(timeout=BARRIER_TIMEOUT):
                    raise TimeoutError(f"the test never let {identity.run_key} go on")
            handle = lc.start_task(pipeline, task, identity, 1)
            lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=index * 1000 + j))
            while True:
                try:
                    finished = lc.finish_run(pipeline, identity, {task: "success"})
                    break
                except LockTimeoutError as exc:  # a retried finish task; the run stays IN-PROGRESS meanwhile
                    tally["FINISH_REFUSED:LockTimeoutError"] += 1
                    refusals.append(f"finish: {exc}"[:300])
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(rng.uniform(0.001, 0.01))
            report("RUN", {"run_key": identity.run_key, "run_id": outcome.pipeline_run_id, "live": live,
                           "status": finished.status, "blocked": blocked, "refused": refused,
                           "rows_written": index * 1000 + j})  # fmt: skip
    report("TALLY", {"tally": dict(tally), "refusals": refusals[:20]})


def raw_in_progress_insert(
    hook: EngineDBHook, report: Report, *, index: int, pipeline: str, together: Any
) -> None:
    """INSERT an IN-PROGRESS run straight into the table (no lock, no lifecycle) at the same moment as siblings."""
    engine = hook.engine
    conn = hook.get_conn()
    try:
        together.wait(timeout=BARRIER_TIMEOUT)
        try:
            with engine.transaction(conn) as cur:
                cur.execute(engine.sql(
                    "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, START_DATE, STATUS, RUN_KEY, TRIGGER_KIND) "
                    "SELECT PIPELINE_ID, ?, 'IN-PROGRESS', ?, 'MANUAL' FROM CFG_PIPELINES "
                    "WHERE PIPELINE_CODE = ? AND ACTIVE_FLAG = 'Y'"),
                    (engine.to_db_time(engine.now()), f"raw:{index}", pipeline))  # fmt: skip
                inserted = cur.rowcount
        except engine.integrity_error():
            report("INSERT", "INTEGRITY")
        else:
            report("INSERT", "INSERTED" if inserted == 1 else f"ROWCOUNT {inserted}")
    finally:
        conn.close()


def lock_probe(hook: EngineDBHook, report: Report, *, index: int, name: str, timeout: float,
               checked: Any) -> None:  # fmt: skip
    """Wait at most ``timeout`` for lock ``name`` on a connection of our own (the test holds the lock meanwhile).

    Reports ``TRYING`` (our PostgreSQL backend pid; None on SQLite) just before the wait, then ``ENDED`` with
    how it ended (``TIMEOUT`` or ``ACQUIRED``), the seconds waited, the error text and, on PostgreSQL, the
    advisory locks our session holds afterwards (read on that same session). The connection and the process
    stay as they are until the test, having looked from outside, sets ``checked``.
    """
    postgres = hook.engine_profile.dialect_name == "postgresql"
    conn = hook.get_conn()
    try:
        backend = hook.engine.query(conn, "SELECT pg_backend_pid()")[0][0] if postgres else None
        report("TRYING", backend)
        started = time.monotonic()
        outcome, message = "ACQUIRED", ""
        try:
            with hook.lock(name, timeout=timeout, conn=conn):
                pass
        except LockTimeoutError as exc:
            outcome, message = "TIMEOUT", str(exc)
        waited = time.monotonic() - started
        held = None
        if postgres:
            held = hook.engine.query(conn, "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' "
                                           "AND pid = pg_backend_pid()")[0][0]  # fmt: skip
        report("ENDED", {"outcome": outcome, "waited": waited, "message": message, "held": held,
                         "backend": backend, "pid": os.getpid()})  # fmt: skip
        if not checked.wait(timeout=BARRIER_TIMEOUT):
            raise TimeoutError("the test never finished its checks")
    finally:
        conn.close()


# -- 2. duplicate delivery ----------------------------------------------------------------------------------


def start_same_try(hook: EngineDBHook, report: Report, *, index: int, pipeline: str, task: str, run_id: str,
                   try_number: int, together: Any) -> None:  # fmt: skip
    """Open a connection, meet the sibling at the barrier, then start the same try of the same task."""
    with hook.lifecycle(lock_timeout=30) as lc:
        together.wait(timeout=BARRIER_TIMEOUT)
        try:
            handle = lc.start_task(pipeline, task, RunIdentity("dup_dag", run_id), try_number)
        except StaleTransitionError as exc:
            report("STALE", str(exc))
        else:
            report("OK", handle)


# -- 5. SQLite writers (soak) -------------------------------------------------------------------------------


def soak_writer(hook: EngineDBHook, report: Report, *, index: int, mode: str, seconds: float, start: Any,
                shared_pipeline: str, shared_run_id: str, tasks_per_worker: int, own_pipeline: str,
                own_tasks: list[str], min_opened: int, going: Any, overrun: float) -> None:  # fmt: skip
    """Write task records for ``seconds``; count every write that returned, and every exception seen.

    Once it has opened ``min_opened`` attempts a writer reports ``GOING``; it stops only when ``seconds`` are
    over and the test has set ``going`` (every writer is GOING), so each writer's first ``min_opened`` writes
    happen while all the others are still writing, however slow the machine. Past ``seconds + overrun`` it
    gives up (TimeoutError: some writer never got going).

    ``mode="tries"``: start/finish ever higher tries of our own task codes in one shared IN-PROGRESS run.
    ``mode="runs"``: claim, run and finish runs of our own pipeline (one task fails its first try each run).
    Reports ``RESULT`` with the counts and ``errors`` (every exception, as text).
    """
    errors: list[str] = []
    opened = 0
    ended: Counter[str] = Counter()
    rows_written = 0
    tries: Counter[str] = Counter()  # task code → attempts opened in the shared run
    runs: Counter[str] = Counter()  # claim actions and finish statuses of our own pipeline's runs

    def attempt(
        lc: Any, pipeline: str, code: str, identity: RunIdentity, try_number: int, fail: bool
    ) -> bool:
        """One try: start it, then end it FAILED or SUCCESS; False when a write raised (reported)."""
        nonlocal opened, rows_written
        try:
            handle = lc.start_task(pipeline, code, identity, try_number)
        except Exception as exc:  # noqa: BLE001 - counted and reported
            errors.append(f"start_task {code} try {try_number}: {type(exc).__name__}: {exc}")
            return False
        opened += 1
        tries[code] += 1
        status = "FAILED" if fail else "SUCCESS"
        written = 0 if fail else try_number + index
        try:
            lc.finish_task(handle, status, TaskCounts(rows_written=written),
                           error=f"soak failure {index}/{code}/{try_number}" if fail else None)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - counted and reported
            errors.append(f"finish_task {code} try {try_number}: {type(exc).__name__}: {exc}")
            return False
        ended[status] += 1
        rows_written += written
        return True

    def more() -> bool:
        """Go on while the soak lasts or some writer has not got going yet (ours: report it once)."""
        nonlocal said_going
        if opened >= min_opened and not said_going:
            report("GOING", opened)
            said_going = True
        now = time.monotonic()
        if now < deadline:
            return True
        if going.is_set():
            return False
        if now > deadline + overrun:
            raise TimeoutError(f"after {seconds + overrun:g}s not every writer has opened {min_opened} attempts "
                               f"(this one: {opened}; errors: {errors[:3]})")  # fmt: skip
        return True

    said_going = False
    with hook.lifecycle(lock_timeout=60) as lc:
        start.wait(timeout=BARRIER_TIMEOUT)
        deadline = time.monotonic() + seconds
        n = 0
        if mode == "tries":
            shared = RunIdentity("soak_dag", shared_run_id)
            codes = [f"T{index}_{k}" for k in range(tasks_per_worker)]
            while more():
                try_number = n // len(codes) + 1
                attempt(
                    lc, shared_pipeline, codes[n % len(codes)], shared, try_number, fail=try_number % 3 == 0
                )
                n += 1
        else:
            while more():
                identity = RunIdentity("soak_dag", f"own_{index}_{n}")
                n += 1
                try:
                    outcome = lc.claim(own_pipeline, identity)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    errors.append(f"claim {identity.run_key}: {type(exc).__name__}: {exc}")
                    continue
                runs[outcome.action] += 1
                if outcome.action != "CREATED":
                    errors.append(f"claim {identity.run_key}: unexpected {outcome.action}")
                    continue
                for k, code in enumerate(own_tasks):
                    first_fails = k == n % len(own_tasks)
                    if attempt(lc, own_pipeline, code, identity, 1, fail=first_fails) and first_fails:
                        attempt(lc, own_pipeline, code, identity, 2, fail=False)
                try:
                    finished = lc.finish_run(own_pipeline, identity, dict.fromkeys(own_tasks, "success"))
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    errors.append(f"finish_run {identity.run_key}: {type(exc).__name__}: {exc}")
                    continue
                runs[f"FINISHED:{finished.status}"] += 1
    report("RESULT", {"mode": mode, "errors": errors, "opened": opened, "ended": dict(ended),
                      "rows_written": rows_written, "tries": dict(tries), "runs": dict(runs)})  # fmt: skip


def fail_on_purpose(hook: EngineDBHook, report: Report, *, index: int) -> None:
    """A command that raises: the pool must report it as ERROR and stay usable."""
    raise EtlCraftError(f"worker {index} fails on purpose")


def ping(hook: EngineDBHook, report: Report, *, index: int) -> None:
    """Answer with our pid and whether the Engine profile resolves (a liveness check of the pool)."""
    report("PONG", (os.getpid(), hook.engine_profile.dialect_name))
