"""What the failover tier's spawned workers run (the pool of ``tests/reliability/conftest.py``).

:func:`workload` drives the real run lifecycle the way the operators do: every step (a claim, a task's
start, its end, a run's finish) opens its own connection (``with hook.lifecycle() as lc``) through the
profile's multi-host jdbc_url, and a step that fails is retried the way Airflow retries the task:

* a claim: the same claim again (same run key);
* a task's start or end: the task's next try, ``start_task(try_number + 1)`` and then its end;
* a finish: the same finish again.

Every acknowledged step and every error goes to the worker's journal (one JSON line each, one file per
process), which the test reads afterwards; nothing is judged here.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from airflow_provider_etl_craft.errors import EtlCraftError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import RunIdentity, TaskCounts
from airflow_provider_etl_craft.runs.gates import GateSkipped, GateWaiting
from airflow_provider_etl_craft.runs.lifecycle import RunLifecycle

Report = Callable[[str, Any], None]
DAG_ID = "failover_dag"
#: Airflow's retry delay between two tries of a step (kept short: the window is seconds long).
RETRY_DELAY = 0.2
#: Tries of one step before the worker gives up on it (journaled as gave_up; the test fails on it): after
#: retryable or untyped errors, and after errors Airflow would not retry.
MAX_TRIES = 200
FINAL_TRIES = 3
LOCK_TIMEOUT = 10.0
#: Seconds a task waits for an upstream pipeline's run to end (a cross-pipeline task edge).
GATE_WAIT = 90.0


class Journal:
    """One JSON line per event, flushed at once (a worker that dies leaves every line it wrote)."""

    def __init__(self, path: Path) -> None:
        self.file: TextIO = path.open("a", encoding="utf-8", buffering=1)

    def write(self, kind: str, **event: Any) -> None:
        self.file.write(json.dumps({"kind": kind, **event}, default=str) + "\n")


class Steps:
    """Runs one step on a fresh connection and journals what happened."""

    def __init__(self, hook: EngineDBHook, journal: Journal, worker: int) -> None:
        self.hook, self.journal, self.worker = hook, journal, worker

    def __call__(self, step: str, call: Callable[[RunLifecycle], Any], **ctx: Any) -> tuple[bool, Any]:
        """``(True, result)`` once the step is acknowledged, else ``(False, the exception)`` (journaled)."""
        began = time.time()
        port = None
        try:
            with self.hook.lifecycle(lock_timeout=LOCK_TIMEOUT) as lc:
                info = getattr(lc.conn, "info", None)
                port = getattr(info, "port", None)
                result = call(lc)
        except (GateWaiting, GateSkipped) as exc:
            return False, exc
        except Exception as exc:  # noqa: BLE001 - every error is journaled; the test judges its type
            text = str(exc)
            self.journal.write(
                "error",
                step=step,
                cls=type(exc).__name__,
                module=type(exc).__module__,
                retryable=getattr(exc, "retryable", None),
                status=getattr(exc, "status_name", None),
                line=text.splitlines()[0] if text else "",
                began=began,
                t=time.time(),
                worker=self.worker,
                **ctx,
            )
            return False, exc
        self.journal.write("ok", step=step, began=began, t=time.time(), port=port, worker=self.worker,
                           **ctx, **self._describe(result))  # fmt: skip
        return True, result

    @staticmethod
    def _describe(result: Any) -> dict[str, Any]:
        described: dict[str, Any] = {}
        for name in ("action", "pipeline_run_id", "attempt_id", "attempt_number", "task_run_id", "status"):
            if hasattr(result, name):
                described[name] = getattr(result, name)
        return described


def _final(error: BaseException) -> bool:
    """A typed error Airflow does not retry (``retryable`` False): the task fails for good."""
    return isinstance(error, EtlCraftError) and not error.retryable


class Tries:
    """Airflow's retries of one step: a retryable or untyped error is retried up to MAX_TRIES times; an error
    Airflow would not retry is tried FINAL_TRIES times (to keep the workload going; the test flags it)."""

    def __init__(self) -> None:
        self.retried = self.final = 0

    def failed(self, error: BaseException) -> bool:
        """Count a failure; whether the step may be tried again."""
        if _final(error):
            self.final += 1
        else:
            self.retried += 1
        return self.final < FINAL_TRIES and self.retried < MAX_TRIES


def _retry(steps: Steps, step: str, call: Callable[[RunLifecycle], Any], **ctx: Any) -> Any:
    """The same step until it is acknowledged (a claim or a finish retried by Airflow); None if given up."""
    tries = Tries()
    while True:
        ok, result = steps(step, call, **ctx)
        if ok:
            return result
        if not tries.failed(result):
            steps.journal.write("gave_up", step=step, t=time.time(), worker=steps.worker, **ctx)
            return None
        time.sleep(RETRY_DELAY)


def _run_task(
    steps: Steps, pipeline: str, task: str, identity: RunIdentity, rows: int, gate_wait: float
) -> str:
    """One task through Airflow's tries: start try n, end it SUCCESS; a failed start or end moves to try n+1.
    Returns Airflow's final state of the task ("success", "skipped", or "failed" once given up)."""
    try_number = 1
    ctx = {"pipeline": pipeline, "task": task, "run_key": identity.run_key}
    tries = Tries()
    wait_until = time.monotonic() + gate_wait
    while time.monotonic() < wait_until:
        ok, started = steps("start", lambda lc, n=try_number: lc.start_task(pipeline, task, identity, n),
                            try_number=try_number, **ctx)  # fmt: skip
        if ok:
            handle = started
            counts = TaskCounts(rows_written=rows)
            ok, error = steps("end", lambda lc, h=handle, c=counts: lc.finish_task(h, "SUCCESS", c),
                              try_number=try_number, attempt_id=handle.attempt_id, **ctx)  # fmt: skip
            if ok:
                return "success"
        elif isinstance(started, GateWaiting):  # an upstream runs: the sensor pokes again, same try
            time.sleep(0.05)
            continue
        elif isinstance(started, GateSkipped):  # recorded SKIPPED by the Engine; Airflow skips the task
            steps.journal.write(
                "ok", step="skipped", t=time.time(), worker=steps.worker, try_number=try_number, **ctx
            )
            return "skipped"
        else:
            error = started
        if not tries.failed(error):
            break
        try_number += 1
        time.sleep(RETRY_DELAY)
    steps.journal.write(
        "gave_up", step="task", t=time.time(), worker=steps.worker, try_number=try_number, **ctx
    )
    return "failed"


def workload(hook: EngineDBHook, report: Report, *, index: int, pipelines: dict[str, list[str]],
             journal_dir: str, stop_file: str, gate_wait: float = GATE_WAIT) -> None:  # fmt: skip
    """Claim, record and finish runs of random ``pipelines`` with run keys of our own until ``stop_file``
    exists; a run that was claimed is always recorded and finished. Reports ``RUNS`` (how many finished)."""
    rng = random.Random(index)
    journal = Journal(Path(journal_dir) / f"worker-{index}.jsonl")
    steps = Steps(hook, journal, index)
    stop = Path(stop_file)
    finished = 0
    n = 0
    while not stop.exists():
        pipeline = rng.choice(sorted(pipelines))
        identity = RunIdentity(DAG_ID, f"w{index}_r{n}")
        n += 1
        outcome = _retry(steps, "claim", lambda lc, p=pipeline, i=identity: lc.claim(p, i),
                         pipeline=pipeline, run_key=identity.run_key)  # fmt: skip
        if outcome is None:  # the claim failed for good: Airflow fails the DAG run, nothing to finish
            continue
        if outcome.action == "BLOCKED":
            time.sleep(rng.uniform(0.01, 0.05))
            continue
        states = {}
        for k, task in enumerate(pipelines[pipeline]):
            states[task] = _run_task(steps, pipeline, task, identity, 100 * n + k, gate_wait)
        _retry(steps, "finish", lambda lc, p=pipeline, i=identity, s=states: lc.finish_run(p, i, s),
               pipeline=pipeline, run_key=identity.run_key)  # fmt: skip
        finished += 1
    journal.file.close()
    report("RUNS", finished)
