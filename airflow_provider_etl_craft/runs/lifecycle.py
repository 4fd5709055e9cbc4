"""The run lifecycle (SPEC §9) in one place: claim, reopen, abandon, task attempts and finish.

Operators and the CLI both call :class:`RunLifecycle`; it holds no Airflow imports. Every state change is
one Engine DB transaction, and the schema's unique indexes (one IN-PROGRESS run per pipeline, one task-run
row per task and run, one live attempt per task run) are the last word on races: a lost race surfaces
as :class:`StaleTransitionError`, never as a duplicate row.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
from airflow_provider_etl_craft.engine.locks import pipeline_lock
from airflow_provider_etl_craft.engine.schema import require_current
from airflow_provider_etl_craft.errors import MetadataError, RunStateError, StaleTransitionError
from airflow_provider_etl_craft.runs.counts import TaskCounts, clean_text
from airflow_provider_etl_craft.runs.gates import (
    SATISFIED,
    UNSATISFIED,
    WAIT,
    Edge,
    Gates,
    GateSkipped,
    GateWaiting,
    Observed,
    UpstreamStates,
)
from airflow_provider_etl_craft.runs.identity import RunIdentity
from airflow_provider_etl_craft.runs.mapped import AIRFLOW_FAILED, IndexAttempt, settle
from airflow_provider_etl_craft.settings import OPTIONS

#: Seconds to wait for the ``pipeline:<code>`` lock before a retryable LOCK_TIMEOUT (``[etl_craft] lock_timeout``).
DEFAULT_LOCK_TIMEOUT = float(OPTIONS["lock_timeout"].default)
LIVE_ATTEMPT = ("QUEUED", "CLAIMED", "RUNNING")
#: Task-run statuses that make a run FAILED when held by a data task (not an EMAIL_ALERT one).
FAILING_TASK = ("FAILED", "CANCELLED")
ALERT_HANDLER = "EMAIL_ALERT"
#: How an attempt can end → (the attempt's status, its task run's status). The task-run table has no
#: TIMED_OUT; a skip (``AirflowSkipException``, a gate) is a CANCELLED attempt of a SKIPPED task run.
ATTEMPT_ENDS = {
    "SUCCESS": ("SUCCESS", "SUCCESS"),
    "FAILED": ("FAILED", "FAILED"),
    "TIMED_OUT": ("TIMED_OUT", "FAILED"),
    "CANCELLED": ("CANCELLED", "CANCELLED"),
    "SKIPPED": ("CANCELLED", "SKIPPED"),
}
#: TASK_LOG of an attempt that ended because its task skipped (how a mapped task run tells it from a kill).
SKIP_NOTE = "skipped: "

#: The run columns :meth:`RunLifecycle._run_row` reads, in order (written out in each statement):
#: r.PIPELINE_RUN_ID, r.PIPELINE_ID, r.STATUS, r.RUN_KEY, r.START_DATE, r.END_DATE, r.REPAIR_PENDING, r.OUTPUT_REVISION


#: Start an attempt in one statement when nothing needs judging: the keyed run is IN-PROGRESS (its row
#: share-locked, as the transaction path does), the task has no dependencies, the pipeline is not paused
#: and no earlier attempt is live. Otherwise nothing is written and the transaction path decides.
START_ATTEMPT_ONE_STATEMENT = (
    "WITH info AS (SELECT t.TASK_ID, r.PIPELINE_RUN_ID FROM CFG_PIPELINES p "
    "JOIN CFG_TASKS t ON t.PIPELINE_ID = p.PIPELINE_ID AND t.TASK_CODE = ? AND t.ACTIVE_FLAG = 'Y' "
    "JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_ID = p.PIPELINE_ID AND r.RUN_KEY = ? "
    "WHERE p.PIPELINE_CODE = ? AND p.ACTIVE_FLAG = 'Y' AND r.STATUS = 'IN-PROGRESS' "
    "AND NOT EXISTS (SELECT 1 FROM CFG_TASK_DEPENDENCY d WHERE d.TASK_ID = t.TASK_ID AND d.ACTIVE_FLAG = 'Y') "
    "AND NOT EXISTS (SELECT 1 FROM AUD_PIPELINE_PAUSES pp WHERE pp.PIPELINE_ID = p.PIPELINE_ID AND pp.RESUMED_AT IS NULL) "
    "AND NOT EXISTS (SELECT 1 FROM AUD_TASK_RUN_LOG ltr JOIN AUD_TASK_ATTEMPTS la ON la.TASK_RUN_ID = ltr.TASK_RUN_ID "
    "WHERE ltr.TASK_ID = t.TASK_ID AND ltr.PIPELINE_RUN_ID = r.PIPELINE_RUN_ID AND la.STATUS IN ('QUEUED', 'CLAIMED', 'RUNNING')) "
    "FOR SHARE OF r), "
    "tr AS (INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, START_DATE, STATUS, ATTEMPT_COUNT) "
    "SELECT TASK_ID, PIPELINE_RUN_ID, ?, 'IN-PROGRESS', 1 FROM info ON CONFLICT (TASK_ID, PIPELINE_RUN_ID) DO UPDATE SET "
    "STATUS = 'IN-PROGRESS', END_DATE = NULL, ERROR_MESSAGE = NULL, ATTEMPT_COUNT = AUD_TASK_RUN_LOG.ATTEMPT_COUNT + 1 "
    "RETURNING TASK_RUN_ID, PIPELINE_RUN_ID) "
    "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, STATUS, OWNER_ID, CLAIMED_AT, STARTED_AT, HEARTBEAT_AT, "
    "HOST, PID, LOG_PATH, REQUESTED_BY, REQUESTED_BY_KIND) "
    "SELECT TASK_RUN_ID, ?, 'RUNNING', ?, ?, ?, ?, ?, ?, ?, ?, ? FROM tr "
    "RETURNING ATTEMPT_ID, TASK_RUN_ID, (SELECT PIPELINE_RUN_ID FROM tr)"
)  # fmt: skip
#: The attempt ``a`` of one try of a task (and map index) in the keyed run, found by pipeline code, task
#: code, run key, attempt number and ``COALESCE(MAP_INDEX, -1)`` (in that order of parameters).
ATTEMPT_OF_KEYED_TRY = (
    "FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "
    "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = tr.PIPELINE_RUN_ID "
    "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ? AND t.TASK_CODE = ? "
    "AND r.RUN_KEY = ? AND a.ATTEMPT_NUMBER = ? AND COALESCE(a.MAP_INDEX, -1) = ? "
)
#: End an attempt and copy it to its task run in one statement (no consumption to write).
FINISH_ATTEMPT_ONE_STATEMENT = (
    "WITH a AS (UPDATE AUD_TASK_ATTEMPTS SET STATUS = ?, ENDED_AT = ?, HEARTBEAT_AT = ?, SOURCE_COUNT = ?, "
    "TARGET_COUNT = ?, INSERT_COUNT = ?, UPDATE_COUNT = ?, DELETE_COUNT = ?, ROWS_WRITTEN = ?, ERROR_MESSAGE = ? "
    "WHERE ATTEMPT_ID = ? AND OWNER_ID = ? AND STATUS IN ('QUEUED', 'CLAIMED', 'RUNNING') RETURNING TASK_RUN_ID) "
    "UPDATE AUD_TASK_RUN_LOG SET STATUS = ?, END_DATE = ?, SOURCE_COUNT = ?, TARGET_COUNT = ?, INSERT_COUNT = ?, "
    "UPDATE_COUNT = ?, DELETE_COUNT = ?, ROWS_WRITTEN = ?, ERROR_MESSAGE = ? WHERE TASK_RUN_ID IN (SELECT TASK_RUN_ID FROM a)"
)  # fmt: skip


@dataclass(frozen=True)
class RunRow:
    """The columns of an ``AUD_PIPELINES_RUN_LOG`` row the lifecycle decides on."""

    pipeline_run_id: int
    pipeline_id: int
    status: str
    run_key: str | None
    start_date: datetime | None
    end_date: datetime | None
    repair_pending: str
    output_revision: int

    def describe(self) -> str:
        since = f" since {self.start_date:%Y-%m-%d %H:%M:%S}Z" if self.start_date else ""
        return (
            f"run {self.pipeline_run_id} ({self.run_key or 'started outside Airflow'}, {self.status}{since})"
        )


@dataclass(frozen=True)
class ClaimOutcome:
    """What a claim did.

    ``action``: CREATED, RESUMED (retry of the claim), REOPENED (a cleared DAG run), BLOCKED (another run of
    the pipeline is IN-PROGRESS: ``blocking``), WAITING (a pipeline dependency's upstream is IN-PROGRESS;
    nothing written) or SKIPPED (the pipeline is paused, or its dependencies are not satisfied: the run
    is recorded SKIPPED). ``reason`` explains WAITING and SKIPPED.
    """

    action: str
    pipeline_run_id: int | None = None
    blocking: RunRow | None = None
    reason: str | None = None
    #: CREATED/REOPENED/RESUMED: task codes that need a lenient trigger rule (see ``Gates.lenient_tasks``).
    lenient_tasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pause:
    """An open ``AUD_PIPELINE_PAUSES`` row."""

    pause_id: int
    paused_at: datetime | None
    paused_by: str | None
    paused_by_kind: str | None
    reason: str | None

    def describe(self, code: str) -> str:
        since = f" since {self.paused_at:%Y-%m-%d %H:%M:%S}Z" if self.paused_at else ""
        return f"pipeline {code} is paused by {self.paused_by or 'someone'}{since}: {self.reason or 'no reason given'}"


@dataclass(frozen=True)
class AttemptHandle:
    """The live attempt a task try writes to; ``owner_id`` proves it is still this try's row at the end."""

    pipeline_run_id: int
    task_run_id: int
    attempt_id: int
    attempt_number: int
    owner_id: str
    task_code: str
    #: Whether a success consumes upstream runs (SATISFIED cross-pipeline task-dependency decisions).
    consumes: bool = False
    #: The Airflow map index of a mapped task's instance (None: an unmapped task).
    map_index: int | None = None


@dataclass(frozen=True)
class FinishOutcome:
    pipeline_run_id: int
    status: str
    already_ended: bool = False
    skipped: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    failed: tuple[str, ...] = field(default=())
    sla_status: str | None = None


class RunLifecycle:
    """Engine-side bookkeeping of pipeline runs on one open connection (autocommit; transactions explicit).

    :param engine: the dialect of the Engine DB.
    :param conn: a connection from ``engine.connect()``; the caller closes it.
    :param lock_timeout: seconds to wait for ``pipeline:<code>`` locks.
    """

    def __init__(
        self, engine: EngineDialect, conn: Any, lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> None:
        self.engine = engine
        self.conn = conn
        self.lock_timeout = lock_timeout
        self.gates = Gates(engine)

    # -- helpers ---------------------------------------------------------------------------------------

    def _locked(self, pipeline_code: str) -> AbstractContextManager[Any]:
        """A write transaction holding the ``pipeline:<code>`` lock, released by its COMMIT or ROLLBACK."""
        return self.engine.transaction(
            self.conn, lock=pipeline_lock(pipeline_code), lock_timeout=self.lock_timeout
        )

    def _exec(self, cur: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
        cur.execute(self.engine.sql(sql), params)
        return cur

    def _now(self) -> tuple[datetime, Any]:
        now = self.engine.now()
        return now, self.engine.to_db_time(now)

    def _run_row(self, row: tuple[Any, ...]) -> RunRow:
        t = self.engine.from_db_time
        return RunRow(int(row[0]), int(row[1]), row[2], row[3], t(row[4]), t(row[5]), row[6], int(row[7]))

    def _active_pipeline(self, cur: Any, code: str) -> tuple[int, float | None]:
        row = self._exec(
            cur, "SELECT PIPELINE_ID, SLA_IN_HOURS FROM CFG_PIPELINES WHERE PIPELINE_CODE = ? AND ACTIVE_FLAG = 'Y'",
            (code,),
        ).fetchone()  # fmt: skip
        if row is None:
            retired = self._exec(
                cur, "SELECT COUNT(*) FROM CFG_PIPELINES WHERE PIPELINE_CODE = ?", (code,)
            ).fetchone()
            state = "is retired (ACTIVE_FLAG='N')" if retired[0] else "does not exist"
            raise MetadataError(
                f"pipeline {code} {state} in CFG_PIPELINES of the Engine DB {self.engine.describe()}; add or "
                "re-activate it through a project migration, or fix pipeline_code"
            )
        return int(row[0]), (None if row[1] is None else float(row[1]))

    def _check_task_codes(self, cur: Any, pipeline_id: int, code: str, task_codes: Collection[str],
                          where: str) -> tuple[str, ...]:  # fmt: skip
        """Compare the DAG's task codes with the active ``CFG_TASKS``; return the lenient ones (one query)."""
        rows = self.gates.active_tasks(cur, pipeline_id)
        active = {r[0] for r in rows}
        unknown, missing = sorted(set(task_codes) - active), sorted(active - set(task_codes))
        if unknown or missing:
            parts = []
            if unknown:
                parts.append(
                    f"{where} records task codes that are not active tasks of {code}: {', '.join(unknown)}"
                )
            if missing:
                parts.append(f"active CFG_TASKS of {code} that {where} does not run: {', '.join(missing)}")
            raise MetadataError(
                "; ".join(parts)
                + "; make the DAG's task codes and CFG_TASKS agree (add, rename or retire tasks "
                "through a project migration, or set task_code= on the DAG's tasks)"
            )
        return tuple(sorted(c for c, lenient in rows if lenient))

    def _intervention(self, cur: Any, pipeline_id: int, run_id: int, action: str, from_status: str | None,
                      to_status: str | None, reason: str, identity: RunIdentity, task_id: int | None = None,
                      ) -> None:  # fmt: skip
        self._exec(
            cur,
            "INSERT INTO AUD_RUN_INTERVENTIONS (PIPELINE_ID, PIPELINE_RUN_ID, TASK_ID, ACTION, FROM_STATUS, "
            "TO_STATUS, REASON, REQUESTED_BY, REQUESTED_BY_KIND, REQUESTED_AT) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (pipeline_id, run_id, task_id, action, from_status, to_status, clean_text(reason), identity.actor,
             identity.actor_kind, self._now()[1]),
        )  # fmt: skip

    def _conflict(self, exc: BaseException, what: str) -> StaleTransitionError:
        return StaleTransitionError(
            f"{what}: another worker changed the Engine DB first ({_first_line(exc)}); a retry re-reads it"
        )

    # -- claim -------------------------------------------------------------------------------------------

    def claim(self, pipeline_code: str, identity: RunIdentity, task_codes: Collection[str] | None = None,
              where: str = "the DAG") -> ClaimOutcome:  # fmt: skip
        """Claim the Engine run of ``identity`` under the ``pipeline:<code>`` lock.

        Resumes the keyed run if IN-PROGRESS, reports BLOCKED while another run of the pipeline is
        IN-PROGRESS, reopens the keyed run if it ended (REOPEN intervention, REPAIR_PENDING='Y'), else
        inserts a new IN-PROGRESS run.

        :param task_codes: when given, must equal the pipeline's active task codes (METADATA otherwise).
        :raises MetadataError: the pipeline is not active, or the task codes differ.
        :raises LockTimeoutError: the pipeline lock was busy for ``lock_timeout`` seconds.
        :raises EngineDBError: the Engine tables are missing, partial or not migrated to this release.
        """
        require_current(self.engine, self.conn)
        try:
            with self._locked(pipeline_code) as cur:
                return self._claim(cur, pipeline_code, identity, task_codes, where)
        except self.engine.integrity_error() as exc:
            raise self._conflict(exc, f"claiming {identity.run_key} for {pipeline_code}") from None

    def _claim(self, cur: Any, code: str, identity: RunIdentity, task_codes: Collection[str] | None,
               where: str) -> ClaimOutcome:  # fmt: skip
        pipeline_id, _ = self._active_pipeline(cur, code)
        lenient = (
            () if task_codes is None else self._check_task_codes(cur, pipeline_id, code, task_codes, where)
        )
        outcome = self._claim_run(cur, pipeline_id, code, identity)
        if lenient and outcome.action in ("CREATED", "REOPENED", "RESUMED"):
            outcome = ClaimOutcome(outcome.action, outcome.pipeline_run_id, reason=outcome.reason,
                                   lenient_tasks=lenient)  # fmt: skip
        return outcome

    def _claim_run(self, cur: Any, pipeline_id: int, code: str, identity: RunIdentity) -> ClaimOutcome:
        rows = [self._run_row(r) for r in self._exec(
            cur,
            "SELECT r.PIPELINE_RUN_ID, r.PIPELINE_ID, r.STATUS, r.RUN_KEY, r.START_DATE, r.END_DATE, r.REPAIR_PENDING, r.OUTPUT_REVISION FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_ID = ? "
            "AND (r.RUN_KEY = ? OR r.STATUS = 'IN-PROGRESS') ORDER BY r.PIPELINE_RUN_ID",
            (pipeline_id, identity.run_key),
        ).fetchall()]  # fmt: skip
        mine = next((r for r in rows if r.run_key == identity.run_key), None)
        if mine is not None and mine.status == "IN-PROGRESS":
            return ClaimOutcome("RESUMED", mine.pipeline_run_id)
        blocking = next((r for r in rows if r.status == "IN-PROGRESS"), None)
        if blocking is not None:
            return ClaimOutcome("BLOCKED", blocking=blocking)
        pause = self._open_pause(cur, pipeline_id)
        if pause is not None:
            reason = pause.describe(code)
            if mine is not None:  # a cleared DAG run of an ended run: left as it is while paused
                return ClaimOutcome("SKIPPED", mine.pipeline_run_id, reason=reason)
            run_id = self._insert_run(
                cur, pipeline_id, identity, "SKIPPED", (pause.paused_by, pause.paused_by_kind)
            )
            return ClaimOutcome("SKIPPED", run_id, reason=reason)
        if mine is not None:
            self._reopen(cur, mine, identity, f"Airflow DAG run {identity.run_id} of {identity.dag_id} ran again "
                         "(cleared)")  # fmt: skip
            return ClaimOutcome("REOPENED", mine.pipeline_run_id)
        edges = self.gates.pipeline_edges(cur, pipeline_id)
        if not edges:
            return ClaimOutcome("CREATED", self._insert_run(cur, pipeline_id, identity, "IN-PROGRESS"))
        verdict = self.gates.judge(edges, lambda edge: self.gates.observe_latest(cur, edge))
        if verdict.result == WAIT:
            return ClaimOutcome("WAITING", reason=f"pipeline {code}: {verdict.reason}")
        status = "IN-PROGRESS" if verdict.result == SATISFIED else "SKIPPED"
        run_id = self._insert_run(cur, pipeline_id, identity, status, (identity.actor, identity.actor_kind))
        self.gates.record(cur, verdict, run_id, None, self._now()[1])
        return ClaimOutcome("CREATED" if status == "IN-PROGRESS" else "SKIPPED", run_id,
                            reason=f"pipeline {code}: {verdict.reason}")  # fmt: skip

    def _insert_run(self, cur: Any, pipeline_id: int, identity: RunIdentity, status: str,
                    ended_by: tuple[str | None, str | None] | None = None) -> int:  # fmt: skip
        """Insert the keyed run IN-PROGRESS, or already ended (SKIPPED) with ``ended_by`` (actor, kind)."""
        now_db = self._now()[1]
        run_date = None if identity.run_date is None else self.engine.to_db_time(identity.run_date)
        end, by, kind = (now_db, *ended_by) if status != "IN-PROGRESS" and ended_by else (None, None, None)
        (run_id,) = self._exec(
            cur,
            "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, START_DATE, END_DATE, STATUS, RUN_DATE, BACKFILL, "
            "RUN_KEY, TRIGGER_KIND, OWNER_ID, STARTED_BY, STARTED_BY_KIND, ENDED_BY, ENDED_BY_KIND) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, 'ORCHESTRATOR', ?, ?, ?, ?, ?) RETURNING PIPELINE_RUN_ID",
            (pipeline_id, now_db, end, status, run_date, "Y" if identity.backfill else "N", identity.run_key,
             identity.run_key, identity.actor, identity.actor_kind, by, kind),
        ).fetchone()  # fmt: skip
        return int(run_id)

    def _open_pause(self, cur: Any, pipeline_id: int) -> Pause | None:
        row = self._exec(
            cur, "SELECT PIPELINE_PAUSE_ID, PAUSED_AT, PAUSED_BY, PAUSED_BY_KIND, REASON FROM AUD_PIPELINE_PAUSES "
            "WHERE PIPELINE_ID = ? AND RESUMED_AT IS NULL", (pipeline_id,),
        ).fetchone()  # fmt: skip
        return None if row is None else Pause(int(row[0]), self.engine.from_db_time(row[1]), *row[2:])

    # -- pauses ------------------------------------------------------------------------------------------

    def pause(self, pipeline_code: str, reason: str, by: str, by_kind: str = "HUMAN") -> int:
        """Open a pause of the pipeline (``AUD_PIPELINE_PAUSES``); returns its id.

        While it is open, claims skip their DAG runs and running runs start no new task.

        :raises MetadataError: the pipeline is not active.
        :raises RunStateError: the pipeline is paused already (one open pause per pipeline).
        """
        with self.engine.transaction(self.conn) as cur:
            pipeline_id, _ = self._active_pipeline(cur, pipeline_code)
            current = self._open_pause(cur, pipeline_id)
            if current is not None:
                raise RunStateError(
                    f"{current.describe(pipeline_code)}; resume it first (etl-craft-airflow resume)"
                )
            try:
                (pause_id,) = self._exec(
                    cur, "INSERT INTO AUD_PIPELINE_PAUSES (PIPELINE_ID, PAUSED_AT, PAUSED_BY, PAUSED_BY_KIND, REASON) "
                    "VALUES (?, ?, ?, ?, ?) RETURNING PIPELINE_PAUSE_ID",
                    (pipeline_id, self._now()[1], clean_text(by), by_kind, clean_text(reason)),
                ).fetchone()  # fmt: skip
            except self.engine.integrity_error() as exc:
                raise self._conflict(exc, f"pausing {pipeline_code}") from None
        return int(pause_id)

    def resume(self, pipeline_code: str, reason: str, by: str, by_kind: str = "HUMAN") -> Pause:
        """Close the pipeline's open pause; returns it.

        :raises RunStateError: the pipeline is not paused.
        """
        with self.engine.transaction(self.conn) as cur:
            pipeline_id, _ = self._active_pipeline(cur, pipeline_code)
            current = self._open_pause(cur, pipeline_id)
            if current is None:
                raise RunStateError(f"pipeline {pipeline_code} is not paused; nothing to resume")
            updated = self._exec(
                cur, "UPDATE AUD_PIPELINE_PAUSES SET RESUMED_AT = ?, RESUMED_BY = ?, RESUMED_BY_KIND = ?, "
                "RESUME_REASON = ? WHERE PIPELINE_PAUSE_ID = ? AND RESUMED_AT IS NULL",
                (self._now()[1], clean_text(by), by_kind, clean_text(reason), current.pause_id),
            ).rowcount  # fmt: skip
            if updated != 1:
                raise StaleTransitionError(f"pause {current.pause_id} of {pipeline_code} changed; retry")
        return current

    def _reopen(
        self, cur: Any, run: RunRow, identity: RunIdentity, reason: str, task_id: int | None = None
    ) -> None:
        updated = self._exec(
            cur,
            "UPDATE AUD_PIPELINES_RUN_LOG SET STATUS = 'IN-PROGRESS', END_DATE = NULL, ENDED_BY = NULL, "
            "ENDED_BY_KIND = NULL, REPAIR_PENDING = 'Y' WHERE PIPELINE_RUN_ID = ? AND STATUS = ?",
            (run.pipeline_run_id, run.status),
        ).rowcount
        if updated != 1:
            raise StaleTransitionError(
                f"{run.describe()} changed while it was being reopened; a retry re-reads it"
            )
        self._intervention(cur, run.pipeline_id, run.pipeline_run_id, "REOPEN", run.status, "IN-PROGRESS", reason,
                           identity, task_id)  # fmt: skip

    def close_abandoned(
        self, pipeline_code: str, pipeline_run_id: int, identity: RunIdentity, reason: str
    ) -> bool:
        """Close an IN-PROGRESS run whose driver is gone as CANCELLED (CANCEL intervention; attempts LOST).

        :return: False when the run was no longer IN-PROGRESS (someone else closed it first).
        """
        with self._locked(pipeline_code) as cur:
            row = self._exec(
                cur, "SELECT r.PIPELINE_RUN_ID, r.PIPELINE_ID, r.STATUS, r.RUN_KEY, r.START_DATE, r.END_DATE, r.REPAIR_PENDING, r.OUTPUT_REVISION FROM AUD_PIPELINES_RUN_LOG r "
                "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID WHERE r.PIPELINE_RUN_ID = ? AND p.PIPELINE_CODE = ?"
                " FOR UPDATE", (pipeline_run_id, pipeline_code),
            ).fetchone()  # fmt: skip
            if row is None or row[2] != "IN-PROGRESS":
                return False
            run = self._run_row(row)
            now_db = self._now()[1]
            note = clean_text(f"abandoned: {reason}")
            self._exec(
                cur,
                "UPDATE AUD_TASK_ATTEMPTS SET STATUS = 'LOST', ENDED_AT = ?, ERROR_MESSAGE = ? WHERE STATUS IN ('QUEUED', 'CLAIMED', 'RUNNING') "
                "AND TASK_RUN_ID IN (SELECT TASK_RUN_ID FROM AUD_TASK_RUN_LOG WHERE PIPELINE_RUN_ID = ?)",
                (now_db, note, pipeline_run_id),
            )  # fmt: skip
            self._exec(
                cur,
                "UPDATE AUD_TASK_RUN_LOG SET STATUS = 'CANCELLED', END_DATE = ?, ERROR_MESSAGE = ? "
                "WHERE PIPELINE_RUN_ID = ? AND STATUS = 'IN-PROGRESS'",
                (now_db, note, pipeline_run_id),
            )
            self._exec(
                cur,
                "UPDATE AUD_PIPELINES_RUN_LOG SET STATUS = 'CANCELLED', END_DATE = ?, ENDED_BY = ?, ENDED_BY_KIND = ?, "
                "REPAIR_PENDING = 'N' WHERE PIPELINE_RUN_ID = ?",
                (now_db, identity.actor, identity.actor_kind, pipeline_run_id),
            )  # fmt: skip
            self._intervention(cur, run.pipeline_id, pipeline_run_id, "CANCEL", "IN-PROGRESS", "CANCELLED",
                               f"abandoned: {reason}", identity)  # fmt: skip
            return True

    # -- task attempts -----------------------------------------------------------------------------------

    def start_task(self, pipeline_code: str, task_code: str, identity: RunIdentity, try_number: int,
                   log_path: str | None = None, upstream_states: UpstreamStates | None = None,
                   claim_skipped: Callable[[], bool] | None = None, map_index: int | None = None,
                   resume: bool = False) -> AttemptHandle:  # fmt: skip
        """Open attempt ``try_number`` of ``task_code`` in the keyed run (one transaction).

        Finds or creates the task's single ``AUD_TASK_RUN_LOG`` row; a live attempt of an earlier try
        (its worker died, Airflow moved on) is closed LOST first; a second live attempt of the same try
        is refused. A run that already ended (a task cleared in Airflow) is reopened first. The task's
        dependencies and run condition are judged first (SPEC §10).

        :param upstream_states: Airflow's state of same-pipeline upstream tasks, by task code, for those
            that have no row in the run yet (without it such an upstream is waited for).
        :param claim_skipped: whether this DAG run's claim skipped (a paused pipeline, unsatisfied
            dependencies); a task that runs anyway (``all_done``) then skips instead of reopening the run.
        :param map_index: the instance of a mapped task (None: unmapped); attempts are per map index.
        :param resume: the try comes back after a reschedule or a deferral: its attempt, parked QUEUED by
            :meth:`park_task`, is taken over instead of a new one opened (nothing is judged again).
        :raises GateWaiting: the pipeline is paused, or an upstream is still IN-PROGRESS (nothing written).
        :raises GateSkipped: the dependencies are not satisfied: the attempt was recorded CANCELLED and the
            task run SKIPPED, with the decisions.
        :raises MetadataError: the pipeline or task is not active.
        :raises RunStateError: no run with this key (the claim did not run).
        :raises StaleTransitionError: this try already has an attempt (a duplicate delivery).
        """
        if resume:
            adopted = self._adopt(pipeline_code, task_code, identity, try_number, map_index)
            if adopted is not None:
                return adopted
        attempt_number, note = try_number, None
        for _ in range(4):
            try:
                if note is None and map_index is None and self.engine.writes_in_with:
                    fast = self._start_task_one_statement(
                        pipeline_code, task_code, identity, attempt_number, log_path
                    )
                    if fast is not None:
                        return fast
                with self.engine.transaction(self.conn) as cur:
                    handle = self._start_task(cur, pipeline_code, task_code, identity, try_number, attempt_number,
                                              note, log_path, upstream_states, map_index)  # fmt: skip
            except self.engine.integrity_error() as exc:
                taken = self._attempt_taken(pipeline_code, task_code, identity, attempt_number, map_index)
                if taken is None or taken[0] in LIVE_ATTEMPT or taken[2]:
                    raise StaleTransitionError(
                        f"task {task_code} in {identity.run_key} already has a live attempt or a record of try "
                        f"{try_number}: a second delivery is refused ({_first_line(exc)})"
                    ) from None
                # The number is taken by an ended attempt and nothing is live: Airflow restarted its try
                # numbering (a DAG run deleted and created again under the same run id). Continue the task
                # run's numbering. (With a later try live, this is a late duplicate: refused above.)
                attempt_number = taken[1] + 1
                note = (
                    f"Airflow try {try_number}; its try numbering restarted (the DAG run was created again)"
                )
                continue
            if isinstance(handle, GateSkipped):
                raise handle
            if isinstance(handle, AttemptHandle):
                return handle
            if claim_skipped is not None and claim_skipped():
                raise GateSkipped(f"task {task_code} does not run: {handle[0].describe()} was skipped when this DAG "
                                  "run claimed it")  # fmt: skip
            self._reopen_for_task(pipeline_code, *handle, identity, task_code)
        raise StaleTransitionError(f"{identity.run_key} changed while task {task_code} was starting; retry")

    def _adopt(self, code: str, task_code: str, identity: RunIdentity, try_number: int,
               map_index: int | None) -> AttemptHandle | None:  # fmt: skip
        """Take over this try's attempt parked QUEUED by a reschedule or deferral; None when there is none."""
        owner = _owner_token()
        with self.engine.transaction(self.conn) as cur:
            row = self._exec(
                cur,
                "SELECT a.ATTEMPT_ID, a.TASK_RUN_ID, tr.PIPELINE_RUN_ID " + ATTEMPT_OF_KEYED_TRY
                + "AND r.STATUS = 'IN-PROGRESS' AND a.STATUS = 'QUEUED' FOR UPDATE",
                (code, task_code, identity.run_key, try_number, _map_key(map_index)),
            ).fetchone()  # fmt: skip
            if row is None:
                return None
            now_db = self._now()[1]
            self._exec(
                cur, "UPDATE AUD_TASK_ATTEMPTS SET STATUS = 'RUNNING', OWNER_ID = ?, HEARTBEAT_AT = ?, HOST = ?, PID = ?, "
                "TASK_LOG = NULL WHERE ATTEMPT_ID = ? AND STATUS = 'QUEUED'",
                (owner, now_db, socket.gethostname(), os.getpid(), row[0]),
            )  # fmt: skip
        # consumes=True: the attempt's gate decisions were recorded when it opened; consuming them on success
        # is one INSERT … SELECT that finds nothing when there is nothing to consume.
        return AttemptHandle(
            int(row[2]), int(row[1]), int(row[0]), try_number, owner, task_code, True, map_index
        )

    def park_task(self, handle: AttemptHandle, note: str) -> None:
        """Park the live attempt QUEUED while Airflow reschedules or defers this try (no worker runs it).

        The attempt stays live, so nothing else can open one for this try; the try's next poke or its
        resumed method takes it over (``start_task(resume=True)``), and ATTEMPT_COUNT does not move.

        :raises StaleTransitionError: the attempt is no longer this try's (closed by a later try or finish).
        """
        now_db = self._now()[1]
        updated = self.engine.execute(
            self.conn, "UPDATE AUD_TASK_ATTEMPTS SET STATUS = 'QUEUED', QUEUED_AT = ?, HEARTBEAT_AT = ?, TASK_LOG = ? "
            "WHERE ATTEMPT_ID = ? AND OWNER_ID = ? AND STATUS = 'RUNNING'",
            (now_db, now_db, clean_text(note), handle.attempt_id, handle.owner_id),
        ).rowcount  # fmt: skip
        if updated != 1:
            raise self._closed_by_someone_else(handle)

    def _start_task_one_statement(self, code: str, task_code: str, identity: RunIdentity, attempt_number: int,
                                  log_path: str | None) -> AttemptHandle | None:  # fmt: skip
        """The common case in one round trip (see ``START_ATTEMPT_ONE_STATEMENT``); None: take the full path."""
        now_db = self._now()[1]
        owner = _owner_token()
        rows = self.engine.execute(self.conn, START_ATTEMPT_ONE_STATEMENT, (
            task_code, identity.run_key, code, now_db, attempt_number, owner, now_db, now_db, now_db,
            socket.gethostname(), os.getpid(), log_path, identity.actor, identity.actor_kind,
        )).rows  # fmt: skip
        if not rows:
            return None
        row = rows[0]
        return AttemptHandle(int(row[2]), int(row[1]), int(row[0]), attempt_number, owner, task_code)

    def _attempt_taken(self, code: str, task_code: str, identity: RunIdentity, attempt_number: int,
                       map_index: int | None) -> tuple[str, int, bool] | None:  # fmt: skip
        """Attempt ``attempt_number`` of the task (and map index) in the keyed run: its status, the highest
        attempt number, and whether any attempt of the task run and map index is live."""
        with self.engine.transaction(self.conn) as cur:
            row = self._exec(
                cur,
                "SELECT a.STATUS, (SELECT MAX(m.ATTEMPT_NUMBER) FROM AUD_TASK_ATTEMPTS m WHERE m.TASK_RUN_ID = "  # noqa: S608 - constant SQL
                "a.TASK_RUN_ID AND COALESCE(m.MAP_INDEX, -1) = COALESCE(a.MAP_INDEX, -1)), (SELECT COUNT(*) FROM "
                "AUD_TASK_ATTEMPTS l WHERE l.TASK_RUN_ID = a.TASK_RUN_ID AND COALESCE(l.MAP_INDEX, -1) = "
                "COALESCE(a.MAP_INDEX, -1) AND l.STATUS IN ('QUEUED', 'CLAIMED', 'RUNNING')) "
                + ATTEMPT_OF_KEYED_TRY,
                (code, task_code, identity.run_key, attempt_number, _map_key(map_index)),
            ).fetchone()
        return None if row is None else (row[0], int(row[1]), int(row[2]) > 0)

    def _start_task(self, cur: Any, code: str, task_code: str, identity: RunIdentity, try_number: int,
                    attempt_number: int, note: str | None, log_path: str | None, upstream_states: UpstreamStates | None,
                    map_index: int | None) -> AttemptHandle | GateSkipped | tuple[RunRow, int]:  # fmt: skip
        row = self._exec(
            cur,
            "SELECT t.TASK_ID, r.PIPELINE_RUN_ID, r.PIPELINE_ID, r.STATUS, r.RUN_KEY, r.START_DATE, r.END_DATE, r.REPAIR_PENDING, r.OUTPUT_REVISION, "
            "t.RUN_CONDITION, t.RUN_CONDITION_COUNT, (SELECT COUNT(*) FROM CFG_TASK_DEPENDENCY d WHERE d.TASK_ID = "
            "t.TASK_ID AND d.ACTIVE_FLAG = 'Y'), (SELECT COUNT(*) FROM AUD_PIPELINE_PAUSES pp WHERE pp.PIPELINE_ID = "
            "p.PIPELINE_ID AND pp.RESUMED_AT IS NULL), (SELECT COUNT(*) FROM AUD_TASK_RUN_LOG ltr JOIN AUD_TASK_ATTEMPTS la "
            "ON la.TASK_RUN_ID = ltr.TASK_RUN_ID WHERE ltr.TASK_ID = t.TASK_ID AND ltr.PIPELINE_RUN_ID = r.PIPELINE_RUN_ID "
            "AND la.STATUS IN ('QUEUED', 'CLAIMED', 'RUNNING') AND la.ATTEMPT_NUMBER < ? AND COALESCE(la.MAP_INDEX, -1) = ?) "
            "FROM CFG_PIPELINES p JOIN CFG_TASKS t ON t.PIPELINE_ID = p.PIPELINE_ID AND t.TASK_CODE = ? AND t.ACTIVE_FLAG = 'Y' "
            "JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_ID = p.PIPELINE_ID AND r.RUN_KEY = ? "
            "WHERE p.PIPELINE_CODE = ? AND p.ACTIVE_FLAG = 'Y' FOR SHARE",
            (attempt_number, _map_key(map_index), task_code, identity.run_key, code),
        ).fetchone()  # fmt: skip
        if row is None:
            self._explain_missing(cur, code, task_code, identity)
        task_id, run = int(row[0]), self._run_row(row[1:9])
        condition, condition_count, n_edges, paused, earlier_live = (
            row[9],
            row[10],
            int(row[11]),
            int(row[12]),
            int(row[13]),
        )
        if run.status != "IN-PROGRESS":
            return run, task_id
        if paused:
            pause = self._open_pause(cur, run.pipeline_id)
            if pause is not None:
                raise GateWaiting(f"task {task_code} does not start: {pause.describe(code)}")
        verdict = None
        if n_edges:
            verdict = self.gates.judge(
                self.gates.task_edges(cur, run.pipeline_id, task_id),
                lambda edge: self._observe_task_edge(cur, edge, run.pipeline_run_id, upstream_states),
                condition, None if condition_count is None else int(condition_count),
            )  # fmt: skip
            if verdict.result == WAIT:
                raise GateWaiting(f"task {task_code}: {verdict.reason}")
        now_db = self._now()[1]
        if earlier_live:  # an earlier try's worker died without recording: close its attempt LOST
            self._exec(
                cur,
                "UPDATE AUD_TASK_ATTEMPTS SET STATUS = 'LOST', ENDED_AT = ?, ERROR_MESSAGE = ? WHERE STATUS IN ('QUEUED', 'CLAIMED', 'RUNNING') "
                "AND ATTEMPT_NUMBER < ? AND COALESCE(MAP_INDEX, -1) = ? AND TASK_RUN_ID = "
                "(SELECT TASK_RUN_ID FROM AUD_TASK_RUN_LOG WHERE TASK_ID = ? AND PIPELINE_RUN_ID = ?)",
                (now_db, f"lost: Airflow started try {try_number} while this attempt was still live (its worker ended "
                 "without recording)", attempt_number, _map_key(map_index), task_id, run.pipeline_run_id),
            )  # fmt: skip
        (task_run_id,) = self._exec(
            cur,
            "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, START_DATE, STATUS, ATTEMPT_COUNT) "
            "VALUES (?, ?, ?, 'IN-PROGRESS', 1) ON CONFLICT (TASK_ID, PIPELINE_RUN_ID) DO UPDATE SET "
            "STATUS = 'IN-PROGRESS', END_DATE = NULL, ERROR_MESSAGE = NULL, "
            "ATTEMPT_COUNT = AUD_TASK_RUN_LOG.ATTEMPT_COUNT + 1 RETURNING TASK_RUN_ID",
            (task_id, run.pipeline_run_id, now_db),
        ).fetchone()  # fmt: skip
        owner = _owner_token()
        skip = None if verdict is None or verdict.result != UNSATISFIED else f"{SKIP_NOTE}{verdict.reason}"
        (attempt_id,) = self._exec(
            cur,
            "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, MAP_INDEX, STATUS, OWNER_ID, CLAIMED_AT, "
            "STARTED_AT, HEARTBEAT_AT, ENDED_AT, HOST, PID, LOG_PATH, TASK_LOG, ERROR_MESSAGE, REQUESTED_BY, "
            "REQUESTED_BY_KIND) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING ATTEMPT_ID",
            (task_run_id, attempt_number, map_index, "CANCELLED" if skip else "RUNNING", owner, now_db, now_db,
             now_db, now_db if skip else None, socket.gethostname(), os.getpid(), log_path,
             clean_text(skip) if skip else note, clean_text(skip) if skip else None, identity.actor,
             identity.actor_kind),
        ).fetchone()  # fmt: skip
        if verdict is not None:
            self.gates.record(cur, verdict, run.pipeline_run_id, int(attempt_id), now_db)
        if skip:
            if map_index is None:
                self._exec(
                    cur, "UPDATE AUD_TASK_RUN_LOG SET STATUS = 'SKIPPED', END_DATE = ?, TASK_LOG = ? WHERE TASK_RUN_ID = ?",
                    (now_db, clean_text(skip), task_run_id),
                )  # fmt: skip
            else:
                self._settle_mapped(cur, int(task_run_id), None, now_db)
            return GateSkipped(f"task {task_code} {skip}")
        consumes = verdict is not None and any(
            v.result == SATISFIED and not v.edge.same_pipeline for v in verdict.decided
        )
        return AttemptHandle(run.pipeline_run_id, int(task_run_id), int(attempt_id), attempt_number, owner, task_code,
                             consumes, map_index)  # fmt: skip

    def _observe_task_edge(self, cur: Any, edge: Edge, pipeline_run_id: int,
                           upstream_states: UpstreamStates | None) -> Observed:  # fmt: skip
        if edge.same_pipeline:
            return self.gates.observe_same_run(cur, edge, pipeline_run_id, upstream_states)
        return self.gates.observe_latest(cur, edge)

    def _explain_missing(self, cur: Any, code: str, task_code: str, identity: RunIdentity) -> None:
        pipeline_id, _ = self._active_pipeline(cur, code)
        found = self._exec(
            cur, "SELECT COUNT(*) FROM CFG_TASKS WHERE PIPELINE_ID = ? AND TASK_CODE = ? AND ACTIVE_FLAG = 'Y'",
            (pipeline_id, task_code),
        ).fetchone()[0]  # fmt: skip
        if not found:
            raise MetadataError(
                f"task {task_code} is not an active task of pipeline {code} in CFG_TASKS of the Engine DB "
                f"{self.engine.describe()}; add it through a project migration, or fix task_code"
            )
        raise RunStateError(
            f"no Engine run of pipeline {code} has the run key {identity.run_key}: the pipeline's claim task has not "
            "run for this DAG run; put ClaimPipelineRunOperator (or etl_craft_pipeline) upstream of this task"
        )

    def _reopen_for_task(
        self, code: str, run: RunRow, task_id: int, identity: RunIdentity, task_code: str
    ) -> None:
        with self._locked(code) as cur:
            busy = self._exec(
                cur,
                "SELECT r.PIPELINE_RUN_ID, r.PIPELINE_ID, r.STATUS, r.RUN_KEY, r.START_DATE, r.END_DATE, r.REPAIR_PENDING, r.OUTPUT_REVISION FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_ID = ? AND "
                "r.STATUS = 'IN-PROGRESS' AND r.PIPELINE_RUN_ID <> ?",
                (run.pipeline_id, run.pipeline_run_id),
            ).fetchone()
            if busy is not None:
                raise StaleTransitionError(
                    f"task {task_code} was cleared in {identity.run_key}, whose {run.describe()} has ended, but "
                    f"{self._run_row(busy).describe()} holds the pipeline now; retry after it ends"
                )
            current = self._exec(
                cur, "SELECT r.PIPELINE_RUN_ID, r.PIPELINE_ID, r.STATUS, r.RUN_KEY, r.START_DATE, r.END_DATE, r.REPAIR_PENDING, r.OUTPUT_REVISION FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_RUN_ID = ?",
                (run.pipeline_run_id,),
            ).fetchone()  # fmt: skip
            if current is not None and current[2] != "IN-PROGRESS":
                self._reopen(cur, self._run_row(current), identity, f"task {task_code} ran again in Airflow (cleared)",
                             task_id)  # fmt: skip

    def finish_task(self, handle: AttemptHandle, status: str, counts: TaskCounts | None = None,
                    error: str | None = None, map_count: int | None = None) -> None:  # fmt: skip
        """End the attempt and copy it to its task run, in one transaction.

        ``status`` is SUCCESS, FAILED, TIMED_OUT (the task run FAILED), CANCELLED, or SKIPPED (the attempt
        CANCELLED and the task run SKIPPED, ``error`` being the reason, kept in TASK_LOG). A mapped
        instance's end settles its task run over every map index (:mod:`~.mapped`); ``map_count`` is how
        many instances Airflow expanded.

        :raises StaleTransitionError: the attempt is no longer this try's live attempt (closed as LOST by a
            later try or by the finish task).
        """
        if status not in ATTEMPT_ENDS:
            raise ValueError(f"an attempt ends {', '.join(ATTEMPT_ENDS)}, not {status!r}")
        attempt_status, run_status = ATTEMPT_ENDS[status]
        values = (counts or TaskCounts()).values()
        message = None if error is None else clean_text(error)
        note, message = (
            (clean_text(SKIP_NOTE + (error or "")), None) if status == "SKIPPED" else (None, message)
        )
        now_db = self._now()[1]
        simple = note is None and handle.map_index is None and not (status == "SUCCESS" and handle.consumes)
        if self.engine.writes_in_with and simple:
            updated = self.engine.execute(self.conn, FINISH_ATTEMPT_ONE_STATEMENT, (
                attempt_status, now_db, now_db, *values, message, handle.attempt_id, handle.owner_id,
                run_status, now_db, *values, message,
            )).rowcount  # fmt: skip
            if updated != 1:
                raise self._closed_by_someone_else(handle)
            return
        with self.engine.transaction(self.conn) as cur:
            updated = self._exec(
                cur,
                "UPDATE AUD_TASK_ATTEMPTS SET STATUS = ?, ENDED_AT = ?, HEARTBEAT_AT = ?, SOURCE_COUNT = ?, "
                "TARGET_COUNT = ?, INSERT_COUNT = ?, UPDATE_COUNT = ?, DELETE_COUNT = ?, ROWS_WRITTEN = ?, "
                "ERROR_MESSAGE = ?, TASK_LOG = COALESCE(?, TASK_LOG) WHERE ATTEMPT_ID = ? AND OWNER_ID = ? "
                "AND STATUS IN ('QUEUED', 'CLAIMED', 'RUNNING')",
                (attempt_status, now_db, now_db, *values, message, note, handle.attempt_id, handle.owner_id),
            ).rowcount
            if updated != 1:
                raise self._closed_by_someone_else(handle)
            if handle.map_index is not None:
                self._settle_mapped(cur, handle.task_run_id, map_count, now_db)
            else:
                self._exec(
                    cur,
                    "UPDATE AUD_TASK_RUN_LOG SET STATUS = ?, END_DATE = ?, SOURCE_COUNT = ?, TARGET_COUNT = ?, "
                    "INSERT_COUNT = ?, UPDATE_COUNT = ?, DELETE_COUNT = ?, ROWS_WRITTEN = ?, ERROR_MESSAGE = ?, "
                    "TASK_LOG = COALESCE(?, TASK_LOG) WHERE TASK_RUN_ID = ?",
                    (run_status, now_db, *values, message, note, handle.task_run_id),
                )
            if status == "SUCCESS" and handle.consumes:
                self.gates.consume_attempt(cur, handle.attempt_id, now_db)

    def _settle_mapped(self, cur: Any, task_run_id: int, map_count: int | None, now_db: Any,
                       airflow_only: Mapping[int, IndexAttempt] | None = None) -> str:  # fmt: skip
        """Write a mapped task run's status and counts from its map indexes' latest attempts; returns it.

        :param airflow_only: map indexes that recorded no attempt, as Airflow reports them (finish only).
        """
        latest: dict[int, IndexAttempt] = dict(airflow_only or {})
        for map_index, status, log, error, *counts in self._exec(
            cur,
            "SELECT MAP_INDEX, STATUS, TASK_LOG, ERROR_MESSAGE, SOURCE_COUNT, TARGET_COUNT, INSERT_COUNT, "
            "UPDATE_COUNT, DELETE_COUNT, ROWS_WRITTEN FROM AUD_TASK_ATTEMPTS WHERE TASK_RUN_ID = ? "
            "ORDER BY COALESCE(MAP_INDEX, -1), ATTEMPT_NUMBER",
            (task_run_id,),
        ).fetchall():  # fmt: skip
            skipped = status == "CANCELLED" and (log or "").startswith(SKIP_NOTE)
            latest[_map_key(map_index)] = IndexAttempt(status, skipped, error, counts)
        settled = settle(latest, map_count)
        self._exec(
            cur,
            "UPDATE AUD_TASK_RUN_LOG SET STATUS = ?, END_DATE = ?, SOURCE_COUNT = ?, TARGET_COUNT = ?, INSERT_COUNT = ?, "
            "UPDATE_COUNT = ?, DELETE_COUNT = ?, ROWS_WRITTEN = ?, ERROR_MESSAGE = ?, TASK_LOG = ? WHERE TASK_RUN_ID = ?",
            (settled.status, None if settled.status == "IN-PROGRESS" else now_db, *settled.counts, settled.error,
             settled.log, task_run_id),
        )  # fmt: skip
        return settled.status

    @staticmethod
    def _closed_by_someone_else(handle: AttemptHandle) -> StaleTransitionError:
        return StaleTransitionError(
            f"attempt {handle.attempt_number} of task {handle.task_code} (ATTEMPT_ID {handle.attempt_id}) "
            "was closed by someone else (a later try or the finish task); its result is not recorded"
        )

    # -- finish ------------------------------------------------------------------------------------------

    def finish_run(self, pipeline_code: str, identity: RunIdentity, airflow_states: Mapping[str, str | None],
                   map_states: Mapping[str, Mapping[int, str | None]] | None = None,
                   not_deciding: Collection[str] = ()) -> FinishOutcome:  # fmt: skip
        """End the keyed run (SPEC §9 *Finish*), under the pipeline lock, in one transaction.

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
        with self._locked(pipeline_code) as cur:
            return self._finish_run(
                cur, pipeline_code, identity, airflow_states, map_states or {}, frozenset(not_deciding)
            )

    def _finish_run(self, cur: Any, code: str, identity: RunIdentity, airflow_states: Mapping[str, str | None],
                    map_states: Mapping[str, Mapping[int, str | None]], not_deciding: frozenset[str]) -> FinishOutcome:  # fmt: skip
        row = self._exec(
            cur,
            "SELECT r.PIPELINE_RUN_ID, r.PIPELINE_ID, r.STATUS, r.RUN_KEY, r.START_DATE, r.END_DATE, r.REPAIR_PENDING, r.OUTPUT_REVISION, r.SLA_STATUS, p.SLA_IN_HOURS FROM AUD_PIPELINES_RUN_LOG r "
            "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ? AND r.RUN_KEY = ? "
            "ORDER BY r.PIPELINE_RUN_ID DESC FOR UPDATE",
            (code, identity.run_key),
        ).fetchone()  # fmt: skip
        if row is None:
            raise RunStateError(
                f"no Engine run of pipeline {code} has the run key {identity.run_key}, so there is nothing to finish; "
                "the claim task failed or did not run (see its log)"
            )
        run, sla_status, sla_hours = self._run_row(row[:8]), row[8], row[9]
        if run.status != "IN-PROGRESS":
            return FinishOutcome(run.pipeline_run_id, run.status, already_ended=True, sla_status=sla_status)
        now, now_db = self._now()
        lost_codes = self._close_lost(cur, run.pipeline_run_id, now_db)
        tasks = self._exec(
            cur,
            "SELECT t.TASK_ID, t.TASK_CODE, t.HANDLER, tr.TASK_RUN_ID, tr.STATUS FROM CFG_TASKS t "
            "LEFT JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_ID = t.TASK_ID AND tr.PIPELINE_RUN_ID = ? "
            "WHERE t.PIPELINE_ID = ? AND (t.ACTIVE_FLAG = 'Y' OR tr.TASK_RUN_ID IS NOT NULL)",
            (run.pipeline_run_id, run.pipeline_id),
        ).fetchall()
        statuses: list[tuple[str, str, str]] = []  # (code, handler, status)
        skipped: list[str] = []
        for task_id, task_code, handler, task_run_id, status in tasks:
            if task_code in map_states and (task_run_id is not None or map_states[task_code]):
                task_run_id = task_run_id or self._insert_task_run(cur, task_id, run.pipeline_run_id, now_db)
                status = self._settle_mapped(cur, task_run_id, len(map_states[task_code]), now_db,
                                             _unrecorded_indexes(map_states[task_code]))  # fmt: skip
            elif task_run_id is None:
                if task_code not in airflow_states:
                    continue  # active in CFG_TASKS but not part of this DAG
                status = self._record_unrun(cur, run, task_id, airflow_states[task_code], identity, now_db)
                if status == "SKIPPED":
                    skipped.append(task_code)
            else:
                status = self._follow_mark(cur, run, task_id, task_run_id, status, airflow_states.get(task_code),
                                           identity, now_db)  # fmt: skip
            statuses.append((task_code, handler, status))
        failed = sorted(c for c, _, s in statuses if s in FAILING_TASK)
        data_failed = [c for c, handler, s in statuses
                       if handler != ALERT_HANDLER and c not in not_deciding and s in FAILING_TASK]  # fmt: skip
        if data_failed:
            final = "FAILED"
        elif all(s == "SKIPPED" for _, _, s in statuses):
            final = "SKIPPED"
        else:
            final = "SUCCESS"
        new_sla = None
        if (
            run.repair_pending == "N"
            and sla_status is None
            and sla_hours is not None
            and run.start_date is not None
        ):
            hours = (now - run.start_date).total_seconds() / 3600
            new_sla = "MET" if hours <= float(sla_hours) else "BREACHED"
        revision = run.output_revision + (1 if run.repair_pending == "Y" else 0)
        self._exec(
            cur,
            "UPDATE AUD_PIPELINES_RUN_LOG SET STATUS = ?, END_DATE = ?, ENDED_BY = ?, ENDED_BY_KIND = ?, "
            "SLA_STATUS = COALESCE(SLA_STATUS, ?), OUTPUT_REVISION = ?, REPAIR_PENDING = 'N' "
            "WHERE PIPELINE_RUN_ID = ?",
            (final, now_db, identity.actor, identity.actor_kind, new_sla, revision, run.pipeline_run_id),
        )
        if final == "SUCCESS":
            self.gates.consume_run(cur, run.pipeline_run_id, now_db)
        return FinishOutcome(run.pipeline_run_id, final, skipped=tuple(sorted(skipped)),
                             lost=tuple(sorted(lost_codes)), failed=tuple(failed),
                             sla_status=sla_status or new_sla)  # fmt: skip

    def _close_lost(self, cur: Any, pipeline_run_id: int, now_db: Any) -> list[str]:
        """Close attempts a killed worker left live as LOST, their task runs FAILED; returns the task codes."""
        lost = self._exec(
            cur,
            "UPDATE AUD_TASK_ATTEMPTS SET STATUS = 'LOST', ENDED_AT = ?, ERROR_MESSAGE = ? WHERE STATUS IN ('QUEUED', 'CLAIMED', 'RUNNING') "
            "AND TASK_RUN_ID IN (SELECT TASK_RUN_ID FROM AUD_TASK_RUN_LOG WHERE PIPELINE_RUN_ID = ?) "
            "RETURNING TASK_RUN_ID",
            (now_db, "lost: the attempt was still live when the DAG run finished (its worker ended without "
             "recording, or the task was marked by hand while it ran)", pipeline_run_id),
        ).fetchall()  # fmt: skip
        if not lost:
            return []
        return [r[0] for r in self._exec(
            cur,
            "UPDATE AUD_TASK_RUN_LOG SET STATUS = 'FAILED', END_DATE = ?, ERROR_MESSAGE = ? "
            "WHERE PIPELINE_RUN_ID = ? AND STATUS = 'IN-PROGRESS' RETURNING "
            "(SELECT TASK_CODE FROM CFG_TASKS t WHERE t.TASK_ID = AUD_TASK_RUN_LOG.TASK_ID)",
            (now_db, "failed: its attempt was lost (the worker ended without recording)", pipeline_run_id),
        ).fetchall()]  # fmt: skip

    def _insert_task_run(self, cur: Any, task_id: int, pipeline_run_id: int, now_db: Any) -> int:
        (task_run_id,) = self._exec(
            cur,
            "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, START_DATE, STATUS, ATTEMPT_COUNT) "
            "VALUES (?, ?, ?, 'IN-PROGRESS', 0) RETURNING TASK_RUN_ID",
            (task_id, pipeline_run_id, now_db),
        ).fetchone()
        return int(task_run_id)

    def _record_unrun(self, cur: Any, run: RunRow, task_id: int, state: str | None, identity: RunIdentity,
                      now_db: Any) -> str:  # fmt: skip
        """A task of the DAG that recorded no attempt: recorded as Airflow saw it; returns its status."""
        if state == "success":
            status, why = "SUCCESS", "marked success in Airflow without running here (no attempt recorded)"
        elif state in AIRFLOW_FAILED:
            status, why = (
                "FAILED",
                f"failed in Airflow before it recorded an attempt (Airflow state: {state})",
            )
        else:
            status, why = "SKIPPED", f"not run by Airflow (Airflow state: {state or 'none'})"
        self._exec(
            cur,
            "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, START_DATE, END_DATE, STATUS, ATTEMPT_COUNT, "
            "ERROR_MESSAGE, TASK_LOG) VALUES (?, ?, ?, ?, ?, 0, ?, ?)",
            (task_id, run.pipeline_run_id, now_db, now_db, status, why if status == "FAILED" else None, why),
        )  # fmt: skip
        if status == "SUCCESS":
            self._intervention(cur, run.pipeline_id, run.pipeline_run_id, "MARK", None, "SUCCESS", why, identity,
                               task_id)  # fmt: skip
        return status

    def _follow_mark(self, cur: Any, run: RunRow, task_id: int, task_run_id: int, status: str, state: str | None,
                     identity: RunIdentity, now_db: Any) -> str:  # fmt: skip
        """Follow a task marked success or failed by hand in Airflow: the task run takes Airflow's outcome
        and a MARK intervention records the change. Returns the task run's status."""
        if state == "success" and status not in ("SUCCESS", "IN-PROGRESS"):
            to_status = "SUCCESS"
        elif state == "failed" and status == "SUCCESS":
            to_status = "FAILED"
        else:
            return status
        reason = (f"marked {state} in Airflow (by hand in the UI or API) while the Engine DB had {status}; recorded "
                  "as Airflow says")  # fmt: skip
        self._exec(
            cur,
            "UPDATE AUD_TASK_RUN_LOG SET STATUS = ?, END_DATE = COALESCE(END_DATE, ?), ERROR_MESSAGE = ?, TASK_LOG = ? "
            "WHERE TASK_RUN_ID = ?",
            (to_status, now_db, reason if to_status == "FAILED" else None, reason, task_run_id),
        )  # fmt: skip
        self._intervention(cur, run.pipeline_id, run.pipeline_run_id, "MARK", status, to_status, reason, identity,
                           task_id)  # fmt: skip
        return to_status


def _unrecorded_indexes(states: Mapping[int, str | None]) -> dict[int, IndexAttempt]:
    """Airflow's map indexes as attempts, for those that recorded none (their recorded attempts win)."""
    found: dict[int, IndexAttempt] = {}
    for index, state in states.items():
        if state == "success":
            found[index] = IndexAttempt("SUCCESS")
        elif state in AIRFLOW_FAILED:
            found[index] = IndexAttempt(
                "FAILED", error=f"failed in Airflow before it recorded an attempt ({state})"
            )
        else:
            found[index] = IndexAttempt("CANCELLED", skipped=True)
    return found


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _owner_token() -> str:
    """``OWNER_ID`` of an attempt this process writes: host, pid and a random part (a lease token)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"


def _map_key(map_index: int | None) -> int:
    """``COALESCE(MAP_INDEX, -1)``: the schema's key for "this map index, or the unmapped task"."""
    return -1 if map_index is None else map_index
