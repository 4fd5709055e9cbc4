"""Part 2: contention on PostgreSQL — pipeline runs per second from 1, 4 and 16 processes, against a baseline.

Every worker is a real OS process (``multiprocessing`` with the ``spawn`` start method), started once and
reused for every round, so the (slow) Airflow import is not part of any measurement. A round gives the
first ``procs`` workers the same job; each connects, says it is ready, and all start at the same instant
for the same fixed window:

* ``lifecycle``: on one connection held for the window (one ``RunLifecycle``), loop full pipeline runs of
  the worker's OWN pipeline (``BENCH_Cnn``, seeded before): claim, then start and finish each of its
  tasks, then finish_run. Only runs that ended inside the window count; one still open at the end is
  finished afterwards (uncounted), so the next round can claim.
  Their statements are counted by the same proxies as in part 1 (:mod:`bench.counting`).
* ``baseline``: on one connection from the same dialect (same TLS session, same server), loop the simplest
  transaction that writes one row: ``INSERT INTO bench_baseline (…) VALUES (…) RETURNING id`` in
  autocommit, one transaction each.

A pipeline run is ``2 + 2 × tasks`` lifecycle transactions (claim, a start and a finish per task,
finish_run), which is what the ratio to the baseline's transactions per second compares. A lifecycle
transaction sends several statements where the baseline's sends one, so the ratio of statements per
second is reported beside it.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Statement of the baseline transaction (one row, autocommit).
BASELINE_INSERT = "INSERT INTO bench_baseline (worker, payload) VALUES (%s, %s) RETURNING id"
BASELINE_TABLE = (
    "CREATE TABLE IF NOT EXISTS bench_baseline (id BIGSERIAL PRIMARY KEY, worker INTEGER NOT NULL, "
    "payload TEXT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())"
)
LOCK_TIMEOUT = 60.0
READY_TIMEOUT = 180.0


def pipeline_code(worker: int) -> str:
    """The pipeline worker ``worker`` runs (each worker its own)."""
    return f"BENCH_C{worker:02d}"


@dataclass(frozen=True)
class Job:
    """What the workers of one round do: ``kind`` is ``lifecycle`` or ``baseline``."""

    kind: str
    seconds: float
    task_codes: tuple[str, ...]


# --------------------------------------------------------------------------- the worker process


def worker_main(index: int, config_path: str, inbox: Any, outbox: Any) -> None:
    """Entry point of a worker process: import once, then serve jobs until it receives None."""
    try:
        from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

        hook = EngineDBHook.from_config(Path(config_path))
        outbox.put(("started", index, None))
    except BaseException:  # reported to the parent
        outbox.put(("error", index, traceback.format_exc()))
        return
    while True:
        job = inbox.get()
        if job is None:
            return
        try:
            count = _serve(index, hook, job, inbox, outbox)
            outbox.put(("done", index, count))
        except BaseException:  # reported to the parent
            outbox.put(("error", index, traceback.format_exc()))


def _wait_for_start(index: int, inbox: Any, outbox: Any) -> float:
    """Tell the parent this worker is ready; return the agreed start time (``time.time()`` seconds)."""
    outbox.put(("ready", index, None))
    start_at = float(inbox.get())
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    return start_at


def _serve(index: int, hook: Any, job: Job, inbox: Any, outbox: Any) -> dict[str, int]:
    if job.kind == "baseline":
        return _baseline(index, hook, job, inbox, outbox)
    if job.kind == "lifecycle":
        return _lifecycle(index, hook, job, inbox, outbox)
    raise ValueError(f"unknown job kind {job.kind!r}")


def _baseline(index: int, hook: Any, job: Job, inbox: Any, outbox: Any) -> dict[str, int]:
    """One-row INSERT transactions until the window closes; each is one statement (one round trip)."""
    with closing(hook.engine.connect()) as conn, conn.cursor() as cur:
        payload = f"worker {index}"
        start_at = _wait_for_start(index, inbox, outbox)
        deadline, count = start_at + job.seconds, 0
        while True:
            cur.execute(BASELINE_INSERT, (index, payload))
            cur.fetchone()
            if time.time() > deadline:
                return {"completed": count, "statements": count}
            count += 1


def _lifecycle(index: int, hook: Any, job: Job, inbox: Any, outbox: Any) -> dict[str, int]:
    """Full pipeline runs until the window closes, their statements counted by the proxies."""
    from airflow_provider_etl_craft.runs.counts import TaskCounts
    from bench.bookkeeping import new_identity
    from bench.counting import RoundTripCounter, instrument

    code, states = pipeline_code(index), dict.fromkeys(job.task_codes, "success")
    counter = RoundTripCounter()
    restore = instrument(hook, counter)
    try:
        with hook.lifecycle(LOCK_TIMEOUT) as lc:
            start_at = _wait_for_start(index, inbox, outbox)
            deadline, count = start_at + job.seconds, 0
            first = last = counter.total_statements()
            while True:
                identity = new_identity("bench_contention", f"w{index:02d}")
                outcome = lc.claim(code, identity, task_codes=job.task_codes)
                if outcome.action != "CREATED":
                    raise RuntimeError(f"claim of {identity.run_key} returned {outcome.action}")
                for task_code in job.task_codes:
                    handle = lc.start_task(code, task_code, identity, 1)
                    lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=1))
                finished = lc.finish_run(code, identity, states)
                if finished.status != "SUCCESS":
                    raise RuntimeError(f"{identity.run_key} ended {finished.status}")
                if time.time() > deadline:
                    return {"completed": count, "statements": last - first}
                count += 1
                last = counter.total_statements()
    finally:
        restore()


# --------------------------------------------------------------------------- the parent side


class WorkerPool:
    """``size`` spawned worker processes on the Engine DB of ``config_path``."""

    def __init__(self, size: int, config_path: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.outbox: Any = ctx.Queue()
        self.inboxes: list[Any] = [ctx.Queue() for _ in range(size)]
        self.processes = [
            ctx.Process(
                target=worker_main,
                args=(i, str(config_path), self.inboxes[i], self.outbox),
                name=f"bench-worker-{i}",
                daemon=True,
            )  # fmt: skip
            for i in range(size)
        ]
        for process in self.processes:
            process.start()
        self._expect("started", range(size))

    def _expect(self, what: str, workers: range) -> dict[int, Any]:
        pending, got = set(workers), {}
        deadline = time.monotonic() + READY_TIMEOUT
        while pending:
            try:
                kind, index, value = self.outbox.get(timeout=1.0)
            except queue.Empty:
                dead = [p.name for p in self.processes if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"workers stopped answering while waiting for '{what}' (dead: {dead})"
                    ) from None
                continue
            if kind == "error":
                raise RuntimeError(f"worker {index} failed:\n{value}")
            if kind != what:
                raise RuntimeError(f"worker {index} said {kind!r}, expected {what!r}")
            pending.discard(index)
            got[index] = value
        return got

    def run(self, job: Job, procs: int) -> dict[str, Any]:
        """Run ``job`` on the first ``procs`` workers at once; return the completed count and rate."""
        workers = range(procs)
        for i in workers:
            self.inboxes[i].put(job)
        self._expect("ready", workers)
        start_at = time.time() + 0.5
        for i in workers:
            self.inboxes[i].put(start_at)
        done = self._expect("done", workers)
        total = sum(d["completed"] for d in done.values())
        statements = sum(d["statements"] for d in done.values())
        return {"procs": procs, "seconds": job.seconds, "completed": total, "per_second": total / job.seconds,
                "statements": statements, "statements_per_second": statements / job.seconds,
                "per_worker": [done[i]["completed"] for i in workers]}  # fmt: skip

    def close(self) -> None:
        """Stop the workers (they exit on None; stragglers are terminated)."""
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)


def prepare(hook: Any, workers: int, task_codes: tuple[str, ...]) -> None:
    """Seed one pipeline per worker and create the baseline table."""
    from bench.engines import seed_pipelines

    seed_pipelines(hook, [(pipeline_code(i), task_codes) for i in range(workers)])
    with closing(hook.engine.connect()) as conn, conn.cursor() as cur:
        cur.execute(BASELINE_TABLE)


def measure(config_path: Path, hook: Any, procs_list: tuple[int, ...], seconds: float,
            task_codes: tuple[str, ...], log: Any = print) -> dict[str, Any]:  # fmt: skip
    """Both jobs at each process count, alternating; returns rates and the lifecycle/baseline ratios."""
    size = max(procs_list)
    prepare(hook, size, task_codes)
    tx_per_run = 2 + 2 * len(task_codes)
    started = time.perf_counter()
    pool = WorkerPool(size, config_path)
    log(f"  {size} worker processes started in {time.perf_counter() - started:.1f}s")
    rows = []
    try:
        for procs in procs_list:
            lifecycle = pool.run(Job("lifecycle", seconds, task_codes), procs)
            baseline = pool.run(Job("baseline", seconds, task_codes), procs)
            runs_per_s = lifecycle["per_second"]
            row = {
                "procs": procs,
                "runs_per_s": runs_per_s,
                "lifecycle_tx_per_s": runs_per_s * tx_per_run,
                "baseline_tx_per_s": baseline["per_second"],
                "ratio": runs_per_s * tx_per_run / baseline["per_second"] if baseline["per_second"] else None,
                "lifecycle_statements_per_s": lifecycle["statements_per_second"],
                "statements_per_run": lifecycle["statements"] / lifecycle["completed"]
                if lifecycle["completed"]
                else None,
                "statement_ratio": (
                    lifecycle["statements_per_second"] / baseline["statements_per_second"]
                    if baseline["statements_per_second"]
                    else None
                ),
                "lifecycle": lifecycle,
                "baseline": baseline,
            }
            rows.append(row)
            log(f"  {procs:>2} procs: {runs_per_s:8.1f} runs/s = {row['lifecycle_tx_per_s']:8.1f} lifecycle tx/s "
                f"({row['lifecycle_statements_per_s']:.0f} statements/s); baseline {baseline['per_second']:8.1f} tx/s")  # fmt: skip
    finally:
        pool.close()
    return {"tasks_per_run": len(task_codes), "transactions_per_run": tx_per_run, "seconds": seconds,
            "rows": rows}  # fmt: skip
