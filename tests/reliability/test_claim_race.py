"""Sixteen worker processes race to claim runs of one pipeline (SPEC §6 one IN-PROGRESS run, §8 locks, §9 claim).

Each worker claims ``ROUNDS`` runs with run keys of its own, retrying while BLOCKED (another run holds the
pipeline) or refused (LOCK_TIMEOUT / STALE_TRANSITION, which Airflow retries), then runs the task and
finishes the run. The test process watches the IN-PROGRESS count the whole time on its own connection.
"""

from __future__ import annotations

import time
from contextlib import closing

import pytest

from airflow_provider_etl_craft.runs import RunIdentity
from tests.conftest import EngineSetup
from tests.reliability import workers
from tests.reliability.conftest import Pool, rows, scalar, seed

WORKERS = 16
ROUNDS = 5
PIPELINE, TASK = "RACE", "WORK"
#: Pipeline-lock timeouts: even workers wait long, odd ones briefly, so LOCK_TIMEOUT refusals happen and are
#: counted (on PostgreSQL this also races lock grants against lock_timeout: see
#: test_a_lock_timeout_never_leaves_the_advisory_lock_held below).
LOCK_TIMEOUT = 5.0
SHORT_LOCK_TIMEOUT = {"sqlite": 0.02, "postgresql": 0.02}
LEAK_HUNT_SECONDS = 15.0
RACE_DEADLINE = 150.0
#: Claim outcomes a worker may see here (nobody reuses a key, nothing is paused or gated).
ALLOWED = {"CREATED", "BLOCKED", "REFUSED:LockTimeoutError", "REFUSED:StaleTransitionError",
           "FINISH_REFUSED:LockTimeoutError"}  # fmt: skip


def test_sixteen_processes_claiming_one_pipeline_never_overlap_and_lose_nothing(engine: EngineSetup,
                                                                                pool: Pool) -> None:  # fmt: skip
    seed(engine, {PIPELINE: [TASK]})
    go = pool.barrier(WORKERS + 1)
    job = pool.send(workers.claim_race, engine, range(WORKERS), pipeline=PIPELINE, task=TASK, rounds=ROUNDS,
                    lock_timeout=LOCK_TIMEOUT, short_lock_timeout=SHORT_LOCK_TIMEOUT[engine.dialect], deadline_s=RACE_DEADLINE, start=go)  # fmt: skip
    go.wait(timeout=120)
    started = time.monotonic()

    # The test process samples the IN-PROGRESS rows of the pipeline until every worker is done.
    hook = engine.hook()
    sql = hook.engine.sql("SELECT r.PIPELINE_RUN_ID FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p "
                          "ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ? AND r.STATUS = 'IN-PROGRESS'")  # fmt: skip
    samples, overlaps, seen_live = 0, [], set()
    with closing(hook.get_conn()) as conn:
        while not job.finished and time.monotonic() - started < RACE_DEADLINE + 30:
            cur = conn.cursor()
            cur.execute(sql, (PIPELINE,))
            live = [r[0] for r in cur.fetchall()]
            cur.close()
            samples += 1
            seen_live.update(live)
            if len(live) > 1:
                overlaps.append(live)
            job.pump(0.003)
    job.wait(timeout=max(1.0, RACE_DEADLINE + 30 - (time.monotonic() - started)))  # no deadlock: all finish
    elapsed = time.monotonic() - started

    assert overlaps == [], f"two IN-PROGRESS runs of {PIPELINE} at once: {overlaps[:5]}"
    assert samples >= 10 and len(seen_live) >= 2, (samples, seen_live)  # the watcher really watched the race
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
    assert totals.get("BLOCKED", 0) > 0, totals  # sixteen at once: the race happened
    blocked_then_won = sum(1 for run in runs if run["blocked"] > 0)
    assert blocked_then_won > 0
    for run in runs:
        assert run["live"] == [run["run_id"]], run  # while it ran, it was the only IN-PROGRESS run
        assert run["status"] == "SUCCESS", run

    # No lost or doubled row: the Engine DB holds exactly the runs the workers reported as CREATED.
    stored = rows(engine, "SELECT r.RUN_KEY, r.PIPELINE_RUN_ID, r.STATUS FROM AUD_PIPELINES_RUN_LOG r "
                          "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ?", PIPELINE)  # fmt: skip
    assert len(stored) == created
    assert sorted(stored) == sorted((run["run_key"], run["run_id"], "SUCCESS") for run in runs)
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


@pytest.mark.parametrize("engine", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
def test_a_lock_timeout_never_leaves_the_advisory_lock_held(engine: EngineSetup, pool: Pool) -> None:
    """Eight processes take ``pipeline:RACE`` in turns; four wait only 20 ms. After every LockTimeoutError the
    refused process asks PostgreSQL whether its session holds an advisory lock anyway: it must never."""
    seed(engine, {PIPELINE: [TASK]})
    found = pool.manager.Event()
    job = pool.send(workers.lock_hammer, engine, range(8), name=f"pipeline:{PIPELINE}", seconds=LEAK_HUNT_SECONDS,
                    short_timeout=0.02, long_timeout=LOCK_TIMEOUT, found_leak=found)  # fmt: skip
    job.wait(timeout=LEAK_HUNT_SECONDS + 120)
    results = [payload for _, payload in job.of_kind("HAMMER")]
    assert sum(r["held"] for r in results) > 0
    assert sum(r["timeouts"] for r in results) > 0  # refusals happened
    leaks = [r for r in results if r["leaks"]]
    assert leaks == [], f"LockTimeoutError raised while the session still held the lock: {leaks}"
