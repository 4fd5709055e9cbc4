"""SQLite Engine DBs: WAL, busy timeout, foreign keys, ``BEGIN IMMEDIATE``, a lock file per named lock."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow_provider_etl_craft.engine import actor, locks
from airflow_provider_etl_craft.engine.dbapi import Cursor
from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
from airflow_provider_etl_craft.engine.shared import PROVIDER_LEDGER
from airflow_provider_etl_craft.engine.url import SqliteTarget
from airflow_provider_etl_craft.errors import (
    ConfigurationError,
    EngineDBError,
    EngineUnreachableError,
    EtlCraftError,
    LockTimeoutError,
    first_line,
)

MIN_VERSION = (3, 35, 0)
_ROW_LOCK = re.compile(r"\s+FOR\s+(?:UPDATE|SHARE)\s*$", re.IGNORECASE)
#: Writers queue on the database lock for up to this long instead of failing with "database is locked".
BUSY_TIMEOUT_S = 60.0


def check_sqlite_version(found: tuple[int, int, int] = sqlite3.sqlite_version_info) -> None:
    """:raises ConfigurationError: when the linked SQLite is older than 3.35 (needed for RETURNING)."""
    if found < MIN_VERSION:
        have = ".".join(map(str, found))
        raise ConfigurationError(
            f"SQLite {'.'.join(map(str, MIN_VERSION))} or newer is required (RETURNING, partial indexes); this "
            f"Python links SQLite {have}; use a Python built against a newer SQLite, or a PostgreSQL Engine DB"
        )


class SqliteDialect(EngineDialect[sqlite3.Connection]):
    name = "sqlite"
    placeholder = "?"
    begin_statement = "BEGIN IMMEDIATE"

    #: Whether this Engine DB keeps etl-craft's time text (an Engine DB etl-craft made; set by :meth:`connect`).
    etl_craft_times = False

    def to_db_time(self, value: datetime) -> str:
        if self.etl_craft_times:  # etl-craft's form, so both tools' text comparisons order every row
            return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f") + "+00:00"
        # The same text form as the schema's strftime('%Y-%m-%dT%H:%M:%fZ') defaults: sortable as text.
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"

    def from_db_time(self, value: Any) -> datetime | None:
        if value is None:
            return None
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(UTC)

    def integrity_error(self) -> type[Exception]:
        return sqlite3.IntegrityError

    def change_counter(self, conn: sqlite3.Connection) -> int | None:
        """``PRAGMA data_version``: changes when another connection commits to the file (never for ``conn``'s
        own writes), read from the WAL index without touching the database pages."""
        (version,) = conn.execute("PRAGMA data_version").fetchone()
        return int(version)

    def database_error(self) -> type[Exception]:
        return sqlite3.Error

    def classify(self, exc: BaseException, conn: sqlite3.Connection | None = None) -> EtlCraftError:
        """By SQLite's primary result code (``sqlite_errorcode & 0xFF``), never by message text."""
        code = getattr(exc, "sqlite_errorcode", None)
        name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
        detail = first_line(exc, name)
        where = f"the SQLite Engine DB {self.path} ({self.profile.setting('jdbc_url')})"
        primary = None if code is None else code & 0xFF
        if primary == _SQLITE_READONLY:
            return ConfigurationError(
                f"{where} is read-only for this user ({name}: {detail}); let the user write the file and its folder "
                "(SQLite keeps its journal beside the file), or run as the user that owns them"
            )
        if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
            return EngineDBError(
                f"{where} is damaged or not a SQLite database ({name}: {detail}); restore it from a backup (or point "
                "jdbc_url at the right file); `etl-craft-airflow init-db` creates a new one only where none exists"
            )
        if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
            return LockTimeoutError(
                f"{where} stayed locked by another connection ({name}); a retry may succeed"
            )
        if primary in (_SQLITE_CANTOPEN, _SQLITE_PERM, _SQLITE_AUTH):
            return ConfigurationError(
                f"cannot use {where} ({name}: {detail}); check that the file and its folder exist and that this "
                "user may read and write both"
            )
        if primary in (_SQLITE_IOERR, _SQLITE_FULL):
            return EngineUnreachableError(
                f"reading or writing {where} failed ({name}: {detail}); check the disk; a retry may succeed"
            )
        if code is None:  # raised by Python's sqlite3 module itself (a closed connection, a bad binding)
            return EngineDBError(
                f"the sqlite3 module refused a command on {where} ({name}: {detail}); this is a "
                "defect of the provider: please report it"
            )
        return EngineDBError(
            f"{where} refused a command ({name}: {detail}); run `etl-craft-airflow migrate` if "
            "Engine tables are missing"
        )

    def _transaction_lock(self, lock: str | None, timeout: float | None) -> AbstractContextManager[None]:
        # The lock file is taken before BEGIN IMMEDIATE and given back after COMMIT/ROLLBACK.
        return nullcontext() if lock is None else locks.file_lock(self.path, lock, timeout)

    @contextmanager
    def schema_transaction(
        self, conn: sqlite3.Connection, lock: str | None = None, lock_timeout: float | None = None
    ) -> Iterator[Cursor]:
        """SQLite's procedure for changes it cannot ALTER in place (a table rebuilt and renamed).

        Foreign keys are switched off for this connection around the transaction (the pragma is a no-op
        inside one) and checked with ``PRAGMA foreign_key_check`` before COMMIT, so a change that breaks
        a reference rolls back like any failing statement. ``lock`` (a lock file) is held around all of it.
        """
        with self._transaction_lock(lock, lock_timeout):
            conn.execute("PRAGMA foreign_keys=OFF")
            try:
                with self.transaction(conn) as cur:
                    yield cur
                    cur.execute("PRAGMA foreign_key_check")
                    broken = cur.fetchall()
                    if broken:
                        table, rowid, parent, _ = broken[0]
                        raise sqlite3.IntegrityError(
                            f"FOREIGN KEY constraint failed: {table} row {rowid} references a missing {parent} "
                            f"row ({len(broken)} broken reference(s))"
                        )
            finally:
                conn.execute("PRAGMA foreign_keys=ON")

    def translate(self, text: str) -> str:
        # BEGIN IMMEDIATE already holds the database's write lock: SQLite has (and needs) no row locks.
        return _ROW_LOCK.sub("", text)

    @property
    def path(self) -> Path:
        target = self.profile.target
        assert isinstance(target, SqliteTarget)
        return target.path

    def connect(self, create: bool = False) -> sqlite3.Connection:
        check_sqlite_version()
        if not create and not self.path.exists():
            raise EngineDBError(
                f"the SQLite Engine DB {self.path} ({self.profile.setting('jdbc_url')}) does not exist on this "
                "machine (a SQLite Engine DB is one file on one machine); run `etl-craft-airflow init-db` (or "
                "EngineInitDbOperator) here to create it"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA synchronous=NORMAL")
            register_actor_functions(conn)
            shared = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND upper(name) = ?", (PROVIDER_LEDGER,)
            ).fetchone()
            self.etl_craft_times = shared is not None
        except sqlite3.Error as exc:
            raise self.classify(exc) from None
        except OSError as exc:
            raise ConfigurationError(
                f"cannot open the SQLite Engine DB {self.path} ({self.profile.setting('jdbc_url')}): {exc}; "
                "check the path and that its folder is writable"
            ) from None
        return conn

    def lock(
        self, name: str, timeout: float | None, conn: sqlite3.Connection | None = None
    ) -> AbstractContextManager[None]:
        return locks.file_lock(self.path, name, timeout)

    def idle(self, conn: sqlite3.Connection) -> bool:
        try:
            return conn.isolation_level is None and not conn.in_transaction
        except sqlite3.ProgrammingError:  # closed
            return False

    def set_autocommit(self, conn: sqlite3.Connection, autocommit: bool) -> None:
        # Python's sqlite3 opens its implicit transactions with this keyword: IMMEDIATE queues writers.
        conn.isolation_level = None if autocommit else "IMMEDIATE"

    def get_autocommit(self, conn: sqlite3.Connection) -> bool:
        return conn.isolation_level is None

    def execute_script(self, cursor: Cursor, text: str) -> None:
        for statement in split_statements(text):
            cursor.execute(statement)

    def table_names_query(self) -> tuple[str, tuple[Any, ...]]:
        return "SELECT upper(name) FROM sqlite_master WHERE type = 'table'", ()


def register_actor_functions(conn: sqlite3.Connection) -> None:
    """The functions etl-craft's SQLite triggers and column defaults call (etl-craft registers the same on its
    own connections): the actor of the writes, its kind, the purpose (``retention`` in a purge batch only) and the
    migration being applied, from :mod:`~airflow_provider_etl_craft.engine.actor`; and the bookkeeping that
    keeps its CFG_ audit triggers from treating their own stamping UPDATE as a change. See
    docs/etl-craft-parity.md, "Sharing an Engine DB"."""
    inserting: set[str] = set()

    def enter(table: str) -> int:
        inserting.add(table)
        return 1

    def leave(table: str) -> int:
        inserting.discard(table)
        return 1

    conn.create_function("etl_craft_actor", 0, lambda: actor.current().name, deterministic=True)
    conn.create_function("etl_craft_actor_kind", 0, lambda: actor.current().kind, deterministic=True)
    conn.create_function("etl_craft_purpose", 0, lambda: actor.current().purpose, deterministic=True)
    conn.create_function("etl_craft_migration", 0, lambda: actor.current().migration, deterministic=True)
    conn.create_function("etl_craft_enter_insert", 1, enter)
    conn.create_function("etl_craft_exit_insert", 1, leave)
    conn.create_function("etl_craft_inserting", 1, lambda table: table in inserting)


# SQLite's primary result codes (https://sqlite.org/rescode.html).
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN = 10, 11, 13, 14
_SQLITE_AUTH, _SQLITE_NOTADB = 23, 26


def split_statements(text: str) -> list[str]:
    """Split a SQL script into statements with SQLite's own ``complete_statement`` (triggers stay whole)."""
    statements: list[str] = []
    pending = ""
    for line in text.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            if pending.strip().strip(";").strip():
                statements.append(pending.strip())
            pending = ""
    if pending.strip() and not _only_comments(pending):
        raise ConfigurationError("the SQL script ends with an unterminated statement (missing ';')")
    return statements


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in text.splitlines())
