"""Part 2: contention on PostgreSQL — N processes share ONE pipeline, a connection per step, against a baseline.

Every worker is a real OS process (``multiprocessing`` with the ``spawn`` start method), started once and
reused for every round, so the (slow) Airflow import is not part of any measurement. A round gives the
first ``procs`` workers (N = 1, 4, 16 by default) the same job; each says it is ready, and all start at the
same instant for the same fixed window:

* ``lifecycle``: every worker loops full pipeline runs of the SAME pipeline (``BENCH_SHARED``, seeded
  before), each run under a run key of its own (a new ``RunIdentity`` per run, the worker's number in its
  run id). Each step opens its own connection, as the operators do (one ``hook.lifecycle()`` context per
  step, closed after the step): claim, then start and finish each task, then finish_run. Only one run of a
  pipeline can be IN-PROGRESS, so a claim returns ``BLOCKED`` while another worker's run is open; the
  worker then sleeps :data:`BLOCKED_SLEEP` (``--retry-ms``) and claims again (a tight retry loop), and counts the blocked
  claim. Only runs that ended inside the window count; a run still open at the end is finished afterwards
  (uncounted), so the next round can claim; a worker still blocked at the end stops claiming.

  Measured per round: completed runs/s; errors (every exception of a step, by type; must be 0); the
  claim *wait* — from a worker's first claim attempt for a run to the end of its successful claim, so it
  includes the time spent blocked behind other workers' runs; the claim *step* — one claim call with its
  connection (open, claim, close), whatever the outcome; the bare claim call (``lc.claim(…)`` alone); the
  blocked claims; statements sent (the proxies of :mod:`bench.counting`, connection setup included).
* ``baseline``: one-row INSERT transactions (``INSERT INTO bench_baseline (…) VALUES (…) RETURNING id``,
  autocommit), each on a NEW connection of the same dialect (same TLS login, same setup statement), so
  both sides pay a connection per transaction.
* ``baseline_held``: the same INSERT on ONE connection held for the window (the figure this part reported
  before it opened a connection per step; kept for comparison, labelled "held").

A pipeline run is ``2 + 2 × tasks`` lifecycle transactions (claim, a start and a finish per task,
finish_run); lifecycle transactions/s = completed runs/s × that (blocked claims are not counted), and the
ratio compares it with the baseline's transactions/s at the same number of processes.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from collections import Counter
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
#: The one pipeline every worker runs.
SHARED_PIPELINE = "BENCH_SHARED"
DAG_ID = "bench_contention"
LOCK_TIMEOUT = 60.0
READY_TIMEOUT = 180.0
#: Seconds a worker sleeps after a BLOCKED claim before it claims again.
BLOCKED_SLEEP = 0.002
#: Seconds a worker sleeps after a failed step before it goes on (so an error cannot spin the CPU).
ERROR_SLEEP = 0.05
#: A worker gives up its round after this many errors (each one is reported).
MAX_ERRORS = 50
JOB_KINDS = ("lifecycle", "baseline", "baseline_held")


@dataclass(frozen=True)
class Job:
    """What the workers of one round do: ``kind`` is one of :data:`JOB_KINDS`."""

    kind: str
    seconds: float
    task_codes: tuple[str, ...]
    #: Seconds a worker sleeps after a BLOCKED claim.
    blocked_sleep: float = BLOCKED_SLEEP


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
            result = _serve(index, hook, job, inbox, outbox)
            outbox.put(("done", index, result))
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


def _serve(index: int, hook: Any, job: Job, inbox: Any, outbox: Any) -> dict[str, Any]:
    from bench.counting import RoundTripCounter, instrument

    counter = RoundTripCounter()
    restore = instrument(hook, counter)
    try:
        if job.kind == "lifecycle":
            return _lifecycle(index, hook, job, counter, inbox, outbox)
        if job.kind in ("baseline", "baseline_held"):
            return _baseline(index, hook, job, counter, inbox, outbox)
        raise ValueError(f"unknown job kind {job.kind!r}")
    finally:
        restore()


class _Errors:
    """Exceptions of one worker's round: counted by type, the first message of each type kept."""

    def __init__(self) -> None:
        self.by_type: Counter[str] = Counter()
        self.first: dict[str, str] = {}

    def add(self, where: str, exc: BaseException) -> None:
        name = type(exc).__name__
        self.by_type[name] += 1
        self.first.setdefault(name, f"{where}: {str(exc).splitlines()[0][:300] if str(exc) else name}")
        time.sleep(ERROR_SLEEP)

    @property
    def total(self) -> int:
        return sum(self.by_type.values())

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "by_type": dict(self.by_type), "first": self.first}


def _baseline(index: int, hook: Any, job: Job, counter: Any, inbox: Any, outbox: Any) -> dict[str, Any]:
    """One-row INSERT transactions until the window closes: a new connection each, or one held connection."""
    payload, errors = f"worker {index}", _Errors()
    held = hook.get_conn() if job.kind == "baseline_held" else None
    try:
        start_at = _wait_for_start(index, inbox, outbox)
        deadline, count = start_at + job.seconds, 0
        first = counter.total_statements()
        while errors.total < MAX_ERRORS:
            try:
                if held is not None:
                    with held.cursor() as cur:
                        cur.execute(BASELINE_INSERT, (index, payload))
                        cur.fetchone()
                else:
                    with closing(hook.get_conn()) as conn, conn.cursor() as cur:
                        cur.execute(BASELINE_INSERT, (index, payload))
                        cur.fetchone()
            except Exception as exc:  # every failure is reported, by type
                errors.add("insert", exc)
                continue
            if time.time() > deadline:
                break
            count += 1
        return {"completed": count, "statements": counter.total_statements() - first,
                "errors": errors.as_dict()}  # fmt: skip
    finally:
        if held is not None:
            held.close()


def _lifecycle(index: int, hook: Any, job: Job, counter: Any, inbox: Any, outbox: Any) -> dict[str, Any]:
    """Full runs of the shared pipeline until the window closes, a connection per step."""
    from bench.bookkeeping import new_identity

    stats: dict[str, Any] = {"completed": 0, "claim_calls": 0, "blocked": 0, "wait_s": [], "step_s": [],
                             "call_s": [], "abandoned_claims": 0}  # fmt: skip
    errors = _Errors()
    start_at = _wait_for_start(index, inbox, outbox)
    deadline = start_at + job.seconds
    first = last = counter.total_statements()
    while time.time() <= deadline and errors.total < MAX_ERRORS:
        identity = new_identity(DAG_ID, f"w{index:02d}")
        if not _claim(hook, identity, job, deadline, stats, errors):
            continue
        outcome = _run_and_finish(hook, identity, job.task_codes, errors)
        if outcome == "stuck":
            break  # the run could not be finished: the pipeline stays blocked, nothing more to measure
        if outcome == "success" and time.time() <= deadline:
            stats["completed"] += 1
            last = counter.total_statements()
    stats["statements"] = last - first
    stats["errors"] = errors.as_dict()
    return stats


def _claim(hook: Any, identity: Any, job: Job, deadline: float, stats: dict[str, Any],
           errors: _Errors) -> bool:  # fmt: skip
    """Claim ``identity``'s run of the shared pipeline, again after each BLOCKED, until it is claimed (True)
    or the window has closed (False). Records the wait, each claim step and each bare claim call."""
    first_attempt = time.perf_counter()
    while time.time() <= deadline and errors.total < MAX_ERRORS:
        opened = time.perf_counter()
        try:
            with hook.lifecycle(LOCK_TIMEOUT) as lc:
                called = time.perf_counter()
                outcome = lc.claim(SHARED_PIPELINE, identity, task_codes=job.task_codes)
                returned = time.perf_counter()
        except Exception as exc:  # every failure is reported, by type
            errors.add("claim", exc)
            continue
        closed = time.perf_counter()
        stats["claim_calls"] += 1
        stats["step_s"].append(closed - opened)
        stats["call_s"].append(returned - called)
        if outcome.action in ("CREATED", "RESUMED"):  # RESUMED: an earlier attempt's claim did land
            stats["wait_s"].append(closed - first_attempt)
            return True
        if outcome.action == "BLOCKED":
            stats["blocked"] += 1
            time.sleep(job.blocked_sleep)
            continue
        errors.add("claim", RuntimeError(f"claim of {identity.run_key} returned {outcome.action}"))
        return False
    stats["abandoned_claims"] += 1  # still blocked when the window closed
    return False


def _run_and_finish(hook: Any, identity: Any, codes: tuple[str, ...], errors: _Errors) -> str:
    """The tasks and finish_run of a claimed run, each step on its own connection: ``success``. After an error
    the run is still finished (FAILED), so that the pipeline is not left blocked: ``failed`` (not counted as
    a completed run), or ``stuck`` when even that failed."""
    from airflow_provider_etl_craft.runs.counts import TaskCounts

    try:
        for task_code in codes:
            with hook.lifecycle(LOCK_TIMEOUT) as lc:
                handle = lc.start_task(SHARED_PIPELINE, task_code, identity, 1)
            with hook.lifecycle(LOCK_TIMEOUT) as lc:
                lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=1))
        with hook.lifecycle(LOCK_TIMEOUT) as lc:
            finished = lc.finish_run(SHARED_PIPELINE, identity, dict.fromkeys(codes, "success"))
        if finished.status == "SUCCESS":
            return "success"
        errors.add("finish_run", RuntimeError(f"{identity.run_key} ended {finished.status}"))
        return "failed"
    except Exception as exc:  # every failure is reported, by type
        errors.add("run", exc)
    try:
        with hook.lifecycle(LOCK_TIMEOUT) as lc:
            lc.finish_run(SHARED_PIPELINE, identity, dict.fromkeys(codes, "failed"))
        return "failed"
    except Exception as exc:  # every failure is reported, by type
        errors.add("finish_run after an error", exc)
        return "stuck"


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

    def run(self, job: Job, procs: int) -> dict[int, dict[str, Any]]:
        """Run ``job`` on the first ``procs`` workers at once; return each worker's result."""
        workers = range(procs)
        for i in workers:
            self.inboxes[i].put(job)
        self._expect("ready", workers)
        start_at = time.time() + 0.5
        for i in workers:
            self.inboxes[i].put(start_at)
        return self._expect("done", workers)

    def close(self) -> None:
        """Stop the workers (they exit on None; stragglers are terminated)."""
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)


def percentiles_ms(values: list[float]) -> dict[str, float] | None:
    """p50, p99 (nearest rank) and max of ``values`` (seconds), in milliseconds; None without values."""
    if not values:
        return None
    ordered = sorted(values)

    def rank(p: int) -> float:
        return ordered[max(0, -(-len(ordered) * p // 100) - 1)] * 1000

    return {"p50": round(rank(50), 2), "p99": round(rank(99), 2), "max": round(ordered[-1] * 1000, 2),
            "n": len(ordered)}  # fmt: skip


def _merge_errors(results: dict[int, dict[str, Any]]) -> dict[str, Any]:
    by_type: Counter[str] = Counter()
    first: dict[str, str] = {}
    for result in results.values():
        by_type.update(result["errors"]["by_type"])
        for name, message in result["errors"]["first"].items():
            first.setdefault(name, message)
    return {"total": sum(by_type.values()), "by_type": dict(by_type), "first": first}


def _rate(results: dict[int, dict[str, Any]], seconds: float) -> dict[str, Any]:
    completed = sum(r["completed"] for r in results.values())
    statements = sum(r["statements"] for r in results.values())
    return {"completed": completed, "per_second": completed / seconds, "statements": statements,
            "statements_per_second": statements / seconds, "errors": _merge_errors(results),
            "per_worker": [results[i]["completed"] for i in sorted(results)]}  # fmt: skip


def prepare(hook: Any, task_codes: tuple[str, ...]) -> None:
    """Seed the shared pipeline and create the baseline table."""
    from bench.engines import seed_pipelines

    seed_pipelines(hook, [(SHARED_PIPELINE, task_codes)])
    with closing(hook.engine.connect()) as conn, conn.cursor() as cur:
        cur.execute(BASELINE_TABLE)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def measure(config_path: Path, hook: Any, procs_list: tuple[int, ...], seconds: float,
            task_codes: tuple[str, ...], log: Any = print,
            blocked_sleep: float = BLOCKED_SLEEP) -> dict[str, Any]:  # fmt: skip
    """The three jobs at each process count, one after the other; rates, latencies, errors and ratios."""
    size = max(procs_list)
    prepare(hook, task_codes)
    tx_per_run = 2 + 2 * len(task_codes)
    started = time.perf_counter()
    pool = WorkerPool(size, config_path)
    log(f"  {size} worker processes started in {time.perf_counter() - started:.1f}s")
    rows = []
    try:
        for procs in procs_list:
            raw = pool.run(Job("lifecycle", seconds, task_codes, blocked_sleep), procs)
            lifecycle = _rate(raw, seconds)
            baseline = _rate(pool.run(Job("baseline", seconds, task_codes), procs), seconds)
            held = _rate(pool.run(Job("baseline_held", seconds, task_codes), procs), seconds)
            runs_per_s = lifecycle["per_second"]
            lifecycle_tx = runs_per_s * tx_per_run
            completed = lifecycle["completed"]
            row = {
                "procs": procs,
                "runs_per_s": runs_per_s,
                "completed_runs": completed,
                "errors": lifecycle["errors"],
                "baseline_errors": {"per_connection": baseline["errors"], "held": held["errors"]},
                "claim_calls": sum(r["claim_calls"] for r in raw.values()),
                "blocked_claims": sum(r["blocked"] for r in raw.values()),
                "blocked_per_run": _ratio(sum(r["blocked"] for r in raw.values()), completed),
                "abandoned_claims": sum(r["abandoned_claims"] for r in raw.values()),
                "claim_wait_ms": percentiles_ms([x for r in raw.values() for x in r["wait_s"]]),
                "claim_step_ms": percentiles_ms([x for r in raw.values() for x in r["step_s"]]),
                "claim_call_ms": percentiles_ms([x for r in raw.values() for x in r["call_s"]]),
                "lifecycle_tx_per_s": lifecycle_tx,
                "baseline_tx_per_s": baseline["per_second"],
                "ratio": _ratio(lifecycle_tx, baseline["per_second"]),
                "baseline_held_tx_per_s": held["per_second"],
                "ratio_held": _ratio(lifecycle_tx, held["per_second"]),
                "lifecycle_statements_per_s": lifecycle["statements_per_second"],
                "statements_per_run": _ratio(lifecycle["statements"], completed),
                "per_worker_runs": lifecycle["per_worker"],
                "baseline": baseline,
                "baseline_held": held,
            }
            rows.append(row)
            wait = row["claim_wait_ms"] or {"p50": float("nan"), "p99": float("nan")}
            log(f"  {procs:>2} procs: {runs_per_s:7.1f} runs/s = {lifecycle_tx:7.1f} lifecycle tx/s, "
                f"{row['blocked_claims']} blocked claims, claim wait p50 {wait['p50']:.1f} ms p99 {wait['p99']:.1f} ms, "
                f"{lifecycle['errors']['total']} errors; baseline {baseline['per_second']:.1f} tx/s "
                f"(connection each), {held['per_second']:.1f} tx/s (held)")  # fmt: skip
    finally:
        pool.close()
    return {"pipeline": SHARED_PIPELINE, "tasks_per_run": len(task_codes), "transactions_per_run": tx_per_run,
            "seconds": seconds, "blocked_sleep_ms": blocked_sleep * 1000, "rows": rows}  # fmt: skip
