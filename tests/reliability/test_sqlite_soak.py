"""Eight SQLite writers at once for ``$ETL_CRAFT_SOAK_SECONDS`` (default 60): no "database is locked", no lost row.

Four workers start and end ever higher tries of their own task codes in one shared IN-PROGRESS run (every third
try fails); four claim, run and finish runs of a pipeline of their own (one task fails its first try per run).
Every worker counts the writes that returned and reports every exception it saw, as text; meanwhile the test
process reads the attempt count as a reader (the CLI, the Airflow UI) would. Afterwards the Engine DB must hold
exactly what the workers counted. Nobody stops before every writer has opened MIN_OPENED attempts, so on a slow
machine the soak runs longer rather than ending with a writer that never got going.
"""

from __future__ import annotations

import os
import time
from contextlib import closing

import pytest

from airflow_provider_etl_craft.runs import RunIdentity
from harness.engines import EngineSetup
from tests.reliability import workers
from tests.reliability.conftest import Pool, rows, seed

SECONDS = float(os.environ.get("ETL_CRAFT_SOAK_SECONDS", "60"))
#: Attempts every writer opens while all the others are still writing (the soak lasts until they all have).
MIN_OPENED = 10
#: How long past SECONDS the writers wait for every one of them to get there before they give up.
OVERRUN = 60.0
TRY_WRITERS = (0, 1, 2, 3)
RUN_WRITERS = (4, 5, 6, 7)
TASKS_PER_WORKER = 5
OWN_TASKS = ["R1", "R2", "R3"]
SHARED, SHARED_RUN = "SOAK_SHARED", "soak_shared"


def own_pipeline(index: int) -> str:
    return f"SOAK_W{index}"


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_eight_sqlite_writers_never_see_database_is_locked_and_lose_no_row(engine: EngineSetup,
                                                                          pool: Pool) -> None:  # fmt: skip
    shared_tasks = [f"T{i}_{k}" for i in TRY_WRITERS for k in range(TASKS_PER_WORKER)]
    seed(engine, {SHARED: shared_tasks, **{own_pipeline(i): OWN_TASKS for i in RUN_WRITERS}})
    shared = RunIdentity("soak_dag", SHARED_RUN)
    hook = engine.hook()
    with hook.lifecycle(lock_timeout=30) as lc:
        assert lc.claim(SHARED, shared).action == "CREATED"

    writers = len(TRY_WRITERS) + len(RUN_WRITERS)
    go, going = pool.barrier(writers + 1), pool.manager.Event()
    common = {"seconds": SECONDS, "start": go, "shared_pipeline": SHARED, "shared_run_id": SHARED_RUN,
              "tasks_per_worker": TASKS_PER_WORKER, "own_tasks": OWN_TASKS, "min_opened": MIN_OPENED,
              "going": going, "overrun": OVERRUN}  # fmt: skip
    jobs = [pool.send(workers.soak_writer, engine, TRY_WRITERS, mode="tries", own_pipeline="", **common)]
    jobs += [pool.send(workers.soak_writer, engine, (i,), mode="runs", own_pipeline=own_pipeline(i), **common)
             for i in RUN_WRITERS]  # fmt: skip
    go.wait(timeout=120)
    started = time.monotonic()

    # A reader alongside the writers: the attempt count only grows. Once every writer is GOING (and the reader
    # has read twice), the writers may stop when SECONDS are over.
    samples: list[int] = []
    all_going = False
    try:
        with closing(hook.get_conn()) as conn:
            while not all(job.finished for job in jobs) and time.monotonic() - started < SECONDS + 120:
                samples.append(conn.execute("SELECT COUNT(*) FROM AUD_TASK_ATTEMPTS").fetchone()[0])
                for job in jobs:
                    job.pump(0.05)
                if not all_going and len(samples) > 1:
                    all_going = sum(len(job.of_kind("GOING")) for job in jobs) == writers
                    if all_going:
                        going.set()
    finally:
        going.set()
    results = []
    for job in jobs:
        job.wait(timeout=max(1.0, SECONDS + 120 - (time.monotonic() - started)))
        results += [payload for _, payload in job.of_kind("RESULT")]
    elapsed = time.monotonic() - started
    assert len(results) == len(TRY_WRITERS) + len(RUN_WRITERS)

    # No worker saw "database is locked" (nor any other error).
    errors = [error for result in results for error in result["errors"]]
    locked = [error for error in errors if "locked" in error.lower() or "busy" in error.lower()]
    assert locked == [], f"{len(locked)} 'database is locked' errors, e.g. {locked[:3]}"
    assert errors == [], f"{len(errors)} errors, e.g. {errors[:3]}"
    assert samples == sorted(samples) and len(samples) > 1, samples[-10:]

    # No lost row: the Engine DB holds exactly the writes the workers counted.
    opened = sum(r["opened"] for r in results)
    ended = {status: sum(r["ended"].get(status, 0) for r in results) for status in ("SUCCESS", "FAILED")}
    assert all(r["opened"] >= MIN_OPENED for r in results), [r["opened"] for r in results]  # all got going
    by_status = dict(rows(engine, "SELECT STATUS, COUNT(*) FROM AUD_TASK_ATTEMPTS GROUP BY STATUS"))
    assert sum(by_status.values()) == opened, (by_status, opened)
    assert by_status == {k: v for k, v in ended.items() if v}, (by_status, ended)  # nothing left live
    written = rows(engine, "SELECT SUM(ROWS_WRITTEN) FROM AUD_TASK_ATTEMPTS")[0][0]
    assert written == sum(r["rows_written"] for r in results)

    # The shared run: one task-run row per task code, its ATTEMPT_COUNT = the tries the worker opened.
    tries = {code: n for r in results if r["mode"] == "tries" for code, n in r["tries"].items()}
    found = dict(rows(engine, "SELECT t.TASK_CODE, tr.ATTEMPT_COUNT FROM AUD_TASK_RUN_LOG tr JOIN CFG_TASKS t "
                              "ON t.TASK_ID = tr.TASK_ID JOIN CFG_PIPELINES p ON p.PIPELINE_ID = t.PIPELINE_ID "
                              "WHERE p.PIPELINE_CODE = ?", SHARED))  # fmt: skip
    assert found == tries
    # Its finish sees the last try of each task: FAILED when any of those failed (every third try fails).
    # Airflow's view agrees with each task's last try (a failed last try is a failed task in Airflow).
    expect_failed = sorted(code for code, n in tries.items() if n % 3 == 0)
    states = {code: "failed" if code in expect_failed else "success" for code in shared_tasks}
    with hook.lifecycle(lock_timeout=30) as lc:
        outcome = lc.finish_run(SHARED, shared, states)
    assert (outcome.status, list(outcome.failed)) == ("FAILED" if expect_failed else "SUCCESS", expect_failed)

    # The own pipelines: every claimed run finished SUCCESS with one task-run row per task.
    reported: dict[str, int] = {}
    for job, index in zip(jobs[1:], RUN_WRITERS, strict=True):
        (payload,) = [p for _, p in job.of_kind("RESULT")]
        created = payload["runs"].get("CREATED", 0)
        assert created > 0 and payload["runs"] == {"CREATED": created, "FINISHED:SUCCESS": created}, payload
        reported[own_pipeline(index)] = created
    runs = dict(rows(engine, "SELECT p.PIPELINE_CODE, COUNT(*) FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p "
                             "ON p.PIPELINE_ID = r.PIPELINE_ID WHERE r.STATUS = 'SUCCESS' GROUP BY p.PIPELINE_CODE"))  # fmt: skip
    task_rows = dict(rows(engine, "SELECT p.PIPELINE_CODE, COUNT(*) FROM AUD_TASK_RUN_LOG tr JOIN AUD_PIPELINES_RUN_LOG r "
                                  "ON r.PIPELINE_RUN_ID = tr.PIPELINE_RUN_ID JOIN CFG_PIPELINES p ON p.PIPELINE_ID = "
                                  "r.PIPELINE_ID WHERE tr.STATUS = 'SUCCESS' GROUP BY p.PIPELINE_CODE"))  # fmt: skip
    assert {k: v for k, v in runs.items() if k != SHARED} == reported
    assert {k: v for k, v in task_rows.items() if k != SHARED} == {
        k: v * len(OWN_TASKS) for k, v in reported.items()
    }
    total_runs = rows(engine, "SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG")[0][0]
    assert total_runs == sum(reported.values()) + 1
    print(f"\n[soak] {len(results)} writers x {elapsed:.0f}s: {opened} attempts ({ended}), "
          f"{sum(reported.values())} own runs, {len(samples)} reader samples, 0 errors")  # fmt: skip
