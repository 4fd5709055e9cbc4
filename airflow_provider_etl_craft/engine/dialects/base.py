"""What a dialect provides; callers (schema, migrations, run lifecycle) never branch on the database."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from msgspec import Struct

from airflow_provider_etl_craft.engine.dbapi import Connection, Cursor, Row

if TYPE_CHECKING:
    from airflow_provider_etl_craft.config.profile import EngineProfile
    from airflow_provider_etl_craft.errors import EtlCraftError


class StatementResult(Struct, frozen=True):
    """What one statement returned: its rows (empty for statements without results) and its row count."""

    rows: list[Row]
    rowcount: int


class ServerFunction(Struct, frozen=True):
    """A server-side function of an ENGINE migration that runs a transition in one call (PostgreSQL's
    ``ETL_CRAFT_CLAIM``, ``ETL_CRAFT_FINISH``), declared by the transition's ``runs/`` module.

    ``types``: the SQL types of its arguments after the lock key (BIGINT) and the lock wait (TEXT) the dialect
    passes first; the last two are the actor and its kind, which the dialect sets for the call's transaction
    before the function writes.
    """

    name: str
    types: tuple[str, ...]


class OneStatement(Struct, frozen=True):
    """Several dependent writes of a transition as one statement (a data-modifying ``WITH``), declared by the
    transition's ``runs/`` module with ``?`` placeholders; :meth:`EngineDialect.write_at_once` runs it where the
    database can.

    ``notifies``: its last two placeholders are the change channel and the notice prefix
    (``pg_notify(?, ? || PIPELINE_ID)``), which the dialect appends to the caller's parameters.
    """

    text: str
    notifies: bool = False


class SessionLost(Exception):
    """The Engine DB session ended under a write's COMMIT (or under a write sent as one statement), so the
    server may or may not have committed it: the write is *in doubt* (docs/high-availability.md).

    Raised by the dialect at those points only, around the driver's error (``cause``); the run lifecycle
    repeats the step on a new connection, and anything else reports it as a retryable
    :class:`~airflow_provider_etl_craft.errors.EngineUnreachableError` that says "in doubt".
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


#: Pauses between the tries of :meth:`EngineDialect.reconnect` (seconds): about 15 s in all, the time a
#: streaming standby takes to be promoted or a floating address to move, and short against Airflow's retries.
RECONNECT_DELAYS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)

log = logging.getLogger(__name__)


#: The connection type a dialect opens (sqlite3's, or a psycopg2/psycopg 3 one).
ConnT = TypeVar("ConnT", bound=Connection)


class EngineDialect(ABC, Generic[ConnT]):
    """One Engine DB: opens connections to it, runs transactions and scripts, and holds named locks.

    SQL written by callers uses ``?`` placeholders; :meth:`sql` rewrites them for the driver.

    Generic in the connection type its driver opens, so a dialect uses its driver's own features typed
    (PostgreSQL's ``autocommit``, SQLite's ``isolation_level``). Callers hold a plain ``EngineDialect`` (either
    kind) and give it back only connections it opened, typed as
    :class:`~airflow_provider_etl_craft.engine.dbapi.Connection`.
    """

    name: ClassVar[str]
    placeholder: ClassVar[str]

    def __init__(self, profile: EngineProfile) -> None:
        self.profile = profile
        self._sql_cache: dict[str, str] = {}
        self._alone_cache: dict[str, str] = {}

    @abstractmethod
    def connect(self, create: bool = False) -> ConnT:
        """A new DB-API connection in autocommit mode, session set up (pragmas, checks done).

        :param create: may create the database itself where the dialect can (a SQLite file): only init-db
            and migrate pass it, so no other path makes an empty Engine DB by accident.
        :raises ConfigurationError: bad settings, missing schema, failed login.
        :raises EngineDBError: the SQLite file does not exist and ``create`` is false.
        :raises EngineUnreachableError: the database did not answer (retryable).
        """

    def connect_for_sql(self) -> ConnT:
        """A connection for SQL of the user's own (``EngineDBHook.get_conn()``): names resolve in the Engine
        schema. SQLite: its one schema, ``main``, is the only one there is; PostgreSQL sets it per transaction."""
        return self.connect()

    def login(self, create: bool = False) -> ConnT:
        """:meth:`connect` without checking that the profile's schema exists: ``check`` reports the login and
        the schema as two findings. Same errors as :meth:`connect` otherwise."""
        return self.connect(create)

    def require_schema(self, conn: ConnT) -> None:
        """:raises ConfigurationError: the profile's schema does not exist (PostgreSQL; SQLite has none)."""
        return None

    #: Whether :meth:`connect` may run in one thread and the connection be used in another, so a task process
    #: can log in while it loads the modules of its steps (:func:`~airflow_provider_etl_craft.engine.reuse.
    #: log_in_ahead`). SQLite's connections belong to the thread that opened them, and open in microseconds.
    logs_in_ahead: ClassVar[bool] = False

    def prepare_login(self) -> None:
        """Load what a login needs (the driver) in the calling thread, before a login ahead runs in another:
        an import holds the GIL, so made in the login's thread it would only compete with the caller's own
        imports. Errors are left for the login to raise where it is used."""
        return None

    #: Statement that opens a write transaction (SQLite: ``BEGIN IMMEDIATE``, so writers queue up front).
    begin_statement: ClassVar[str] = "BEGIN"
    # -- one-round-trip forms of run-lifecycle transitions -----------------------------------------------------
    # Where a dialect can send several dependent writes as one atomic statement (PostgreSQL: INSERT/UPDATE …
    # RETURNING inside WITH, or a call of a server-side function of an ENGINE migration), a transition's common
    # case takes one round trip instead of a transaction. What the statement or function does is the
    # transition's, declared in its ``runs/`` module (:class:`OneStatement`, :class:`ServerFunction`); the
    # dialect only runs it. Each returns None where the dialect has no such form; the transition then takes its
    # transaction form, which also decides every case the one-round-trip form leaves alone.

    #: False: every one-round-trip form answers None, so the lifecycle takes its transaction forms (tests set it
    #: on a dialect instance to compare the two forms on the same scenarios).
    at_once_forms: bool = True

    def call_at_once(
        self,
        conn: ConnT,
        function: ServerFunction,
        params: Sequence[Any],
        *,
        lock: str,
        lock_timeout: float | None,
    ) -> Row | None:
        """Call ``function`` with ``lock`` held, as one statement and its own transaction; its row.

        ``params``: the function's arguments after the lock key and wait, the actor and its kind last (as
        :class:`ServerFunction` says). None: not called here (no server functions), or the function is missing
        or may not be used (an Engine DB not migrated yet, a role without USAGE): nothing was written, and the
        transaction form checks the schema and says why.

        :raises LockTimeoutError: ``lock`` was not acquired within ``lock_timeout`` seconds; nothing was done.
        """
        return None

    def write_at_once(
        self, conn: ConnT, statement: OneStatement, params: Sequence[Any]
    ) -> StatementResult | None:
        """Run ``statement`` (several dependent writes in one) as its own transaction; None where this dialect
        cannot (SQLite has no data-modifying WITH): nothing written, the transaction form decides."""
        return None

    # -- change notices (what wakes deferred waits: :mod:`airflow_provider_etl_craft.runs.changes`) -----------
    # A transaction that ends a run, an attempt or a pause announces the pipeline it changed; a waiting
    # trigger listens where the database can deliver that (PostgreSQL LISTEN/NOTIFY, sent at COMMIT) and
    # otherwise looks at a cheap change counter or polls. A notice is only a hint to look again: what a
    # wait decides on is always the state it reads.

    #: Whether :meth:`listen` can deliver notices at all (PostgreSQL); else waits poll.
    delivers_notices: ClassVar[bool] = False

    def change_notice(
        self, pipeline_id: int | None = None, pipeline_run_id: int | None = None
    ) -> tuple[str, tuple[Any, ...]] | None:
        """The statement (``?`` placeholders, params) that announces a change of ``pipeline_id`` (or of the
        pipeline of ``pipeline_run_id``) when its transaction commits; None where notices do not exist."""
        return None

    def listen(self, conn: ConnT) -> None:
        """Subscribe ``conn`` (autocommit) to change notices of this Engine DB."""

    def received_notices(self, conn: ConnT) -> set[int]:
        """The pipeline ids of the notices ``conn`` has received since the last call (never waits).

        :raises: the driver's error when the connection was lost.
        """
        return set()

    def change_counter(self, conn: ConnT) -> int | None:
        """A number that changes whenever another connection commits (SQLite's ``PRAGMA data_version``);
        None where the database has none."""
        return None

    @abstractmethod
    def to_db_time(self, value: datetime) -> Any:
        """A timezone-aware datetime as this database stores it (UTC)."""

    @abstractmethod
    def from_db_time(self, value: Any) -> datetime | None:
        """A stored timestamp back as an aware UTC datetime (None stays None)."""

    def to_db_date(self, value: datetime) -> Any:
        """The UTC calendar date of a timezone-aware datetime, as this database stores a DATE (``RUN_DATE``):
        ISO text ``YYYY-MM-DD`` here (a SQLite TEXT column checked with ``date()``)."""
        return value.astimezone(UTC).date().isoformat()

    def from_db_date(self, value: Any) -> date | None:
        """A stored DATE back as a date (None stays None); drivers return a date or ISO text."""
        if value is None or (isinstance(value, date) and not isinstance(value, datetime)):
            return value
        return date.fromisoformat(str(value))

    @abstractmethod
    def integrity_error(self) -> type[Exception]:
        """The driver's integrity-violation exception class."""

    @abstractmethod
    def database_error(self) -> type[Exception]:
        """The driver's base class of errors the database reported (DB-API ``Error``)."""

    @abstractmethod
    def classify(self, exc: BaseException, conn: ConnT | None = None) -> EtlCraftError:
        """The provider's typed error for the driver error ``exc``.

        Decided by the database's own code (PostgreSQL's SQLSTATE, SQLite's result code) and the driver's
        error class, never by message text (servers translate their messages). The server's message is
        shown in the result, not read. ``conn``, when still usable, lets a dialect ask the database what
        the code leaves open (PostgreSQL: a "missing" table in a schema the role may not use).
        """

    @contextmanager
    def classified(self, conn: ConnT | None = None) -> Iterator[None]:
        """Driver errors (and :class:`SessionLost`) leave the block as the provider's typed errors
        (:meth:`classify`)."""
        try:
            yield
        except SessionLost as lost:
            raise self.classify(lost, conn) from lost.cause
        except self.database_error() as exc:
            raise self.classify(exc, conn) from exc

    def session_lost(self, exc: BaseException) -> bool:
        """Whether the driver error ``exc`` says the session ended (server gone, network cut, a failover), by
        the database's code and the driver's error class; never for SQLite, a local file."""
        return False

    def reconnects(self, exc: BaseException) -> bool:
        """Whether a new connection may get through a command that failed with ``exc``: the session was lost,
        or a standby answered a write (the primary moved); nothing of that command was applied but for an
        in-doubt COMMIT (:class:`SessionLost`)."""
        return isinstance(exc, SessionLost) or self.session_lost(exc)

    @contextmanager
    def committing(self) -> Iterator[None]:
        """Around a COMMIT, or a write sent as one statement: a session lost here leaves the write in doubt,
        and leaves as :class:`SessionLost`."""
        try:
            yield
        except self.database_error() as exc:
            if self.session_lost(exc):
                raise SessionLost(exc) from exc
            raise

    def reconnect(self, what: str) -> ConnT:
        """:meth:`connect` again after a lost session, tried for a short while (:data:`RECONNECT_DELAYS`) while
        it fails with a retryable error (no primary yet, a server restarting); ``what`` names the step for
        the log.

        :raises EtlCraftError: the last connect's error once the delays are used up, or at once when it is not
            retryable.
        """
        from airflow_provider_etl_craft.errors import EtlCraftError

        last: EtlCraftError | None = None
        for delay in RECONNECT_DELAYS:
            time.sleep(delay)
            try:
                return self.connect()
            except EtlCraftError as exc:
                if not exc.retryable:
                    raise
                last = exc
                log.warning("etl-craft: reconnecting to the Engine DB for %s: %s", what, exc)
        assert last is not None
        raise last

    def now(self) -> datetime:
        """The current time, UTC (a method so one transaction can use one clock reading)."""
        return datetime.now(UTC)

    @contextmanager
    def transaction(
        self, conn: ConnT, lock: str | None = None, lock_timeout: float | None = None
    ) -> Iterator[Cursor]:
        """Open a write transaction on ``conn``; commit on success, roll back on error. Yields a cursor.

        With ``lock``, the named cross-process lock (docs/locks.md) is taken for exactly this transaction (a
        PostgreSQL advisory *transaction* lock, a lock file around ``BEGIN IMMEDIATE`` on SQLite), so it is
        released by the COMMIT or ROLLBACK, on the same server session, even behind a transaction pooler.

        :param lock_timeout: seconds to wait for ``lock`` (None: wait forever).
        :raises LockTimeoutError: ``lock`` was not acquired in time; nothing was done.
        """
        with self._transaction_lock(lock, lock_timeout):
            cur = conn.cursor()
            try:
                self.begin(cur, lock, lock_timeout)
            except BaseException:
                cur.close()
                raise
            try:
                yield cur
            except BaseException:
                # If the connection is gone the server has rolled back already; keep the original error.
                with suppress(Exception):
                    cur.execute("ROLLBACK")
                raise
            else:
                with self.committing():
                    cur.execute("COMMIT")
            finally:
                cur.close()

    def _transaction_lock(self, lock: str | None, timeout: float | None) -> AbstractContextManager[None]:
        """What holds ``lock`` around the whole transaction (SQLite's lock file); nothing by default."""
        return nullcontext()

    def begin(self, cur: Cursor, lock: str | None, lock_timeout: float | None) -> None:
        """Open the transaction on ``cur`` (and take ``lock`` inside it where the database can)."""
        cur.execute(self.begin_statement)

    def schema_transaction(
        self, conn: ConnT, lock: str | None = None, lock_timeout: float | None = None
    ) -> AbstractContextManager[Cursor]:
        """A transaction for schema changes (init-db, migrations); SQLite widens it (see its dialect)."""
        return self.transaction(conn, lock, lock_timeout)

    def verify_schema(self, conn: ConnT) -> None:
        """Check that transactions on ``conn`` resolve names in the profile's schema (PostgreSQL).

        :raises ConfigurationError: they do not (the role cannot use the schema).
        """
        return None  # SQLite: a database file has no schemas to resolve

    @abstractmethod
    def lock(
        self, name: str, timeout: float | None, conn: ConnT | None = None
    ) -> AbstractContextManager[None]:
        """Hold the named cross-process lock (docs/locks.md) around code that is not one transaction.

        Prefer ``transaction(conn, lock=name)``, which ties the lock to the transaction that needs it.
        ``conn`` may be reused where the lock needs one (PostgreSQL then holds a session lock on it).
        """

    def idle(self, conn: ConnT) -> bool:
        """Whether ``conn`` is open, in autocommit and outside any transaction: safe to use again later
        (:mod:`~airflow_provider_etl_craft.engine.reuse`). False by default: never reused."""
        return False

    @abstractmethod
    def set_autocommit(self, conn: ConnT, autocommit: bool) -> None:
        """Switch ``conn`` between autocommit and driver-managed transactions (common-sql's ``run``)."""

    @abstractmethod
    def get_autocommit(self, conn: ConnT) -> bool:
        """Whether ``conn`` is in autocommit mode."""

    @abstractmethod
    def execute_script(self, cursor: Cursor, text: str) -> None:
        """Run a multi-statement SQL file inside the caller's transaction."""

    def table_names(self, conn: ConnT, cur: Cursor | None = None) -> set[str]:
        """Upper-cased names of the tables in the Engine schema (on ``cur``, inside its transaction, if given)."""
        text, params = self.table_names_query()
        rows = self.rows(cur, text, params) if cur is not None else self.query(conn, text, params)
        return {r[0] for r in rows if not r[0].startswith("SQLITE_")}

    @abstractmethod
    def table_names_query(self) -> tuple[str, tuple[Any, ...]]:
        """SQL (``?`` placeholders) and parameters listing the upper-cased table names of the Engine schema."""

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

    def write_alone(self, conn: ConnT, text: str, params: Sequence[Any] = ()) -> StatementResult:
        """:meth:`execute` for a write: it commits on its own, so a session lost under it leaves it in doubt
        (:class:`SessionLost`)."""
        with self.committing():
            return self.execute(conn, text, params)

    def query(self, conn: ConnT, text: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one statement outside an explicit transaction and return all rows (empty without results)."""
        return self.execute(conn, text, params).rows

    def execute(self, conn: ConnT, text: str, params: Sequence[Any] = ()) -> StatementResult:
        """Run one statement on autocommit ``conn`` as its own transaction: its rows and row count.

        PostgreSQL scopes the Engine schema to that transaction (no session state, see its dialect).
        """
        cur = conn.cursor()
        try:
            cur.execute(self.sql(text), tuple(params))
            return StatementResult(list(cur.fetchall()) if cur.description else [], cur.rowcount)
        finally:
            cur.close()

    def table_prefix(self) -> str:
        """What names an Engine table without a ``search_path``, put where ``{schema}`` stands in the text of
        :meth:`query_alone` (here nothing: a SQLite file's tables are the Engine's)."""
        return ""

    def query_alone(self, conn: ConnT, text: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one read-only statement on autocommit ``conn``, its Engine tables written ``{schema}NAME``.

        The text names the Engine schema itself, so the statement is sent alone: one round trip with every
        driver and no session state, where :meth:`execute` sets the schema for the statement first (psycopg 3
        then takes a transaction of its own). For reads on the run lifecycle's hot path.
        """
        qualified = self._alone_cache.get(text)
        if qualified is None:
            qualified = self._alone_cache[text] = self.sql(text.format(schema=self.table_prefix()))
        cur = conn.cursor()
        try:
            cur.execute(qualified, tuple(params))
            return list(cur.fetchall())
        finally:
            cur.close()

    def rows(self, cur: Cursor, text: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one statement on ``cur`` (inside the caller's transaction) and return all rows."""
        cur.execute(self.sql(text), tuple(params))
        return list(cur.fetchall()) if cur.description else []

    def describe(self) -> str:
        return self.profile.target.describe()
