"""What a dialect provides; callers (schema, migrations, run lifecycle) never branch on the database."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from airflow_provider_etl_craft.config.profile import EngineProfile


class EngineDialect(ABC):
    """One Engine DB: opens connections to it, runs transactions and scripts, and holds named locks.

    SQL written by callers uses ``?`` placeholders; :meth:`sql` rewrites them for the driver.
    """

    name: ClassVar[str]
    placeholder: ClassVar[str]

    def __init__(self, profile: EngineProfile) -> None:
        self.profile = profile
        self._sql_cache: dict[str, str] = {}

    @abstractmethod
    def connect(self) -> Any:
        """A new DB-API connection in autocommit mode, session set up (pragmas or search_path, checks done).

        :raises ConfigurationError: bad settings, missing schema, failed login.
        :raises EngineUnreachableError: the database did not answer (retryable).
        """

    #: Statement that opens a write transaction (SQLite: ``BEGIN IMMEDIATE``, so writers queue up front).
    begin_statement: ClassVar[str] = "BEGIN"
    #: Whether ``INSERT``/``UPDATE … RETURNING`` may run inside ``WITH`` (PostgreSQL), so that several
    #: dependent writes go to the server as one atomic statement: one round trip instead of a transaction.
    writes_in_with: ClassVar[bool] = False

    @abstractmethod
    def to_db_time(self, value: datetime) -> Any:
        """A timezone-aware datetime as this database stores it (UTC)."""

    @abstractmethod
    def from_db_time(self, value: Any) -> datetime | None:
        """A stored timestamp back as an aware UTC datetime (None stays None)."""

    def is_conflict(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a unique/check violation (a lost race), as opposed to a broken connection."""
        return isinstance(exc, self.integrity_error())

    @abstractmethod
    def integrity_error(self) -> type[Exception]:
        """The driver's integrity-violation exception class."""

    @abstractmethod
    def database_error(self) -> type[Exception]:
        """The driver's base class of errors the database reported (DB-API ``Error``)."""

    def now(self) -> datetime:
        """The current time, UTC (a method so one transaction can use one clock reading)."""
        return datetime.now(UTC)

    @contextmanager
    def transaction(self, conn: Any) -> Iterator[Any]:
        """Open a write transaction on ``conn``; commit on success, roll back on error. Yields a cursor."""
        cur = conn.cursor()
        cur.execute(self.begin_statement)
        try:
            yield cur
        except BaseException:
            # If the connection is gone the server has rolled back already; keep the original error.
            with suppress(Exception):
                cur.execute("ROLLBACK")
            raise
        else:
            cur.execute("COMMIT")
        finally:
            cur.close()

    def schema_transaction(self, conn: Any) -> AbstractContextManager[Any]:
        """A transaction for schema changes (init-db, migrations); SQLite widens it (see its dialect)."""
        return self.transaction(conn)

    @abstractmethod
    def lock(self, name: str, timeout: float | None, conn: Any | None = None) -> AbstractContextManager[None]:
        """Hold the named cross-process lock (SPEC §8); ``conn`` may be reused where the lock needs one."""

    @abstractmethod
    def set_autocommit(self, conn: Any, autocommit: bool) -> None:
        """Switch ``conn`` between autocommit and driver-managed transactions (common-sql's ``run``)."""

    @abstractmethod
    def get_autocommit(self, conn: Any) -> bool:
        """Whether ``conn`` is in autocommit mode."""

    @abstractmethod
    def execute_script(self, cursor: Any, text: str) -> None:
        """Run a multi-statement SQL file inside the caller's transaction."""

    @abstractmethod
    def table_names(self, conn: Any) -> set[str]:
        """Upper-cased names of the tables in the Engine schema."""

    def sql(self, text: str) -> str:
        """Callers' SQL as this database takes it (cached; SQL texts are constants): see :meth:`translate`."""
        cached = self._sql_cache.get(text)
        if cached is None:
            cached = self._sql_cache[text] = self.translate(text)
        return cached

    def translate(self, text: str) -> str:
        """Rewrite ``?`` placeholders for the driver; row-lock clauses (``FOR UPDATE``/``FOR SHARE``) stay."""
        if self.placeholder == "?":
            return text
        return text.replace("%", "%%").replace("?", self.placeholder)

    def query(self, conn: Any, text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement and return all rows (empty for statements without results)."""
        cur = conn.cursor()
        try:
            cur.execute(self.sql(text), tuple(params))
            return list(cur.fetchall()) if cur.description else []
        finally:
            cur.close()

    def describe(self) -> str:
        return self.profile.target.describe()
