"""Part 1: the bookkeeping cost of one pipeline run — claim, N × (start_task, finish_task), finish_run.

Each run uses a fresh run key (a new Airflow run id) and is measured two ways:

* ``fresh``: as the operators do it — every step opens its own connection (``hook.lifecycle()``), runs one
  lifecycle call and closes it. Round trips are counted per operation; the connection's own cost is
  counted apart under ``connect`` (see :mod:`bench.counting`).
* ``shared``: all steps of a run on one connection (one ``RunLifecycle``), for the wall time without the
  connection cost.

The counts are checked against an independent witness: PostgreSQL's ``pg_stat_statements`` (the server's
own count of the statements the Engine role ran, logins excluded) and, on SQLite, the library's trace
callback on each connection (statements after setup).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from operator import methodcaller
from typing import Any

from airflow_provider_etl_craft.runs.counts import TaskCounts
from airflow_provider_etl_craft.runs.identity import RunIdentity
from bench.counting import CONNECT_OP, RoundTripCounter, instrument

OPERATIONS = ("claim", "start_task", "finish_task", "finish_run")
LOCK_TIMEOUT = 60.0
DAG_ID = "bench_bookkeeping"


def new_identity(dag_id: str, prefix: str = "bench") -> RunIdentity:
    """A RunIdentity with a run id nobody used before (so claim always creates a run)."""
    now = datetime.now(UTC)
    return RunIdentity(dag_id=dag_id, run_id=f"{prefix}__{now:%Y-%m-%dT%H:%M:%S.%f}_{uuid.uuid4().hex[:8]}",
                       run_date=now)  # fmt: skip


def run_pipeline(lifecycle_for: Callable[[str], AbstractContextManager[Any]], pipeline_code: str, codes: tuple[str, ...],
                 identity: RunIdentity, timings: dict[str, list[float]] | None = None) -> None:  # fmt: skip
    """One full run: claim, then start and finish each task in turn, then finish_run.

    ``lifecycle_for(op)`` is a context manager yielding the RunLifecycle to use for operation ``op``.
    """

    def step(op: str, call: Callable[[Any], Any]) -> Any:
        started = time.perf_counter()
        with lifecycle_for(op) as lc:
            result = call(lc)
        if timings is not None:
            timings.setdefault(op, []).append(time.perf_counter() - started)
        return result

    outcome = step("claim", lambda lc: lc.claim(pipeline_code, identity, task_codes=codes))
    if outcome.action != "CREATED":
        raise RuntimeError(f"claim of {identity.run_key} returned {outcome.action}, expected CREATED")
    for code in codes:
        handle = step("start_task", methodcaller("start_task", pipeline_code, code, identity, 1))
        step("finish_task", methodcaller("finish_task", handle, "SUCCESS", TaskCounts(rows_written=1)))
    finished = step(
        "finish_run", lambda lc: lc.finish_run(pipeline_code, identity, dict.fromkeys(codes, "success"))
    )
    if finished.status != "SUCCESS":
        raise RuntimeError(f"run {identity.run_key} ended {finished.status}, expected SUCCESS")


def _fresh(hook: Any, counter: RoundTripCounter) -> Callable[[str], AbstractContextManager[Any]]:
    """``lifecycle_for`` of the operator-like mode: a new connection per operation, counted under it."""

    @contextmanager
    def lifecycle_for(op: str) -> Iterator[Any]:
        with counter.operation(op), hook.lifecycle(LOCK_TIMEOUT) as lc:
            yield lc

    return lifecycle_for


def _shared(lifecycle: Any, counter: RoundTripCounter) -> Callable[[str], AbstractContextManager[Any]]:
    """``lifecycle_for`` of the one-connection mode: the same RunLifecycle for every operation."""

    @contextmanager
    def lifecycle_for(op: str) -> Iterator[Any]:
        with counter.operation(op):
            yield lifecycle

    return lifecycle_for


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[max(0, -(-len(ordered) * 95 // 100) - 1)]  # nearest rank
    return {"median": round(statistics.median(ordered) * 1000, 3), "p95": round(p95 * 1000, 3),
            "min": round(ordered[0] * 1000, 3), "max": round(ordered[-1] * 1000, 3)}  # fmt: skip


def _counts(counter: RoundTripCounter, runs: int, n_tasks: int) -> dict[str, Any]:
    ops: dict[str, Any] = {}
    for op in OPERATIONS:
        ops[op] = {
            "calls": counter.calls[op],
            "per_call": counter.per_call(op),
            "connections_per_call": counter.connections_by_op[op] / (counter.calls[op] or 1),
            "sent_per_call": counter.statements_per_call(op),
        }
    connect = counter.per_call(CONNECT_OP)
    per_run = {op: counter.round_trips(op) / runs for op in (*OPERATIONS, CONNECT_OP)}
    return {
        "operations": ops,
        "connect": {
            "connections": counter.calls[CONNECT_OP],
            "per_connection": connect,
            "sent_per_connection": counter.statements_per_call(CONNECT_OP),
            "connect_ms": _ms(counter.connect_seconds) if counter.connect_seconds else None,
            "close_ms": _ms(counter.close_seconds) if counter.close_seconds else None,
        },  # fmt: skip
        "per_run": per_run,
        "per_run_total": sum(per_run.values()),
        "per_run_statements": sum(counter.statements(op) for op in (*OPERATIONS, CONNECT_OP)) / runs,
        "connections_per_run": counter.calls[CONNECT_OP] / runs,
        "tasks": n_tasks,
    }


def measure(hook: Any, dialect: str, pipeline_code: str, codes: tuple[str, ...], runs: int,
            server_statements: Callable[[], int | None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Measure ``runs`` pipeline runs of ``len(codes)`` tasks each on the Engine DB of ``hook``, both modes.

    ``server_statements`` (PostgreSQL) returns the server's running statement count for the Engine role.
    """
    result: dict[str, Any] = {"dialect": dialect, "runs": runs, "tasks": len(codes)}

    # Warm-up (not counted): first connection, SQL translation caches, the planner's first plans.
    warm = RoundTripCounter()
    restore = instrument(hook, warm)
    try:
        run_pipeline(_fresh(hook, warm), pipeline_code, codes, new_identity(DAG_ID, "warmup"))
    finally:
        restore()

    # Operator-like: a connection per step.
    counter = RoundTripCounter()
    timings: dict[str, list[float]] = {}
    wall: list[float] = []
    before = server_statements() if server_statements else None
    restore = instrument(hook, counter)
    try:
        for _ in range(runs):
            started = time.perf_counter()
            run_pipeline(_fresh(hook, counter), pipeline_code, codes, new_identity(DAG_ID), timings)
            wall.append(time.perf_counter() - started)
    finally:
        restore()
    after = server_statements() if server_statements else None
    result["fresh"] = {
        "wall_ms": _ms(wall),
        "op_ms": {op: _ms(v) for op, v in timings.items()},
        "round_trips": _counts(counter, runs, len(codes)),
        # SQLite has no server count: its check is the trace callback's, below.
        "check": _server_check(counter, before, after) if dialect == "postgresql" else None,
    }

    # All steps of a run on one connection.
    shared_counter = RoundTripCounter()
    shared_wall: list[float] = []
    shared_timings: dict[str, list[float]] = {}
    restore = instrument(hook, shared_counter)
    try:
        for _ in range(runs):
            started = time.perf_counter()
            with hook.lifecycle(LOCK_TIMEOUT) as lc:
                run_pipeline(
                    _shared(lc, shared_counter), pipeline_code, codes, new_identity(DAG_ID), shared_timings
                )
            shared_wall.append(time.perf_counter() - started)
    finally:
        restore()
    result["shared"] = {
        "wall_ms": _ms(shared_wall),
        "op_ms": {op: _ms(v) for op, v in shared_timings.items()},
        "round_trips": _counts(shared_counter, runs, len(codes)),
    }
    if dialect == "sqlite":
        result["fresh"]["check"] = _sqlite_trace_check(hook, pipeline_code, codes)
    return result


def _server_check(counter: RoundTripCounter, before: int | None, after: int | None) -> dict[str, Any]:
    """Compare the proxy's statement count with the server's (pg_stat_statements) over the same window."""
    proxy = counter.server_statements
    if proxy <= 0:
        raise AssertionError("the counting proxy saw no statements at all: the instrumentation is broken")
    if before is None or after is None:
        raise AssertionError("no pg_stat_statements count: the round-trip cross-check cannot run")
    server = after - before
    return {"method": "pg_stat_statements calls of the Engine role", "proxy": proxy, "server": server,
            "match": proxy == server}  # fmt: skip


def _sqlite_trace_check(hook: Any, pipeline_code: str, codes: tuple[str, ...]) -> dict[str, Any]:
    """Two more runs with SQLite's trace callback on every connection: statements it saw vs the proxy's."""
    traced = [0]

    def tracer(statement: str) -> None:
        if not statement.lstrip().startswith("--"):
            traced[0] += 1

    counter = RoundTripCounter()
    restore = instrument(hook, counter, on_raw_connection=lambda raw: raw.set_trace_callback(tracer))
    try:
        for _ in range(2):
            run_pipeline(_fresh(hook, counter), pipeline_code, codes, new_identity(DAG_ID, "check"))
    finally:
        restore()
    proxy = sum(counter.statements(op) for op in OPERATIONS)
    if proxy <= 0:
        raise AssertionError("the counting proxy saw no statements at all: the instrumentation is broken")
    return {"method": "sqlite3 trace callback (statements after connection setup)", "proxy": proxy,
            "server": traced[0], "match": proxy == traced[0]}  # fmt: skip
