"""Read-only views of a pipeline's runs, task runs and attempts (the CLI's ``status`` and ``history``).

Runs are found by ``PIPELINE_CODE`` across every ``CFG_PIPELINES`` row with that code, so a pipeline that
was retired and re-added through a migration keeps its history. Newest means the highest ``PIPELINE_RUN_ID``
(ids are never reused). Nothing here writes, takes a lock or opens a transaction.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass, field, fields, is_dataclass, replace
from datetime import UTC, datetime
from typing import Any

from airflow_provider_etl_craft.engine.dbapi import Connection
from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
from airflow_provider_etl_craft.engine.schema import require_current
from airflow_provider_etl_craft.errors import MetadataError
from airflow_provider_etl_craft.runs.records import Pause, Pipeline

#: Order of the task statuses in a run's summary ("3 SUCCESS, 1 SKIPPED"); others follow alphabetically.
STATUS_ORDER = ("IN-PROGRESS", "SUCCESS", "FAILED", "SKIPPED", "CANCELLED")
#: The largest LIMIT both drivers bind (a signed 64-bit integer); larger requests mean "all runs".
MAX_LIMIT = 2**63 - 1

_RUN_COLUMNS = (
    "SELECT r.PIPELINE_RUN_ID, r.STATUS, r.RUN_KEY, r.RUN_DATE, r.START_DATE, r.END_DATE, r.SLA_STATUS, "
    "r.OUTPUT_REVISION, r.TRIGGER_KIND, r.BACKFILL "
    "FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ? "
)
_RECENT_RUNS = _RUN_COLUMNS + "ORDER BY r.PIPELINE_RUN_ID DESC LIMIT ?"
_CURRENT_OR_LATEST_RUN = (
    _RUN_COLUMNS
    + "ORDER BY CASE WHEN r.STATUS = 'IN-PROGRESS' THEN 0 ELSE 1 END, r.PIPELINE_RUN_ID DESC LIMIT 1"
)
_TASK_RUNS = (
    "SELECT tr.PIPELINE_RUN_ID, tr.TASK_RUN_ID, t.TASK_CODE, tr.STATUS, tr.ATTEMPT_COUNT, tr.SOURCE_COUNT, "
    "tr.TARGET_COUNT, tr.INSERT_COUNT, tr.UPDATE_COUNT, tr.DELETE_COUNT, tr.ROWS_WRITTEN, tr.START_DATE, "
    "tr.END_DATE, tr.ERROR_MESSAGE, tr.TASK_LOG "
    "FROM AUD_TASK_RUN_LOG tr JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
    "JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = tr.PIPELINE_RUN_ID "
    "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID "
    "WHERE p.PIPELINE_CODE = ? AND tr.PIPELINE_RUN_ID BETWEEN ? AND ? ORDER BY tr.TASK_RUN_ID"
)
_ATTEMPTS = (
    "SELECT a.TASK_RUN_ID, a.ATTEMPT_ID, a.MAP_INDEX, a.ATTEMPT_NUMBER, a.STATUS, a.HOST, a.PID, a.STARTED_AT, "
    "a.ENDED_AT, a.ERROR_MESSAGE "
    "FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "
    "JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = tr.PIPELINE_RUN_ID "
    "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID "
    "WHERE p.PIPELINE_CODE = ? AND tr.PIPELINE_RUN_ID BETWEEN ? AND ? "
    "ORDER BY a.TASK_RUN_ID, COALESCE(a.MAP_INDEX, -1), a.ATTEMPT_NUMBER"
)


@dataclass(frozen=True)
class AttemptInfo:
    attempt_id: int
    #: The map index of a mapped task's instance; None for an unmapped task.
    map_index: int | None
    attempt_number: int
    status: str
    host: str | None
    pid: int | None
    started_at: datetime | None
    ended_at: datetime | None
    error_message: str | None


@dataclass(frozen=True)
class TaskRunInfo:
    task_run_id: int
    task_code: str
    status: str
    attempt_count: int
    source_count: int | None
    target_count: int | None
    insert_count: int | None
    update_count: int | None
    delete_count: int | None
    rows_written: int | None
    start_date: datetime | None
    end_date: datetime | None
    error_message: str | None
    task_log: str | None
    attempts: tuple[AttemptInfo, ...] = ()


@dataclass(frozen=True)
class RunInfo:
    """An ``AUD_PIPELINES_RUN_LOG`` row with its task runs (in creation order) and their attempts."""

    pipeline_run_id: int
    status: str
    run_key: str | None
    run_date: datetime | None
    start_date: datetime | None
    end_date: datetime | None
    sla_status: str | None
    output_revision: int
    trigger_kind: str | None
    backfill: str
    #: How many task runs ended in each status, in :data:`STATUS_ORDER`.
    task_status_counts: dict[str, int] = field(default_factory=dict)
    task_runs: tuple[TaskRunInfo, ...] = ()

    def with_task_runs(self, task_runs: tuple[TaskRunInfo, ...]) -> RunInfo:
        return replace(
            self, task_runs=task_runs, task_status_counts=status_counts(t.status for t in task_runs)
        )


def status_counts(statuses: Any) -> dict[str, int]:
    """Statuses counted, in :data:`STATUS_ORDER` (unknown ones last, alphabetically)."""
    counts = Counter(statuses)
    order = {s: i for i, s in enumerate(STATUS_ORDER)}
    return {s: counts[s] for s in sorted(counts, key=lambda s: (order.get(s, len(order)), s))}


def iso_utc(value: datetime) -> str:
    """ISO-8601 UTC text to the millisecond (SQLite keeps milliseconds), e.g. ``2026-07-01T06:00:00.000Z``."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def as_json(value: Any) -> Any:
    """Dataclasses as dicts (field order kept), tuples as lists, datetimes as :func:`iso_utc` text."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return iso_utc(value)
    return value


class RunQueries:
    """Read-only queries on one open Engine DB connection; the caller closes it.

    :param engine: the dialect of the Engine DB.
    :param conn: a connection from ``engine.connect()``.
    """

    def __init__(self, engine: EngineDialect, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self.engine.query(self.conn, sql, params)

    def check_tables(self) -> None:
        """:raises EngineDBError: the Engine schema is not CURRENT (see :class:`~...engine.schema.Verdict`).
        :raises ConfigurationError: the role may not use the Engine schema (names the GRANT)."""
        require_current(self.engine, self.conn)

    def pipeline(self, code: str) -> Pipeline:
        """The active ``CFG_PIPELINES`` row of ``code``, else its newest retired row.

        :raises MetadataError: no row has this code; the message suggests close codes.
        """
        rows = self._rows(Pipeline.BY_CODE, (code,))
        if not rows:
            known = {
                r[0].lower(): r[0] for r in self._rows("SELECT DISTINCT PIPELINE_CODE FROM CFG_PIPELINES")
            }
            close = [known[c] for c in difflib.get_close_matches(code.lower(), list(known), n=3)]
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise MetadataError(
                f"pipeline {code} does not exist in CFG_PIPELINES of the Engine DB {self.engine.describe()}; "
                f"fix --pipeline, or add the pipeline through a project migration{hint}"
            )
        return Pipeline.from_db(rows[0])

    def open_pause(self, pipeline_id: int) -> Pause | None:
        """The pipeline's open pause, if any (the schema allows at most one)."""
        rows = self._rows(Pause.OPEN, (pipeline_id,))
        return Pause.from_db(self.engine, rows[0]) if rows else None

    def current_or_latest_run(self, code: str) -> RunInfo | None:
        """The pipeline's IN-PROGRESS run, else its newest run, with task runs and attempts (None: no runs)."""
        runs = self._with_tasks(code, [self._run(r) for r in self._rows(_CURRENT_OR_LATEST_RUN, (code,))])
        return runs[0] if runs else None

    def recent_runs(self, code: str, limit: int) -> list[RunInfo]:
        """The ``limit`` newest runs of the pipeline, newest first, with task runs and attempts."""
        limit = min(limit, MAX_LIMIT)
        return self._with_tasks(code, [self._run(r) for r in self._rows(_RECENT_RUNS, (code, limit))])

    def _run(self, row: tuple[Any, ...]) -> RunInfo:
        t = self.engine.from_db_time
        run_id, status, key, run_date, start, end, sla, revision, trigger, backfill = row
        return RunInfo(
            int(run_id), status, key, t(run_date), t(start), t(end), sla, int(revision), trigger, backfill
        )

    def _with_tasks(self, code: str, runs: list[RunInfo]) -> list[RunInfo]:
        """Attach task runs and attempts: two queries over the runs' id range, whatever the number of runs."""
        if not runs:
            return runs
        t = self.engine.from_db_time
        ids = [r.pipeline_run_id for r in runs]
        span = (code, min(ids), max(ids))
        attempts = self._attempts(span)
        tasks: dict[int, list[TaskRunInfo]] = {}
        for row in self._rows(_TASK_RUNS, span):
            run_id, trid, task_code, status, attempt_count = row[:5]
            source, target, inserted, updated, deleted, written = (
                None if c is None else int(c) for c in row[5:11]
            )
            start, end, error, log = row[11:]
            tasks.setdefault(int(run_id), []).append(
                TaskRunInfo(
                    int(trid),
                    task_code,
                    status,
                    int(attempt_count),
                    source,
                    target,
                    inserted,
                    updated,
                    deleted,
                    written,
                    t(start),
                    t(end),
                    error,
                    log,
                    tuple(attempts.get(int(trid), ())),
                )
            )
        # Runs of other pipelines inside the id range were filtered out by code; newer runs of this one
        # (started between the queries) are dropped here.
        return [r.with_task_runs(tuple(tasks.get(r.pipeline_run_id, ()))) for r in runs]

    def _attempts(self, span: tuple[str, int, int]) -> dict[int, list[AttemptInfo]]:
        """The attempts of the task runs in ``span`` (pipeline code, first and last run id), by task run."""
        t = self.engine.from_db_time
        attempts: dict[int, list[AttemptInfo]] = {}
        for task_run_id, aid, index, number, status, host, pid, started, ended, error in self._rows(
            _ATTEMPTS, span
        ):
            attempts.setdefault(int(task_run_id), []).append(
                AttemptInfo(
                    int(aid),
                    None if index is None else int(index),
                    int(number),
                    status,
                    host,
                    None if pid is None else int(pid),
                    t(started),
                    t(ended),
                    error,
                )
            )
        return attempts
