"""What the pooler tier's spawned worker processes run (see ``tests/reliability/workers.py`` for the pool).

Each command is ``command(hook, report, *, index, ...)``: ``hook`` is an ``EngineDBHook`` built in the worker
from the test's craft-connector.yml (whose jdbc_url points at PgBouncer).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from airflow_provider_etl_craft.errors import LockTimeoutError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import RunIdentity, TaskCounts

#: ``report(kind, payload)``: sends a message to the test.
Report = Callable[[str, Any], None]


def contend(
    hook: EngineDBHook,
    report: Report,
    *,
    index: int,
    pipeline: str,
    task: str,
    seconds: float,
    lock_timeout: float,
    finish_grace: float,
) -> None:
    """For ``seconds``, claim runs of ``pipeline`` with keys of our own; run and finish each one we create.

    Every step opens a fresh connection, as separate Airflow task processes do: the claim, the task's start,
    its end, and the run's finish. BLOCKED (another run is IN-PROGRESS) and LockTimeoutError (the pipeline
    lock stayed busy for ``lock_timeout``) are the expected outcomes of a busy pipeline and are retried; any
    other exception ends the command and is reported as ERROR. A run we created is always finished, retrying
    refused finishes for up to ``finish_grace`` seconds past the end of the loop.

    Reports ``RUN`` (run key, run id, status) per run, then ``TALLY`` (every outcome seen, counted).
    """
    rng = random.Random(index)
    tally: Counter[str] = Counter()
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        identity = RunIdentity("pooler_dag", f"w{index}_r{n}")
        try:
            with hook.lifecycle(lock_timeout=lock_timeout) as lc:
                outcome = lc.claim(pipeline, identity)
        except LockTimeoutError:
            tally["CLAIM_LOCK_TIMEOUT"] += 1
            continue
        tally[outcome.action] += 1
        if outcome.action == "BLOCKED":
            time.sleep(rng.uniform(0.002, 0.02))
            continue
        if outcome.action != "CREATED":
            raise AssertionError(f"claim of the new key {identity.run_key}: {outcome}")
        n += 1
        with hook.lifecycle(lock_timeout=lock_timeout) as lc:
            handle = lc.start_task(pipeline, task, identity, 1)
        with hook.lifecycle(lock_timeout=lock_timeout) as lc:
            lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=n))
        give_up = max(end, time.monotonic()) + finish_grace
        while True:
            try:
                with hook.lifecycle(lock_timeout=lock_timeout) as lc:
                    finished = lc.finish_run(pipeline, identity, {task: "success"})
                break
            except LockTimeoutError:
                tally["FINISH_LOCK_TIMEOUT"] += 1
                if time.monotonic() > give_up:
                    raise
        report("RUN", (identity.run_key, outcome.pipeline_run_id, finished.status))
    report("TALLY", dict(tally))
