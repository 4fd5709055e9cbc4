"""Claim a pipeline run for a DAG run, and close a run whose driver is gone (docs/lifecycle.md, *Runs*).

The claim's rule is :class:`Claim`. Its common cases (a new run, a resume, a block) also have a server-side
form on PostgreSQL, one round trip: the function ``ETL_CRAFT_CLAIM`` of ENGINE migration
``sql/postgresql/migrations/0003_claim_finish_functions.sql``, replaced by ``0004_cfg_semantics.sql`` (migrations
are immutable: a change is a new migration). :data:`CLAIM_FUNCTION` declares its arguments (:class:`ClaimCall`);
``tests/integration/test_claim_finish_at_once.py`` plays the same scenarios with and without it and compares
every outcome and every ``AUD_`` row.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any, NamedTuple

from airflow_provider_etl_craft.engine.dbapi import Cursor, Row
from airflow_provider_etl_craft.engine.dialects.base import ServerFunction
from airflow_provider_etl_craft.engine.locks import pipeline_lock
from airflow_provider_etl_craft.engine.schema import current_marks, require_current
from airflow_provider_etl_craft.errors import MetadataError
from airflow_provider_etl_craft.runs import events
from airflow_provider_etl_craft.runs.counts import clean_text
from airflow_provider_etl_craft.runs.gates import SATISFIED, WAIT
from airflow_provider_etl_craft.runs.graph import refuse_invalid
from airflow_provider_etl_craft.runs.identity import RunIdentity
from airflow_provider_etl_craft.runs.records import ClaimOutcome, RunRow
from airflow_provider_etl_craft.runs.transition import Transition
from airflow_provider_etl_craft.runs.vocabulary import (
    LIVE_SQL,
    ClaimAction,
    InterventionAction,
    OneCallAnswer,
    RunStatus,
)

#: The keyed run and any IN-PROGRESS run of the pipeline; parameters: PIPELINE_ID, RUN_KEY, PIPELINE_ID. Two
#: index probes (UX_AUD_PIPELINES_RUN_LOG_RUN_KEY, UX_AUD_PIPELINES_RUN_LOG_IN_PROGRESS): written as one ``OR``,
#: SQLite read every run of the pipeline, so a claim grew with the pipeline's history.
_CANDIDATES = (
    f"SELECT {RunRow.COLUMNS} FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_ID = ? AND r.RUN_KEY = ? "  # noqa: S608
    f"UNION SELECT {RunRow.COLUMNS} FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_ID = ? "
    f"AND r.STATUS = '{RunStatus.IN_PROGRESS.value}' ORDER BY PIPELINE_RUN_ID"
)
#: One run of a pipeline, row-locked; parameters: PIPELINE_RUN_ID, PIPELINE_CODE.
_RUN_OF_PIPELINE = (
    f"SELECT {RunRow.COLUMNS} FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p "  # noqa: S608 - constant
    "ON p.PIPELINE_ID = r.PIPELINE_ID WHERE r.PIPELINE_RUN_ID = ? AND p.PIPELINE_CODE = ? FOR UPDATE"
)


#: ``ETL_CRAFT_CLAIM`` (see the module docstring): the types of :class:`ClaimCall`'s fields, in order.
CLAIM_FUNCTION = ServerFunction(
    "ETL_CRAFT_CLAIM",
    ("TEXT[]", "TEXT[]", "TEXT", "TEXT[]", "TEXT", "TIMESTAMPTZ", "TIMESTAMPTZ", "TEXT", "TEXT", "TEXT"),
)


class ClaimCall(NamedTuple):
    """The arguments of :data:`CLAIM_FUNCTION` (after the lock the dialect passes), in its order."""

    #: ENGINE versions and Engine tables of a current schema (``engine.schema.current_marks``).
    versions: list[str]
    tables: list[str]
    pipeline_code: str
    #: The DAG's task codes, sorted (None: not checked).
    task_codes: list[str] | None
    run_key: str
    #: The caller's time; the function records the later of it and the database's clock once it holds the lock.
    now: Any
    #: The logical date as a timestamp (the function stores its UTC date, ENGINE 0004).
    run_date: Any
    backfill: str
    actor: str | None
    actor_kind: str | None


class _Answer(NamedTuple):
    """The row of :data:`CLAIM_FUNCTION`: an action (CREATED, RESUMED, BLOCKED, or FULL: nothing written), the
    lenient task codes, then the run's ``RunRow`` columns (the blocking run for BLOCKED; only its id otherwise)."""

    action: str
    lenient: tuple[str, ...]
    run: tuple[Any, ...]

    @classmethod
    def from_db(cls, row: Row) -> _Answer:
        return cls(row[0], tuple(sorted(row[1] or ())), tuple(row[2:]))


class Claim(Transition):
    """Bind a DAG run to its Engine run, under the ``pipeline:<code>`` lock.

    Repeatable after a lost session: a run its first send created is RESUMED by the run key; one it
    recorded SKIPPED is known by its START_DATE, the time the step wrote.
    """

    repeatable = True

    def __call__(
        self,
        pipeline_code: str,
        identity: RunIdentity,
        task_codes: Collection[str] | None = None,
        where: str = "the DAG",
    ) -> ClaimOutcome:
        """Claim the Engine run of ``identity`` under the ``pipeline:<code>`` lock.

        Resumes the keyed run if IN-PROGRESS, reports BLOCKED while another run of the pipeline is
        IN-PROGRESS, reopens the keyed run if it ended (REOPEN intervention, REPAIR_PENDING='Y'), else
        inserts a new IN-PROGRESS run. Where the dialect has a one-call form (PostgreSQL), a new run, a
        resume and a block take one round trip; the rest falls back to the transaction.

        First the pipeline's dependency graph is read (one statement, :mod:`~.graph`); a graph that cannot
        run is refused at once with its first problem's error, before anything is written or waited for.

        :param task_codes: when given, must equal the pipeline's active task codes (METADATA otherwise).
        :raises GraphError: the graph is invalid (SELF_DEPENDENCY, DEPENDENCY_CYCLE, UNKNOWN_TASK subclasses).
        :raises MetadataError: the pipeline is not active, the task codes differ, or a dependency is on a
            retired task or pipeline.
        :raises LockTimeoutError: the pipeline lock was busy for ``lock_timeout`` seconds.
        :raises EngineDBError: the Engine tables are missing, partial or not migrated to this release.
        """
        try:
            self._refuse_invalid_graph(pipeline_code)
            answer = self._at_once(pipeline_code, identity, task_codes)
            if answer is not None and answer.action != OneCallAnswer.DECIDE_IN_TRANSACTION:
                return self._answered(answer)
            if answer is None:  # the one call did not find the schema current (or could not ask)
                require_current(self.engine, self.conn)
            with self.locked(pipeline_code) as cur:
                pipeline_id = self.active_pipeline(cur, pipeline_code)
                lenient = (
                    ()
                    if task_codes is None
                    else self._lenient(cur, pipeline_id, pipeline_code, task_codes=task_codes, where=where)
                )
                outcome = self._claim_run(cur, pipeline_id, pipeline_code, identity)
        except self.engine.integrity_error() as exc:
            raise self.conflict(exc, f"claiming {identity.run_key} for {pipeline_code}") from None
        if lenient and outcome.action in (ClaimAction.CREATED, ClaimAction.REOPENED, ClaimAction.RESUMED):
            return ClaimOutcome(
                outcome.action, outcome.pipeline_run_id, reason=outcome.reason, lenient_tasks=lenient
            )
        return outcome

    def _refuse_invalid_graph(self, pipeline_code: str) -> None:
        """Raise the first problem of the pipeline's graph (see :func:`~.graph.refuse_invalid`).

        The statement reads only ``CFG_`` tables; when it fails, an Engine schema that is not current is named
        first (as the rest of the claim would), else the database's error is raised.
        """
        try:
            refuse_invalid(self.engine, self.conn, pipeline_code)
            return
        except self.engine.database_error() as exc:
            failed = exc
        # Outside the handler, so a schema verdict does not carry the driver's error as its context (a
        # traceback of "relation … does not exist" in the task log for what is a "run init-db" message).
        require_current(self.engine, self.conn)
        raise failed

    def _at_once(
        self, pipeline_code: str, identity: RunIdentity, task_codes: Collection[str] | None
    ) -> _Answer | None:
        """The one-call claim (:data:`CLAIM_FUNCTION`, where the dialect has it), which writes only what this
        class would write: a new IN-PROGRESS run when nothing needs judging. Its answer says CREATED, RESUMED or
        BLOCKED; FULL (nothing written, the schema is current) leaves the case to the transaction; None
        (nothing written) leaves the schema check to it too."""
        versions, tables = current_marks(self.engine.name)
        call = ClaimCall(
            versions=versions,
            tables=tables,
            pipeline_code=pipeline_code,
            task_codes=None if task_codes is None else sorted(set(task_codes)),
            run_key=identity.run_key,
            now=self.now()[1],
            run_date=None if identity.run_date is None else self.engine.to_db_time(identity.run_date),
            backfill="Y" if identity.backfill else "N",
            actor=identity.actor,
            actor_kind=identity.actor_kind,
        )
        began = time.monotonic()
        row = self.engine.call_at_once(
            self.conn, CLAIM_FUNCTION, call, lock=pipeline_lock(pipeline_code), lock_timeout=self.lock_timeout
        )
        if row is None or row[0] == OneCallAnswer.SCHEMA_NOT_CURRENT:
            return None
        answer = _Answer.from_db(row)
        if answer.action != OneCallAnswer.DECIDE_IN_TRANSACTION:  # decided under the lock the function took
            self.report_lock_wait(pipeline_code, time.monotonic() - began, "one_call")
        return answer

    def _answered(self, answer: _Answer) -> ClaimOutcome:
        """The outcome of a claim the one call decided."""
        if answer.action == ClaimAction.BLOCKED:
            return ClaimOutcome(ClaimAction.BLOCKED, blocking=self.run_row(answer.run))
        return ClaimOutcome(ClaimAction(answer.action), int(answer.run[0]), lenient_tasks=answer.lenient)

    def _lenient(
        self, cur: Cursor, pipeline_id: int, code: str, *, task_codes: Collection[str], where: str
    ) -> tuple[str, ...]:
        """Compare the DAG's task codes with the active ``CFG_TASKS``; return the lenient ones (one query).

        :raises MetadataError: the codes differ.
        """
        rows = self.gates.active_tasks(cur, pipeline_id)
        active = {r[0] for r in rows}
        unknown, missing = sorted(set(task_codes) - active), sorted(active - set(task_codes))
        parts = []
        if unknown:
            parts.append(
                f"{where} records task codes that are not active tasks of {code}: {', '.join(unknown)}"
            )
        if missing:
            parts.append(f"active CFG_TASKS of {code} that {where} does not run: {', '.join(missing)}")
        if parts:
            raise MetadataError(
                "; ".join(parts)
                + "; make the DAG's task codes and CFG_TASKS agree (add, rename or retire tasks "
                "through a project migration, or set task_code= on the DAG's tasks)"
            )
        return tuple(sorted(c for c, lenient in rows if lenient))

    def _claim_run(self, cur: Cursor, pipeline_id: int, code: str, identity: RunIdentity) -> ClaimOutcome:
        rows = [
            self.run_row(r)
            for r in self.exec(cur, _CANDIDATES, (pipeline_id, identity.run_key, pipeline_id)).fetchall()
        ]
        mine = next((r for r in rows if r.run_key == identity.run_key), None)
        if mine is not None and mine.status == RunStatus.IN_PROGRESS:
            return ClaimOutcome(ClaimAction.RESUMED, mine.pipeline_run_id)
        if mine is not None and self.repeating and self.stamped(mine.start_date):
            return ClaimOutcome(
                ClaimAction.SKIPPED,
                mine.pipeline_run_id,
                reason=f"{mine.describe()} was recorded by this claim before its reply was lost",
            )
        blocking = next((r for r in rows if r.status == RunStatus.IN_PROGRESS), None)
        if blocking is not None:
            return ClaimOutcome(ClaimAction.BLOCKED, blocking=blocking)
        pause = self.open_pause(cur, pipeline_id)
        if pause is not None:
            reason = pause.describe(code)
            if mine is not None:  # a cleared DAG run of an ended run: left as it is while paused
                return ClaimOutcome(ClaimAction.SKIPPED, mine.pipeline_run_id, reason=reason)
            run_id = self._insert_run(
                cur,
                pipeline_id,
                identity,
                RunStatus.SKIPPED,
                ended_by=(pause.paused_by, pause.paused_by_kind),
            )
            return ClaimOutcome(ClaimAction.SKIPPED, run_id, reason=reason)
        if mine is not None:
            cleared = f"Airflow DAG run {identity.run_id} of {identity.dag_id} ran again (cleared)"
            self.reopen(cur, mine, identity, cleared)
            return ClaimOutcome(ClaimAction.REOPENED, mine.pipeline_run_id)
        return self._judged_insert(cur, pipeline_id, code, identity)

    def _judged_insert(self, cur: Cursor, pipeline_id: int, code: str, identity: RunIdentity) -> ClaimOutcome:
        """A new run, IN-PROGRESS or SKIPPED as the pipeline's dependencies decide (nothing while they wait)."""
        edges = self.gates.pipeline_edges(cur, pipeline_id)
        if not edges:
            run_id = self._insert_run(cur, pipeline_id, identity, RunStatus.IN_PROGRESS)
            return ClaimOutcome(ClaimAction.CREATED, run_id)
        verdict = self.gates.judge(edges, lambda edge: self.gates.observe_latest(cur, edge))
        events.report(events.GATE, pipeline=code, task=None, result=verdict.result)
        if verdict.result == WAIT:
            return ClaimOutcome(ClaimAction.WAITING, reason=f"pipeline {code}: {verdict.reason}")
        status = RunStatus.IN_PROGRESS if verdict.result == SATISFIED else RunStatus.SKIPPED
        run_id = self._insert_run(
            cur, pipeline_id, identity, status, ended_by=(identity.actor, identity.actor_kind)
        )
        self.gates.record(cur, verdict, pipeline_run_id=run_id, attempt_id=None, now_db=self.now()[1])
        action = ClaimAction.CREATED if status == RunStatus.IN_PROGRESS else ClaimAction.SKIPPED
        return ClaimOutcome(action, run_id, reason=f"pipeline {code}: {verdict.reason}")

    def _insert_run(
        self,
        cur: Cursor,
        pipeline_id: int,
        identity: RunIdentity,
        status: RunStatus,
        *,
        ended_by: tuple[str | None, str | None] | None = None,
    ) -> int:
        """Insert the keyed run IN-PROGRESS, or already ended (SKIPPED) with ``ended_by`` (actor, kind)."""
        now_db = self.wrote_at = self.now()[1]
        run_date = None if identity.run_date is None else self.engine.to_db_date(identity.run_date)
        end, by, kind = (
            (now_db, *ended_by) if status != RunStatus.IN_PROGRESS and ended_by else (None, None, None)
        )
        run_id = self.returning(
            cur,
            "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, START_DATE, END_DATE, STATUS, RUN_DATE, BACKFILL, "
            "RUN_KEY, TRIGGER_KIND, OWNER_ID, STARTED_BY, STARTED_BY_KIND, ENDED_BY, ENDED_BY_KIND) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, 'ORCHESTRATOR', ?, ?, ?, ?, ?) RETURNING PIPELINE_RUN_ID",
            (
                pipeline_id,
                now_db,
                end,
                status,
                run_date,
                "Y" if identity.backfill else "N",
                identity.run_key,
                identity.run_key,
                identity.actor,
                identity.actor_kind,
                by,
                kind,
            ),
        )
        return int(run_id)


class Abandon(Transition):
    """Close an IN-PROGRESS run whose driver is gone as CANCELLED (CANCEL intervention; attempts LOST)."""

    def __call__(self, pipeline_code: str, pipeline_run_id: int, identity: RunIdentity, reason: str) -> bool:
        """Close an IN-PROGRESS run whose driver is gone as CANCELLED (CANCEL intervention; attempts LOST).

        :return: False when the run was no longer IN-PROGRESS (someone else closed it first).
        """
        with self.locked(pipeline_code) as cur:
            row = self.exec(cur, _RUN_OF_PIPELINE, (pipeline_run_id, pipeline_code)).fetchone()
            run = None if row is None else self.run_row(row)
            if run is None or run.status != RunStatus.IN_PROGRESS:
                return False
            now_db = self.now()[1]
            note = clean_text(f"abandoned: {reason}")
            self.exec(
                cur,
                "UPDATE AUD_TASK_ATTEMPTS SET STATUS = 'LOST', ENDED_AT = ?, ERROR_MESSAGE = ? "  # noqa: S608 - constant SQL
                f"WHERE STATUS IN {LIVE_SQL} "
                "AND TASK_RUN_ID IN (SELECT TASK_RUN_ID FROM AUD_TASK_RUN_LOG WHERE PIPELINE_RUN_ID = ?)",
                (now_db, note, pipeline_run_id),
            )
            self.exec(
                cur,
                "UPDATE AUD_TASK_RUN_LOG SET STATUS = 'CANCELLED', END_DATE = ?, ERROR_MESSAGE = ? "
                "WHERE PIPELINE_RUN_ID = ? AND STATUS = 'IN-PROGRESS'",
                (now_db, note, pipeline_run_id),
            )
            self.exec(
                cur,
                "UPDATE AUD_PIPELINES_RUN_LOG SET STATUS = 'CANCELLED', END_DATE = ?, ENDED_BY = ?, "
                "ENDED_BY_KIND = ?, REPAIR_PENDING = 'N' WHERE PIPELINE_RUN_ID = ?",
                (now_db, identity.actor, identity.actor_kind, pipeline_run_id),
            )
            self.intervention(
                cur,
                run,
                InterventionAction.CANCEL,
                (RunStatus.IN_PROGRESS, RunStatus.CANCELLED),
                reason=f"abandoned: {reason}",
                identity=identity,
            )
            self.announce(cur, run.pipeline_id)
            return True
