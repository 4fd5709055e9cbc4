"""Part 7: what years of history cost a run and the CLI's read commands.

Two Engine DBs of one dialect with the same CFG_ rows (``pipelines`` pipelines; the measured one,
:data:`BENCH_PIPELINE`, has :data:`BENCH_TASKS` tasks, the others :data:`OTHER_TASKS`): one without any run,
one holding ``runs`` finished runs spread over :data:`SPAN_DAYS` days with ``attempts`` task attempts in all.
The history is written set-based (``generate_series`` on PostgreSQL, a recursive CTE on SQLite), each row
final when inserted (the AUD_ tables' triggers refuse changes to some of them), within every CHECK, unique
index and foreign key of the schema.

Measured side by side in one run, alternating which DB goes first:

* a full run of :data:`BENCH_PIPELINE` — claim, start and end of one attempt per task, finish — through the
  run lifecycle, a connection per step as the operators open them (:func:`bench.bookkeeping.run_pipeline`);
* the CLI's read commands ``status``, ``history`` and ``pipelines`` (``cli.main.main`` in this process: the
  parser, the config file, a connection, the queries, the printed table; no interpreter start-up).

Each figure is reported as a median per DB and as history ÷ empty.
"""

# The generator's SQL is put together from constant fragments (the dialect's forms in `_Sql`); every value is bound.
# ruff: noqa: S608

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench import engines
from bench.bookkeeping import OPERATIONS, new_identity, run_pipeline

BENCH_PIPELINE = "BENCH_HIST"
BENCH_TASKS = 5
OTHER_TASKS = 20
#: The history covers this many days, ending :data:`LAST_RUN_DAYS_AGO` days ago.
SPAN_DAYS = 3 * 365
LAST_RUN_DAYS_AGO = 1
#: Minutes a generated run lasts (its tasks and attempts fit inside).
RUN_MINUTES = 120
DAG_ID = "bench_history"
#: Who wrote the CFG_ rows (so the generator finds its pipelines).
CREATED_BY = "bench-history"
CLI_COMMANDS: dict[str, list[str]] = {
    "status": ["status", "--pipeline", BENCH_PIPELINE],
    "history": ["history", "--pipeline", BENCH_PIPELINE],
    "pipelines": ["pipelines"],
}
RATIO_TARGET = 1.25


@dataclass(frozen=True)
class Sizes:
    """How much history to write."""

    pipelines: int
    runs: int
    attempts: int

    @property
    def runs_per_pipeline(self) -> int:
        return max(1, self.runs // self.pipelines)

    @property
    def task_runs(self) -> int:
        return self.runs_per_pipeline * (BENCH_TASKS + (self.pipelines - 1) * OTHER_TASKS)


@dataclass
class EnginePair:
    """The two Engine DBs of one dialect: config paths, and (PostgreSQL) database names for VACUUM."""

    dialect: str
    empty: Path
    history: Path
    generated: dict[str, Any]


# --------------------------------------------------------------------------- writing the history


class _Sql:
    """The few dialect differences of the generator's SQL: a numbers source, timestamps, dates."""

    def __init__(self, dialect: str) -> None:
        self.pg = dialect == "postgresql"

    def numbers(self, alias: str) -> str:
        """A table expression ``alias(n)`` of 1 … N; N is one ``?`` parameter."""
        if self.pg:
            return f"generate_series(1, CAST(? AS BIGINT)) AS {alias}(n)"
        return f"(WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?) SELECT n FROM s) AS {alias}"

    def plus_minutes(self, ts: str, minutes: str) -> str:
        """``ts`` (a column or bound timestamp) plus ``minutes`` (an integer expression)."""
        if self.pg:
            return f"({ts} + ({minutes}) * INTERVAL '1 minute')"
        return f"strftime('%Y-%m-%dT%H:%M:%fZ', {ts}, '+' || ({minutes}) || ' minutes')"

    def utc_date(self, ts: str) -> str:
        if self.pg:
            return f"CAST(({ts}) AT TIME ZONE 'UTC' AS DATE)"
        return f"date({ts})"

    def base(self) -> str:
        """A one-row CTE ``base(t0, step, extra, task_runs)`` of four ``?`` parameters."""
        if self.pg:
            return ("base AS (SELECT CAST(? AS TIMESTAMPTZ) AS t0, CAST(? AS BIGINT) AS step, "
                    "CAST(? AS BIGINT) AS extra, CAST(? AS BIGINT) AS task_runs)")  # fmt: skip
        return "base AS (SELECT ? AS t0, ? AS step, ? AS extra, ? AS task_runs)"


def seed(hook: Any, pipelines: int) -> None:
    """The CFG_ rows both DBs share: :data:`BENCH_PIPELINE` with its tasks, then ``HIST_0002`` … (set-based)."""
    engine = hook.engine
    sql = _Sql(engine.name)
    with closing(engine.connect()) as conn, engine.transaction(conn) as cur:
        cur.execute(
            engine.sql(
                "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY) "
                f"SELECT CASE WHEN g.n = 1 THEN ? ELSE 'HIST_' || SUBSTR(CAST(10000 + g.n AS TEXT), 2) END, "
                f"'history pipeline ' || CAST(g.n AS TEXT), 24, 'FULL', ? FROM {sql.numbers('g')} ORDER BY g.n"
            ),
            (BENCH_PIPELINE, CREATED_BY, pipelines),
        )
        cur.execute(
            engine.sql(
                "INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY) "
                "SELECT 'T' || SUBSTR(CAST(100 + g.n AS TEXT), 2), 'ETL', p.PIPELINE_ID, 'PYTHON', ? "
                f"FROM CFG_PIPELINES p JOIN {sql.numbers('g')} "
                "ON g.n <= CASE WHEN p.PIPELINE_CODE = ? THEN ? ELSE ? END "
                "WHERE p.CREATED_BY = ? ORDER BY p.PIPELINE_ID, g.n"
            ),
            (CREATED_BY, max(BENCH_TASKS, OTHER_TASKS), BENCH_PIPELINE, BENCH_TASKS, OTHER_TASKS, CREATED_BY),
        )


def generate(hook: Any, sizes: Sizes) -> dict[str, Any]:
    """Write the history into the (seeded, run-less) Engine DB of ``hook``; returns the row counts and seconds.

    Runs: ``runs_per_pipeline`` per pipeline, one every ``SPAN_DAYS / runs_per_pipeline`` days, every tenth
    FAILED (its last task failed), ids in time order. Task runs: one per task of the run's pipeline. Attempts:
    one per task run plus ``attempts - task_runs`` retries spread evenly (a retried attempt FAILED before the
    last one).
    """
    engine = hook.engine
    sql = _Sql(engine.name)
    per = sizes.runs_per_pipeline
    extra = sizes.attempts - sizes.task_runs
    if extra < 0:
        raise ValueError(
            f"{sizes.attempts} attempts are fewer than the {sizes.task_runs} task runs of {sizes.runs} runs: "
            "give more attempts or fewer runs"
        )
    step = SPAN_DAYS * 24 * 60 // per
    t0 = (
        engine.now()
        - timedelta(days=LAST_RUN_DAYS_AGO, minutes=RUN_MINUTES)
        - timedelta(minutes=step * (per - 1))
    )
    base = (engine.to_db_time(t0), step, extra, sizes.task_runs)
    max_attempts = 2 + extra // max(1, sizes.task_runs)
    key = "'airflow:hist_dag_' || CAST(pl.k AS TEXT) || ':scheduled__' || CAST(g.n AS TEXT)"
    run_start = sql.plus_minutes("base.t0", "(g.n - 1) * base.step + pl.k")
    runs = (
        f"WITH {sql.base()}, pl AS (SELECT PIPELINE_ID, ROW_NUMBER() OVER (ORDER BY PIPELINE_ID) AS k "
        "FROM CFG_PIPELINES WHERE CREATED_BY = ?) "
        "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, START_DATE, END_DATE, STATUS, SLA_STATUS, RUN_DATE, "
        "BACKFILL, RUN_KEY, TRIGGER_KIND, OWNER_ID, OUTPUT_REVISION, STARTED_BY, STARTED_BY_KIND, ENDED_BY, "
        "ENDED_BY_KIND) "
        f"SELECT pl.PIPELINE_ID, {run_start}, "
        f"{sql.plus_minutes('base.t0', f'(g.n - 1) * base.step + pl.k + {RUN_MINUTES}')}, "
        "CASE WHEN (g.n + pl.k) % 10 = 0 THEN 'FAILED' ELSE 'SUCCESS' END, 'MET', "
        f"{sql.utc_date(run_start)}, 'N', {key}, 'ORCHESTRATOR', {key}, 1, {key}, 'ORCHESTRATOR', {key}, "
        f"'ORCHESTRATOR' FROM base CROSS JOIN {sql.numbers('g')} CROSS JOIN pl ORDER BY g.n, pl.k"
    )
    # i: the task run's ordinal (0-based); its attempts: 1 + its share of the `extra` retries.
    attempts_of = "1 + ((src.i + 1) * base.extra) / base.task_runs - (src.i * base.extra) / base.task_runs"
    task_runs = (
        f"WITH {sql.base()}, tk AS (SELECT TASK_ID, PIPELINE_ID, "
        "ROW_NUMBER() OVER (PARTITION BY PIPELINE_ID ORDER BY TASK_ID) AS t, "
        "COUNT(*) OVER (PARTITION BY PIPELINE_ID) AS nt FROM CFG_TASKS WHERE CREATED_BY = ?), "
        "src AS (SELECT r.PIPELINE_RUN_ID, r.START_DATE, r.STATUS AS RUN_STATUS, tk.TASK_ID, tk.t, tk.nt, "
        "ROW_NUMBER() OVER (ORDER BY r.PIPELINE_RUN_ID, tk.t) - 1 AS i "
        "FROM AUD_PIPELINES_RUN_LOG r JOIN tk ON tk.PIPELINE_ID = r.PIPELINE_ID) "
        "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, START_DATE, END_DATE, STATUS, ATTEMPT_COUNT, "
        "SOURCE_COUNT, TARGET_COUNT, INSERT_COUNT, ROWS_WRITTEN, ERROR_MESSAGE) "
        f"SELECT src.TASK_ID, src.PIPELINE_RUN_ID, {sql.plus_minutes('src.START_DATE', 'src.t')}, "
        f"{sql.plus_minutes('src.START_DATE', f'src.t + {attempts_of}')}, "
        "CASE WHEN src.RUN_STATUS = 'FAILED' AND src.t = src.nt THEN 'FAILED' ELSE 'SUCCESS' END, "
        f"{attempts_of}, 1000 + src.i % 997, 1000 + src.i % 997, src.i % 997, 1000 + src.i % 997, "
        "CASE WHEN src.RUN_STATUS = 'FAILED' AND src.t = src.nt THEN 'ValueError: bad row in the source' END "
        "FROM base CROSS JOIN src ORDER BY src.PIPELINE_RUN_ID, src.t"
    )
    attempt_start = sql.plus_minutes("tr.START_DATE", "g.n - 1")
    attempt_end = sql.plus_minutes("tr.START_DATE", "g.n")
    attempts = (
        "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, STATUS, OWNER_ID, HEARTBEAT_AT, CLAIMED_AT, "
        "STARTED_AT, ENDED_AT, HOST, PID, SOURCE_COUNT, TARGET_COUNT, INSERT_COUNT, ROWS_WRITTEN, ERROR_MESSAGE, "
        "REQUESTED_BY, REQUESTED_BY_KIND) "
        "SELECT tr.TASK_RUN_ID, g.n, CASE WHEN g.n = tr.ATTEMPT_COUNT THEN tr.STATUS ELSE 'FAILED' END, "
        "'bench-host:4242:' || CAST(tr.TASK_RUN_ID AS TEXT) || '.' || CAST(g.n AS TEXT), "
        f"{attempt_end}, {attempt_start}, {attempt_start}, {attempt_end}, 'bench-host', 4242, "
        "CASE WHEN g.n = tr.ATTEMPT_COUNT THEN tr.SOURCE_COUNT END, CASE WHEN g.n = tr.ATTEMPT_COUNT THEN tr.TARGET_COUNT END, "
        "CASE WHEN g.n = tr.ATTEMPT_COUNT THEN tr.INSERT_COUNT END, CASE WHEN g.n = tr.ATTEMPT_COUNT THEN tr.ROWS_WRITTEN END, "
        "CASE WHEN g.n = tr.ATTEMPT_COUNT THEN tr.ERROR_MESSAGE ELSE 'OperationalError: connection reset' END, "
        "r.RUN_KEY, 'ORCHESTRATOR' "
        f"FROM AUD_TASK_RUN_LOG tr JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = tr.PIPELINE_RUN_ID "
        f"JOIN {sql.numbers('g')} ON g.n <= tr.ATTEMPT_COUNT ORDER BY tr.TASK_RUN_ID, g.n"
    )  # fmt: skip
    timings: dict[str, float] = {}
    with closing(engine.connect()) as conn, engine.transaction(conn) as cur:
        for name, text, params in (
            ("runs", runs, (*base, CREATED_BY, per)),
            ("task_runs", task_runs, (*base, CREATED_BY)),
            ("attempts", attempts, (max_attempts,)),
        ):
            started = time.perf_counter()
            cur.execute(engine.sql(text), params)
            timings[name] = round(time.perf_counter() - started, 2)
    counts = table_counts(hook)
    if counts["attempts"] != sizes.attempts or counts["runs"] != per * sizes.pipelines:
        raise AssertionError(f"the generator wrote {counts}, expected {sizes}")
    return {"counts": counts, "seconds": timings, "first_run": t0.isoformat(), "step_minutes": step}


def table_counts(hook: Any) -> dict[str, int]:
    """Rows in the three run tables."""
    engine = hook.engine
    with closing(engine.connect()) as conn:
        return {
            name: int(engine.query(conn, f"SELECT COUNT(*) FROM {table}")[0][0])
            for name, table in (("runs", "AUD_PIPELINES_RUN_LOG"), ("task_runs", "AUD_TASK_RUN_LOG"),
                                ("attempts", "AUD_TASK_ATTEMPTS"))
        }  # fmt: skip


def prepare(dialect: str, folder: Path, sizes: Sizes, pg: engines.PgServer | None,
            log: Callable[[str], None]) -> EnginePair:  # fmt: skip
    """Create, init and seed both Engine DBs of ``dialect`` and write the history into one of them."""
    names: dict[str, str] = {}
    if dialect == "sqlite":
        empty = engines.sqlite_engine(folder / "empty")
        history = engines.sqlite_engine(folder / "history")
    else:
        assert pg is not None
        names["empty"], empty = pg.another_database(folder / "empty")
        names["history"], history = pg.another_database(folder / "history")
    hooks = {"empty": engines.init_engine(empty), "history": engines.init_engine(history)}
    for hook in hooks.values():
        seed(hook, sizes.pipelines)
    started = time.perf_counter()
    generated = generate(hooks["history"], sizes)
    generated["total_s"] = round(time.perf_counter() - started, 2)
    if pg is not None:
        # A years-old database has been vacuumed and analysed by autovacuum; do now what it would have done.
        for name in names.values():
            with closing(pg.cluster.admin_connect(name)) as admin, admin.cursor() as cur:
                cur.execute("VACUUM ANALYZE")
    counts = generated["counts"]
    log(f"  {dialect}: wrote {counts['runs']:,} runs, {counts['task_runs']:,} task runs, {counts['attempts']:,} "
        f"attempts in {generated['total_s']:.1f} s")  # fmt: skip
    return EnginePair(dialect, empty, history, generated)


# --------------------------------------------------------------------------- measuring


def _per_step(hook: Any) -> Callable[[str], AbstractContextManager[Any]]:
    """``lifecycle_for`` of :func:`run_pipeline`: a new connection per step, as the operators open them."""

    @contextmanager
    def lifecycle_for(op: str) -> Iterator[Any]:
        with hook.lifecycle() as lc:
            yield lc

    return lifecycle_for


def _cli(config: Path, argv: list[str]) -> float:
    """Seconds of one in-process CLI command; its exit status must be 0."""
    from airflow_provider_etl_craft.cli.main import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    code = cli_main([*argv, "--config", str(config)], out, err)
    elapsed = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"etl-craft-airflow {' '.join(argv)} exited {code}: {err.getvalue().strip()}")
    return elapsed


def _stats(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"median_ms": round(statistics.median(ordered) * 1000, 3), "min_ms": round(ordered[0] * 1000, 3),
            "max_ms": round(ordered[-1] * 1000, 3), "n": len(ordered)}  # fmt: skip


def measure(pair: EnginePair, repeats: int, cli_repeats: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Full runs and CLI reads on both DBs of ``pair``, alternating (ABBA) so drift hits both alike."""
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

    hooks = {"empty": EngineDBHook.from_config(pair.empty), "history": EngineDBHook.from_config(pair.history)}
    configs = {"empty": pair.empty, "history": pair.history}
    codes = engines.task_codes(BENCH_TASKS)
    wall: dict[str, list[float]] = {"empty": [], "history": []}
    ops: dict[str, dict[str, list[float]]] = {"empty": {}, "history": {}}

    def one_run(db: str, record: bool) -> None:
        timings: dict[str, list[float]] = {}
        started = time.perf_counter()
        run_pipeline(_per_step(hooks[db]), BENCH_PIPELINE, codes, new_identity(DAG_ID), timings)
        if record:
            wall[db].append(time.perf_counter() - started)
            for op, values in timings.items():
                ops[db].setdefault(op, []).extend(values)

    for db in ("empty", "history"):  # warm-up: first connections, caches, the first plans
        one_run(db, record=False)
        for argv in CLI_COMMANDS.values():
            _cli(configs[db], argv)
    for n in range(repeats):
        for db in ("empty", "history") if n % 2 == 0 else ("history", "empty"):
            one_run(db, record=True)
    cli: dict[str, dict[str, list[float]]] = {name: {"empty": [], "history": []} for name in CLI_COMMANDS}
    for n in range(cli_repeats):
        for db in ("empty", "history") if n % 2 == 0 else ("history", "empty"):
            for name, argv in CLI_COMMANDS.items():
                cli[name][db].append(_cli(configs[db], argv))

    def ratio(history: list[float], empty: list[float]) -> float:
        return round(statistics.median(history) / statistics.median(empty), 3)

    result: dict[str, Any] = {
        "dialect": pair.dialect,
        "generated": pair.generated,
        "pipeline": BENCH_PIPELINE,
        "tasks": BENCH_TASKS,
        "repeats": repeats,
        "run": {"empty": _stats(wall["empty"]), "history": _stats(wall["history"]),
                "ratio": ratio(wall["history"], wall["empty"])},
        "ops": {op: {"empty": _stats(ops["empty"][op]), "history": _stats(ops["history"][op]),
                     "ratio": ratio(ops["history"][op], ops["empty"][op])} for op in OPERATIONS},
        "cli_repeats": cli_repeats,
        "cli": {name: {"empty": _stats(v["empty"]), "history": _stats(v["history"]),
                       "ratio": ratio(v["history"], v["empty"])} for name, v in cli.items()},
    }  # fmt: skip
    log(f"  {pair.dialect}: full run {result['run']['history']['median_ms']:.1f} ms with history vs "
        f"{result['run']['empty']['median_ms']:.1f} ms empty ({result['run']['ratio']:.2f}x); CLI "
        + ", ".join(f"{name} {v['ratio']:.2f}x" for name, v in result["cli"].items()))  # fmt: skip
    return result
