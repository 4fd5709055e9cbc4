"""One Engine DB connection per process, lent out for one use at a time (docs/performance.md, "The task
process").

A recorded task's try opens its attempt before the work and ends it after; both steps borrow the same
connection here, so the try logs in (TLS, SCRAM, the schema check) once instead of twice. What makes that
safe behind a transaction-mode pooler is what the Engine code does anyway: connections are in autocommit,
every transaction is explicit and ends before the connection is given back, and the Engine schema and the
actor are set per transaction (``SET LOCAL``), never on the session. A connection given back otherwise (a
transaction or an error state left open, autocommit switched off) is closed, never kept.

* Keyed by the resolved profile (target, schema, role, auth mode, secrets): another profile, or the same
  connection id resolving elsewhere, gets a connection of its own.
* One borrower at a time: a borrow while the connection is lent (``on_kill`` interrupting a step, a second
  thread) gets a connection of its own, closed when it is given back.
* A lost connection is the lifecycle's to replace (``EngineDialect.reconnect``); the replacement is kept.
* After ``fork`` the child never touches the parent's connections (closing one would end the parent's
  session): it keeps them unused and opens its own. Closed at interpreter exit.
* :func:`log_in_ahead` starts the first login in a thread where the dialect allows it
  (``EngineDialect.logs_in_ahead``): a try loads the modules of its steps while the server forks its backend
  and checks the credential, and the first borrow takes the connection that login opened (or raises its error,
  the driver's, where ``engine.connect()`` would have raised it).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

from msgspec import Struct

from airflow_provider_etl_craft.engine.dbapi import Connection

if TYPE_CHECKING:
    from airflow_provider_etl_craft.config.profile import EngineProfile
    from airflow_provider_etl_craft.engine.dialects.base import EngineDialect


class _Login:
    """A login running in a thread of its own (:func:`log_in_ahead`); :meth:`take` waits for it."""

    def __init__(self, engine: EngineDialect) -> None:
        self._engine = engine
        self._conn: Connection | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="etl-craft-login", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._conn = self._engine.connect()
        except BaseException as exc:  # raised again by take(), in the thread that uses the connection
            self._error = exc

    def take(self) -> Connection:
        """The connection the login opened; its error, raised here, if it failed."""
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        assert self._conn is not None  # connect() returned
        return self._conn

    def discard(self) -> None:
        """Wait for the login and close what it opened (nobody will use it)."""
        with suppress(BaseException):
            self.take().close()


class _Slot(Struct):
    """The process's connection for one profile, with the dialect that opened it (its statement caches)."""

    profile: EngineProfile
    engine: EngineDialect
    conn: Connection | None = None
    lent: bool = False
    #: A login started ahead of the first borrow, not taken yet.
    login: _Login | None = None


_lock = threading.Lock()
_slots: list[_Slot] = []
_pid = os.getpid()
#: The parent's connections in a forked child: kept referenced (never closed, never collected) and unused.
_inherited: list[object] = []


def engine_for(profile: EngineProfile) -> EngineDialect:
    """The process's dialect for ``profile`` (an equal profile gets the same one, with its caches)."""
    return _slot(profile).engine


def _slot(profile: EngineProfile) -> _Slot:
    _check_fork()
    with _lock:
        for slot in _slots:
            if slot.profile == profile:
                return slot
        from airflow_provider_etl_craft.engine.dialects import dialect_for

        slot = _Slot(profile, dialect_for(profile))
        _slots.append(slot)
        return slot


def log_in_ahead(engine: EngineDialect) -> None:
    """Start opening the process's connection to ``engine``'s Engine DB now, for the next :func:`borrowed`.

    Only where the dialect allows a connection opened in one thread to be used in another, and only when the
    slot has neither a connection nor a login under way. The login's thread may use Airflow's task-process
    channel (a token's masking), so the caller borrows next without touching it in between, unless the channel
    serializes its threads (:func:`~airflow_provider_etl_craft._compat.channel_serializes_threads`, Airflow 3.2
    and later: :func:`~airflow_provider_etl_craft.operators._engine.engine_ahead` starts it before the task runner
    talks to Airflow).
    """
    if not engine.logs_in_ahead:
        return
    slot = _slot(engine.profile)
    if slot.conn is not None or slot.login is not None:
        return
    slot.engine.prepare_login()
    with _lock:
        if slot.conn is None and slot.login is None and not slot.lent:
            slot.login = _Login(slot.engine)


class Loan(Struct):
    """One use of a borrowed connection; set :attr:`conn` to the connection the use ended on (a reconnect
    replaces a lost one) before the ``with`` block ends."""

    conn: Connection


@contextmanager
def borrowed(engine: EngineDialect) -> Iterator[Loan]:
    """Lend the process's connection to ``engine``'s Engine DB for one use (the ``with`` block).

    Opens it on first use with ``engine.connect()``, or takes the login :func:`log_in_ahead` started (its errors
    are the driver's: classify them around the block). Given back when the block ends, kept only if idle
    (:meth:`EngineDialect.idle`).
    """
    slot = _slot(engine.profile)
    login = None
    with _lock:
        own = slot.lent  # busy: this use opens a connection of its own, closed at its end
        conn = None if own else slot.conn
        if not own:
            slot.lent, slot.conn = True, None
            login, slot.login = slot.login, None
    loan: Loan | None = None
    try:
        if conn is None:
            conn = login.take() if login is not None else slot.engine.connect()
        loan = Loan(conn)
        yield loan
    finally:
        final = None if loan is None else loan.conn
        if own:
            if final is not None:
                with suppress(Exception):
                    final.close()
        else:
            _give_back(slot, final)


def _give_back(slot: _Slot, conn: Connection | None) -> None:
    keep = conn is not None and os.getpid() == _pid and slot.engine.idle(conn)
    if conn is not None and not keep:
        with suppress(Exception):  # broken or dirty: never handed out again
            conn.close()
    with _lock:
        slot.conn = conn if keep else None
        slot.lent = False


def close_all() -> None:
    """Close the process's connections (at interpreter exit; tests call it to start clean)."""
    _check_fork()
    with _lock:
        for slot in _slots:
            if slot.login is not None:
                slot.login.discard()
            if slot.conn is not None and not slot.lent:
                with suppress(Exception):
                    slot.conn.close()
            slot.conn = slot.login = None
        _slots.clear()


def open_count() -> int:
    """How many connections the process keeps open now, logins under way included (for tests and the
    benchmark)."""
    with _lock:
        return sum(1 for slot in _slots if slot.conn is not None or slot.login is not None)


def _check_fork() -> None:
    """In a forked child, forget the parent's connections without closing them (see the module docstring)."""
    global _pid
    if os.getpid() == _pid:
        return
    with _lock:
        if os.getpid() != _pid:
            _inherited.extend(slot.conn for slot in _slots if slot.conn is not None)
            # A login under way in the parent has no thread here; what it opens is the parent's session.
            _inherited.extend(slot.login for slot in _slots if slot.login is not None)
            _slots.clear()
            _pid = os.getpid()


atexit.register(close_all)
