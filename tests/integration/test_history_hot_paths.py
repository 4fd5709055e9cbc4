"""A run's bookkeeping does not grow with the Engine DB's history (docs/benchmarks.md, part 7), judged without a
clock: one full run (claim, start and end of each task's attempt, finish; a connection per step, as the
operators open them) on an Engine DB holding the bench's history and on one with none.

* SQLite: the virtual machine steps of each step (counted through the connection's progress handler) are the
  same on both, so no statement, trigger or foreign key check reads rows in proportion to the history; and no
  statement of the run has a plan that scans an ``AUD_`` table. Once with no planner statistics (an Engine DB
  etl-craft made is never analysed), once after ANALYZE.
* PostgreSQL (analysed, as autovacuum leaves a years-old database): the run reads none of the three history
  tables by a sequential scan, the statements of the ENGINE functions that claim and finish in one round trip
  included (EXPLAIN cannot see those; the server's table statistics count them).
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs.lifecycle import RunLifecycle
from bench import history
from bench.bookkeeping import new_identity, run_pipeline
from bench.engines import task_codes
from harness.engines import EngineSetup

#: 500 runs of each pipeline (the measured one among them), 12,500 task runs, 15,000 attempts.
SIZES = history.Sizes(pipelines=2, runs=1000, attempts=15_000)
CODES = task_codes(history.BENCH_TASKS)
#: VM steps a step may take more on the history DB: half a step per run of the measured pipeline. Reading its
#: runs once takes several steps a run (a claim that did took 3,500 more, a finish that walked the run table
#: 3,000); what may differ is the values' lengths and, after ANALYZE, a plan chosen by the tables' sizes that
#: still reads only the run's own rows (the lost-attempt check through the attempts of the run's task runs).
SLACK = SIZES.runs_per_pipeline // 2
#: Words that may follow a table's name and are no alias.
_KEYWORDS = frozenset(
    "AS CROSS DEFAULT GROUP INNER JOIN LEFT LIMIT ON ORDER RETURNING SELECT SET UNION USING VALUES WHERE".split()  # noqa: SIM905
)


def _engine_db(
    make_engine: Callable[..., EngineSetup],
    folder: Path,
    *,
    with_history: bool,
    dialect: str = "sqlite",
    pipelines: int = SIZES.pipelines,
) -> EngineDBHook:
    """An Engine DB with the bench's pipelines (``pipelines`` of them), and its history when ``with_history``."""
    setup = make_engine(dialect, folder)
    hook = setup.hook()
    hook.init_db()
    history.seed(hook, pipelines)
    if with_history:
        history.generate(hook, SIZES)
    return setup.hook()


def _lifecycles(
    hook: EngineDBHook, opened: Callable[[str, Any], None]
) -> Callable[[str], AbstractContextManager[Any]]:
    """A run lifecycle on a new connection per step; ``opened(op, conn)`` sees each connection first."""

    @contextmanager
    def lifecycle_for(op: str) -> Iterator[RunLifecycle]:
        with closing(hook.engine.connect()) as conn:
            opened(op, conn)
            yield RunLifecycle(hook.engine, conn)

    return lifecycle_for


class _SqliteRun:
    """One full run on a SQLite Engine DB: VM steps per step, and every statement sent."""

    def __init__(self, hook: EngineDBHook) -> None:
        self.steps: dict[str, int] = {}
        self.statements: list[str] = []

        def opened(op: str, conn: sqlite3.Connection) -> None:
            def tick() -> int:
                self.steps[op] = self.steps.get(op, 0) + 1
                return 0

            conn.set_progress_handler(tick, 1)
            conn.set_trace_callback(self.statements.append)

        run_pipeline(_lifecycles(hook, opened), history.BENCH_PIPELINE, CODES, new_identity(history.DAG_ID))


def _table_scans(conn: sqlite3.Connection, statements: list[str], prefix: str = "AUD_") -> list[str]:
    """Plan steps that SCAN a table named ``prefix…`` (by its name or alias) in any of ``statements``."""
    found: list[str] = []
    seen: set[str] = set()
    for text in statements:
        if not re.match(r"\s*(SELECT|WITH|INSERT|UPDATE|DELETE)\b", text, re.IGNORECASE) or text in seen:
            continue
        seen.add(text)
        names = {
            name.upper()
            for table, alias in re.findall(rf"\b({prefix}\w+)(?:\s+(?:AS\s+)?(\w+))?", text, re.IGNORECASE)
            for name in (table, alias)
            if name and name.upper() not in _KEYWORDS
        }
        for *_, step in conn.execute("EXPLAIN QUERY PLAN " + text):
            words = str(step).split()
            if words[0] == "SCAN" and words[1].upper() in names:
                found.append(f"{step}   <- {text[:200]}")
    return found


@pytest.mark.parametrize("statistics", [False, True], ids=["never-analysed", "analysed"])
def test_a_full_run_on_sqlite_takes_the_same_steps_with_history_as_without(
    make_engine: Callable[..., EngineSetup], tmp_path: Path, statistics: bool
) -> None:
    hooks = {
        name: _engine_db(make_engine, tmp_path / name, with_history=name == "history")
        for name in ("empty", "history")
    }
    if statistics:
        for hook in hooks.values():
            with closing(hook.engine.connect()) as conn:
                conn.execute("ANALYZE")
    runs = {name: _SqliteRun(hook) for name, hook in hooks.items()}
    empty, full = runs["empty"].steps, runs["history"].steps
    assert set(empty) == set(full) == {"claim", "start_task", "finish_task", "finish_run"}
    grown = {op: (empty[op], full[op]) for op in empty if full[op] > empty[op] + SLACK}
    assert not grown, f"VM steps (empty DB, history DB) of the steps that grow with history: {grown}"
    with closing(hooks["history"].engine.connect()) as conn:
        scans = _table_scans(conn, runs["history"].statements)
    assert not scans, "\n".join(scans)


#: Configured pipelines of the smaller and the larger Engine DB (each other pipeline has 20 tasks).
FEW, MANY = 2, 50
#: VM steps a step may take more among MANY pipelines than among FEW: the measured pipeline's own rows are the
#: same, and one pass over the other pipelines' 960 tasks takes thousands.
CFG_SLACK = 200


@pytest.mark.parametrize("statistics", [False, True], ids=["never-analysed", "analysed"])
def test_a_full_run_on_sqlite_reads_only_its_own_pipelines_configuration(
    make_engine: Callable[..., EngineSetup], tmp_path: Path, statistics: bool
) -> None:
    """A platform runs hundreds of pipelines on one Engine DB: no step of a run (the claim's dependency graph,
    the finish's task list included) reads the other pipelines' CFG_ rows, whether or not the DB has planner
    statistics; so each step takes the same VM steps among FEW pipelines as among MANY, and no statement of
    the run has a plan that scans a ``CFG_`` table there."""
    hooks = {
        count: _engine_db(make_engine, tmp_path / str(count), with_history=False, pipelines=count)
        for count in (FEW, MANY)
    }
    if statistics:
        for hook in hooks.values():
            with closing(hook.engine.connect()) as conn:
                conn.execute("ANALYZE")
    runs = {count: _SqliteRun(hook) for count, hook in hooks.items()}
    few, many = runs[FEW].steps, runs[MANY].steps
    assert set(few) == set(many) == {"claim", "start_task", "finish_task", "finish_run"}
    grown = {op: (few[op], many[op]) for op in few if many[op] > few[op] + CFG_SLACK}
    assert not grown, f"VM steps (among {FEW} pipelines, among {MANY}) of the steps that grow: {grown}"
    assert any("CFG_TASK_DEPENDENCY" in text for text in runs[MANY].statements), "no dependency graph read"
    with closing(hooks[MANY].engine.connect()) as conn:
        scans = _table_scans(conn, runs[MANY].statements, prefix="CFG_")
    assert not scans, "\n".join(scans)


#: The history tables, as PostgreSQL's statistics views name them.
HISTORY_TABLES = ("aud_pipelines_run_log", "aud_task_run_log", "aud_task_attempts")
#: Pipelines configured for the PostgreSQL run among many (4,000 tasks: the planner reads CFG_TASKS by an index
#: when it has one).
PG_PIPELINES = 200


def _seq_scans(hook: EngineDBHook, conn: Any, tables: tuple[str, ...]) -> dict[str, int]:
    """Sequential scans of ``tables`` so far, this session's own included (flushed first)."""
    hook.engine.query(conn, "SELECT pg_stat_force_next_flush()")  # flushed when the session goes idle
    read = (
        "SELECT relname, seq_scan FROM pg_stat_user_tables WHERE relid = ANY (ARRAY[{}]::regclass[])".format(
            ", ".join(f"to_regclass('{table}')" for table in tables)
        )
    )
    counts = {str(name): int(n) for name, n in hook.engine.query(conn, read)}
    assert set(counts) == set(tables), counts
    return counts


def _pg_run_seq_scans(hook: EngineDBHook, tables: tuple[str, ...]) -> tuple[dict[str, int], dict[str, int]]:
    """Sequential scans of ``tables`` before and after one full run on the analysed Engine DB of ``hook``."""
    with closing(hook.engine.connect()) as conn:
        ((version,),) = hook.engine.query(conn, "SELECT current_setting('server_version_num')::int")
        if version < 150000:
            pytest.skip("pg_stat_force_next_flush() needs PostgreSQL 15")
        hook.engine.execute(conn, "ANALYZE")
        lifecycle = RunLifecycle(hook.engine, conn)
        # Other sessions report their statistics when they end, a moment after they close: wait until stable.
        before, deadline = _seq_scans(hook, conn, tables), time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.3)
            now = _seq_scans(hook, conn, tables)
            if now == before:
                break
            before = now

        @contextmanager
        def lifecycle_for(op: str) -> Iterator[RunLifecycle]:
            yield lifecycle  # one session, so every statement of the run is counted before the read below

        run_pipeline(lifecycle_for, history.BENCH_PIPELINE, CODES, new_identity(history.DAG_ID))
        return before, _seq_scans(hook, conn, tables)


@pytest.mark.postgres
def test_a_full_run_on_postgresql_reads_no_history_table_by_a_sequential_scan(
    make_engine: Callable[..., EngineSetup], tmp_path: Path
) -> None:
    hook = _engine_db(make_engine, tmp_path, with_history=True, dialect="postgresql")
    before, after = _pg_run_seq_scans(hook, HISTORY_TABLES)
    assert after == before, f"sequential scans of the history tables during one run: {before} -> {after}"


@pytest.mark.postgres
def test_a_full_run_on_postgresql_reads_no_configured_task_by_a_sequential_scan(
    make_engine: Callable[..., EngineSetup], tmp_path: Path
) -> None:
    """Among many pipelines, no statement of the run (those of ETL_CRAFT_CLAIM and ETL_CRAFT_FINISH included)
    reads CFG_TASKS whole: the finish's task list goes through IX_CFG_TASKS_PIPELINE (ENGINE 0007)."""
    hook = _engine_db(make_engine, tmp_path, with_history=False, dialect="postgresql", pipelines=PG_PIPELINES)
    before, after = _pg_run_seq_scans(hook, ("cfg_tasks",))
    assert after == before, f"sequential scans of CFG_TASKS during one run: {before} -> {after}"
