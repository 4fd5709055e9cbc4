"""Open a task try's attempt (docs/lifecycle.md, *Attempts*): judge its dependencies, close a dead try's attempt,
reopen a run a cleared task belongs to, and take over an attempt parked by a reschedule or deferral.

The rule is :class:`StartAttempt`. Its common case (nothing to judge) also has a one-statement form,
:data:`START_AT_ONCE`, which the dialect runs where the database has data-modifying ``WITH`` (PostgreSQL);
``tests/integration/test_claim_finish_at_once.py`` plays the same task starts with and without it and compares
every ``AUD_`` row.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

from msgspec import Struct
from msgspec.structs import replace

from airflow_provider_etl_craft.engine.dbapi import Cursor
from airflow_provider_etl_craft.engine.dialects.base import OneStatement
from airflow_provider_etl_craft.errors import MetadataError, RunStateError, StaleTransitionError, first_line
from airflow_provider_etl_craft.runs import events
from airflow_provider_etl_craft.runs.attempts import settle_mapped
from airflow_provider_etl_craft.runs.counts import clean_text
from airflow_provider_etl_craft.runs.gates import (
    SATISFIED,
    UNSATISFIED,
    WAIT,
    Edge,
    GateSkipped,
    GateVerdict,
    GateWaiting,
    Observed,
    UpstreamStates,
)
from airflow_provider_etl_craft.runs.identity import RunIdentity
from airflow_provider_etl_craft.runs.records import SKIP_NOTE, AttemptHandle, RunRow, map_key
from airflow_provider_etl_craft.runs.transition import Transition
from airflow_provider_etl_craft.runs.vocabulary import (
    LIVE_ATTEMPT,
    LIVE_SQL,
    AttemptStatus,
    RunStatus,
    TaskRunStatus,
)

#: The attempt ``a`` of one try of a task (and map index) in the keyed run, found by pipeline code, task
#: code, run key, attempt number and ``COALESCE(MAP_INDEX, -1)`` (in that order of parameters).
_ATTEMPT_OF_KEYED_TRY = (
    "FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "
    "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = tr.PIPELINE_RUN_ID "
    "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ? AND t.TASK_CODE = ? "
    "AND r.RUN_KEY = ? AND a.ATTEMPT_NUMBER = ? AND COALESCE(a.MAP_INDEX, -1) = ? "
)
#: What starting a try decides on, in one share-locked read; parameters: attempt number, map key, task
#: code, run key, pipeline code.
_TRY_CONTEXT = (
    f"SELECT t.TASK_ID, {RunRow.COLUMNS}, t.RUN_CONDITION, t.RUN_CONDITION_COUNT, "  # noqa: S608 - constant
    "(SELECT COUNT(*) FROM CFG_TASK_DEPENDENCY d WHERE d.TASK_ID = t.TASK_ID AND d.ACTIVE_FLAG = 'Y'), "
    "(SELECT COUNT(*) FROM AUD_PIPELINE_PAUSES pp WHERE pp.PIPELINE_ID = p.PIPELINE_ID AND pp.RESUMED_AT IS NULL), "
    "(SELECT COUNT(*) FROM AUD_TASK_RUN_LOG ltr JOIN AUD_TASK_ATTEMPTS la ON la.TASK_RUN_ID = ltr.TASK_RUN_ID "
    "WHERE ltr.TASK_ID = t.TASK_ID AND ltr.PIPELINE_RUN_ID = r.PIPELINE_RUN_ID "
    f"AND la.STATUS IN {LIVE_SQL} AND la.ATTEMPT_NUMBER < ? AND COALESCE(la.MAP_INDEX, -1) = ?) "
    "FROM CFG_PIPELINES p JOIN CFG_TASKS t ON t.PIPELINE_ID = p.PIPELINE_ID AND t.TASK_CODE = ? AND t.ACTIVE_FLAG = 'Y' "
    "JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_ID = p.PIPELINE_ID AND r.RUN_KEY = ? "
    "WHERE p.PIPELINE_CODE = ? AND p.ACTIVE_FLAG = 'Y' FOR SHARE"
)
#: Start an attempt in one statement when nothing needs judging: the keyed run is IN-PROGRESS (its row
#: share-locked, as the transaction form does), the task has no dependencies, the pipeline is not paused
#: and no earlier attempt is live. Otherwise nothing is written and the transaction form decides. Parameters:
#: :class:`StartCall`; its row: ATTEMPT_ID, TASK_RUN_ID, PIPELINE_RUN_ID.
START_AT_ONCE = OneStatement(
    "WITH info AS (SELECT t.TASK_ID, r.PIPELINE_RUN_ID FROM CFG_PIPELINES p "  # noqa: S608 - constant SQL
    "JOIN CFG_TASKS t ON t.PIPELINE_ID = p.PIPELINE_ID AND t.TASK_CODE = ? AND t.ACTIVE_FLAG = 'Y' "
    "JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_ID = p.PIPELINE_ID AND r.RUN_KEY = ? "
    f"WHERE p.PIPELINE_CODE = ? AND p.ACTIVE_FLAG = 'Y' AND r.STATUS = '{RunStatus.IN_PROGRESS}' "
    "AND NOT EXISTS (SELECT 1 FROM CFG_TASK_DEPENDENCY d WHERE d.TASK_ID = t.TASK_ID AND d.ACTIVE_FLAG = 'Y') "
    "AND NOT EXISTS (SELECT 1 FROM AUD_PIPELINE_PAUSES pp WHERE pp.PIPELINE_ID = p.PIPELINE_ID "
    "AND pp.RESUMED_AT IS NULL) "
    "AND NOT EXISTS (SELECT 1 FROM AUD_TASK_RUN_LOG ltr JOIN AUD_TASK_ATTEMPTS la ON la.TASK_RUN_ID = ltr.TASK_RUN_ID "
    "WHERE ltr.TASK_ID = t.TASK_ID AND ltr.PIPELINE_RUN_ID = r.PIPELINE_RUN_ID "
    f"AND la.STATUS IN {LIVE_SQL}) "
    "FOR SHARE OF r), "
    "tr AS (INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, START_DATE, STATUS, ATTEMPT_COUNT) "
    f"SELECT TASK_ID, PIPELINE_RUN_ID, ?, '{TaskRunStatus.IN_PROGRESS}', 1 FROM info "
    f"ON CONFLICT (TASK_ID, PIPELINE_RUN_ID) DO UPDATE SET STATUS = '{TaskRunStatus.IN_PROGRESS}', END_DATE = NULL, "
    "ERROR_MESSAGE = NULL, ATTEMPT_COUNT = AUD_TASK_RUN_LOG.ATTEMPT_COUNT + 1 "
    "RETURNING TASK_RUN_ID, PIPELINE_RUN_ID) "
    "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, STATUS, OWNER_ID, CLAIMED_AT, STARTED_AT, "
    "HEARTBEAT_AT, HOST, PID, LOG_PATH, REQUESTED_BY, REQUESTED_BY_KIND) "
    f"SELECT TASK_RUN_ID, ?, '{AttemptStatus.RUNNING}', ?, ?, ?, ?, ?, ?, ?, ?, ? FROM tr "
    "RETURNING ATTEMPT_ID, TASK_RUN_ID, (SELECT PIPELINE_RUN_ID FROM tr)"
)


class StartCall(NamedTuple):
    """The parameters of :data:`START_AT_ONCE`, in its order."""

    task_code: str
    run_key: str
    pipeline_code: str
    #: The task run's START_DATE.
    started: Any
    attempt_number: int
    owner_id: str
    claimed_at: Any
    started_at: Any
    heartbeat_at: Any
    host: str
    pid: int
    log_path: str | None
    requested_by: str | None
    requested_by_kind: str | None


#: How many times a start re-reads after a lost race or a reopen before it gives up (retryable).
_ROUNDS = 4


class Try(Struct, frozen=True):
    """One Airflow try of a task in a DAG run, as the start of its attempt needs it."""

    pipeline_code: str
    task_code: str
    identity: RunIdentity
    #: Airflow's try number: the attempt's number, unless Airflow restarted its numbering.
    try_number: int
    log_path: str | None
    map_index: int | None
    #: Airflow's state of same-pipeline upstream tasks without a row in the run yet, by task code.
    upstream_states: UpstreamStates | None

    def params(self, attempt_number: int) -> tuple[Any, ...]:
        """Parameters of :data:`_ATTEMPT_OF_KEYED_TRY`."""
        return (
            self.pipeline_code,
            self.task_code,
            self.identity.run_key,
            attempt_number,
            map_key(self.map_index),
        )


class _Context(Struct, frozen=True):
    """The row of :data:`_TRY_CONTEXT`."""

    task_id: int
    run: RunRow
    condition: str | None
    condition_count: int | None
    has_edges: bool
    paused: bool
    earlier_live: bool


class _RunEnded(Exception):
    """The keyed run has ended (a task cleared in Airflow): reopen it, then start again."""

    def __init__(self, run: RunRow, task_id: int) -> None:
        super().__init__(run.describe())
        self.run, self.task_id = run, task_id


class StartAttempt(Transition):
    """Open attempt ``try_number`` of a task in the keyed run (one transaction, or one statement).

    Repeatable after a lost session: the attempt of this try already written under the step's token
    (``OWNER_ID``) is its own, and is returned (or its skip raised again) instead of refused as a second
    delivery.
    """

    repeatable = True

    def __call__(
        self,
        pipeline_code: str,
        task_code: str,
        identity: RunIdentity,
        try_number: int,
        *,
        log_path: str | None = None,
        upstream_states: UpstreamStates | None = None,
        claim_skipped: Callable[[], bool] | None = None,
        map_index: int | None = None,
        resume: bool = False,
    ) -> AttemptHandle:
        """Open attempt ``try_number`` of ``task_code`` in the keyed run (one transaction).

        Finds or creates the task's single ``AUD_TASK_RUN_LOG`` row; a live attempt of an earlier try
        (its worker died, Airflow moved on) is closed LOST first; a second live attempt of the same try
        is refused. A run that already ended (a task cleared in Airflow) is reopened first. The task's
        dependencies and run condition are judged first (docs/gates.md).

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
        attempt = Try(
            pipeline_code=pipeline_code,
            task_code=task_code,
            identity=identity,
            try_number=try_number,
            log_path=log_path,
            map_index=map_index,
            upstream_states=upstream_states,
        )
        adopted = self._adopt(attempt) if resume else None
        return adopted or self._start(attempt, claim_skipped)

    def _start(self, attempt: Try, claim_skipped: Callable[[], bool] | None) -> AttemptHandle:
        """Open the attempt, again after a restarted try numbering or a reopened run (a few rounds)."""
        number, note = attempt.try_number, None
        for _ in range(_ROUNDS):
            try:
                handle, skip = self._open(attempt, number, note)
            except self.engine.integrity_error() as exc:
                own = self._own_attempt(attempt, number) if self.repeating else None
                if own is not None:
                    return own
                number = self._renumber(attempt, number, exc)
                note = f"Airflow try {attempt.try_number}; its try numbering restarted (the DAG run was created again)"
                continue
            except _RunEnded as ended:
                if claim_skipped is not None and claim_skipped():
                    raise GateSkipped(
                        f"task {attempt.task_code} does not run: {ended.run.describe()} was skipped when this DAG "
                        "run claimed it"
                    ) from None
                self._reopen_for_task(attempt, ended.run, ended.task_id)
                continue
            if skip is not None:
                raise skip
            return handle
        raise StaleTransitionError(
            f"{attempt.identity.run_key} changed while task {attempt.task_code} was starting; retry"
        )

    def _open(self, attempt: Try, number: int, note: str | None) -> tuple[AttemptHandle, GateSkipped | None]:
        """One round: the single statement where it applies, else the judged transaction."""
        if note is None and attempt.map_index is None:
            handle = self._open_at_once(attempt, number)
            if handle is not None:
                return handle, None
        with self.engine.transaction(self.conn) as cur:
            context = self._context(cur, attempt, number)
            verdict = self._judge(cur, attempt, context)
            return self._write(cur, attempt, number=number, note=note, context=context, verdict=verdict)

    def _open_at_once(self, attempt: Try, number: int) -> AttemptHandle | None:
        """:data:`START_AT_ONCE`, where the dialect runs it; None when it wrote nothing (judge it in a transaction)."""
        now_db, identity = self.now()[1], attempt.identity
        call = StartCall(
            task_code=attempt.task_code,
            run_key=identity.run_key,
            pipeline_code=attempt.pipeline_code,
            started=now_db,
            attempt_number=number,
            owner_id=self.token,
            claimed_at=now_db,
            started_at=now_db,
            heartbeat_at=now_db,
            host=socket.gethostname(),
            pid=os.getpid(),
            log_path=attempt.log_path,
            requested_by=identity.actor,
            requested_by_kind=identity.actor_kind,
        )
        result = self.engine.write_at_once(self.conn, START_AT_ONCE, call)
        if result is None or not result.rows:
            return None
        attempt_id, task_run_id, pipeline_run_id = result.rows[0]
        return AttemptHandle(
            pipeline_run_id=int(pipeline_run_id),
            task_run_id=int(task_run_id),
            attempt_id=int(attempt_id),
            attempt_number=number,
            owner_id=self.token,
            task_code=attempt.task_code,
        )

    def _renumber(self, attempt: Try, number: int, exc: BaseException) -> int:
        """After a unique-index refusal: the attempt number to use next, or refuse a duplicate delivery.

        The number is taken by an ended attempt and nothing is live: Airflow restarted its try numbering (a
        DAG run deleted and created again under the same run id), so the task run's numbering continues.
        With a later try live, this is a late duplicate.
        """
        taken = self._attempt_taken(attempt, number)
        if taken is None or taken[0] in LIVE_ATTEMPT or taken[2]:
            raise StaleTransitionError(
                f"task {attempt.task_code} in {attempt.identity.run_key} already has a live attempt or a record of "
                f"try {attempt.try_number}: a second delivery is refused ({first_line(exc)})"
            ) from None
        return taken[1] + 1

    def _own_attempt(self, attempt: Try, number: int) -> AttemptHandle | None:
        """The attempt ``number`` of this try that this step's first send wrote (its ``OWNER_ID`` is the step's
        token), as a handle; None when it is not there.

        :raises GateSkipped: the first send recorded it skipped (its dependencies were not satisfied).
        """
        with self.engine.transaction(self.conn) as cur:
            row = self.exec(
                cur,
                "SELECT a.ATTEMPT_ID, a.TASK_RUN_ID, tr.PIPELINE_RUN_ID, a.STATUS, a.TASK_LOG "
                + _ATTEMPT_OF_KEYED_TRY
                + "AND a.OWNER_ID = ?",
                (*attempt.params(number), self.token),
            ).fetchone()
        if row is None:
            return None
        attempt_id, task_run_id, pipeline_run_id, status, task_log = row
        if status not in LIVE_ATTEMPT:
            raise GateSkipped(f"task {attempt.task_code} {task_log or SKIP_NOTE.strip()}")
        # consumes=True: consuming the gate decisions it recorded finds nothing when there are none.
        return AttemptHandle(
            pipeline_run_id=int(pipeline_run_id),
            task_run_id=int(task_run_id),
            attempt_id=int(attempt_id),
            attempt_number=number,
            owner_id=self.token,
            task_code=attempt.task_code,
            consumes=True,
            map_index=attempt.map_index,
        )

    def _adopt(self, attempt: Try) -> AttemptHandle | None:
        """Take over this try's attempt parked QUEUED by a reschedule or deferral; None when there is none."""
        owner = self.token
        with self.engine.transaction(self.conn) as cur:
            row = self.exec(
                cur,
                "SELECT a.ATTEMPT_ID, a.TASK_RUN_ID, tr.PIPELINE_RUN_ID "
                + _ATTEMPT_OF_KEYED_TRY
                + f"AND r.STATUS = '{RunStatus.IN_PROGRESS}' AND a.STATUS = '{AttemptStatus.QUEUED}' FOR UPDATE",
                attempt.params(attempt.try_number),
            ).fetchone()
            if row is None:
                return None
            self.exec(
                cur,
                f"UPDATE AUD_TASK_ATTEMPTS SET STATUS = '{AttemptStatus.RUNNING}', OWNER_ID = ?, HEARTBEAT_AT = ?, "  # noqa: S608 - constant SQL
                f"HOST = ?, PID = ?, TASK_LOG = NULL WHERE ATTEMPT_ID = ? AND STATUS = '{AttemptStatus.QUEUED}'",
                (owner, self.now()[1], socket.gethostname(), os.getpid(), row[0]),
            )
        # consumes=True: the attempt's gate decisions were recorded when it opened; consuming them on success
        # is one INSERT … SELECT that finds nothing when there is nothing to consume.
        attempt_id, task_run_id, pipeline_run_id = row
        return AttemptHandle(
            pipeline_run_id=int(pipeline_run_id),
            task_run_id=int(task_run_id),
            attempt_id=int(attempt_id),
            attempt_number=attempt.try_number,
            owner_id=owner,
            task_code=attempt.task_code,
            consumes=True,
            map_index=attempt.map_index,
        )

    def _attempt_taken(self, attempt: Try, number: int) -> tuple[str, int, bool] | None:
        """Attempt ``number`` of the task (and map index) in the keyed run: its status, the highest attempt
        number, and whether any attempt of the task run and map index is live."""
        with self.engine.transaction(self.conn) as cur:
            row = self.exec(
                cur,
                "SELECT a.STATUS, (SELECT MAX(m.ATTEMPT_NUMBER) FROM AUD_TASK_ATTEMPTS m WHERE m.TASK_RUN_ID = "  # noqa: S608 - constant SQL
                "a.TASK_RUN_ID AND COALESCE(m.MAP_INDEX, -1) = COALESCE(a.MAP_INDEX, -1)), (SELECT COUNT(*) FROM "
                "AUD_TASK_ATTEMPTS l WHERE l.TASK_RUN_ID = a.TASK_RUN_ID AND COALESCE(l.MAP_INDEX, -1) = "
                f"COALESCE(a.MAP_INDEX, -1) AND l.STATUS IN {LIVE_SQL}) " + _ATTEMPT_OF_KEYED_TRY,
                attempt.params(number),
            ).fetchone()
        if row is None:
            return None
        status, highest, live = row
        return status, int(highest), int(live) > 0

    def _context(self, cur: Cursor, attempt: Try, number: int) -> _Context:
        """Read what the start decides on.

        :raises _RunEnded: the keyed run is not IN-PROGRESS (nothing written).
        """
        params = (
            number,
            map_key(attempt.map_index),
            attempt.task_code,
            attempt.identity.run_key,
            attempt.pipeline_code,
        )
        row = self.exec(cur, _TRY_CONTEXT, params).fetchone()
        if row is None:
            self._explain_missing(cur, attempt)
        width = RunRow.WIDTH
        task_id, run = int(row[0]), self.run_row(row[1 : 1 + width])
        condition, count, edges, paused, live = row[1 + width :]
        if run.status != RunStatus.IN_PROGRESS:
            raise _RunEnded(run, task_id)
        return _Context(
            task_id=task_id,
            run=run,
            condition=condition,
            condition_count=None if count is None else int(count),
            has_edges=int(edges) > 0,
            paused=int(paused) > 0,
            earlier_live=int(live) > 0,
        )

    def _judge(self, cur: Cursor, attempt: Try, context: _Context) -> GateVerdict | None:
        """The pause and the task's dependencies (docs/gates.md); None: the task has none.

        :raises GateWaiting: the pipeline is paused, or an upstream is still IN-PROGRESS.
        """
        run, code = context.run, attempt.pipeline_code
        if context.paused:
            pause = self.open_pause(cur, run.pipeline_id)
            if pause is not None:
                raise GateWaiting(f"task {attempt.task_code} does not start: {pause.describe(code)}")
        if not context.has_edges:
            return None

        def observe(edge: Edge) -> Observed:
            if edge.same_pipeline:
                return self.gates.observe_same_run(cur, edge, run.pipeline_run_id, attempt.upstream_states)
            return self.gates.observe_latest(cur, edge)

        edges = self.gates.task_edges(cur, run.pipeline_id, context.task_id)
        verdict = self.gates.judge(edges, observe, context.condition, context.condition_count)
        events.report(events.GATE, pipeline=code, task=attempt.task_code, result=verdict.result)
        if verdict.result == WAIT:
            raise GateWaiting(f"task {attempt.task_code}: {verdict.reason}")
        return verdict

    def _write(
        self,
        cur: Cursor,
        attempt: Try,
        *,
        number: int,
        note: str | None,
        context: _Context,
        verdict: GateVerdict | None,
    ) -> tuple[AttemptHandle, GateSkipped | None]:
        """Close a dead earlier try's attempt, upsert the task run, insert the attempt (CANCELLED when the
        dependencies are not satisfied, with the task run SKIPPED) and record the gate decisions."""
        run, now_db = context.run, self.now()[1]
        if context.earlier_live:
            self._close_earlier(cur, attempt, number=number, context=context, now_db=now_db)
        task_run_id = self.returning(
            cur,
            "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, START_DATE, STATUS, ATTEMPT_COUNT) "
            "VALUES (?, ?, ?, 'IN-PROGRESS', 1) ON CONFLICT (TASK_ID, PIPELINE_RUN_ID) DO UPDATE SET "
            "STATUS = 'IN-PROGRESS', END_DATE = NULL, ERROR_MESSAGE = NULL, "
            "ATTEMPT_COUNT = AUD_TASK_RUN_LOG.ATTEMPT_COUNT + 1 RETURNING TASK_RUN_ID",
            (context.task_id, run.pipeline_run_id, now_db),
        )
        unsatisfied = verdict is not None and verdict.result == UNSATISFIED
        skip = clean_text(f"{SKIP_NOTE}{verdict.reason}") if verdict is not None and unsatisfied else None
        handle = self._insert_attempt(
            cur,
            attempt,
            number=number,
            task_run_id=int(task_run_id),
            run=run,
            log_and_error=(skip or note, skip),
            now_db=now_db,
        )
        if verdict is not None:
            self.gates.record(
                cur, verdict, pipeline_run_id=run.pipeline_run_id, attempt_id=handle.attempt_id, now_db=now_db
            )
            consumes = any(v.result == SATISFIED and not v.edge.same_pipeline for v in verdict.decided)
            handle = replace(handle, consumes=consumes)
        if skip is None:
            return handle, None
        if attempt.map_index is None:
            self.exec(
                cur,
                "UPDATE AUD_TASK_RUN_LOG SET STATUS = 'SKIPPED', END_DATE = ?, TASK_LOG = ? WHERE TASK_RUN_ID = ?",
                (now_db, skip, task_run_id),
            )
        else:
            settle_mapped(self, cur, int(task_run_id), map_count=None, now_db=now_db)
        return handle, GateSkipped(f"task {attempt.task_code} {skip}")

    def _close_earlier(
        self, cur: Cursor, attempt: Try, *, number: int, context: _Context, now_db: Any
    ) -> None:
        """An earlier try's worker died without recording: close its attempt LOST."""
        lost = (
            f"lost: Airflow started try {attempt.try_number} while this attempt was still live (its worker "
            "ended without recording)"
        )
        self.exec(
            cur,
            "UPDATE AUD_TASK_ATTEMPTS SET STATUS = 'LOST', ENDED_AT = ?, ERROR_MESSAGE = ? "  # noqa: S608 - constant SQL
            f"WHERE STATUS IN {LIVE_SQL} AND ATTEMPT_NUMBER < ? AND COALESCE(MAP_INDEX, -1) = ? "
            "AND TASK_RUN_ID = (SELECT TASK_RUN_ID FROM AUD_TASK_RUN_LOG WHERE TASK_ID = ? AND PIPELINE_RUN_ID = ?)",
            (now_db, lost, number, map_key(attempt.map_index), context.task_id, context.run.pipeline_run_id),
        )

    def _insert_attempt(
        self,
        cur: Cursor,
        attempt: Try,
        *,
        number: int,
        task_run_id: int,
        run: RunRow,
        log_and_error: tuple[str | None, str | None],
        now_db: Any,
    ) -> AttemptHandle:
        """Insert the attempt RUNNING, or CANCELLED and ended when it carries an error (a skip)."""
        owner, ended = self.token, log_and_error[1] is not None
        times = (now_db, now_db, now_db, now_db if ended else None)
        worker = (socket.gethostname(), os.getpid(), attempt.log_path)
        requested = (attempt.identity.actor, attempt.identity.actor_kind)
        status = AttemptStatus.CANCELLED if ended else AttemptStatus.RUNNING
        attempt_id = self.returning(
            cur,
            "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, MAP_INDEX, STATUS, OWNER_ID, CLAIMED_AT, "
            "STARTED_AT, HEARTBEAT_AT, ENDED_AT, HOST, PID, LOG_PATH, TASK_LOG, ERROR_MESSAGE, REQUESTED_BY, "
            "REQUESTED_BY_KIND) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING ATTEMPT_ID",
            (
                task_run_id,
                number,
                attempt.map_index,
                status,
                owner,
                *times,
                *worker,
                *log_and_error,
                *requested,
            ),
        )
        return AttemptHandle(
            pipeline_run_id=run.pipeline_run_id,
            task_run_id=task_run_id,
            attempt_id=int(attempt_id),
            attempt_number=number,
            owner_id=owner,
            task_code=attempt.task_code,
            map_index=attempt.map_index,
        )

    def _explain_missing(self, cur: Cursor, attempt: Try) -> NoReturn:
        """:raises MetadataError: the task is not active. :raises RunStateError: the claim did not run."""
        code, task_code = attempt.pipeline_code, attempt.task_code
        pipeline_id = self.active_pipeline(cur, code)
        found = self.returning(
            cur,
            "SELECT COUNT(*) FROM CFG_TASKS WHERE PIPELINE_ID = ? AND TASK_CODE = ? AND ACTIVE_FLAG = 'Y'",
            (pipeline_id, task_code),
        )
        if not found:
            raise MetadataError(
                f"task {task_code} is not an active task of pipeline {code} in CFG_TASKS of the Engine DB "
                f"{self.engine.describe()}; add it through a project migration, or fix task_code"
            )
        raise RunStateError(
            f"no Engine run of pipeline {code} has the run key {attempt.identity.run_key}: the pipeline's claim task "
            "has not run for this DAG run; put ClaimPipelineRunOperator (or etl_craft_pipeline) upstream of this task"
        )

    def _reopen_for_task(self, attempt: Try, run: RunRow, task_id: int) -> None:
        """Reopen the ended run a cleared task belongs to, under the pipeline lock, unless another run holds
        the pipeline now."""
        with self.locked(attempt.pipeline_code) as cur:
            busy = self.exec(
                cur,
                f"SELECT {RunRow.COLUMNS} FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_ID = ? "  # noqa: S608 - constant
                "AND r.STATUS = 'IN-PROGRESS' AND r.PIPELINE_RUN_ID <> ?",
                (run.pipeline_id, run.pipeline_run_id),
            ).fetchone()
            if busy is not None:
                raise StaleTransitionError(
                    f"task {attempt.task_code} was cleared in {attempt.identity.run_key}, whose {run.describe()} has "
                    f"ended, but {self.run_row(busy).describe()} holds the pipeline now; retry after it ends"
                )
            current = self.exec(
                cur,
                f"SELECT {RunRow.COLUMNS} FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_RUN_ID = ?",  # noqa: S608
                (run.pipeline_run_id,),
            ).fetchone()
            ended = None if current is None else self.run_row(current)
            if ended is not None and ended.status != RunStatus.IN_PROGRESS:
                cleared = f"task {attempt.task_code} ran again in Airflow (cleared)"
                self.reopen(cur, ended, attempt.identity, cleared, task_id=task_id)
