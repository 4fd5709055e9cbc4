"""End a pipeline run once Airflow is done with its tasks (docs/lifecycle.md, *Runs*).

Where "finish a run" is decided: :class:`FinishRun` (the final status, the SLA, tasks Airflow never ran, marks
by hand, lost attempts). Its common case (every task recorded, nothing live, nothing marked by hand) also has a
server-side form on PostgreSQL, one round trip: the function ``ETL_CRAFT_FINISH`` of ENGINE migration
``sql/postgresql/migrations/0003_claim_finish_functions.sql`` (migrations are immutable: a change is a new
migration and a new function name). :data:`FINISH_FUNCTION` declares its arguments (:class:`FinishCall`);
``tests/integration/test_claim_finish_at_once.py`` plays the same scenarios with and without it and compares
every outcome and every ``AUD_`` row.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, NamedTuple

from msgspec.structs import replace

from airflow_provider_etl_craft.engine.dbapi import Connection, Cursor
from airflow_provider_etl_craft.engine.dialects.base import EngineDialect, ServerFunction
from airflow_provider_etl_craft.engine.locks import pipeline_lock
from airflow_provider_etl_craft.engine.schema import current_marks
from airflow_provider_etl_craft.errors import RunStateError
from airflow_provider_etl_craft.runs.attempts import settle_mapped
from airflow_provider_etl_craft.runs.identity import RunIdentity
from airflow_provider_etl_craft.runs.mapped import AIRFLOW_FAILED, IndexAttempt
from airflow_provider_etl_craft.runs.records import ALERT_HANDLER, FinishOutcome, RunRow
from airflow_provider_etl_craft.runs.transition import Transition
from airflow_provider_etl_craft.runs.vocabulary import (
    FAILING_TASK,
    LIVE_SQL,
    AttemptStatus,
    InterventionAction,
    OneCallAnswer,
    RunStatus,
    SlaStatus,
    TaskRunStatus,
)

#: The keyed run with its SLA, row-locked; parameters: pipeline code, run key.
#: ``CROSS JOIN`` fixes the join order on SQLite (the pipeline rows first, then the run through
#: UX_AUD_PIPELINES_RUN_LOG_RUN_KEY): with a plain JOIN, SQLite's planner walked the whole run table backwards
#: to spare itself the sort, so the finish grew with history (docs/benchmarks.md, part 7). PostgreSQL plans a
#: CROSS JOIN with a join condition as the inner join it is.
_KEYED_RUN = (
    f"SELECT {RunRow.COLUMNS}, r.SLA_STATUS, p.SLA_IN_HOURS FROM CFG_PIPELINES p "  # noqa: S608 - constant
    "CROSS JOIN AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_ID = p.PIPELINE_ID AND p.PIPELINE_CODE = ? "
    "AND r.RUN_KEY = ? ORDER BY r.PIPELINE_RUN_ID DESC FOR UPDATE"
)
#: A run's start and end; parameter: pipeline run id.
_RUN_TIMES = "SELECT START_DATE, END_DATE FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = ?"
#: Every task of the run's pipeline with its task run, if any; parameters: pipeline run id, pipeline id.
_TASKS_OF_RUN = (
    "SELECT t.TASK_ID, t.TASK_CODE, t.HANDLER, tr.TASK_RUN_ID, tr.STATUS FROM CFG_TASKS t "
    "LEFT JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_ID = t.TASK_ID AND tr.PIPELINE_RUN_ID = ? "
    "WHERE t.PIPELINE_ID = ? AND (t.ACTIVE_FLAG = 'Y' OR tr.TASK_RUN_ID IS NOT NULL)"
)


#: ``ETL_CRAFT_FINISH`` (see the module docstring): the types of :class:`FinishCall`'s fields, in order.
FINISH_FUNCTION = ServerFunction(
    "ETL_CRAFT_FINISH", ("TEXT[]", "TEXT[]", "TEXT", "TEXT", "JSONB", "TEXT[]", "TIMESTAMPTZ", "TEXT", "TEXT")
)


class FinishCall(NamedTuple):
    """The arguments of :data:`FINISH_FUNCTION` (after the lock the dialect passes), in its order."""

    #: ENGINE versions and Engine tables of a current schema (``engine.schema.current_marks``).
    versions: list[str]
    tables: list[str]
    pipeline_code: str
    run_key: str
    #: Airflow's task states by code, a JSON object.
    airflow_states: str
    #: The codes whose failure decides nothing, sorted.
    not_deciding: list[str]
    #: The caller's time; the function records the later of it and the database's clock once it holds the lock.
    now: Any
    actor: str | None
    actor_kind: str | None


class _Answer(NamedTuple):
    """The row of :data:`FINISH_FUNCTION`: FINISHED, or ENDED (it had ended already, nothing written); the
    run's id, status and SLA status, and the codes of its failed or cancelled task runs."""

    action: str
    pipeline_run_id: int
    status: str
    sla_status: str | None
    failed: tuple[str, ...]

    @classmethod
    def from_db(cls, row: Any) -> _Answer:
        action, run_id, status, sla_status, failed = row
        return cls(
            action=action,
            pipeline_run_id=int(run_id),
            status=status,
            sla_status=sla_status,
            failed=tuple(failed or ()),
        )


class FinishRun(Transition):
    """End the keyed run under the pipeline lock, in one transaction, as Airflow saw its tasks.

    Repeatable after a lost session: a run already ended is reported with its recorded status; one that ended
    since the step began is taken for the step's own end (not ``already_ended``).
    """

    repeatable = True

    def __call__(
        self,
        pipeline_code: str,
        identity: RunIdentity,
        airflow_states: Mapping[str, str | None],
        map_states: Mapping[str, Mapping[int, str | None]] | None = None,
        *,
        not_deciding: Collection[str] = (),
    ) -> FinishOutcome:
        """End the keyed run (docs/lifecycle.md, *Runs*), under the pipeline lock, in one transaction.

        Finish runs once every task of the pipeline is done in Airflow (a teardown, ``all_done``), so no
        attempt Airflow still runs, reschedules or defers can be closed here.

        :param airflow_states: Airflow's state of each of the DAG's tasks of this pipeline, by task code;
            a code without a task-run row is recorded SKIPPED (FAILED when Airflow says it failed, SUCCESS
            with a MARK intervention when it was marked success by hand).
        :param map_states: for mapped tasks, Airflow's state of each map index, by task code.
        :param not_deciding: task codes whose failure does not fail the run, as Airflow's own rule for the
            DAG run says (teardown tasks without ``on_failure_fail_dagrun``), like ``EMAIL_ALERT`` tasks.
        :raises RunStateError: no run with this key.
        """
        if not map_states and not self.repeating:  # a repeat reads the run's END_DATE (below)
            done = self._at_once(pipeline_code, identity, airflow_states, not_deciding)
            if done is not None:
                return done
        with self.locked(pipeline_code) as cur:
            row = self.exec(cur, _KEYED_RUN, (pipeline_code, identity.run_key)).fetchone()
            if row is None:
                raise RunStateError(
                    f"no Engine run of pipeline {pipeline_code} has the run key {identity.run_key}, so there is "
                    "nothing to finish; the claim task failed or did not run (see its log)"
                )
            run, sla_status, sla_hours = self.run_row(row[: RunRow.WIDTH]), *row[RunRow.WIDTH :]
            if run.status != RunStatus.IN_PROGRESS:
                # Ended since this step began: by its first send, whose reply was lost (the end's time is the
                # server's or the step's, whichever is later, so the time alone cannot prove it).
                mine = self.repeating and run.end_date is not None and run.end_date >= self.began
                return FinishOutcome(
                    run.pipeline_run_id, run.status, already_ended=not mine, sla_status=sla_status
                )
            now, now_db = self.now()
            lost = self._close_lost(cur, run.pipeline_run_id, now_db)
            statuses, skipped = self._task_statuses(
                cur, run, identity, airflow_states=airflow_states, map_states=map_states or {}, now_db=now_db
            )
            final = _final_status(statuses, frozenset(not_deciding))
            sla = sla_status or _sla(run, sla_hours, now)
            self._close_run(
                cur, run, final, new_sla=None if sla_status else sla, identity=identity, now_db=now_db
            )
            self.announce(cur, run.pipeline_id)
        failed = sorted(c for c, _, s in statuses if s in FAILING_TASK)
        outcome = FinishOutcome(run.pipeline_run_id, final, skipped=_sorted(skipped), lost=_sorted(lost))
        duration = None if run.start_date is None else (now - run.start_date).total_seconds()
        return replace(outcome, failed=_sorted(failed), sla_status=sla, duration=duration)

    def _at_once(
        self,
        pipeline_code: str,
        identity: RunIdentity,
        airflow_states: Mapping[str, str | None],
        not_deciding: Collection[str],
    ) -> FinishOutcome | None:
        """The one-call finish (:data:`FINISH_FUNCTION`, where the dialect has it) when nothing needs recording
        but the run's end: every task of the DAG has a task run Airflow's state does not overrule, and no attempt
        is live. It writes what this class would write. None: nothing written, the transaction decides.
        """
        # ETL_CRAFT_FINISH sends the change notice itself, as the transaction form's announce() does.
        versions, tables = current_marks(self.engine.name)
        call = FinishCall(
            versions=versions,
            tables=tables,
            pipeline_code=pipeline_code,
            run_key=identity.run_key,
            airflow_states=json.dumps(dict(airflow_states)),
            not_deciding=sorted(set(not_deciding)),
            now=self.now()[1],
            actor=identity.actor,
            actor_kind=identity.actor_kind,
        )
        began = time.monotonic()
        row = self.engine.call_at_once(
            self.conn,
            FINISH_FUNCTION,
            call,
            lock=pipeline_lock(pipeline_code),
            lock_timeout=self.lock_timeout,
        )
        if row is None or row[0] in (OneCallAnswer.SCHEMA_NOT_CURRENT, OneCallAnswer.DECIDE_IN_TRANSACTION):
            return None
        self.report_lock_wait(pipeline_code, time.monotonic() - began, "one_call")
        answer = _Answer.from_db(row)
        status = RunStatus(answer.status)
        if answer.action == OneCallAnswer.ENDED:
            return FinishOutcome(
                answer.pipeline_run_id, status, already_ended=True, sla_status=answer.sla_status
            )
        return FinishOutcome(
            answer.pipeline_run_id, status, failed=_sorted(list(answer.failed)), sla_status=answer.sla_status
        )

    def _close_run(
        self,
        cur: Cursor,
        run: RunRow,
        final: RunStatus,
        *,
        new_sla: str | None,
        identity: RunIdentity,
        now_db: Any,
    ) -> None:
        """Write the run's end (a repair raises OUTPUT_REVISION) and, on SUCCESS, what it consumed."""
        revision = run.output_revision + (1 if run.repair_pending == "Y" else 0)
        self.exec(
            cur,
            "UPDATE AUD_PIPELINES_RUN_LOG SET STATUS = ?, END_DATE = ?, ENDED_BY = ?, ENDED_BY_KIND = ?, "
            "SLA_STATUS = COALESCE(SLA_STATUS, ?), OUTPUT_REVISION = ?, REPAIR_PENDING = 'N' "
            "WHERE PIPELINE_RUN_ID = ?",
            (final, now_db, identity.actor, identity.actor_kind, new_sla, revision, run.pipeline_run_id),
        )
        if final == RunStatus.SUCCESS:
            self.gates.consume_run(cur, run.pipeline_run_id, now_db)

    def _task_statuses(
        self,
        cur: Cursor,
        run: RunRow,
        identity: RunIdentity,
        *,
        airflow_states: Mapping[str, str | None],
        map_states: Mapping[str, Mapping[int, str | None]],
        now_db: Any,
    ) -> tuple[list[tuple[str, str, str]], list[str]]:
        """Settle every task of the DAG: ``(code, handler, status)`` of each, and the codes recorded SKIPPED
        because Airflow never ran them."""
        statuses: list[tuple[str, str, str]] = []
        skipped: list[str] = []
        for task_id, task_code, handler, task_run_id, status in self.exec(
            cur, _TASKS_OF_RUN, (run.pipeline_run_id, run.pipeline_id)
        ).fetchall():
            if task_code in map_states and (task_run_id is not None or map_states[task_code]):
                indexes = map_states[task_code]
                task_run_id = task_run_id or self._insert_task_run(cur, task_id, run.pipeline_run_id, now_db)
                status = settle_mapped(
                    self,
                    cur,
                    task_run_id,
                    map_count=len(indexes),
                    now_db=now_db,
                    airflow_only=_unrecorded(indexes),
                )
            elif task_run_id is None:
                if task_code not in airflow_states:
                    continue  # active in CFG_TASKS but not part of this DAG
                state = airflow_states[task_code]
                status = self._record_unrun(cur, run, task_id, state=state, identity=identity, now_db=now_db)
                if status == TaskRunStatus.SKIPPED:
                    skipped.append(task_code)
            else:
                state = airflow_states.get(task_code)
                status = self._follow_mark(
                    cur,
                    run,
                    (task_id, task_run_id),
                    status=status,
                    state=state,
                    identity=identity,
                    now_db=now_db,
                )
            statuses.append((task_code, handler, status))
        return statuses, skipped

    def _close_lost(self, cur: Cursor, pipeline_run_id: int, now_db: Any) -> list[str]:
        """Close attempts a killed worker left live as LOST, their task runs FAILED; returns the task codes."""
        lost = self.exec(
            cur,
            "UPDATE AUD_TASK_ATTEMPTS SET STATUS = 'LOST', ENDED_AT = ?, ERROR_MESSAGE = ? "  # noqa: S608 - constant SQL
            f"WHERE STATUS IN {LIVE_SQL} "
            "AND TASK_RUN_ID IN (SELECT TASK_RUN_ID FROM AUD_TASK_RUN_LOG WHERE PIPELINE_RUN_ID = ?) "
            "RETURNING TASK_RUN_ID",
            (
                now_db,
                "lost: the attempt was still live when the DAG run finished (its worker ended without "
                "recording, or the task was marked by hand while it ran)",
                pipeline_run_id,
            ),
        ).fetchall()
        if not lost:
            return []
        failed = self.exec(
            cur,
            "UPDATE AUD_TASK_RUN_LOG SET STATUS = 'FAILED', END_DATE = ?, ERROR_MESSAGE = ? "
            "WHERE PIPELINE_RUN_ID = ? AND STATUS = 'IN-PROGRESS' RETURNING "
            "(SELECT TASK_CODE FROM CFG_TASKS t WHERE t.TASK_ID = AUD_TASK_RUN_LOG.TASK_ID)",
            (now_db, "failed: its attempt was lost (the worker ended without recording)", pipeline_run_id),
        ).fetchall()
        return [r[0] for r in failed]

    def _insert_task_run(self, cur: Cursor, task_id: int, pipeline_run_id: int, now_db: Any) -> int:
        task_run_id = self.returning(
            cur,
            "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, START_DATE, STATUS, ATTEMPT_COUNT) "
            "VALUES (?, ?, ?, 'IN-PROGRESS', 0) RETURNING TASK_RUN_ID",
            (task_id, pipeline_run_id, now_db),
        )
        return int(task_run_id)

    def _record_unrun(
        self, cur: Cursor, run: RunRow, task_id: int, *, state: str | None, identity: RunIdentity, now_db: Any
    ) -> TaskRunStatus:
        """A task of the DAG that recorded no attempt: recorded as Airflow saw it; returns its status."""
        if state == "success":
            status, why = (
                TaskRunStatus.SUCCESS,
                "marked success in Airflow without running here (no attempt recorded)",
            )
        elif state in AIRFLOW_FAILED:
            status, why = (
                TaskRunStatus.FAILED,
                f"failed in Airflow before it recorded an attempt (Airflow state: {state})",
            )
        else:
            status, why = TaskRunStatus.SKIPPED, f"not run by Airflow (Airflow state: {state or 'none'})"
        self.exec(
            cur,
            "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, START_DATE, END_DATE, STATUS, ATTEMPT_COUNT, "
            "ERROR_MESSAGE, TASK_LOG) VALUES (?, ?, ?, ?, ?, 0, ?, ?)",
            (
                task_id,
                run.pipeline_run_id,
                now_db,
                now_db,
                status,
                why if status == TaskRunStatus.FAILED else None,
                why,
            ),
        )
        if status == TaskRunStatus.SUCCESS:
            mark = (None, status)
            self.intervention(
                cur, run, InterventionAction.MARK, mark, reason=why, identity=identity, task_id=task_id
            )
        return status

    def _follow_mark(
        self,
        cur: Cursor,
        run: RunRow,
        task: tuple[int, int],
        *,
        status: str,
        state: str | None,
        identity: RunIdentity,
        now_db: Any,
    ) -> str:
        """Follow a task marked success or failed by hand in Airflow: the task run takes Airflow's outcome
        and a MARK intervention records the change. ``task`` is (task id, task run id); returns the status."""
        if state == "success" and status not in (TaskRunStatus.SUCCESS, TaskRunStatus.IN_PROGRESS):
            to_status = TaskRunStatus.SUCCESS
        elif state == "failed" and status == TaskRunStatus.SUCCESS:
            to_status = TaskRunStatus.FAILED
        else:
            return status
        reason = (
            f"marked {state} in Airflow (by hand in the UI or API) while the Engine DB had {status}; recorded "
            "as Airflow says"
        )
        self.exec(
            cur,
            "UPDATE AUD_TASK_RUN_LOG SET STATUS = ?, END_DATE = COALESCE(END_DATE, ?), ERROR_MESSAGE = ?, "
            "TASK_LOG = ? WHERE TASK_RUN_ID = ?",
            (to_status, now_db, reason if to_status == TaskRunStatus.FAILED else None, reason, task[1]),
        )
        self.intervention(
            cur,
            run,
            InterventionAction.MARK,
            (status, to_status),
            reason=reason,
            identity=identity,
            task_id=task[0],
        )
        return to_status


def _sorted(codes: list[str]) -> tuple[str, ...]:
    return tuple(sorted(codes))


def _final_status(statuses: list[tuple[str, str, str]], not_deciding: frozenset[str]) -> RunStatus:
    """FAILED when a data task that decides the run failed; SKIPPED when every task skipped; else SUCCESS."""
    if any(h != ALERT_HANDLER and c not in not_deciding and s in FAILING_TASK for c, h, s in statuses):
        return RunStatus.FAILED
    if all(s == TaskRunStatus.SKIPPED for _, _, s in statuses):
        return RunStatus.SKIPPED
    return RunStatus.SUCCESS


def _sla(run: RunRow, sla_hours: Any, now: datetime) -> SlaStatus | None:
    """MET or BREACHED for a first (not repaired) run of a pipeline with an SLA; None otherwise."""
    if run.repair_pending != "N" or sla_hours is None or run.start_date is None:
        return None
    hours = (now - run.start_date).total_seconds() / 3600
    return SlaStatus.MET if hours <= float(sla_hours) else SlaStatus.BREACHED


def _unrecorded(states: Mapping[int, str | None]) -> dict[int, IndexAttempt]:
    """Airflow's map indexes as attempts, for those that recorded none (their recorded attempts win)."""
    found: dict[int, IndexAttempt] = {}
    for index, state in states.items():
        if state == "success":
            found[index] = IndexAttempt(AttemptStatus.SUCCESS)
        elif state in AIRFLOW_FAILED:
            found[index] = IndexAttempt(
                AttemptStatus.FAILED, error=f"failed in Airflow before it recorded an attempt ({state})"
            )
        else:
            found[index] = IndexAttempt(AttemptStatus.CANCELLED, skipped=True)
    return found


def run_duration(engine: EngineDialect, conn: Connection, pipeline_run_id: int) -> float | None:
    """The run's START_DATE to END_DATE in seconds, read back (PostgreSQL's one-call finish returns no dates,
    and stays one round trip; the caller asks only when it needs the value). None when the run has no end yet
    or the read fails: it must never fail a finish already committed."""
    try:
        rows = engine.execute(conn, _RUN_TIMES, (pipeline_run_id,)).rows  # one statement, schema scoped
    except engine.database_error():
        return None
    if not rows:
        return None
    row = rows[0]
    started, ended = engine.from_db_time(row[0]), engine.from_db_time(row[1])
    return None if started is None or ended is None else (ended - started).total_seconds()
