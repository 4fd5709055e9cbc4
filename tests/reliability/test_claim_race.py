"""Sixteen worker processes race to claim runs of one pipeline (one IN-PROGRESS run:
docs/schema.md; locks: docs/locks.md; the claim: docs/lifecycle.md).

Each worker claims ``ROUNDS`` runs with run keys of its own, retrying while BLOCKED (another run holds the
pipeline) or refused (LOCK_TIMEOUT / STALE_TRANSITION, which Airflow retries), then runs the task and
finishes the run. The test process watches the IN-PROGRESS count the whole time on its own connection.

Every condition a test checks is forced by the test (a run or a lock it holds, a backend it freezes), never
left to the timing of the processes: on an idle or a loaded machine the same things happen.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.engine.locks import pipeline_lock
from airflow_provider_etl_craft.runs import RunIdentity
from harness.engines import EngineSetup
from tests.reliability import workers
from tests.reliability.conftest import Job, Pool, rows, scalar, seed, wait_until

WORKERS = 16
ROUNDS = 5
PIPELINE, TASK = "RACE", "WORK"
#: Pipeline-lock timeouts: even workers wait long, odd ones briefly, so LOCK_TIMEOUT refusals can happen
#: and are then counted and retried (the lock-timeout tests below force them instead).
LOCK_TIMEOUT = 5.0
SHORT_LOCK_TIMEOUT = {"sqlite": 0.02, "postgresql": 0.02}
RACE_DEADLINE = 150.0
#: The worker that keeps its first run IN-PROGRESS until the test's watcher has seen it.
HOLDER = 0
#: Claim outcomes a worker may see here (nobody reuses a key, nothing is paused or gated).
ALLOWED = {"CREATED", "BLOCKED", "REFUSED:LockTimeoutError", "REFUSED:StaleTransitionError",
           "FINISH_REFUSED:LockTimeoutError"}  # fmt: skip


def test_sixteen_processes_claiming_one_pipeline_never_overlap_and_lose_nothing(engine: EngineSetup,
                                                                                pool: Pool) -> None:  # fmt: skip
    """The race is forced, not hoped for: the test's own run ("gate") is IN-PROGRESS when the workers start,
    so every worker's first claim comes back BLOCKED; the gate is finished only once all sixteen have reported
    that, and the race is on. Worker HOLDER then keeps its first run IN-PROGRESS until the test's watcher has
    seen it, so the watcher is known to have watched the race (two different live runs, at least)."""
    seed(engine, {PIPELINE: [TASK]})
    hook = engine.hook()
    gate = RunIdentity("race_dag", "gate")
    with hook.lifecycle(lock_timeout=LOCK_TIMEOUT) as lc:
        outcome = lc.claim(PIPELINE, gate)
    assert outcome.action == "CREATED", outcome
    gate_id = outcome.pipeline_run_id
    go, hold = pool.barrier(WORKERS + 1), pool.manager.Event()
    job = pool.send(workers.claim_race, engine, range(WORKERS), pipeline=PIPELINE, task=TASK, rounds=ROUNDS,
                    lock_timeout=LOCK_TIMEOUT, short_lock_timeout=SHORT_LOCK_TIMEOUT[engine.dialect],
                    deadline_s=RACE_DEADLINE, start=go, hold=hold, hold_index=HOLDER)  # fmt: skip
    go.wait(timeout=120)
    started = time.monotonic()

    # The test process samples the IN-PROGRESS rows of the pipeline until every worker is done; meanwhile it
    # ends the gate once every worker was blocked by it, and lets HOLDER go on once it has seen HOLDER's run.
    sql = ("SELECT r.PIPELINE_RUN_ID FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p "
                          "ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ? AND r.STATUS = 'IN-PROGRESS'")  # fmt: skip
    samples, overlaps, seen_live = 0, [], set()
    phase, held_id, gate_status = "gate", None, None
    try:
        with closing(hook.get_conn()) as conn:
            while not job.finished and time.monotonic() - started < RACE_DEADLINE + 30:
                live = [r[0] for r in hook.engine.query(conn, sql, (PIPELINE,))]
                samples += 1
                seen_live.update(live)
                if len(live) > 1:
                    overlaps.append(live)
                job.pump(0.003)
                if phase == "gate" and gate_id in seen_live and len(job.of_kind("FIRST_BLOCKED")) == WORKERS:
                    with hook.lifecycle(lock_timeout=RACE_DEADLINE) as lc:
                        gate_status = lc.finish_run(PIPELINE, gate, {}).status
                    phase = "race"
                elif phase == "race" and job.of_kind("HOLDING"):
                    held_id = job.of_kind("HOLDING")[0][1]
                    if held_id in seen_live and samples >= 10:
                        hold.set()
                        phase = "released"
    finally:
        hold.set()  # whatever happened, HOLDER must not wait for the test any longer
    job.wait(timeout=max(1.0, RACE_DEADLINE + 30 - (time.monotonic() - started)))  # no deadlock: all finish
    elapsed = time.monotonic() - started

    assert overlaps == [], f"two IN-PROGRESS runs of {PIPELINE} at once: {overlaps[:5]}"
    assert phase == "released", (phase, job.messages[-20:])
    assert gate_status == "SKIPPED"  # finished without any task run
    # Every worker was blocked by the gate first; the watcher saw the gate and HOLDER's run live.
    assert sorted(i for i, _ in job.of_kind("FIRST_BLOCKED")) == list(range(WORKERS))
    assert {blocking for _, blocking in job.of_kind("FIRST_BLOCKED")} == {gate_id}
    assert samples >= 10 and {gate_id, held_id} <= seen_live, (samples, seen_live, held_id)
    assert job.of_kind("UNEXPECTED") == []

    # Every claim outcome is one of the clean ones, and the tallies add up.
    tallies = [payload["tally"] for _, payload in job.of_kind("TALLY")]
    assert len(tallies) == WORKERS
    totals: dict[str, int] = {}
    for tally in tallies:
        for action, count in tally.items():
            totals[action] = totals.get(action, 0) + count
    assert set(totals) <= ALLOWED, totals
    runs = [payload for _, payload in job.of_kind("RUN")]
    created = totals.get("CREATED", 0)
    assert created == len(runs) == WORKERS * ROUNDS, (totals, len(runs))
    assert totals.get("BLOCKED", 0) >= WORKERS, totals
    blocked_then_won = sum(1 for run in runs if run["blocked"] > 0)
    assert blocked_then_won >= WORKERS  # at least every worker's first run
    for run in runs:
        assert run["live"] == [run["run_id"]], run  # while it ran, it was the only IN-PROGRESS run
        assert run["status"] == "SUCCESS", run
    assert held_id in {run["run_id"] for run in runs}

    # No lost or doubled row: the Engine DB holds exactly the gate and the runs the workers reported as CREATED.
    stored = rows(engine, "SELECT r.RUN_KEY, r.PIPELINE_RUN_ID, r.STATUS FROM AUD_PIPELINES_RUN_LOG r "
                          "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ?", PIPELINE)  # fmt: skip
    assert len(stored) == created + 1
    assert sorted(stored) == sorted(
        [(gate.run_key, gate_id, gate_status)] + [(run["run_key"], run["run_id"], "SUCCESS") for run in runs]
    )
    task_rows = rows(engine, "SELECT COUNT(*), COUNT(DISTINCT PIPELINE_RUN_ID), MIN(STATUS), MAX(STATUS), "
                             "SUM(ROWS_WRITTEN), MAX(ATTEMPT_COUNT) FROM AUD_TASK_RUN_LOG")  # fmt: skip
    assert task_rows == [
        (created, created, "SUCCESS", "SUCCESS", sum(run["rows_written"] for run in runs), 1)
    ]
    attempts = rows(
        engine, "SELECT COUNT(*), MIN(STATUS), MAX(STATUS), MAX(ATTEMPT_NUMBER) FROM AUD_TASK_ATTEMPTS"
    )
    assert attempts == [(created, "SUCCESS", "SUCCESS", 1)]
    print(f"\n[{engine.dialect}] claim race: {WORKERS} processes x {ROUNDS} runs in {elapsed:.1f}s; outcomes "
          f"{dict(sorted(totals.items()))}; {blocked_then_won} runs were BLOCKED first; {samples} samples")  # fmt: skip


def test_the_unique_index_refuses_a_second_in_progress_run_even_without_the_lock(engine: EngineSetup,
                                                                                 pool: Pool) -> None:  # fmt: skip
    """The last word on the race is the schema: sixteen processes INSERT an IN-PROGRESS run directly, at once,
    without the pipeline lock; exactly one row gets in, the others hit the partial unique index."""
    seed(engine, {PIPELINE: [TASK]})
    go = pool.barrier(WORKERS)
    job = pool.send(workers.raw_in_progress_insert, engine, range(WORKERS), pipeline=PIPELINE, together=go)
    job.wait(timeout=120)
    results = sorted(payload for _, payload in job.of_kind("INSERT"))
    assert results.count("INSERTED") == 1, results
    assert results.count("INTEGRITY") == WORKERS - 1, results
    assert scalar(engine, "SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG WHERE STATUS = 'IN-PROGRESS'") == 1
    # And the lifecycle sees that run as the holder: a claim is BLOCKED by it.
    with engine.hook().lifecycle(lock_timeout=10) as lc:
        outcome = lc.claim(PIPELINE, RunIdentity("race_dag", "after_raw_inserts"))
    assert outcome.action == "BLOCKED" and outcome.blocking is not None
    assert outcome.blocking.run_key.startswith("raw:")


# -- a lock timeout never leaves the lock held --------------------------------------------------------------
#
# The waits below time out because the test itself holds ``pipeline:RACE`` (the provider's own lock, taken on
# a connection of the test's) for as long as they last: a timeout is certain, not hoped for.

PROBES = 4
PROBE_TIMEOUT = 0.2
#: lock_timeout of the lone claim afterwards: 0 = one try, no wait (a free lock is taken at once on both
#: dialects; a lock somebody still holds refuses it), so "at once" needs no clock.
AT_ONCE = 0


def advisory_locks(engine: EngineSetup) -> list[tuple[int, bool]]:
    """(pid, granted) of every advisory lock in the test's database, as PostgreSQL sees it right now."""
    return rows(engine, "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' AND database = "
                        "(SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY pid")  # fmt: skip


def claim_at_once(engine: EngineSetup, run_id: str) -> None:
    """A lone claim gets the pipeline lock without waiting at all, and creates its run."""
    with engine.hook().lifecycle(lock_timeout=AT_ONCE) as lc:
        outcome = lc.claim(PIPELINE, RunIdentity("race_dag", run_id))
    assert outcome.action == "CREATED", outcome


def check_ended(ended: dict[str, object], timeout: float) -> None:
    """A probe's wait ended in LockTimeoutError after waiting its timeout, and left its session holding nothing."""
    assert ended["outcome"] == "TIMEOUT", f"the wait did not end in LockTimeoutError: {ended}"
    assert float(ended["waited"]) >= timeout * 0.9, ended  # it really waited for the held lock
    assert f"lock 'pipeline:{PIPELINE}'" in str(ended["message"]), ended
    assert ended["held"] in (None, 0), f"LockTimeoutError, yet the session still holds the lock: {ended}"


def test_a_lock_timeout_never_leaves_the_lock_held(engine: EngineSetup, pool: Pool) -> None:
    """The test holds ``pipeline:RACE``; four worker processes wait for it for 0.2 s. Each must get
    LockTimeoutError and hold nothing afterwards: PostgreSQL shows no advisory lock of theirs (asked on their own
    sessions, and from outside while those sessions are still open), and a lone claim gets the lock at once
    while the workers are still alive."""
    seed(engine, {PIPELINE: [TASK]})
    name = pipeline_lock(PIPELINE)
    hook = engine.hook()
    postgres = engine.dialect == "postgresql"
    checked = pool.manager.Event()
    try:
        with closing(hook.get_conn()) as own:
            with hook.lock(name, timeout=LOCK_TIMEOUT, conn=own):
                job = pool.send(workers.lock_probe, engine, range(PROBES), name=name, timeout=PROBE_TIMEOUT,
                                checked=checked)  # fmt: skip
                ended = [payload for _, payload in job.expect("ENDED", PROBES)]
                if postgres:  # the only advisory lock is the test's; no probe is left waiting either
                    mine = hook.engine.query(own, "SELECT pg_backend_pid()")[0][0]
                    assert advisory_locks(engine) == [(mine, True)]
            for payload in ended:
                check_ended(payload, PROBE_TIMEOUT)
            assert all(payload["pid"] in pool.pids.values() for payload in ended)
            if postgres:  # released: no advisory lock held or awaited, while the probes' sessions are open
                assert advisory_locks(engine) == []
            claim_at_once(engine, "after_timeouts")
    finally:
        checked.set()
    job.wait(timeout=120)


@pytest.mark.parametrize("engine", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
def test_a_lock_granted_just_as_its_wait_times_out_is_given_back(engine: EngineSetup, pool: Pool) -> None:
    """PostgreSQL can grant an advisory lock to a waiter whose lock_timeout fires at that moment: the waiter
    gets the lock-timeout error with its session holding the lock. The provider gives such a lock back.

    The test forces that moment instead of hunting for it: it holds ``pipeline:RACE`` while a worker process
    waits for it; freezes (SIGSTOP) the worker's server backend inside the wait; releases the lock (the server
    grants it to the frozen backend); waits until that backend's lock_timeout alarm is pending; and thaws it
    (SIGCONT). The worker then must get LockTimeoutError and hold nothing."""
    seed(engine, {PIPELINE: [TASK]})
    name = pipeline_lock(PIPELINE)
    hook = engine.hook()
    admin = engine.database.cluster.admin_connect(engine.database.name)  # type: ignore[attr-defined]
    admin.autocommit = True  # every look at pg_stat_activity sees the present, not a snapshot
    forced = []
    with closing(admin):
        # The waiter's lock_timeout only has to outlast the test's freezing of its backend (milliseconds);
        # should a loaded machine take longer, the wait simply times out unfrozen and the test tries again.
        for timeout in (1.0, 2.0, 4.0, 8.0):
            checked = pool.manager.Event()
            try:
                with closing(hook.get_conn()) as own:
                    holding = ExitStack()
                    holding.enter_context(hook.lock(name, timeout=LOCK_TIMEOUT, conn=own))
                    with holding:
                        job = pool.send(workers.lock_probe, engine, (0,), name=name, timeout=timeout,
                                        checked=checked)  # fmt: skip
                        ((_, backend),) = job.expect("TRYING", 1)
                        if freeze_in_wait_and_grant(admin, job, backend, holding):
                            forced.append(timeout)
                        # Forced or not (then the test still holds the lock), the wait ends in a timeout.
                        ((_, ended),) = job.expect("ENDED", 1)
                    check_ended(ended, timeout)
                    assert advisory_locks(engine) == []  # the worker's session is still open
            finally:
                checked.set()
            job.wait(timeout=120)
            if forced:
                break
    assert forced, "the worker's backend could not be frozen inside its wait, even with an 8 s lock_timeout"
    claim_at_once(engine, "after_the_forced_grant")
    print(f"\n[postgresql] lock granted as its {forced[0]:g}s wait timed out (forced): given back")


def wait_event(admin: Any, backend: int) -> tuple[str | None, str | None] | None:
    with admin.cursor() as cur:
        cur.execute("SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", (backend,))
        found = cur.fetchone()
    return None if found is None else (found[0], found[1])


def proc_status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())}


def alarm_pending(pid: int) -> bool:
    """SIGALRM (PostgreSQL's timeout timer) is pending for the stopped process ``pid``."""
    status = proc_status(pid)
    pending = int(status["ShdPnd"], 16) | int(status["SigPnd"], 16)
    return bool(pending & (1 << (signal.SIGALRM - 1)))


def freeze_in_wait_and_grant(admin: Any, job: Job, backend: int, holding: ExitStack) -> bool:
    """Stop ``backend`` inside its advisory-lock wait, release the test's lock (``holding``) so the server
    grants it the lock, wait for its lock_timeout alarm, and continue it. False (and nothing released) if the
    backend was not waiting any more once stopped: its wait timed out before the test could freeze it."""

    def waiting_or_ended() -> str | None:
        job.pump(0)
        if job.of_kind("ENDED"):
            return "ended"
        return "waiting" if wait_event(admin, backend) == ("Lock", "advisory") else None

    if wait_until(waiting_or_ended, 120, f"backend {backend} waits for the lock") == "ended":
        return False
    os.kill(backend, signal.SIGSTOP)
    try:
        wait_until(lambda: proc_status(backend)["State"].startswith("T"), 30, f"backend {backend} stopped")
        # Stopped inside WaitLatch (it reports the wait event only there, holding no LWLock), still queued:
        if wait_event(admin, backend) != ("Lock", "advisory"):
            return False
        with admin.cursor() as cur:
            cur.execute("SELECT granted FROM pg_locks WHERE locktype = 'advisory' AND pid = %s", (backend,))
            if cur.fetchall() != [(False,)]:
                return False
        holding.close()  # the test lets go: the server grants the lock to the frozen backend
        with admin.cursor() as cur:
            cur.execute("SELECT granted FROM pg_locks WHERE locktype = 'advisory' AND pid = %s", (backend,))
            assert cur.fetchall() == [(True,)], "the server did not grant the lock to the waiting backend"
        wait_until(lambda: alarm_pending(backend), 60, f"the lock_timeout alarm of backend {backend}", 0.02)
        return True
    finally:
        os.kill(backend, signal.SIGCONT)
