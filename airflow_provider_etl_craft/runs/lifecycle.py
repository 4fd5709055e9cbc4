"""The run lifecycle (SPEC §9): the one front operators and the CLI call.

Every state change is one Engine DB transaction (or one statement), and the schema's unique indexes (one
IN-PROGRESS run per pipeline, one task-run row per task and run, one live attempt per task run) are the
last word on races: a lost race surfaces as :class:`StaleTransitionError`, never as a duplicate row. Each
transition lives in its own module: :mod:`~.claim` (claim, abandonment), :mod:`~.pauses`, :mod:`~.start`
(opening an attempt), :mod:`~.attempts` (parking and ending one), :mod:`~.finish`; this class holds no
logic of its own and no Airflow imports.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Generic, TypeVar

from airflow_provider_etl_craft.engine.dbapi import Connection
from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
from airflow_provider_etl_craft.runs.attempts import EndAttempt, ParkAttempt
from airflow_provider_etl_craft.runs.claim import Abandon, Claim
from airflow_provider_etl_craft.runs.finish import FinishRun
from airflow_provider_etl_craft.runs.gates import Gates
from airflow_provider_etl_craft.runs.pauses import EndPause, OpenPause
from airflow_provider_etl_craft.runs.start import StartAttempt
from airflow_provider_etl_craft.runs.transition import Transition
from airflow_provider_etl_craft.settings import OPTIONS

#: Seconds to wait for the ``pipeline:<code>`` lock before a retryable LOCK_TIMEOUT (``[etl_craft] lock_timeout``).
DEFAULT_LOCK_TIMEOUT = float(OPTIONS["lock_timeout"].default)

_T = TypeVar("_T", bound=Transition)


class _Bound(Generic[_T]):
    """A transition as an attribute of :class:`RunLifecycle`: bound to its connection on each access, so
    ``lifecycle.claim(...)`` calls :meth:`Claim.__call__ <.claim.Claim.__call__>` (its signature and docs)."""

    def __init__(self, transition: type[_T]) -> None:
        self.transition = transition

    def __get__(self, lifecycle: RunLifecycle, owner: type | None = None) -> _T:
        return self.transition(
            lifecycle.engine,
            lifecycle.conn,
            lifecycle.lock_timeout,
            lifecycle.gates,
            None if lifecycle.reconnect_with is None else lifecycle.reconnect,
        )


class RunLifecycle:
    """Engine-side bookkeeping of pipeline runs on one open connection (autocommit; transactions explicit).

    :param engine: the dialect of the Engine DB.
    :param conn: a connection from ``engine.connect()``; the caller closes :attr:`conn` (a lost one is replaced).
    :param lock_timeout: seconds to wait for ``pipeline:<code>`` locks.
    :param reconnect_with: opens a new connection (``engine.reconnect``) when a step's session is lost; the
        step is then sent once more on it (docs/high-availability.md, "In-doubt commits"). None: not repeated.
    """

    def __init__(
        self,
        engine: EngineDialect,
        conn: Connection,
        lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
        reconnect_with: Callable[[str], Connection] | None = None,
    ) -> None:
        self.engine = engine
        self.conn = conn
        self.lock_timeout = lock_timeout
        self.gates = Gates(engine)
        self.reconnect_with = reconnect_with

    def reconnect(self, step: str) -> Connection:
        """Close the lost connection and open the one the next steps use (see ``reconnect_with``)."""
        assert self.reconnect_with is not None
        with suppress(Exception):  # the session is gone already
            self.conn.close()
        self.conn = self.reconnect_with(step)
        return self.conn

    claim = _Bound(Claim)
    close_abandoned = _Bound(Abandon)
    pause = _Bound(OpenPause)
    resume = _Bound(EndPause)
    start_task = _Bound(StartAttempt)
    park_task = _Bound(ParkAttempt)
    finish_task = _Bound(EndAttempt)
    finish_run = _Bound(FinishRun)
