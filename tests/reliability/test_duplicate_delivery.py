"""Duplicate delivery (docs/pipelines.md, *Tasks*): two worker processes start the same try of the same task at once.

Airflow can deliver one task try twice (a scheduler failover, an executor that re-sends). Exactly one of the two
deliveries may open the attempt; the other gets STALE_TRANSITION (retryable, and Airflow's retry is then a new
try). Half the rounds race on try 2 while try 1's worker is dead with its attempt still live: both deliveries
want to close try 1 LOST and open try 2, and still only one attempt 2 may exist.
"""

from __future__ import annotations

from airflow_provider_etl_craft.errors import StaleTransitionError
from airflow_provider_etl_craft.runs import AttemptHandle, RunIdentity, TaskCounts
from harness.engines import EngineSetup
from tests.reliability import workers
from tests.reliability.conftest import Pool, rows, seed

REPEATS = 10
PIPELINE, TASK = "DUP", "STEP"
LIVE = ("QUEUED", "CLAIMED", "RUNNING")


def attempts_of(engine: EngineSetup, run_id: int) -> list[tuple[int, int, str]]:
    return rows(engine, "SELECT a.ATTEMPT_NUMBER, a.ATTEMPT_ID, a.STATUS FROM AUD_TASK_ATTEMPTS a "
                        "JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID WHERE tr.PIPELINE_RUN_ID = ? "
                        "ORDER BY a.ATTEMPT_NUMBER", run_id)  # fmt: skip


def test_two_deliveries_of_one_try_open_exactly_one_live_attempt(engine: EngineSetup, pool: Pool) -> None:
    seed(engine, {PIPELINE: [TASK]})
    hook = engine.hook()
    winners: dict[int, int] = {}
    for k in range(REPEATS):
        run_id, try_number = f"dup_{k}", 1 + k % 2
        identity = RunIdentity("dup_dag", run_id)
        dead: AttemptHandle | None = None
        with hook.lifecycle(lock_timeout=30) as lc:
            outcome = lc.claim(PIPELINE, identity)
            assert outcome.action == "CREATED", outcome
            pipeline_run_id = outcome.pipeline_run_id
            if try_number == 2:  # try 1's worker died: its attempt is still RUNNING
                dead = lc.start_task(PIPELINE, TASK, identity, 1)

        pair = ((2 * k) % len(pool.procs), (2 * k + 1) % len(pool.procs))
        job = pool.send(workers.start_same_try, engine, pair, pipeline=PIPELINE, task=TASK, run_id=run_id,
                        try_number=try_number, together=pool.barrier(2))  # fmt: skip
        job.wait(timeout=120)
        ok, stale = job.of_kind("OK"), job.of_kind("STALE")
        assert len(ok) == 1 and len(stale) == 1, f"round {k}: {job.messages}"
        (winner, handle), (_, message) = ok[0], stale[0]
        winners[winner] = winners.get(winner, 0) + 1
        assert isinstance(handle, AttemptHandle) and handle.attempt_number == try_number
        assert "second delivery" in message, message

        # Exactly one row for this attempt number, live; try 1 of a dead worker closed LOST.
        found = attempts_of(engine, pipeline_run_id)
        expected = [(try_number, handle.attempt_id, "RUNNING")]
        if dead is not None:
            expected.insert(0, (1, dead.attempt_id, "LOST"))
        assert found == expected, f"round {k}: {found}"
        assert sum(1 for a in found if a[2] in LIVE) == 1
        (count,) = rows(engine, "SELECT ATTEMPT_COUNT FROM AUD_TASK_RUN_LOG WHERE PIPELINE_RUN_ID = ?",
                        pipeline_run_id)[0]  # fmt: skip
        assert count == try_number, f"round {k}: the loser's ATTEMPT_COUNT increment was not rolled back"

        with hook.lifecycle(lock_timeout=30) as lc:
            if dead is not None:  # the dead worker's late result is refused: its attempt was closed LOST
                try:
                    lc.finish_task(dead, "SUCCESS")
                except StaleTransitionError:
                    pass
                else:
                    raise AssertionError(f"round {k}: a LOST attempt accepted a late result")
            lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=k))  # the winner records normally
            finished = lc.finish_run(PIPELINE, identity, {TASK: "success"})
        assert finished.status == "SUCCESS", finished

    # Nothing was lost or doubled over the rounds.
    summary = rows(engine, "SELECT COUNT(*), MIN(STATUS), MAX(STATUS) FROM AUD_PIPELINES_RUN_LOG")
    assert summary == [(REPEATS, "SUCCESS", "SUCCESS")]
    by_status = dict(rows(engine, "SELECT STATUS, COUNT(*) FROM AUD_TASK_ATTEMPTS GROUP BY STATUS"))
    assert by_status == {"SUCCESS": REPEATS, "LOST": REPEATS // 2}, by_status
    assert rows(engine, "SELECT COUNT(*), SUM(ROWS_WRITTEN) FROM AUD_TASK_RUN_LOG") == [
        (REPEATS, sum(range(REPEATS)))
    ]
