"""An operator try's Engine DB: the task process's one connection, reached without ``EngineDBHook``.

Every operator that writes to the Engine DB in a task (the claim, recorded tasks, the finish, a deferred
wait's fingerprint read) gets there the same way: the profile of its Airflow connection, read once per
try as the hook reads it, and the process's one connection to that Engine DB
(:mod:`~airflow_provider_etl_craft.engine.reuse`). The hook is a common-sql ``DbApiHook``, and importing
common-sql (with ``sqlparse``) costs a task process 20-30 ms that none of these steps needs
(docs/performance.md, "In the task process").

A recorded task, the claim and the finish begin that work early (:func:`engine_ahead`), when Airflow's task
runner prepares the task, so that it runs while the runner waits on Airflow's API (the rendered fields' call)
instead of after it.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import TYPE_CHECKING

from airflow_provider_etl_craft import _compat

if TYPE_CHECKING:
    from airflow_provider_etl_craft.engine.dialects.base import EngineDialect

_PACKAGE = "airflow_provider_etl_craft"
#: What :func:`_engine` loads: the profile's and the connection's modules.
_ENGINE_MODULES = (f"{_PACKAGE}.config.connection", f"{_PACKAGE}.engine.reuse")
#: What a try loads besides its steps: the run lifecycle and the gates (a recorded try's start judges them).
_TRY_MODULES = (f"{_PACKAGE}.runs.lifecycle", f"{_PACKAGE}.runs.gates")


class Ahead(threading.Thread):
    """The module loads of one try's :func:`try_engine`, begun early in a daemon thread (:func:`engine_ahead`),
    with the engine resolved ahead on the try's thread, if it was."""

    def __init__(
        self, key: tuple[str, str | None], steps: tuple[str, ...], engine: EngineDialect | None
    ) -> None:
        super().__init__(name=f"etl-craft-ahead-{key[0]}", daemon=True)
        self.key, self.steps, self.engine = key, steps, engine

    def run(self) -> None:
        try:
            if self.engine is None:
                for name in _ENGINE_MODULES:
                    importlib.import_module(name)
                _compat.resolve("Connection")  # Airflow's connection class, which the profile's lookup makes
            for name in _modules(self.steps):
                importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - loaded again on the try's own thread, which raises it typed
            self.engine = None


def engine_ahead(conn_id: str, profile: str | None, *steps: str) -> Ahead | None:
    """Begin :func:`try_engine`'s work for this try now; the try passes what this returns to :func:`try_engine`
    (the operator copy Airflow's ``prepare_for_execution`` makes for the try carries it: no state outlives it).

    Where Airflow's task-process channel serializes the threads that use it
    (:func:`~airflow_provider_etl_craft._compat.channel_serializes_threads`), the profile is resolved here, on
    the try's thread, and the login started in its own (it may mask a token through the channel while the
    runner uses it); elsewhere that waits for :func:`try_engine`. A daemon thread loads the modules the try
    needs meanwhile. Nothing is kept unless :func:`try_engine` takes it: a failure here is met again, and raised
    typed, there.
    """
    key = (conn_id, profile)
    engine = None
    if _compat.channel_serializes_threads():
        try:
            engine = _engine(*key)
        except Exception:  # noqa: BLE001 - resolved again by try_engine, which raises it typed
            engine = None
    elif all(name in sys.modules for name in (*_ENGINE_MODULES, *_modules(steps))):
        return None  # a later try in the same process (dag.test()): nothing left to do ahead
    ahead = Ahead(key, steps, engine)
    ahead.start()
    return ahead


def try_engine(conn_id: str, profile: str | None, *steps: str, ahead: Ahead | None = None) -> EngineDialect:
    """The process's dialect for the Engine DB of Airflow connection ``conn_id`` (``profile``: the Engine
    profile of a file-backed connection), its login started.

    On PostgreSQL the login runs in the background while the modules of ``steps`` (names in
    ``airflow_provider_etl_craft.runs``) load; the first :func:`~airflow_provider_etl_craft.runs.lifecycle.lent_lifecycle`
    takes that session. Call it once per try, and borrow next without talking to Airflow in between
    (:func:`~airflow_provider_etl_craft.engine.reuse.log_in_ahead`). Takes what :func:`engine_ahead` began
    (``ahead``) for the same connection, once it is done.
    """
    if ahead is not None and ahead.key == (conn_id, profile):
        ahead.join()
        if ahead.engine is not None:
            return ahead.engine
    engine = _engine(conn_id, profile)
    for step in steps:
        importlib.import_module(f"{_PACKAGE}.runs.{step}")
    return engine


def _modules(steps: tuple[str, ...]) -> tuple[str, ...]:
    return (*_TRY_MODULES, *(f"{_PACKAGE}.runs.{step}" for step in steps))


def _engine(conn_id: str, profile: str | None) -> EngineDialect:
    """The profile of ``conn_id`` read, its dialect made and its login started (:func:`try_engine`)."""
    from airflow_provider_etl_craft.config.connection import profile_for_conn_id
    from airflow_provider_etl_craft.engine.reuse import engine_for, log_in_ahead

    engine = engine_for(profile_for_conn_id(conn_id, profile))
    log_in_ahead(engine)
    return engine
