"""The run lifecycle (docs/lifecycle.md): the one front operators and the CLI call.

Every state change is one Engine DB transaction (or one statement), and the schema's unique indexes (one
IN-PROGRESS run per pipeline, one task-run row per task and run, one live attempt per task run) are the
last word on races: a lost race surfaces as :class:`StaleTransitionError`, never as a duplicate row. Each
transition lives in its own module: :mod:`~.claim` (claim, abandonment), :mod:`~.pauses`, :mod:`~.start`
(opening an attempt), :mod:`~.attempts` (parking and ending one), :mod:`~.finish`; this class holds no
logic of its own and no Airflow imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from airflow_provider_etl_craft.engine.dbapi import Connection
from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
from airflow_provider_etl_craft.runs.gates import Gates
from airflow_provider_etl_craft.runs.transition import Transition
from airflow_provider_etl_craft.settings import OPTIONS

if TYPE_CHECKING:
    from airflow_provider_etl_craft.runs.attempts import EndAttempt, ParkAttempt
    from airflow_provider_etl_craft.runs.claim import Abandon, Claim
    from airflow_provider_etl_craft.runs.finish import FinishRun
    from airflow_provider_etl_craft.runs.pauses import EndPause, OpenPause
    from airflow_provider_etl_craft.runs.start import StartAttempt

#: Seconds to wait for the ``pipeline:<code>`` lock before a retryable LOCK_TIMEOUT (``[etl_craft] lock_timeout``).
RUN_LOCK_TIMEOUT = float(OPTIONS["lock_timeout"].default)

_T = TypeVar("_T", bound=Transition)


class _Bound(Generic[_T]):
    """A transition as an attribute of :class:`RunLifecycle`: bound to its connection on each access, so
    ``lifecycle.claim(...)`` calls :meth:`Claim.__call__ <.claim.Claim.__call__>` (its signature and docs).

    Named by module and class, imported on first access: a recorded task's process loads the start and the
    end of an attempt, not the claim's graph checks or the finish (docs/performance.md).
    """

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name
        self._transition: type[_T] | None = None

    @property
    def transition(self) -> type[_T]:
        if self._transition is None:
            found: Any = getattr(importlib.import_module(f"{__package__}.{self.module}"), self.name)
            self._transition = found
        assert self._transition is not None
        return self._transition

    def __get__(self, lifecycle: RunLifecycle, owner: type | None = None) -> _T:
        return self.transition(
            lifecycle.engine,
            lifecycle.conn,
            lifecycle.lock_timeout,
            lifecycle.gates,
            reconnect=None if lifecycle.reconnect_with is None else lifecycle.reconnect,
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
        lock_timeout: float | None = RUN_LOCK_TIMEOUT,
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

    claim: _Bound[Claim] = _Bound("claim", "Claim")
    close_abandoned: _Bound[Abandon] = _Bound("claim", "Abandon")
    pause: _Bound[OpenPause] = _Bound("pauses", "OpenPause")
    resume: _Bound[EndPause] = _Bound("pauses", "EndPause")
    start_task: _Bound[StartAttempt] = _Bound("start", "StartAttempt")
    park_task: _Bound[ParkAttempt] = _Bound("attempts", "ParkAttempt")
    finish_task: _Bound[EndAttempt] = _Bound("attempts", "EndAttempt")
    finish_run: _Bound[FinishRun] = _Bound("finish", "FinishRun")


@contextmanager
def lent_lifecycle(
    engine: EngineDialect, lock_timeout: float | None = RUN_LOCK_TIMEOUT
) -> Iterator[RunLifecycle]:
    """The run lifecycle on the process's one connection to ``engine``'s Engine DB
    (:mod:`~airflow_provider_etl_craft.engine.reuse`): a recorded task's attempt starts and ends on one login.

    As ``EngineDBHook.lifecycle``: driver errors leave typed, a lost session is replaced (and the replacement
    kept for the next use), a step whose session is lost is sent once more on the new connection.
    """
    from airflow_provider_etl_craft.engine.reuse import borrowed

    with engine.classified(), borrowed(engine) as loan:
        lifecycle = RunLifecycle(engine, loan.conn, lock_timeout, engine.reconnect)
        try:
            with engine.classified(lifecycle.conn):
                yield lifecycle
        finally:
            loan.conn = lifecycle.conn
