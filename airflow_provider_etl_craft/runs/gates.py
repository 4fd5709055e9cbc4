"""Dependencies and run conditions (docs/gates.md): what a gate sees upstream, and what it decides.

A *gate* is the set of dependency edges in front of a pipeline run (``CFG_PIPELINE_DEPENDENCY``, judged
at claim) or a task (``CFG_TASK_DEPENDENCY`` plus the task's run condition, judged when it starts).

* Same-pipeline task edges look at the upstream task's row in the current run (or, before it has one,
  at Airflow's state of that task).
* Pipeline edges and cross-pipeline task edges look at the upstream pipeline's **latest finished,
  non-backfill run**, and count it only when it is newer than what the edge last consumed: a higher
  run id, or the same run at a higher ``OUTPUT_REVISION`` when ``CONSUME_REPAIRS='Y'``.
* An upstream run still IN-PROGRESS makes the edge WAIT; nothing is written while a gate waits.

Every decided edge is written to ``AUD_GATE_DECISIONS``; consumption rows are written from the
SATISFIED decisions only when the downstream run (pipeline edges) or attempt (task edges) succeeds.
The truth table (:func:`judge_status`) and the run conditions (:func:`combine`) are pure functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from msgspec import Struct

from airflow_provider_etl_craft.engine.dbapi import Cursor
from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
from airflow_provider_etl_craft.runs.counts import clean_text
from airflow_provider_etl_craft.runs.vocabulary import (
    ENDED_RUN_SQL,
    DependencyType,
    GateResult,
    RunCondition,
    RunStatus,
    TaskRunStatus,
)

SATISFIED, UNSATISFIED, WAIT = GateResult.SATISFIED, GateResult.UNSATISFIED, GateResult.WAIT
#: Airflow task states after which a same-pipeline upstream will not record a row any more, and the
#: status the gate reads them as (a task Airflow never ran counts as SKIPPED, as the finish records it).
AIRFLOW_FINISHED = {
    "failed": TaskRunStatus.FAILED,
    "upstream_failed": TaskRunStatus.SKIPPED,
    "skipped": TaskRunStatus.SKIPPED,
    "removed": TaskRunStatus.SKIPPED,
    "success": TaskRunStatus.SKIPPED,
}
#: Asks Airflow for the state of same-pipeline upstream tasks, by task code (None: no state yet).
UpstreamStates = Callable[[Sequence[str]], Mapping[str, str | None]]


#: Per edge kind (constant SQL texts; the dependency column is the only difference).
_LAST_CONSUMED = {
    kind: f"SELECT CONSUMED_PIPELINE_RUN_ID, CONSUMED_REVISION FROM AUD_DEPENDENCY_CONSUMPTION WHERE {column} = ? "  # noqa: S608
    "ORDER BY CONSUMPTION_ID DESC LIMIT 1"
    for kind, column in (("pipeline", "PIPELINE_DEPENDENCY_ID"), ("task", "TASK_DEPENDENCY_ID"))
}
_RECORD_DECISION = {
    kind: f"INSERT INTO AUD_GATE_DECISIONS (PIPELINE_RUN_ID, ATTEMPT_ID, {column}, SELECTED_PIPELINE_RUN_ID, "  # noqa: S608
    "SELECTED_TASK_RUN_ID, SELECTED_REVISION, RESULT, REASON, DECIDED_AT) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    for kind, column in (("pipeline", "PIPELINE_DEPENDENCY_ID"), ("task", "TASK_DEPENDENCY_ID"))
}


class GateWaiting(Exception):  # noqa: N818 - an outcome, not an error
    """The gate cannot decide yet (an upstream is IN-PROGRESS, or the pipeline is paused); nothing was written.

    Raised by a task's start, which otherwise returns an attempt handle; a claim reports the same situations as
    ``ClaimOutcome.action`` WAITING / SKIPPED instead (see :class:`~.records.ClaimOutcome` for why).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class GateSkipped(Exception):  # noqa: N818 - an outcome, not an error
    """The gate decided UNSATISFIED (or the pipeline is paused at claim); the run or task was recorded SKIPPED."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Edge(Struct, frozen=True, kw_only=True):
    """One active dependency row."""

    kind: str  # "pipeline" or "task"
    dependency_id: int
    dependency_type: str
    consume_repairs: bool
    upstream_pipeline_id: int
    upstream_pipeline_code: str
    upstream_task_id: int | None = None
    upstream_task_code: str | None = None
    same_pipeline: bool = False

    def describe(self) -> str:
        what = self.upstream_pipeline_code + (
            f".{self.upstream_task_code}" if self.upstream_task_code else ""
        )
        return f"{self.dependency_type} on {what}"


class Observed(Struct, frozen=True):
    """The upstream state an edge is judged on; ``status`` None means nothing (new) has finished."""

    status: str | None
    what: str
    pipeline_run_id: int | None = None
    task_run_id: int | None = None
    revision: int | None = None
    rows_written: int | None = None


class EdgeVerdict(Struct, frozen=True):
    edge: Edge
    result: GateResult
    reason: str
    observed: Observed


class GateVerdict(Struct, frozen=True):
    """The gate's decision; ``decided`` holds the edges to record (those still waiting are left out)."""

    result: GateResult
    reason: str
    decided: tuple[EdgeVerdict, ...]
    waiting: tuple[EdgeVerdict, ...]


def judge_status(dependency_type: str, status: str | None, rows_written: int | None) -> GateResult:
    """The truth table of docs/gates.md for one edge and one observed upstream status."""
    if status is None:
        return UNSATISFIED
    if status == RunStatus.IN_PROGRESS:
        return WAIT
    if dependency_type == DependencyType.ALWAYS:
        return SATISFIED
    if dependency_type == DependencyType.SUCCESS:
        return SATISFIED if status == RunStatus.SUCCESS else UNSATISFIED
    if dependency_type == DependencyType.HAS_DATA:
        return SATISFIED if status == RunStatus.SUCCESS and (rows_written or 0) >= 1 else UNSATISFIED
    if dependency_type == DependencyType.FAILURE:
        return SATISFIED if status == RunStatus.FAILED else UNSATISFIED
    raise ValueError(f"unknown DEPENDENCY_TYPE {dependency_type!r}")


def combine(
    verdicts: Sequence[EdgeVerdict], condition: str | None = None, count: int | None = None
) -> GateVerdict:
    """Apply a run condition (``ALL`` by default, ``ANY``, ``N`` with ``count``) over the edges' verdicts.

    Decides as early as the decided edges allow: ``ALL`` fails on the first UNSATISFIED edge even while
    others wait; ``ANY`` passes on the first SATISFIED; ``N`` passes at ``count`` satisfied edges and fails
    once too few can still be satisfied.
    """
    condition = condition or RunCondition.ALL
    satisfied = [v for v in verdicts if v.result == SATISFIED]
    unsatisfied = [v for v in verdicts if v.result == UNSATISFIED]
    waiting = tuple(v for v in verdicts if v.result == WAIT)
    decided = tuple(v for v in verdicts if v.result != WAIT)
    if condition not in set(RunCondition):
        raise ValueError(f"unknown RUN_CONDITION {condition!r}")
    need = {RunCondition.ALL: len(verdicts), RunCondition.ANY: 1}.get(RunCondition(condition), count or 1)
    label = str(condition) if condition != RunCondition.N else f"N={count}"
    if len(satisfied) >= need:
        return GateVerdict(
            SATISFIED,
            f"{label}: {len(satisfied)} of {len(verdicts)} dependencies satisfied",
            decided,
            waiting,
        )
    if len(satisfied) + len(waiting) < need:
        why = "; ".join(v.reason for v in unsatisfied)
        return GateVerdict(
            UNSATISFIED,
            f"{label}: {len(satisfied)} of {len(verdicts)} dependencies satisfied, {need} needed ({why})",
            decided,
            waiting,
        )
    why = "; ".join(v.reason for v in waiting)
    return GateVerdict(WAIT, f"{label}: not decided yet ({why})", decided, waiting)


class Gates:
    """Reads dependencies and upstream state, records decisions and consumption, on the caller's cursor."""

    def __init__(self, engine: EngineDialect) -> None:
        self.engine = engine

    def _rows(self, cur: Cursor, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        cur.execute(self.engine.sql(sql), params)
        return list(cur.fetchall())

    # -- what the edges are ------------------------------------------------------------------------------

    def pipeline_edges(self, cur: Cursor, pipeline_id: int) -> list[Edge]:
        return [
            Edge(
                kind="pipeline",
                dependency_id=int(r[0]),
                dependency_type=r[1],
                consume_repairs=r[2] == "Y",
                upstream_pipeline_id=int(r[3]),
                upstream_pipeline_code=r[4],
            )
            for r in self._rows(
                cur,
                "SELECT d.PIPELINE_DEPENDENCY_ID, d.DEPENDENCY_TYPE, d.CONSUME_REPAIRS, d.DEPENDS_ON_PIPELINE_ID, "
                "up.PIPELINE_CODE FROM CFG_PIPELINE_DEPENDENCY d JOIN CFG_PIPELINES up ON up.PIPELINE_ID = "
                "d.DEPENDS_ON_PIPELINE_ID WHERE d.PIPELINE_ID = ? AND d.ACTIVE_FLAG = 'Y' ORDER BY d.PIPELINE_DEPENDENCY_ID",
                (pipeline_id,),
            )
        ]

    def task_edges(self, cur: Cursor, pipeline_id: int, task_id: int) -> list[Edge]:
        return [
            Edge(
                kind="task",
                dependency_id=int(r[0]),
                dependency_type=r[1],
                consume_repairs=r[2] == "Y",
                upstream_pipeline_id=int(r[3]),
                upstream_pipeline_code=r[4],
                upstream_task_id=int(r[5]),
                upstream_task_code=r[6],
                same_pipeline=int(r[3]) == pipeline_id,
            )
            for r in self._rows(
                cur,
                "SELECT d.TASK_DEPENDENCY_ID, d.DEPENDENCY_TYPE, d.CONSUME_REPAIRS, d.DEPENDS_ON_PIPELINE_ID, "
                "up.PIPELINE_CODE, d.DEPENDS_ON_TASK_ID, ut.TASK_CODE FROM CFG_TASK_DEPENDENCY d "
                "JOIN CFG_PIPELINES up ON up.PIPELINE_ID = d.DEPENDS_ON_PIPELINE_ID "
                "JOIN CFG_TASKS ut ON ut.TASK_ID = d.DEPENDS_ON_TASK_ID "
                "WHERE d.TASK_ID = ? AND d.ACTIVE_FLAG = 'Y' ORDER BY d.TASK_DEPENDENCY_ID",
                (task_id,),
            )
        ]

    def active_tasks(self, cur: Cursor, pipeline_id: int) -> list[tuple[str, bool]]:
        """The pipeline's active task codes, each with whether it is *lenient*: its gate may pass although an
        upstream failed or was skipped (a FAILURE or ALWAYS dependency, or an ANY / N run condition), so
        Airflow must be told to start it anyway (a trigger rule other than ``all_success``)."""
        return [
            (r[0], bool(r[1]))
            for r in self._rows(
                cur,
                "SELECT t.TASK_CODE, CASE WHEN t.RUN_CONDITION IN ('ANY', 'N') OR EXISTS (SELECT 1 FROM "
                "CFG_TASK_DEPENDENCY d WHERE d.TASK_ID = t.TASK_ID AND d.ACTIVE_FLAG = 'Y' AND d.DEPENDENCY_TYPE IN "
                "('FAILURE', 'ALWAYS')) THEN 1 ELSE 0 END FROM CFG_TASKS t WHERE t.PIPELINE_ID = ? AND t.ACTIVE_FLAG = 'Y'",
                (pipeline_id,),
            )
        ]

    # -- what the edges see ------------------------------------------------------------------------------

    def observe_latest(self, cur: Cursor, edge: Edge) -> Observed:
        """The upstream pipeline's latest finished non-backfill run, if newer than the edge's last consumption."""
        up = edge.upstream_pipeline_code
        running = self._running(cur, edge)
        if running is not None:
            return running
        latest = self._rows(
            cur,
            "SELECT r.PIPELINE_RUN_ID, r.STATUS, r.OUTPUT_REVISION, (SELECT SUM(tr.ROWS_WRITTEN) FROM AUD_TASK_RUN_LOG tr "  # noqa: S608 - constant SQL
            "WHERE tr.PIPELINE_RUN_ID = r.PIPELINE_RUN_ID) FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_ID = ? "
            f"AND r.BACKFILL = 'N' AND r.STATUS IN {ENDED_RUN_SQL} "
            "ORDER BY r.PIPELINE_RUN_ID DESC LIMIT 1",
            (edge.upstream_pipeline_id,),
        )
        if not latest:
            return Observed(None, f"no finished run of {up} yet")
        run_id, status, revision, rows = int(latest[0][0]), latest[0][1], int(latest[0][2]), latest[0][3]
        stale = self._consumed_already(cur, edge, run_id, revision)
        if stale is not None:
            return stale
        task_run_id = None
        if edge.kind == "task":
            row = self._rows(
                cur,
                "SELECT TASK_RUN_ID, STATUS, ROWS_WRITTEN FROM AUD_TASK_RUN_LOG WHERE TASK_ID = ? AND "
                "PIPELINE_RUN_ID = ?",
                (edge.upstream_task_id, run_id),
            )
            # A task with no row in a finished run was never run in it: the finish would record it SKIPPED.
            task_run_id, status, rows = (
                (int(row[0][0]), row[0][1], row[0][2]) if row else (None, TaskRunStatus.SKIPPED, None)
            )
        what = f"run {run_id} of {up}" + (f" task {edge.upstream_task_code}" if edge.kind == "task" else "")
        return Observed(
            status=status,
            what=f"{what} ({status}, revision {revision}, {int(rows or 0)} rows written)",
            pipeline_run_id=run_id,
            task_run_id=task_run_id,
            revision=revision,
            rows_written=None if rows is None else int(rows),
        )

    def _running(self, cur: Cursor, edge: Edge) -> Observed | None:
        """The upstream pipeline's IN-PROGRESS non-backfill run, if any (the edge waits for it)."""
        running = self._rows(
            cur,
            "SELECT PIPELINE_RUN_ID, RUN_KEY FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_ID = ? AND BACKFILL = 'N' "
            "AND STATUS = 'IN-PROGRESS'",
            (edge.upstream_pipeline_id,),
        )
        if not running:
            return None
        run_id, key = running[0]
        where = f"run {run_id} of {edge.upstream_pipeline_code}"
        return Observed(
            RunStatus.IN_PROGRESS, f"{where} ({key or 'started outside Airflow'}, IN-PROGRESS)", int(run_id)
        )

    def _consumed_already(self, cur: Cursor, edge: Edge, run_id: int, revision: int) -> Observed | None:
        """The upstream's latest finished run (and revision) was consumed by this edge already: nothing new."""
        consumed = self._rows(cur, _LAST_CONSUMED[edge.kind], (edge.dependency_id,))
        if not consumed:
            return None
        # Revisions are compared within one run only (a run's first is 1, or 0 for runs recorded before ENGINE
        # 0004); a row without one (the provider always writes it) is taken as that run at its current revision.
        c_run, c_rev = int(consumed[0][0]), revision if consumed[0][1] is None else int(consumed[0][1])
        if run_id > c_run or (run_id == c_run and edge.consume_repairs and revision > c_rev):
            return None
        repairs = "" if edge.consume_repairs else ", repairs not consumed (CONSUME_REPAIRS='N')"
        return Observed(
            None,
            f"nothing new from {edge.upstream_pipeline_code}: its latest finished run {run_id} (revision "
            f"{revision}) was consumed already{repairs}",
        )

    def observe_same_run(
        self, cur: Cursor, edge: Edge, pipeline_run_id: int, airflow_states: UpstreamStates | None
    ) -> Observed:
        """The upstream task's row in the current run; before it has one, Airflow's state of that task."""
        code = edge.upstream_task_code or ""
        row = self._rows(
            cur,
            "SELECT TASK_RUN_ID, STATUS, ROWS_WRITTEN FROM AUD_TASK_RUN_LOG WHERE TASK_ID = ? AND PIPELINE_RUN_ID = ?",
            (edge.upstream_task_id, pipeline_run_id),
        )
        if row:
            task_run_id, status, rows = int(row[0][0]), row[0][1], row[0][2]
            return Observed(
                status=status,
                what=f"task {code} of this run ({status}, {int(rows or 0)} rows written)",
                pipeline_run_id=pipeline_run_id,
                task_run_id=task_run_id,
                revision=None,
                rows_written=None if rows is None else int(rows),
            )
        state = (airflow_states([code]) if airflow_states else {}).get(code)
        if state in AIRFLOW_FINISHED:
            status = AIRFLOW_FINISHED[state]
            return Observed(
                status, f"task {code} of this run (not recorded; Airflow state {state})", pipeline_run_id
            )
        return Observed(
            TaskRunStatus.IN_PROGRESS,
            f"task {code} of this run (not started yet; Airflow state {state or 'none'})",
            pipeline_run_id,
        )

    def judge(
        self,
        edges: Sequence[Edge],
        observe: Callable[[Edge], Observed],
        condition: str | None = None,
        count: int | None = None,
    ) -> GateVerdict:
        verdicts = []
        for edge in edges:
            seen = observe(edge)
            result = judge_status(edge.dependency_type, seen.status, seen.rows_written)
            verb = {SATISFIED: "satisfied by", UNSATISFIED: "not satisfied by", WAIT: "waiting for"}[result]
            verdicts.append(EdgeVerdict(edge, result, f"{edge.describe()} {verb} {seen.what}", seen))
        return combine(verdicts, condition, count)

    # -- what is written ---------------------------------------------------------------------------------

    def record(
        self, cur: Cursor, verdict: GateVerdict, *, pipeline_run_id: int, attempt_id: int | None, now_db: Any
    ) -> None:
        """One ``AUD_GATE_DECISIONS`` row per decided edge."""
        for v in verdict.decided:
            cur.execute(
                self.engine.sql(_RECORD_DECISION[v.edge.kind]),
                (
                    pipeline_run_id,
                    attempt_id,
                    v.edge.dependency_id,
                    v.observed.pipeline_run_id,
                    v.observed.task_run_id,
                    v.observed.revision,
                    v.result,
                    clean_text(v.reason),
                    now_db,
                ),
            )

    def consume_run(self, cur: Cursor, pipeline_run_id: int, now_db: Any) -> None:
        """A run that succeeded consumes the upstream runs its SATISFIED pipeline-edge decisions selected."""
        cur.execute(
            self.engine.sql(
                "INSERT INTO AUD_DEPENDENCY_CONSUMPTION (PIPELINE_DEPENDENCY_ID, PIPELINE_ID, PIPELINE_RUN_ID, "
                "DEPENDS_ON_PIPELINE_ID, CONSUMED_PIPELINE_RUN_ID, CONSUMED_AT, CONSUMED_REVISION) "
                "SELECT g.PIPELINE_DEPENDENCY_ID, d.PIPELINE_ID, g.PIPELINE_RUN_ID, d.DEPENDS_ON_PIPELINE_ID, "
                "g.SELECTED_PIPELINE_RUN_ID, ?, g.SELECTED_REVISION FROM AUD_GATE_DECISIONS g "
                "JOIN CFG_PIPELINE_DEPENDENCY d ON d.PIPELINE_DEPENDENCY_ID = g.PIPELINE_DEPENDENCY_ID "
                "WHERE g.PIPELINE_RUN_ID = ? AND g.RESULT = 'SATISFIED' AND g.SELECTED_PIPELINE_RUN_ID IS NOT NULL "
                "AND NOT EXISTS (SELECT 1 FROM AUD_DEPENDENCY_CONSUMPTION c WHERE c.PIPELINE_DEPENDENCY_ID = "
                "g.PIPELINE_DEPENDENCY_ID AND c.PIPELINE_RUN_ID = g.PIPELINE_RUN_ID)"
            ),
            (now_db, pipeline_run_id),
        )

    def consume_attempt(self, cur: Cursor, attempt_id: int, now_db: Any) -> None:
        """An attempt that succeeded consumes what its SATISFIED cross-pipeline task-edge decisions selected."""
        cur.execute(
            self.engine.sql(
                "INSERT INTO AUD_DEPENDENCY_CONSUMPTION (TASK_DEPENDENCY_ID, PIPELINE_ID, PIPELINE_RUN_ID, TASK_ID, "
                "DEPENDS_ON_PIPELINE_ID, CONSUMED_PIPELINE_RUN_ID, CONSUMED_TASK_RUN_ID, CONSUMED_AT, CONSUMED_REVISION) "
                "SELECT g.TASK_DEPENDENCY_ID, d.PIPELINE_ID, g.PIPELINE_RUN_ID, d.TASK_ID, d.DEPENDS_ON_PIPELINE_ID, "
                "g.SELECTED_PIPELINE_RUN_ID, g.SELECTED_TASK_RUN_ID, ?, g.SELECTED_REVISION FROM AUD_GATE_DECISIONS g "
                "JOIN CFG_TASK_DEPENDENCY d ON d.TASK_DEPENDENCY_ID = g.TASK_DEPENDENCY_ID "
                "WHERE g.ATTEMPT_ID = ? AND g.RESULT = 'SATISFIED' AND d.DEPENDS_ON_PIPELINE_ID <> d.PIPELINE_ID "
                "AND g.SELECTED_PIPELINE_RUN_ID IS NOT NULL"
            ),
            (now_db, attempt_id),
        )
