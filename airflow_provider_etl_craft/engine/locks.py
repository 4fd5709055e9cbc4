"""Named cross-process locks: a lock file beside a SQLite database, an advisory lock on PostgreSQL.

On PostgreSQL the Engine takes advisory *transaction* locks inside the transaction that needs them
(``EngineDialect.transaction(conn, lock=…)``); :func:`advisory_lock` (a session lock) remains for the public
``EngineDBHook.lock(conn=…)``. Both use :func:`advisory_key`, and a session lock and a transaction lock on
one key exclude each other, so workers of an older release and of this one serialise during an upgrade.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from airflow_provider_etl_craft.engine.dbapi import PgConnection
from airflow_provider_etl_craft.errors import ConfigurationError, LockTimeoutError

LOCK_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_:.\-]{0,199}$")
MIGRATE_LOCK = "migrate"


def pipeline_lock(pipeline_code: str) -> str:
    """The lock that serialises claiming, reopening and finishing one pipeline's runs."""
    return f"pipeline:{pipeline_code}"


def check_lock_name(name: str) -> str:
    if not LOCK_NAME.fullmatch(name):
        raise ValueError(f"lock name {name!r} must match {LOCK_NAME.pattern}")
    return name


def advisory_key(schema: str, name: str) -> int:
    """Stable signed 64-bit key for (schema, name): two Engine schemas in one database never collide."""
    digest = hashlib.sha256(f"etl-craft\x00{schema}\x00{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def sqlite_lock_path(db_path: Path, name: str) -> Path:
    """``<file>.<name>.lock`` beside the database (``:`` kept; codes cannot hold path separators)."""
    return db_path.with_name(f"{db_path.name}.{check_lock_name(name)}.lock")


@contextmanager
def file_lock(db_path: Path, name: str, timeout: float | None) -> Iterator[None]:
    """Hold an OS file lock (flock): the kernel releases it when the holder dies, even on ``kill -9``."""
    import filelock  # here: only SQLite's named locks need it, and no DAG parse

    path = sqlite_lock_path(db_path, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(path), timeout=-1 if timeout is None else timeout, thread_local=False)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise LockTimeoutError(
            f"lock '{name}' was not acquired within {timeout:g}s (lock file {path}); another process holds "
            "it — wait for it to finish, or raise the lock timeout"
        ) from None
    try:
        yield
    finally:
        lock.release()


#: SQLSTATE of a lock wait that hit ``lock_timeout``.
LOCK_NOT_AVAILABLE = "55P03"


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg2 (``pgcode``) or psycopg 3 (``sqlstate``) error."""
    return getattr(exc, "pgcode", None) or getattr(exc, "sqlstate", None)


def lock_timeout_error(schema: str, name: str, timeout: float | None) -> LockTimeoutError:
    """The error of an advisory-lock wait that hit its bound: names the lock, its key, the schema and the fix."""
    waited = "the lock timeout" if timeout is None else f"{timeout:g}s"
    return LockTimeoutError(
        f"lock '{name}' (advisory key {advisory_key(schema, name)} for schema {schema}) was not acquired within "
        f"{waited}; another process holds it — wait for it to finish, or raise the lock timeout"
    )


@contextmanager
def advisory_lock(conn: PgConnection, schema: str, name: str, timeout: float | None) -> Iterator[None]:
    """Hold a session-level advisory lock on ``conn`` (autocommit); the server frees it if the session dies.

    ``lock_timeout`` bounds the wait server-side, so no polling loop is needed. Setting it, waiting for
    the lock and resetting it is one statement (one round trip): each nested subquery must produce its
    row before the level around it runs, which fixes the order; if the wait times out the statement's
    transaction rolls back, and ``set_config`` with it.

    A session lock needs the same server session for lock and unlock: behind a transaction-mode pooler it
    does not hold. The unlock's result is therefore checked.

    :raises ConfigurationError: the unlock found the lock not held by this session — the statements went to
        different server sessions (a transaction-mode pooler such as PgBouncer between client and server), so
        the lock never excluded anyone and may still be held elsewhere. Retrying cannot fix that; the
        deployment must, hence a configuration error, not a retryable one.
    """
    key = advisory_key(schema, name)
    millis = 0 if timeout is None else max(1, int(timeout * 1000))
    with conn.cursor() as cur:
        try:
            cur.execute(
                "SELECT set_config('lock_timeout', '0', false) FROM (SELECT pg_advisory_lock(%s) FROM "
                "(SELECT set_config('lock_timeout', %s, false)) AS bounded) AS locked",
                (key, f"{millis}ms"),
            )
        except Exception as exc:
            if sqlstate(exc) != LOCK_NOT_AVAILABLE:
                raise
            # The server may grant the lock just as lock_timeout cancels the wait: the error arrives but
            # the session holds the lock. Sessions never nest these locks, so one unlock gives it back.
            cur.execute(
                "SELECT pg_advisory_unlock(%s) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
                "AND classid = %s AND objid = %s AND objsubid = 1",
                (key, (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
            )
            raise lock_timeout_error(schema, name, timeout) from None
    ended = False
    try:
        yield
        ended = True
    finally:
        if not conn.closed:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", (key,))
                row = cur.fetchone()
            assert row is not None  # a SELECT without FROM returns one row
            (released,) = row
            if not released and ended:  # never hide the error the locked code raised
                raise ConfigurationError(
                    f"lock '{name}' (advisory key {key} for schema {schema}) was not held by the session that "
                    "released it: the statements reached different server sessions, so the lock did not exclude "
                    "other processes; connect directly or through a session-mode pooler for EngineDBHook.lock(conn=…), "
                    "or let the lock open its own connection (conn=None)"
                )
