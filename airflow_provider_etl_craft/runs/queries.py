"""Read-only views of a pipeline's runs, task runs and attempts (the CLI's ``status`` and ``history``), and
a task run's configured parameters (its lineage target, docs/lineage.md).

Runs are found by ``PIPELINE_CODE`` across every ``CFG_PIPELINES`` row with that code, so a pipeline that
was retired and re-added through a migration keeps its history. Newest means the highest ``PIPELINE_RUN_ID``
(ids are never reused). Nothing here writes, takes a lock or opens a transaction.
"""

from __future__ import annotations

import difflib
import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

from msgspec import Struct

from airflow_provider_etl_craft.engine.dbapi import Connection
from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
from airflow_provider_etl_craft.engine.schema import require_current
from airflow_provider_etl_craft.errors import MetadataError
from airflow_provider_etl_craft.runs.records import Pause, Pipeline
from airflow_provider_etl_craft.runs.vocabulary import TaskRunStatus

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: Order of the task statuses in a run's summary ("3 SUCCESS, 1 SKIPPED"); others follow alphabetically.
STATUS_ORDER = tuple(TaskRunStatus)
#: The largest LIMIT both drivers bind (a signed 64-bit integer); larger requests mean "all runs".
MAX_LIMIT = 2**63 - 1
#: A record read from a row (:meth:`RunQueries._record`).
R = TypeVar("R", bound="DataclassInstance")

# A record's fields are its query's columns in order (after the leading column the rows are grouped by, where
# there is one): a row is read into its record by position, each value as its field's type says.
_RUNS = (
    "SELECT r.PIPELINE_RUN_ID, r.STATUS, r.RUN_KEY, r.RUN_DATE, r.START_DATE, r.END_DATE, r.SLA_STATUS, "
    "r.OUTPUT_REVISION, r.TRIGGER_KIND, r.BACKFILL, "
    "p.PIPELINE_ID, p.PIPELINE_CODE, p.PIPELINE_NAME, p.ACTIVE_FLAG, p.SLA_IN_HOURS "
    "FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID "
)
_RECENT_RUNS = (
    _RUNS + "WHERE p.PIPELINE_CODE = ? AND r.PIPELINE_RUN_ID < ? ORDER BY r.PIPELINE_RUN_ID DESC LIMIT ?"
)
#: The r.* columns of :data:`_RUNS` (:class:`RunInfo`'s first fields); the p.* columns after them: a Pipeline.
_RUN_COLUMNS = 10
_RUN_BY_ID = _RUNS + "WHERE r.PIPELINE_RUN_ID = ?"
#: A run key is unique per pipeline, so one Airflow DAG run may be the Engine run of several pipelines.
_RUNS_BY_KEY = _RUNS + "WHERE r.RUN_KEY = ? ORDER BY r.PIPELINE_RUN_ID"
#: Every pipeline code's row (active first, else its newest retired one: the order :data:`Pipeline.BY_CODE` picks).
_PIPELINES = (
    "SELECT PIPELINE_ID, PIPELINE_CODE, PIPELINE_NAME, ACTIVE_FLAG, SLA_IN_HOURS FROM CFG_PIPELINES "
    "ORDER BY PIPELINE_CODE, CASE WHEN ACTIVE_FLAG = 'Y' THEN 0 ELSE 1 END, PIPELINE_ID DESC"
)
#: The newest run of every ``CFG_PIPELINES`` row, read per pipeline through IX_AUD_PIPELINES_RUN_LOG_LATEST
#: (PIPELINE_ID, PIPELINE_RUN_ID DESC): one index probe and one primary-key read per pipeline row, however long
#: the history. A code's newest run is the highest of its rows' (retired rows too), picked in Python.
#: The pipeline is matched as a range of one value, not by ``=``: PostgreSQL then cannot drop PIPELINE_ID from
#: the ORDER BY, so only that index gives the order, and it never walks the primary key backwards through all
#: newer history looking for a pipeline whose last run is old (a retired one). SQLite reads it the same way.
_LATEST_RUNS = (
    "SELECT l.PIPELINE_CODE, r.PIPELINE_RUN_ID, r.STATUS, r.RUN_KEY, r.RUN_DATE, r.START_DATE, r.END_DATE, "
    "r.SLA_STATUS FROM (SELECT p.PIPELINE_CODE, (SELECT r2.PIPELINE_RUN_ID FROM AUD_PIPELINES_RUN_LOG r2 "
    "WHERE r2.PIPELINE_ID >= p.PIPELINE_ID AND r2.PIPELINE_ID <= p.PIPELINE_ID "
    "ORDER BY r2.PIPELINE_ID, r2.PIPELINE_RUN_ID DESC LIMIT 1) AS LATEST_RUN_ID FROM CFG_PIPELINES p) l "
    "JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = l.LATEST_RUN_ID"
)
#: A code's IN-PROGRESS run, else its newest: chosen among few candidates, each read through an index (the
#: newest run of each of the code's rows as in :data:`_LATEST_RUNS`, and the IN-PROGRESS runs through
#: UX_AUD_PIPELINES_RUN_LOG_IN_PROGRESS), never by sorting the pipeline's history. Parameters: the code twice.
_CURRENT_OR_LATEST_RUN = (
    _RUNS  # noqa: S608 - constant text, parameters as placeholders
    + "WHERE r.PIPELINE_RUN_ID IN (SELECT (SELECT r2.PIPELINE_RUN_ID FROM AUD_PIPELINES_RUN_LOG r2 "
    + "WHERE r2.PIPELINE_ID >= p2.PIPELINE_ID AND r2.PIPELINE_ID <= p2.PIPELINE_ID "
    + "ORDER BY r2.PIPELINE_ID, r2.PIPELINE_RUN_ID DESC LIMIT 1) FROM CFG_PIPELINES p2 WHERE p2.PIPELINE_CODE = ? "
    + "UNION ALL SELECT r3.PIPELINE_RUN_ID FROM CFG_PIPELINES p3 JOIN AUD_PIPELINES_RUN_LOG r3 "
    + "ON r3.PIPELINE_ID = p3.PIPELINE_ID AND r3.STATUS = 'IN-PROGRESS' WHERE p3.PIPELINE_CODE = ?) "
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
    "a.ENDED_AT, a.ERROR_MESSAGE, a.QUEUED_AT "
    "FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "
    "JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = tr.PIPELINE_RUN_ID "
    "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID "
    "WHERE p.PIPELINE_CODE = ? AND tr.PIPELINE_RUN_ID BETWEEN ? AND ? "
    "ORDER BY a.TASK_RUN_ID, COALESCE(a.MAP_INDEX, -1), a.ATTEMPT_NUMBER"
)
#: The ``CFG_PIPELINES`` rows of a code (a retired row's runs are the code's history too).
_PIPELINE_ROWS = "SELECT PIPELINE_ID FROM CFG_PIPELINES WHERE PIPELINE_CODE = ?"
#: The newest finished runs of one ``CFG_PIPELINES`` row, read backwards through IX_AUD_PIPELINES_RUN_LOG_LATEST
#: (PIPELINE_ID, PIPELINE_RUN_ID DESC) and stopped at LIMIT: the cost follows the limit, not the history. As in
#: :data:`_LATEST_RUNS`, the row is matched as a range of one value so that only this index gives the order.
#: A finished run has an END_DATE and is not IN-PROGRESS (a reopened run is IN-PROGRESS again); at most one
#: run per pipeline is IN-PROGRESS, so the filter skips at most one index entry. Parameters: the row's id
#: twice, the limit.
_TREND_RUNS = (
    "SELECT r.PIPELINE_RUN_ID, r.STATUS, r.RUN_DATE, r.START_DATE, r.END_DATE, r.SLA_STATUS "
    "FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_ID >= ? AND r.PIPELINE_ID <= ? "
    "AND r.END_DATE IS NOT NULL AND r.STATUS <> 'IN-PROGRESS' "
    "ORDER BY r.PIPELINE_ID, r.PIPELINE_RUN_ID DESC LIMIT ?"
)
#: Gate decisions of the runs in a span, with the gated task and the upstream (pipeline, task) in codes.
_GATE_DECISIONS = (
    "SELECT g.PIPELINE_RUN_ID, g.DECISION_ID, g.ATTEMPT_ID, t.TASK_CODE, up.PIPELINE_CODE, ut.TASK_CODE, "
    "g.RESULT, g.REASON, g.SELECTED_PIPELINE_RUN_ID, g.SELECTED_TASK_RUN_ID, g.SELECTED_REVISION, g.DECIDED_AT "
    "FROM AUD_GATE_DECISIONS g JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = g.PIPELINE_RUN_ID "
    "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID "
    "LEFT JOIN CFG_TASK_DEPENDENCY td ON td.TASK_DEPENDENCY_ID = g.TASK_DEPENDENCY_ID "
    "LEFT JOIN CFG_TASKS t ON t.TASK_ID = td.TASK_ID "
    "LEFT JOIN CFG_TASKS ut ON ut.TASK_ID = td.DEPENDS_ON_TASK_ID "
    "LEFT JOIN CFG_PIPELINE_DEPENDENCY pd ON pd.PIPELINE_DEPENDENCY_ID = g.PIPELINE_DEPENDENCY_ID "
    "LEFT JOIN CFG_PIPELINES up ON up.PIPELINE_ID = COALESCE(td.DEPENDS_ON_PIPELINE_ID, pd.DEPENDS_ON_PIPELINE_ID) "
    "WHERE p.PIPELINE_CODE = ? AND g.PIPELINE_RUN_ID BETWEEN ? AND ? ORDER BY g.DECISION_ID"
)
#: The active value of one ``CFG_TASK_PARAMETERS`` name of a task run's task: the task run by its primary key,
#: the parameter through UX_CFG_TASK_PARAMETERS_ACTIVE_NAME (TASK_ID, PARAMETER_NAME, active rows). Parameters:
#: the parameter name, the task run id.
_INTERVENTIONS = (
    "SELECT i.PIPELINE_RUN_ID, i.INTERVENTION_ID, t.TASK_CODE, i.ACTION, i.FROM_STATUS, i.TO_STATUS, i.REASON, "
    "i.REQUESTED_BY, i.REQUESTED_BY_KIND, i.REQUESTED_AT "
    "FROM AUD_RUN_INTERVENTIONS i JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = i.PIPELINE_RUN_ID "
    "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID LEFT JOIN CFG_TASKS t ON t.TASK_ID = i.TASK_ID "
    "WHERE p.PIPELINE_CODE = ? AND i.PIPELINE_RUN_ID BETWEEN ? AND ? ORDER BY i.INTERVENTION_ID"
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
    #: When the attempt was last parked QUEUED while Airflow rescheduled or deferred its try (None: never).
    #: A QUEUED attempt is parked now; a later status means it was taken over again after that time.
    queued_at: datetime | None = None


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
class GateDecisionInfo:
    """An ``AUD_GATE_DECISIONS`` row: why a gated task (None: the whole run) could or could not start."""

    decision_id: int
    attempt_id: int | None
    task_code: str | None
    depends_on_pipeline_code: str | None
    depends_on_task_code: str | None
    result: str
    reason: str | None
    selected_pipeline_run_id: int | None
    selected_task_run_id: int | None
    selected_revision: int | None
    decided_at: datetime | None


@dataclass(frozen=True)
class InterventionInfo:
    """An ``AUD_RUN_INTERVENTIONS`` row of a run: a manual or orchestrator change and who asked for it."""

    intervention_id: int
    task_code: str | None
    action: str
    from_status: str | None
    to_status: str | None
    reason: str | None
    requested_by: str | None
    requested_by_kind: str | None
    requested_at: datetime | None


@dataclass(frozen=True)
class LatestRun:
    """A pipeline's newest run, as the pipelines overview shows it."""

    pipeline_run_id: int
    status: str
    run_key: str | None
    run_date: date | None
    start_date: datetime | None
    end_date: datetime | None
    sla_status: str | None


@dataclass(frozen=True)
class PipelineSummary:
    """One pipeline code in the overview: its row, its open pause and its newest run."""

    pipeline_id: int
    pipeline_code: str
    pipeline_name: str | None
    active_flag: str
    sla_in_hours: float | None
    pause: Pause | None
    latest_run: LatestRun | None


@dataclass(frozen=True)
class RunInfo:
    """An ``AUD_PIPELINES_RUN_LOG`` row with its task runs (in creation order) and their attempts."""

    pipeline_run_id: int
    status: str
    run_key: str | None
    run_date: date | None
    start_date: datetime | None
    end_date: datetime | None
    sla_status: str | None
    output_revision: int
    trigger_kind: str | None
    backfill: str
    #: How many task runs ended in each status, in :data:`STATUS_ORDER`.
    task_status_counts: dict[str, int] = field(default_factory=dict)
    task_runs: tuple[TaskRunInfo, ...] = ()
    gate_decisions: tuple[GateDecisionInfo, ...] = ()
    interventions: tuple[InterventionInfo, ...] = ()

    def with_details(
        self,
        task_runs: tuple[TaskRunInfo, ...],
        gate_decisions: tuple[GateDecisionInfo, ...],
        interventions: tuple[InterventionInfo, ...],
    ) -> RunInfo:
        return replace(
            self,
            task_runs=task_runs,
            task_status_counts=status_counts(t.status for t in task_runs),
            gate_decisions=gate_decisions,
            interventions=interventions,
        )


@dataclass(frozen=True)
class TrendRun:
    """A finished run as the pipeline page's duration chart shows it."""

    pipeline_run_id: int
    status: str
    run_date: date | None
    start_date: datetime | None
    end_date: datetime | None
    #: END_DATE minus START_DATE in seconds (None without a START_DATE).
    duration_seconds: float | None
    #: MET or BREACHED (judged once, when the run first finished); None without an SLA or for a repaired run.
    sla_status: str | None


@dataclass(frozen=True)
class RunsPage:
    """Runs newest first; ``next_before`` is the ``before`` of the next (older) page, None on the last."""

    runs: list[RunInfo]
    next_before: int | None


def status_counts(statuses: Any) -> dict[str, int]:
    """Statuses counted, in :data:`STATUS_ORDER` (unknown ones last, alphabetically)."""
    counts = Counter(statuses)
    order = {s: i for i, s in enumerate(STATUS_ORDER)}
    return {s: counts[s] for s in sorted(counts, key=lambda s: (order.get(s, len(order)), s))}


def iso_utc(value: datetime) -> str:
    """ISO-8601 UTC text to the millisecond (SQLite keeps milliseconds), e.g. ``2026-07-01T06:00:00.000Z``."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def as_json(value: Any) -> Any:
    """Records (dataclasses, structs) as dicts (field order kept), tuples as lists, datetimes as :func:`iso_utc`
    text, dates as ``YYYY-MM-DD``."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Struct):
        return {name: as_json(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return iso_utc(value)
    if isinstance(value, date):
        return value.isoformat()
    return value


class RunQueries:
    """Read-only queries on one open Engine DB connection; the caller closes it.

    :param engine: the dialect of the Engine DB.
    :param conn: a connection from ``engine.connect()``.
    """

    def __init__(self, engine: EngineDialect, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn
        #: How :meth:`_record` reads a column into a field of each type; a field of another type is an error.
        self._readers: dict[Any, Callable[[Any], Any]] = {
            int: int,
            int | None: _int,
            str: _same,
            str | None: _same,
            datetime | None: engine.from_db_time,
            date | None: engine.from_db_date,
        }
        #: The readers of a record's first columns, by record and number of columns (built once).
        self._plans: dict[tuple[type, int], tuple[Callable[[Any], Any], ...]] = {}

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self.engine.query(self.conn, sql, params)

    def _record(self, cls: type[R], row: Sequence[Any], **given: Any) -> R:
        """A ``cls`` from ``row``, whose columns are ``cls``'s first fields in order, each read as its field's
        type says (:attr:`_readers`); the fields after them are ``given`` or keep their defaults."""
        plan = self._plans.get((cls, len(row)))
        if plan is None:
            kinds = _field_types(cls)[: len(row)]
            plan = self._plans[cls, len(row)] = tuple(self._readers[kind] for kind in kinds)
        return cls(*[read(value) for read, value in zip(plan, row, strict=True)], **given)

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

    def pipelines(self) -> list[PipelineSummary]:
        """Every pipeline code (its active row, else its newest retired one) with open pause and newest run."""
        pauses = {int(row[0]): Pause.from_db(self.engine, row[1:]) for row in self._rows(Pause.ALL_OPEN)}
        latest: dict[str, LatestRun] = {}
        for row in self._rows(_LATEST_RUNS):
            known, run = latest.get(row[0]), self._record(LatestRun, row[1:])
            if known is None or run.pipeline_run_id > known.pipeline_run_id:
                latest[row[0]] = run
        chosen: dict[str, Pipeline] = {}
        for row in self._rows(_PIPELINES):
            chosen.setdefault(row[1], Pipeline.from_db(row))
        return [
            PipelineSummary(
                pipeline_id=p.pipeline_id,
                pipeline_code=p.pipeline_code,
                pipeline_name=p.pipeline_name,
                active_flag=p.active_flag,
                sla_in_hours=p.sla_in_hours,
                pause=pauses.get(p.pipeline_id),
                latest_run=latest.get(p.pipeline_code),
            )
            for p in chosen.values()
        ]

    def current_or_latest_run(self, code: str) -> RunInfo | None:
        """The pipeline's IN-PROGRESS run, else its newest run, with its details (None: no runs)."""
        runs = self._detailed(self._rows(_CURRENT_OR_LATEST_RUN, (code, code)))
        return runs[0][1] if runs else None

    def recent_runs(self, code: str, limit: int, before: int | None = None) -> RunsPage:
        """Up to ``limit`` runs of the pipeline with ids below ``before`` (default: all), newest first."""
        limit = min(limit, MAX_LIMIT - 1)
        bound = MAX_LIMIT if before is None else min(before, MAX_LIMIT)
        rows = self._rows(_RECENT_RUNS, (code, bound, limit + 1))
        runs = [run for _, run in self._detailed(rows[:limit])]
        return RunsPage(runs, runs[-1].pipeline_run_id if len(rows) > limit else None)

    def trend(self, code: str, limit: int) -> list[TrendRun]:
        """The pipeline's ``limit`` newest finished runs, oldest first (its retired rows' runs included).

        One indexed read of at most ``limit`` runs per ``CFG_PIPELINES`` row of the code, merged here.
        """
        t = self.engine.from_db_time
        found: list[TrendRun] = []
        for (pipeline_id,) in self._rows(_PIPELINE_ROWS, (code,)):
            for run_id, status, run_date, start, end, sla in self._rows(
                _TREND_RUNS, (pipeline_id, pipeline_id, limit)
            ):
                started, ended = t(start), t(end)
                duration = None if started is None or ended is None else (ended - started).total_seconds()
                found.append(
                    TrendRun(
                        pipeline_run_id=int(run_id),
                        status=status,
                        run_date=self.engine.from_db_date(run_date),
                        start_date=started,
                        end_date=ended,
                        duration_seconds=duration,
                        sla_status=sla,
                    )
                )
        found.sort(key=lambda run: run.pipeline_run_id)
        return found[-limit:]

    def run(self, pipeline_run_id: int) -> list[tuple[Pipeline, RunInfo]]:
        """The run with this id and its pipeline row (empty: no such run)."""
        return self._detailed(self._rows(_RUN_BY_ID, (pipeline_run_id,)))

    def runs_by_key(self, run_key: str) -> list[tuple[Pipeline, RunInfo]]:
        """The runs with this ``RUN_KEY`` (one per pipeline at most), oldest first, with their pipeline rows."""
        return self._detailed(self._rows(_RUNS_BY_KEY, (run_key,)))

    def _detailed(self, rows: list[tuple[Any, ...]]) -> list[tuple[Pipeline, RunInfo]]:
        """Run rows (:data:`_RUNS` columns) with their pipeline rows, task runs, attempts, gate decisions and
        interventions: four queries per pipeline code over the runs' id range, whatever the number of runs."""
        found = [
            (Pipeline.from_db(row[_RUN_COLUMNS:]), self._record(RunInfo, row[:_RUN_COLUMNS])) for row in rows
        ]
        by_code: dict[str, list[int]] = {}
        for pipeline, run in found:
            by_code.setdefault(pipeline.pipeline_code, []).append(run.pipeline_run_id)
        details: dict[int, RunInfo] = {}
        for code, ids in by_code.items():
            span = (code, min(ids), max(ids))
            tasks = self._task_runs(span)
            gates = self._gate_decisions(span)
            interventions = self._interventions(span)
            for pipeline, run in found:
                if pipeline.pipeline_code == code:
                    details[run.pipeline_run_id] = run.with_details(
                        tuple(tasks.get(run.pipeline_run_id, ())),
                        tuple(gates.get(run.pipeline_run_id, ())),
                        tuple(interventions.get(run.pipeline_run_id, ())),
                    )
        return [(pipeline, details[run.pipeline_run_id]) for pipeline, run in found]

    def _task_runs(self, span: tuple[str, int, int]) -> dict[int, list[TaskRunInfo]]:
        """Task runs (with attempts) of the runs in ``span`` (pipeline code, first and last run id), by run.

        Runs of other pipelines inside the id range are filtered out by code; runs the caller did not ask
        for are never looked up in the result.
        """
        attempts = self._attempts(span)
        tasks: dict[int, list[TaskRunInfo]] = {}
        for row in self._rows(_TASK_RUNS, span):
            done = tuple(attempts.get(int(row[1]), ()))  # row[1]: TASK_RUN_ID
            tasks.setdefault(int(row[0]), []).append(self._record(TaskRunInfo, row[1:], attempts=done))
        return tasks

    def _gate_decisions(self, span: tuple[str, int, int]) -> dict[int, list[GateDecisionInfo]]:
        decisions: dict[int, list[GateDecisionInfo]] = {}
        for row in self._rows(_GATE_DECISIONS, span):
            decisions.setdefault(int(row[0]), []).append(self._record(GateDecisionInfo, row[1:]))
        return decisions

    def _interventions(self, span: tuple[str, int, int]) -> dict[int, list[InterventionInfo]]:
        found: dict[int, list[InterventionInfo]] = {}
        for row in self._rows(_INTERVENTIONS, span):
            found.setdefault(int(row[0]), []).append(self._record(InterventionInfo, row[1:]))
        return found

    def _attempts(self, span: tuple[str, int, int]) -> dict[int, list[AttemptInfo]]:
        """The attempts of the task runs in ``span`` (pipeline code, first and last run id), by task run."""
        attempts: dict[int, list[AttemptInfo]] = {}
        for row in self._rows(_ATTEMPTS, span):
            attempts.setdefault(int(row[0]), []).append(self._record(AttemptInfo, row[1:]))
        return attempts


@functools.cache
def _field_types(cls: type[DataclassInstance]) -> tuple[Any, ...]:
    """The types of ``cls``'s fields, in order (resolved from the annotations)."""
    hints = get_type_hints(cls)
    return tuple(hints[f.name] for f in fields(cls))


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _same(value: Any) -> Any:
    return value
