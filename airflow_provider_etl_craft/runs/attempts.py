"""End a live attempt, or park it while Airflow reschedules or defers its try (docs/lifecycle.md, *Attempts*).

The rules are :class:`EndAttempt` and :class:`ParkAttempt`. An end's common case (unmapped, nothing to consume,
not a skip) also has a one-statement form, :data:`END_AT_ONCE`, which the dialect runs where the database has
data-modifying ``WITH`` (PostgreSQL); ``tests/integration/test_claim_finish_at_once.py`` plays the same task
ends with and without it and compares every ``AUD_`` row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from msgspec import Struct

from airflow_provider_etl_craft.engine.dbapi import Cursor
from airflow_provider_etl_craft.engine.dialects.base import OneStatement
from airflow_provider_etl_craft.errors import StaleTransitionError
from airflow_provider_etl_craft.runs.counts import TaskCounts, clean_text
from airflow_provider_etl_craft.runs.mapped import IndexAttempt, settle
from airflow_provider_etl_craft.runs.records import SKIP_NOTE, AttemptHandle, map_key
from airflow_provider_etl_craft.runs.transition import Transition
from airflow_provider_etl_craft.runs.vocabulary import (
    ATTEMPT_ENDS,
    LIVE_SQL,
    AttemptEnd,
    AttemptStatus,
    TaskRunStatus,
)

#: Park a RUNNING attempt QUEUED; parameters: now (queued at), now (heartbeat), note, attempt id, owner.
_PARK = (
    f"UPDATE AUD_TASK_ATTEMPTS SET STATUS = '{AttemptStatus.QUEUED}', QUEUED_AT = ?, HEARTBEAT_AT = ?, TASK_LOG = ? "  # noqa: S608 - constant SQL
    f"WHERE ATTEMPT_ID = ? AND OWNER_ID = ? AND STATUS = '{AttemptStatus.RUNNING}'"
)


#: End a live attempt and copy it to its task run in one statement (no consumption to write), and announce
#: the change (one row per task run updated, so the row count is what an UPDATE's would be). Parameters:
#: :meth:`EndCall.params`, then the change channel and notice prefix (the dialect adds them).
END_AT_ONCE = OneStatement(
    "WITH a AS (UPDATE AUD_TASK_ATTEMPTS SET STATUS = ?, ENDED_AT = ?, HEARTBEAT_AT = ?, SOURCE_COUNT = ?, "  # noqa: S608 - constant SQL
    "TARGET_COUNT = ?, INSERT_COUNT = ?, UPDATE_COUNT = ?, DELETE_COUNT = ?, ROWS_WRITTEN = ?, ERROR_MESSAGE = ? "
    f"WHERE ATTEMPT_ID = ? AND OWNER_ID = ? AND STATUS IN {LIVE_SQL} RETURNING TASK_RUN_ID), "
    "t AS (UPDATE AUD_TASK_RUN_LOG SET STATUS = ?, END_DATE = ?, SOURCE_COUNT = ?, TARGET_COUNT = ?, INSERT_COUNT = ?, "
    "UPDATE_COUNT = ?, DELETE_COUNT = ?, ROWS_WRITTEN = ?, ERROR_MESSAGE = ? "
    "WHERE TASK_RUN_ID IN (SELECT TASK_RUN_ID FROM a) RETURNING PIPELINE_RUN_ID) "
    "SELECT pg_notify(?, ? || r.PIPELINE_ID) FROM t JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = t.PIPELINE_RUN_ID",
    notifies=True,
)


class EndCall(NamedTuple):
    """What :data:`END_AT_ONCE` writes: the attempt's end, then its task run's."""

    attempt_status: AttemptStatus
    ended_at: Any
    #: The six counts of :class:`~.counts.TaskCounts`, in its order (the attempt's and the task run's).
    counts: tuple[int | None, ...]
    error: str | None
    attempt_id: int
    owner_id: str
    run_status: TaskRunStatus

    def params(self) -> tuple[Any, ...]:
        """The statement's parameters, in its order."""
        attempt = (self.attempt_status, self.ended_at, self.ended_at, *self.counts, self.error)
        task_run = (self.run_status, self.ended_at, *self.counts, self.error)
        return (*attempt, self.attempt_id, self.owner_id, *task_run)


class ParkAttempt(Transition):
    """Park the live attempt QUEUED while no worker runs its try (a reschedule or a deferral).

    Repeatable after a lost session: an attempt already QUEUED under the handle's owner is its own.
    """

    repeatable = True

    def __call__(self, handle: AttemptHandle, note: str) -> None:
        """Park the live attempt QUEUED while Airflow reschedules or defers this try (no worker runs it).

        The attempt stays live, so nothing else can open one for this try; the try's next poke or its
        resumed method takes it over (``start_task(resume=True)``), and ATTEMPT_COUNT does not move.

        :raises StaleTransitionError: the attempt is no longer this try's (closed by a later try or finish).
        """
        now_db = self.now()[1]
        updated = self.engine.write_alone(
            self.conn,
            _PARK,
            (now_db, now_db, clean_text(note), handle.attempt_id, handle.owner_id),
        ).rowcount
        if updated != 1 and not left_as(self, handle, AttemptStatus.QUEUED):
            raise closed_by_someone_else(handle)


class _Ending(Struct, frozen=True):
    """What an ended attempt writes to its row and its task run's."""

    attempt_status: AttemptStatus
    run_status: TaskRunStatus
    counts: tuple[int | None, ...]
    error: str | None
    #: TASK_LOG (a skip's reason; None keeps the row's).
    note: str | None
    now_db: Any


class EndAttempt(Transition):
    """End the attempt and copy it to its task run (one statement where the dialect has one, else one
    transaction).

    Repeatable after a lost session, and idempotent for the same handle: an attempt that already ended with
    the same status under the handle's owner was ended by this call (its reply was lost); nothing is written
    twice, consumption included.
    """

    repeatable = True

    def __call__(
        self,
        handle: AttemptHandle,
        status: AttemptEnd | str,
        counts: TaskCounts | None = None,
        error: str | None = None,
        *,
        map_count: int | None = None,
    ) -> None:
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
        message = None if error is None else clean_text(error)
        note = None
        if status == AttemptEnd.SKIPPED:
            note, message = clean_text(SKIP_NOTE + (error or "")), None
        attempt_status, run_status = ATTEMPT_ENDS[AttemptEnd(status)]
        ending = _Ending(
            attempt_status=attempt_status,
            run_status=run_status,
            counts=(counts or TaskCounts()).values(),
            error=message,
            note=note,
            now_db=self.now()[1],
        )
        consume = status == AttemptEnd.SUCCESS and handle.consumes
        if note is None and handle.map_index is None and not consume:
            call = EndCall(
                attempt_status=ending.attempt_status,
                ended_at=ending.now_db,
                counts=ending.counts,
                error=message,
                attempt_id=handle.attempt_id,
                owner_id=handle.owner_id,
                run_status=ending.run_status,
            )
            result = self.engine.write_at_once(self.conn, END_AT_ONCE, call.params())
            if result is not None:
                updated = result.rowcount
                if updated != 1 and not left_as(self, handle, ending.attempt_status):
                    raise closed_by_someone_else(handle)
                return
        try:
            self._in_transaction(handle, ending, map_count, consume)
        except StaleTransitionError:
            if not left_as(self, handle, ending.attempt_status):
                raise

    def _in_transaction(
        self, handle: AttemptHandle, ending: _Ending, map_count: int | None, consume: bool
    ) -> None:
        now_db, counts, error, note = ending.now_db, ending.counts, ending.error, ending.note
        with self.engine.transaction(self.conn) as cur:
            updated = self.exec(
                cur,
                "UPDATE AUD_TASK_ATTEMPTS SET STATUS = ?, ENDED_AT = ?, HEARTBEAT_AT = ?, SOURCE_COUNT = ?, "  # noqa: S608 - constant SQL
                "TARGET_COUNT = ?, INSERT_COUNT = ?, UPDATE_COUNT = ?, DELETE_COUNT = ?, ROWS_WRITTEN = ?, "
                "ERROR_MESSAGE = ?, TASK_LOG = COALESCE(?, TASK_LOG) WHERE ATTEMPT_ID = ? AND OWNER_ID = ? "
                f"AND STATUS IN {LIVE_SQL}",
                (
                    ending.attempt_status,
                    now_db,
                    now_db,
                    *counts,
                    error,
                    note,
                    handle.attempt_id,
                    handle.owner_id,
                ),
            ).rowcount
            if updated != 1:
                raise closed_by_someone_else(handle)
            if handle.map_index is not None:
                settle_mapped(self, cur, handle.task_run_id, map_count=map_count, now_db=now_db)
            else:
                self.exec(
                    cur,
                    "UPDATE AUD_TASK_RUN_LOG SET STATUS = ?, END_DATE = ?, SOURCE_COUNT = ?, TARGET_COUNT = ?, "
                    "INSERT_COUNT = ?, UPDATE_COUNT = ?, DELETE_COUNT = ?, ROWS_WRITTEN = ?, ERROR_MESSAGE = ?, "
                    "TASK_LOG = COALESCE(?, TASK_LOG) WHERE TASK_RUN_ID = ?",
                    (ending.run_status, now_db, *counts, error, note, handle.task_run_id),
                )
            if consume:
                self.gates.consume_attempt(cur, handle.attempt_id, now_db)
            self.announce(cur, pipeline_run_id=handle.pipeline_run_id)


def settle_mapped(
    transition: Transition,
    cur: Cursor,
    task_run_id: int,
    *,
    map_count: int | None,
    now_db: Any,
    airflow_only: Mapping[int, IndexAttempt] | None = None,
) -> str:
    """Write a mapped task run's status and counts from its map indexes' latest attempts; returns it.

    :param airflow_only: map indexes that recorded no attempt, as Airflow reports them (finish only).
    """
    latest: dict[int, IndexAttempt] = dict(airflow_only or {})
    for map_index, status, log, error, *counts in transition.exec(
        cur,
        "SELECT MAP_INDEX, STATUS, TASK_LOG, ERROR_MESSAGE, SOURCE_COUNT, TARGET_COUNT, INSERT_COUNT, "
        "UPDATE_COUNT, DELETE_COUNT, ROWS_WRITTEN FROM AUD_TASK_ATTEMPTS WHERE TASK_RUN_ID = ? "
        "ORDER BY COALESCE(MAP_INDEX, -1), ATTEMPT_NUMBER",
        (task_run_id,),
    ).fetchall():
        skipped = status == AttemptStatus.CANCELLED and (log or "").startswith(SKIP_NOTE)
        latest[map_key(map_index)] = IndexAttempt(AttemptStatus(status), skipped, error, counts)
    settled = settle(latest, map_count)
    transition.exec(
        cur,
        "UPDATE AUD_TASK_RUN_LOG SET STATUS = ?, END_DATE = ?, SOURCE_COUNT = ?, TARGET_COUNT = ?, "
        "INSERT_COUNT = ?, UPDATE_COUNT = ?, DELETE_COUNT = ?, ROWS_WRITTEN = ?, ERROR_MESSAGE = ?, TASK_LOG = ? "
        "WHERE TASK_RUN_ID = ?",
        (
            settled.status,
            None if settled.status == TaskRunStatus.IN_PROGRESS else now_db,
            *settled.counts,
            settled.error,
            settled.log,
            task_run_id,
        ),
    )
    return settled.status


def left_as(transition: Transition, handle: AttemptHandle, status: AttemptStatus) -> bool:
    """Whether the handle's attempt is already ``status`` under the handle's owner: the same call's effect,
    committed while its reply was lost (nobody else writes that owner; a later try or the finish closes it
    LOST)."""
    rows = transition.engine.query(
        transition.conn,
        "SELECT STATUS FROM AUD_TASK_ATTEMPTS WHERE ATTEMPT_ID = ? AND OWNER_ID = ?",
        (handle.attempt_id, handle.owner_id),
    )
    return bool(rows) and rows[0][0] == status


def closed_by_someone_else(handle: AttemptHandle) -> StaleTransitionError:
    return StaleTransitionError(
        f"attempt {handle.attempt_number} of task {handle.task_code} (ATTEMPT_ID {handle.attempt_id}) "
        "was closed by someone else (a later try or the finish task); its result is not recorded"
    )
