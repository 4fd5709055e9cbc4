"""What every run-lifecycle transition shares: its connection, the pipeline lock, and the reads and writes
several transitions make (the active pipeline, its open pause, a reopen, an intervention row).

Each transition (:mod:`~.claim`, :mod:`~.pauses`, :mod:`~.start`, :mod:`~.attempts`, :mod:`~.finish`) is a
subclass with one public entry; :class:`~.lifecycle.RunLifecycle` is the front operators and the CLI call.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar

from msgspec import structs

from airflow_provider_etl_craft.engine import actor
from airflow_provider_etl_craft.engine.dbapi import Connection, Cursor
from airflow_provider_etl_craft.engine.dialects.base import EngineDialect, SessionLost
from airflow_provider_etl_craft.engine.locks import pipeline_lock
from airflow_provider_etl_craft.errors import EtlCraftError, MetadataError, StaleTransitionError, first_line
from airflow_provider_etl_craft.runs import events
from airflow_provider_etl_craft.runs.counts import clean_text
from airflow_provider_etl_craft.runs.gates import Gates
from airflow_provider_etl_craft.runs.identity import ACTOR_KIND, RunIdentity
from airflow_provider_etl_craft.runs.records import AttemptHandle, Pause, Pipeline, RunRow
from airflow_provider_etl_craft.runs.vocabulary import InterventionAction, RunStatus

log = logging.getLogger(__name__)


class Transition:
    """One kind of state change, on an open autocommit connection; every change is one transaction.

    :param engine: the dialect of the Engine DB.
    :param conn: a connection from ``engine.connect()``; the caller closes it.
    :param lock_timeout: seconds to wait for ``pipeline:<code>`` locks.
    """

    #: Whether the step is sent once more on a new connection when its session is lost (see
    #: :func:`_repeated_when_lost`): true of the steps that recognise their own earlier effect.
    repeatable: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Each transition's entry writes as the run it serves (see :func:`_as_run_actor`); a repeatable one
        is sent again once after a lost session (:func:`_repeated_when_lost`)."""
        super().__init_subclass__(**kwargs)
        entry = cls.__dict__.get("__call__")
        if entry is not None:
            if cls.repeatable:
                entry = _repeated_when_lost(entry)
            setattr(cls, "__call__", _as_run_actor(entry))  # noqa: B010 - the class's own entry, wrapped

    def __init__(
        self,
        engine: EngineDialect,
        conn: Connection,
        lock_timeout: float | None,
        gates: Gates,
        *,
        reconnect: Callable[[str], Connection] | None = None,
    ) -> None:
        self.engine = engine
        self.conn = conn
        self.lock_timeout = lock_timeout
        self.gates = gates
        #: A new connection in place of a lost one (the lifecycle's), or None: a lost session is not repeated.
        self.reconnect = reconnect
        #: The step's token: the ``OWNER_ID`` of an attempt it opens, so a repeat knows the attempt its first
        #: send may have committed for its own (docs/high-availability.md, "In-doubt commits").
        self.token = owner_token()
        #: True while the step is sent again after a lost session.
        self.repeating = False
        #: When the step began: what it ended since then may be its own first send's (a repeat's evidence).
        self.began = engine.now()
        #: The time (as stored) of the row the step last wrote, which a repeat recognises it by.
        self.wrote_at: Any = None

    @contextmanager
    def locked(self, pipeline_code: str) -> Iterator[Any]:
        """A write transaction holding the ``pipeline:<code>`` lock, released by its COMMIT or ROLLBACK.

        The time it took to begin and hold the lock is reported (:data:`.events.LOCK_WAIT`).
        """
        began = time.monotonic()
        with self.engine.transaction(
            self.conn, lock=pipeline_lock(pipeline_code), lock_timeout=self.lock_timeout
        ) as cur:
            self.report_lock_wait(pipeline_code, time.monotonic() - began, "transaction")
            yield cur

    def report_lock_wait(self, pipeline_code: str, seconds: float, how: str) -> None:
        """Report how long this step waited for the pipeline lock (:data:`.events.LOCK_WAIT`)."""
        events.report(
            events.LOCK_WAIT, pipeline=pipeline_code, step=self.step_name(), seconds=seconds, how=how
        )

    @classmethod
    def step_name(cls) -> str:
        """The step's name in reports: its class name in snake case (``claim``, ``finish_run``, …)."""
        return "".join(f"_{c.lower()}" if c.isupper() else c for c in cls.__name__).lstrip("_")

    def exec(self, cur: Cursor, sql: str, params: tuple[Any, ...] = ()) -> Cursor:
        cur.execute(self.engine.sql(sql), params)
        return cur

    def returning(self, cur: Cursor, sql: str, params: tuple[Any, ...] = ()) -> Any:
        """The first column of the one row an ``INSERT … RETURNING`` (or an aggregate) gives back."""
        row = self.exec(cur, sql, params).fetchone()
        assert row is not None, "a statement that returns one row returned none"
        return row[0]

    def announce(
        self, cur: Cursor, pipeline_id: int | None = None, pipeline_run_id: int | None = None
    ) -> None:
        """Tell deferred waits (:mod:`~.changes`) that this transaction, once committed, ended something of the
        pipeline (a run, an attempt, a pause); nothing where the dialect has no notices."""
        notice = self.engine.change_notice(pipeline_id, pipeline_run_id)
        if notice is not None:
            self.exec(cur, *notice)

    def now(self) -> tuple[datetime, Any]:
        """The current time, and as the database stores it."""
        now = self.engine.now()
        return now, self.engine.to_db_time(now)

    def stamped(self, value: datetime | None) -> bool:
        """Whether a time read back is the one this step wrote (:attr:`wrote_at`): how a repeated step knows a
        row its first send wrote."""
        return (
            value is not None
            and self.wrote_at is not None
            and value == self.engine.from_db_time(self.wrote_at)
        )

    def run_row(self, row: tuple[Any, ...]) -> RunRow:
        return RunRow.from_db(self.engine, row)

    def active_pipeline(self, cur: Cursor, code: str) -> int:
        """``PIPELINE_ID`` of the active pipeline ``code``.

        :raises MetadataError: no active row has this code (says whether it is retired or unknown).
        """
        row = self.exec(cur, Pipeline.BY_CODE, (code,)).fetchone()
        pipeline = None if row is None else Pipeline.from_db(row)
        if pipeline is not None and pipeline.active_flag == "Y":
            return pipeline.pipeline_id
        state = "does not exist" if pipeline is None else "is retired (ACTIVE_FLAG='N')"
        raise MetadataError(
            f"pipeline {code} {state} in CFG_PIPELINES of the Engine DB {self.engine.describe()}; add or "
            "re-activate it through a project migration, or fix pipeline_code"
        )

    def open_pause(self, cur: Cursor, pipeline_id: int) -> Pause | None:
        row = self.exec(cur, Pause.OPEN, (pipeline_id,)).fetchone()
        return None if row is None else Pause.from_db(self.engine, row)

    def intervention(
        self,
        cur: Cursor,
        run: RunRow,
        action: InterventionAction,
        change: tuple[str | None, str | None],
        *,
        reason: str,
        identity: RunIdentity,
        task_id: int | None = None,
    ) -> None:
        """Record a change made outside the normal flow (``AUD_RUN_INTERVENTIONS``): ``change`` is
        (from status, to status)."""
        self.exec(
            cur,
            "INSERT INTO AUD_RUN_INTERVENTIONS (PIPELINE_ID, PIPELINE_RUN_ID, TASK_ID, ACTION, FROM_STATUS, "
            "TO_STATUS, REASON, REQUESTED_BY, REQUESTED_BY_KIND, REQUESTED_AT) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run.pipeline_id,
                run.pipeline_run_id,
                task_id,
                action,
                *change,
                clean_text(reason),
                identity.actor,
                identity.actor_kind,
                self.now()[1],
            ),
        )

    def reopen(
        self, cur: Cursor, run: RunRow, identity: RunIdentity, reason: str, *, task_id: int | None = None
    ) -> None:
        """Put an ended run back IN-PROGRESS with REPAIR_PENDING='Y' and a REOPEN intervention.

        :raises StaleTransitionError: the run changed since it was read.
        """
        updated = self.exec(
            cur,
            "UPDATE AUD_PIPELINES_RUN_LOG SET STATUS = 'IN-PROGRESS', END_DATE = NULL, ENDED_BY = NULL, "
            "ENDED_BY_KIND = NULL, REPAIR_PENDING = 'Y' WHERE PIPELINE_RUN_ID = ? AND STATUS = ?",
            (run.pipeline_run_id, run.status),
        ).rowcount
        if updated != 1:
            raise StaleTransitionError(
                f"{run.describe()} changed while it was being reopened; a retry re-reads it"
            )
        self.intervention(
            cur,
            run,
            InterventionAction.REOPEN,
            (run.status, RunStatus.IN_PROGRESS),
            reason=reason,
            identity=identity,
            task_id=task_id,
        )

    def conflict(self, exc: BaseException, what: str) -> StaleTransitionError:
        """A unique index refused a write: another worker got there first."""
        return StaleTransitionError(
            f"{what}: another worker changed the Engine DB first ({first_line(exc)}); a retry re-reads it"
        )


def _as_run_actor(entry: Callable[..., Any]) -> Callable[..., Any]:
    """``entry`` with every transaction it opens carrying the run's actor (etl-craft's guards read it; see
    docs/etl-craft-parity.md, "Sharing an Engine DB"): the actor of its RunIdentity argument, or the one an
    AttemptHandle argument was opened by. A handle it returns remembers that actor."""

    @functools.wraps(entry)
    def call(self: Transition, *args: Any, **kwargs: Any) -> Any:
        name = None
        for value in (*args, *kwargs.values()):
            if isinstance(value, RunIdentity | AttemptHandle) and value.actor:
                name = value.actor
        if name is None:
            return entry(self, *args, **kwargs)
        with actor.acting_as(name, ACTOR_KIND):
            result = entry(self, *args, **kwargs)
        if isinstance(result, AttemptHandle) and result.actor is None:
            return structs.replace(result, actor=name)
        return result

    return call


def _repeated_when_lost(entry: Callable[..., Any]) -> Callable[..., Any]:
    """``entry``, sent once more on a new connection when its session is lost (or a standby answered it).

    A lost COMMIT leaves the step in doubt; the repeat finds its own effect if the first send committed it
    (each repeatable step says how), and does the step otherwise. One repeat only: Airflow's retries are the
    loop; the new connection itself is tried for a short while (:meth:`EngineDialect.reconnect`). When no
    connection comes, the first error leaves, typed (in doubt, or not committed).
    """

    @functools.wraps(entry)
    def call(self: Transition, *args: Any, **kwargs: Any) -> Any:
        try:
            return entry(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - only what a new connection may get through is repeated
            if self.reconnect is None or self.repeating or not self.engine.reconnects(exc):
                raise
            lost = exc
        step = type(self).__name__
        if isinstance(lost, SessionLost):
            what = "its commit is in doubt"
        elif self.engine.session_lost(lost):
            what = "its session was lost"
        else:
            what = "a standby answered it"
        log.warning(
            "etl-craft: %s: %s (%s); sending it again on a new connection", step, what, first_line(lost)
        )
        try:
            self.conn = self.reconnect(step)
        except EtlCraftError as failed:
            error = self.engine.classify(lost)
            error.args = (f"{error}; no new connection came within the reconnect window: {failed}",)
            raise error from None
        self.repeating = True
        return entry(self, *args, **kwargs)

    return call


def owner_token() -> str:
    """``OWNER_ID`` of an attempt this process writes: host, pid and a random part (a lease token)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
