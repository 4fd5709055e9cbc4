"""PostgreSQL Engine DBs: psycopg2 connections, the Engine schema set per transaction, advisory locks.

Nothing is kept in the server session (no ``search_path`` startup option, no session locks taken by the
Engine itself), so the provider works behind a transaction-mode pooler (PgBouncer ``pool_mode =
transaction``): every transaction starts with ``SET LOCAL search_path``, and a named lock is an advisory
*transaction* lock taken inside the transaction that needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

from msgspec import Struct

from airflow_provider_etl_craft.config.profile import SCHEMA_NAME
from airflow_provider_etl_craft.engine import actor, locks
from airflow_provider_etl_craft.engine.dbapi import Cursor, PgConnection, PgDriver, Row
from airflow_provider_etl_craft.engine.dialects.base import (
    EngineDialect,
    OneStatement,
    ServerFunction,
    SessionLost,
    StatementResult,
)
from airflow_provider_etl_craft.engine.url import (
    LOAD_BALANCE_LIBPQ,
    SESSION_ATTRS,
    WRITABLE_SESSION_ATTRS,
    PostgresTarget,
    host_port,
)
from airflow_provider_etl_craft.errors import (
    ConfigurationError,
    EngineDBError,
    EngineUnreachableError,
    EtlCraftError,
    LockTimeoutError,
    first_line,
)

if TYPE_CHECKING:
    from airflow_provider_etl_craft.config.profile import EngineProfile
    from airflow_provider_etl_craft.engine.dialects import pg_probe

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT = "10"
DEFAULT_APPLICATION_NAME = "etl-craft-airflow"
#: TCP keepalives on every session, so a server that vanishes without closing the connection (a failed-over
#: host, a cut network: no FIN, no RST) is noticed instead of waited on: an idle session is probed after 30 s,
#: then every 10 s, and given up after 3 unanswered probes; data the server has not acknowledged for 60 s
#: (``tcp_user_timeout``, ms, libpq 12 or newer) ends the session too. A dead server is so noticed within
#: about a minute. The URL's own settings win (docs/failover-errors.md).
KEEPALIVE_DEFAULTS = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",
}
#: The oldest libpq that knows ``tcp_user_timeout`` (``PQlibVersion``); with an older one it is not sent.
_TCP_USER_TIMEOUT_LIBPQ = 120000
#: Seconds each host gets for the real login that tells why no primary was found (see :meth:`_no_primary`).
_NO_PRIMARY_LOGIN_TIMEOUT = 3
#: SQLSTATEs (exact, or a two-character class) that mean the server or the session went away: a retry may work.
_GONE = ("08", "53", "57P01", "57P02", "57P03", "58")
#: SQLSTATEs of a command given up in a conflict with another session (or a timeout): a retry may work.
_CONFLICT = ("40001", "40P01", "55P03", "55006", "57014")
#: SQLSTATEs of missing Engine objects (tables, columns, schema): the Engine DB needs init-db or migrate.
_MISSING = ("42P01", "42703", "3F000", "42883")
_INSUFFICIENT_PRIVILEGE = "42501"
_INVALID_CATALOG = "3D000"
_READ_ONLY_TRANSACTION = "25006"
#: SQLSTATEs of the server ending the session: admin_shutdown, crash_shutdown, cannot_connect_now.
_SESSION_ENDED = ("57P01", "57P02", "57P03")
#: SQLSTATEs of a refused login (invalid_password, invalid_authorization_specification), if the driver has one.
_LOGIN_REFUSED = ("28P01", "28000")
_INVALID_PASSWORD = "28P01"
#: too_many_connections: no connection slot for this login (the server's, or the role's or database's limit).
_TOO_MANY_CONNECTIONS = "53300"
#: libpq settings that ask more of the server than the probe checks (:mod:`.pg_probe`): with one of them, a
#: probe that got a session does not show that libpq would have.
_STRICTER_THAN_PROBE = ("channel_binding", "require_auth", "requirepeer", "sslcrl", "sslcrldir",
                        "ssl_min_protocol_version", "ssl_max_protocol_version")  # fmt: skip
#: libpq settings sent as startup parameters that connection poolers refuse unless their
#: ``ignore_startup_parameters`` lists them (PgBouncer passes only client_encoding, DateStyle, TimeZone,
#: standard_conforming_strings and application_name; RDS Proxy pins or refuses the rest).
POOLER_REFUSED_STARTUP = frozenset({"options"})
#: The channel of change notices (payload ``<schema>:<PIPELINE_ID>``), per database as NOTIFY is; ENGINE
#: migration 0003's ETL_CRAFT_FINISH sends it too (a test pins the two together).
CHANGE_CHANNEL = "etl_craft_changes"


#: libpq's PQTRANS_IDLE: the session is outside any transaction (``connection.info.transaction_status``).
_PQTRANS_IDLE = 0


class PostgresDialect(EngineDialect[PgConnection]):
    name = "postgresql"
    placeholder = "%s"

    def __init__(self, profile: EngineProfile) -> None:
        super().__init__(profile)
        self._scoped_cache: dict[str, str] = {}
        self._at_once_cache: dict[str, str] = {}

    def to_db_time(self, value: datetime) -> datetime:
        return value.astimezone(UTC)

    def from_db_time(self, value: Any) -> datetime | None:
        return None if value is None else value.astimezone(UTC)

    def to_db_date(self, value: datetime) -> date:
        return value.astimezone(UTC).date()

    def integrity_error(self) -> type[Exception]:
        return self._driver_module().IntegrityError

    def database_error(self) -> type[Exception]:
        return self._driver_module().Error

    def _driver_module(self) -> PgDriver:
        """psycopg2, or psycopg 3 for auth modes that need libpq ≥ 18 (sso); both speak DB-API with ``%s``."""
        if self.profile.auth.driver != "psycopg":
            import psycopg2

            return psycopg2
        from airflow_provider_etl_craft.auth.sso import check_libpq

        setting = self.profile.setting("auth_mode")
        try:
            import psycopg
        except ImportError:
            raise ConfigurationError(
                f"{self.profile.origin}: {setting} is '{self.profile.auth.name}', which needs psycopg 3 with libpq 18 "
                "or newer: pip install 'airflow-provider-etl-craft[sso]'"
            ) from None
        check_libpq(
            psycopg.pq.version(), f"{self.profile.origin}: {setting}", f"psycopg {psycopg.__version__}"
        )
        return psycopg

    @property
    def target(self) -> PostgresTarget:
        target = self.profile.target
        assert isinstance(target, PostgresTarget)
        return target

    def connect_kwargs(self) -> dict[str, Any]:
        """Everything passed to ``psycopg2.connect``; holds secrets, so never log it (use :meth:`describe`).

        No ``options`` of its own (poolers refuse that startup parameter); the URL's are passed as given.
        """
        return self._with_target(self.profile.auth.connect_kwargs(self.profile))

    def _with_target(self, auth_kwargs: dict[str, Any], driver: PgDriver | None = None) -> dict[str, Any]:
        """The target's libpq settings over the provider's defaults (connect timeout, application name, TCP
        keepalives: :data:`KEEPALIVE_DEFAULTS`), then hosts, database and the auth mode's ``auth_kwargs``.

        With ``driver``, a default its libpq does not know is left out (``tcp_user_timeout`` before libpq 12).
        """
        target = self.target
        defaults = dict(KEEPALIVE_DEFAULTS)
        if driver is not None and _libpq_version(driver) < _TCP_USER_TIMEOUT_LIBPQ:
            del defaults["tcp_user_timeout"]
        return {
            "connect_timeout": DEFAULT_CONNECT_TIMEOUT,
            "application_name": DEFAULT_APPLICATION_NAME,
            **defaults,
            **target.settings,
            **target.driver_hosts(),
            "dbname": target.database,
            **auth_kwargs,
        }

    def _open(self, driver: PgDriver) -> PgConnection:
        """A session with the auth mode's credential; when the server refuses that login, the mode may renew a
        credential it cached (:meth:`AuthMode.renew_kwargs`) and the login is tried once more, never twice.

        A refusal that did not last (a server starting up or shutting down in a switchover, taking the probe's
        own login a moment later) is told apart by :mod:`.pg_probe` and classified retryable; nothing is tried
        again here for it.
        """
        auth, profile = self.profile.auth, self.profile
        auth_kwargs = auth.connect_kwargs(profile)
        try:
            return driver.connect(**self._with_target(auth_kwargs, driver))
        except driver.OperationalError as exc:
            error, login_refused = self._connect_error(exc, driver, auth_kwargs)
        # Outside the handler: an error of the renewal (the token endpoint is down) carries no driver error.
        renewed = auth.renew_kwargs(profile, auth_kwargs) if login_refused else None
        if renewed is None:
            raise error
        try:
            return driver.connect(**self._with_target(renewed, driver))
        except driver.OperationalError as exc:
            raise self._connect_error(exc, driver, renewed)[0] from None

    #: A login is a round trip or more (TLS, SCRAM) and a backend forked on the server: worth overlapping.
    #: Both drivers' connections are thread-safe (DB-API threadsafety 2).
    logs_in_ahead = True

    def prepare_login(self) -> None:
        with suppress(EtlCraftError, ImportError):
            self._driver_module()

    def connect(self, create: bool = False) -> PgConnection:  # a server database is never created here
        """:meth:`login`, then the schema check, the session's first statement: every error leaves typed."""
        conn = self.login()
        try:
            with self._first_statement(conn):
                self.require_schema(conn)
        except BaseException:
            with suppress(Exception):  # the session may be gone already
                conn.close()
            raise
        return conn

    @contextmanager
    def _first_statement(self, conn: PgConnection) -> Iterator[None]:
        """The first statements on a new session leave driver errors typed (:meth:`classify`), and a session lost
        there (the server went away or restarted after the login, a proxy closed it: a failover) as a retryable
        ``lost_before_first_statement``: those statements only read, so nothing was written."""
        driver = self._driver_module()
        try:
            yield
        except self.database_error() as exc:
            code = locks.sqlstate(exc)
            lost = code is None and isinstance(exc, (driver.OperationalError, driver.InterfaceError))
            if not (lost or _matches(code, _GONE)):
                raise self.classify(exc) from exc
            detail = first_line(exc)
            said = f"SQLSTATE {code}: {detail}" if code else detail
            raise failover_error(
                "lost_before_first_statement",
                f"lost the Engine DB {self.describe()} as {self.profile.user or 'the default role'} right after the "
                f"login, before its first statement ({said}); nothing was written; the server restarted or went "
                "away, or a failover is under way: a retry may succeed once it answers again",
            ) from exc

    def login(self, create: bool = False) -> PgConnection:
        driver = self._driver_module()
        self._check_libpq(driver)
        conn = self._open(driver)
        conn.autocommit = True
        return conn

    def _check_libpq(self, driver: PgDriver) -> None:
        """The URL's multi-host settings need a libpq that knows them (libpq would refuse the keyword).

        :raises ConfigurationError: naming the setting, the libpq it needs and the one the driver has.
        """
        from airflow_provider_etl_craft.auth.sso import libpq_version_text

        settings = self.target.settings
        version = _libpq_version(driver)
        needs = [
            (key, value, oldest)
            for key, value, oldest in (
                ("load_balance_hosts", settings.get("load_balance_hosts"), LOAD_BALANCE_LIBPQ),
                ("target_session_attrs", settings.get("target_session_attrs"), 0),
            )
            if value is not None
        ]
        for key, value, oldest in needs:
            oldest = oldest or SESSION_ATTRS.get(value, 0)
            if version < oldest:
                raise ConfigurationError(
                    f"{self.profile.origin}: {self.profile.setting('jdbc_url')} sets {key}={value}, which needs "
                    f"libpq {libpq_version_text(oldest)} or newer; the driver "
                    f"{getattr(driver, '__name__', 'psycopg2')} uses libpq {libpq_version_text(version)}: install "
                    "a newer psycopg2-binary (or psycopg2 built against a newer libpq), or remove the setting"
                )

    def reached(self, conn: PgConnection) -> tuple[str, bool]:
        """The server this session is on (``host:port``, from the server's side; ``local socket`` over a Unix
        socket) and whether it is a standby (in recovery), for ``check`` to name the host of a multi-host URL.

        The first statement of ``check``'s session: errors leave typed (see :meth:`_first_statement`)."""
        with self._first_statement(conn), conn.cursor() as cur:
            cur.execute("SELECT host(inet_server_addr()), inet_server_port(), pg_is_in_recovery()")
            row = cur.fetchone()
        assert row is not None  # a SELECT without FROM returns one row
        address, port, in_recovery = row
        return ("local socket" if address is None else host_port(address, port)), bool(in_recovery)

    def require_schema(self, conn: PgConnection) -> None:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.profile.schema,))
            found = cur.fetchone()
        if found is None:
            raise ConfigurationError(
                f'schema "{self.profile.schema}" ({self.profile.setting("schema")}) does not exist in database '
                f'"{self.target.database}" on {self.target.servers()}; the provider never creates '
                f"schemas: ask an administrator to run CREATE SCHEMA {self.profile.schema}; and grant your role "
                "CREATE on it"
            )

    def connect_for_sql(self) -> PgConnection:
        """A connection whose cursors put the Engine schema first in every transaction they open, never on the
        session (see :mod:`.pg_user_sql` and docs/etl-craft-parity.md, "Your own SQL")."""
        from airflow_provider_etl_craft.engine.dialects import pg_user_sql

        scope = pg_user_sql.schema_first_sql(self._quoted_schema())
        conn = self.connect()
        if self.profile.auth.driver == "psycopg":
            conn.cursor_factory = pg_user_sql.psycopg_cursor(scope)
        else:
            conn.cursor_factory = pg_user_sql.psycopg2_cursor(scope)
        return conn

    def verify_schema(self, conn: PgConnection) -> None:
        """Inside a transaction, after its ``SET LOCAL search_path``, ``current_schema()`` must be the profile's.

        It is NULL when the role lacks USAGE on the schema (and the schema is then useless to it).
        """
        with self.transaction(conn) as cur:
            cur.execute("SELECT current_schema()")
            row = cur.fetchone()
        assert row is not None  # a SELECT without FROM returns one row
        (found,) = row
        if found != self.profile.schema:
            raise ConfigurationError(
                f"transactions on {self.describe()} as {self.profile.user or 'the default role'} resolve names in "
                f"schema {'no schema' if found is None else repr(found)}, not in the profile's schema "
                f'"{self.profile.schema}" ({self.profile.setting("schema")}); ask an administrator to GRANT USAGE, '
                f"CREATE ON SCHEMA {self.profile.schema} to your role"
            )

    @property
    def _one_round_trip(self) -> bool:
        """psycopg2 interpolates parameters client-side, so several statements go as one query string.

        psycopg 3 binds them server-side, one statement per execute.
        """
        return self.profile.auth.driver != "psycopg"

    def _quoted_schema(self) -> str:
        schema = self.profile.schema
        if not SCHEMA_NAME.fullmatch(schema):  # validated by the profile already; never trust it into SQL
            raise ConfigurationError(f"schema {schema!r} is not a plain identifier")
        return f'"{schema}"'

    def table_prefix(self) -> str:
        return f"{self._quoted_schema()}."

    def _set_search_path(self) -> str:
        return f"SET LOCAL search_path TO {self._quoted_schema()}"

    def begin(self, cur: Cursor, lock: str | None, lock_timeout: float | None) -> None:
        """``BEGIN``, the Engine schema for this transaction, and ``lock`` as an advisory transaction lock.

        ``lock_timeout`` bounds only the lock wait: it is set just before and reset to 0 just after, both
        ``LOCAL``. The actor of the writes (:mod:`~airflow_provider_etl_craft.engine.actor`) is set for the
        transaction, as etl-craft's guards require. With psycopg2 all of it is one round trip.

        :raises LockTimeoutError: the wait hit ``lock_timeout`` (SQLSTATE 55P03); the transaction is rolled back.
        """
        steps: list[tuple[str, tuple[Any, ...]]] = [
            ("BEGIN", ()),
            (self._set_search_path(), ()),
            (_SET_ACTOR, _actor_params()),
        ]
        if lock is not None:
            locks.check_lock_name(lock)
            steps += [
                ("SELECT set_config('lock_timeout', %s, true)", (_lock_wait(lock_timeout),)),
                ("SELECT pg_advisory_xact_lock(%s)", (locks.advisory_key(self.profile.schema, lock),)),
                ("SET LOCAL lock_timeout = 0", ()),
            ]
        try:
            if self._one_round_trip:
                cur.execute("; ".join(text for text, _ in steps), tuple(p for _, ps in steps for p in ps))
            else:
                for text, params in steps:
                    if params:
                        cur.execute(text, params)
                    else:  # none passed: psycopg 3 sends the text as written (no placeholder parsing)
                        cur.execute(text)
        except Exception as exc:
            with suppress(Exception):
                cur.execute("ROLLBACK")
            if lock is not None and locks.sqlstate(exc) == locks.LOCK_NOT_AVAILABLE:
                raise locks.lock_timeout_error(self.profile.schema, lock, lock_timeout) from None
            raise

    def execute(self, conn: PgConnection, text: str, params: Sequence[Any] = ()) -> StatementResult:
        """One statement with the Engine schema (and the actor) set for it alone: with psycopg2
        ``SET LOCAL search_path; SELECT set_config(…); <sql>`` in one query string, which the server runs as one
        implicit transaction (one round trip)."""
        if not self._one_round_trip:
            with self.transaction(conn) as cur:
                cur.execute(self.sql(text), tuple(params))
                return StatementResult(list(cur.fetchall()) if cur.description else [], cur.rowcount)
        scoped = self._scoped_cache.get(text)
        if scoped is None:
            scoped = self._scoped_cache[text] = f"{self._set_search_path()}; {_SET_ACTOR}; {self.sql(text)}"
        cur = conn.cursor()
        try:
            cur.execute(scoped, (*_actor_params(), *params))
            return StatementResult(list(cur.fetchall()) if cur.description else [], cur.rowcount)
        finally:
            cur.close()

    def session_lost(self, exc: BaseException) -> bool:
        """A driver error without a SQLSTATE (psycopg reports a broken session so: server gone, TLS closed,
        network cut), connection_exception (class 08), or the server ending the session (57P01 admin_shutdown,
        57P02 crash_shutdown, 57P03 cannot_connect_now)."""
        if isinstance(exc, SessionLost):
            return True
        driver = self._driver_module()
        code = locks.sqlstate(exc)
        if code is None:
            return isinstance(exc, (driver.OperationalError, driver.InterfaceError))
        return code.startswith("08") or code in _SESSION_ENDED

    def reconnects(self, exc: BaseException) -> bool:
        """A lost session, or 25006 read_only_sql_transaction: a standby or a demoted primary answered a write,
        so the primary has moved (or is moving); a new connection finds it."""
        return self.session_lost(exc) or locks.sqlstate(exc) == _READ_ONLY_TRANSACTION

    def classify(self, exc: BaseException, conn: PgConnection | None = None) -> EtlCraftError:
        """By SQLSTATE (:data:`_BY_SQLSTATE`, the module's tables); a driver error without one after login lost
        the session.

        A :class:`SessionLost` (the session ended under a COMMIT) is reported as in doubt.
        """
        in_doubt = isinstance(exc, SessionLost)
        if isinstance(exc, SessionLost):
            exc = exc.cause
        failed = _Failed(
            code=locks.sqlstate(exc),
            detail=first_line(exc),
            where=f"{self.describe()} as {self.profile.user or 'the default role'}",
        )
        driver = self._driver_module()
        if failed.code is None and not isinstance(exc, (driver.OperationalError, driver.InterfaceError)):
            return EngineDBError(
                f"the database driver refused a command on {failed.where} ({type(exc).__name__}: "
                f"{failed.detail}); this is a defect of the provider: please report it"
            )
        if in_doubt:
            return failover_error(
                "commit_in_doubt",
                f"lost the Engine DB {failed.where} while it committed a write ({failed.said}): the write is in "
                "doubt, committed or not; a retry of the step recognises its own write if it was committed "
                '(docs/high-availability.md, "In-doubt commits")',
                in_doubt=True,
            )
        if failed.code is None:
            return _session_lost(self, failed, conn)
        for codes, error in _BY_SQLSTATE:
            if _matches(failed.code, codes):
                return error(self, failed, conn)
        return EngineDBError(f"the Engine DB {failed.where} refused a command ({failed.said})")

    def _connect_error(
        self, exc: Exception, driver: PgDriver, auth_kwargs: dict[str, Any]
    ) -> tuple[Exception, bool]:
        """Why libpq could not open a session, decided by what the server answers (:mod:`.pg_probe`), by
        SQLSTATE where it gives one, never by libpq's text (which is shown, not read); and whether the login
        itself was refused: the probe, logging in with the same credential, was refused with an authentication
        SQLSTATE (28xxx) or could not answer the server's authentication request (no password; GSSAPI, OAuth),
        or the driver reports an authentication SQLSTATE. A login that passed and then met a limit (53300) is
        no refused login: the credential is not renewed for it.

        With a ``target_session_attrs`` that asks for a primary, a host that would take the session may have
        been skipped for being a standby or read-only: :meth:`_no_primary` logs in to find out first."""
        # Loaded here, on a failed connect only: a login that works never needs the probe (docs/performance.md).
        from airflow_provider_etl_craft.engine.dialects import pg_probe

        target, profile = self.target, self.profile
        # The client's own key or file first: libpq may have failed before the server had a say.
        local = profile.auth.local_problem(profile)
        if local is not None:
            return local, False
        timeout = float(target.settings.get("connect_timeout") or DEFAULT_CONNECT_TIMEOUT)
        startup = {
            k: target.settings[k]
            for k in ("application_name", "options", "client_encoding")
            if target.settings.get(k)
        } or {"application_name": DEFAULT_APPLICATION_NAME}
        login = pg_probe.Login(
            password=auth_kwargs.get("password"),
            cert=auth_kwargs.get("sslcert") or target.settings.get("sslcert"),
            key=auth_kwargs.get("sslkey") or target.settings.get("sslkey"),
            key_password=auth_kwargs.get("sslpassword"),
        )
        answers = [
            (host_port(host, port), pg_probe.ask(
                host, port, target.database, user=profile.user, startup=startup, settings=target.settings,
                timeout=max(1.0, min(timeout, 10.0)), login=login,
            ))
            for host, port in target.hosts
        ]  # fmt: skip
        if target.settings.get("target_session_attrs") in WRITABLE_SESSION_ATTRS and any(
            a.takes_sessions for _, a in answers
        ):
            no_primary = self._no_primary(driver, auth_kwargs, answers)
            if no_primary is not None:
                return no_primary, False
        # The login itself was refused: a credential the probe could not try, or one the server refused (28xxx).
        login_refused = (
            any(
                a.asked_login and not a.logged_in and (a.sqlstate is None or a.sqlstate.startswith("28"))
                for _, a in answers
            )
            or locks.sqlstate(exc) in _LOGIN_REFUSED
        )
        return self._refusal(exc, *_deciding(answers)), login_refused

    def _no_primary(
        self, driver: PgDriver, auth_kwargs: dict[str, Any], answers: list[tuple[str, pg_probe.ServerAnswer]]
    ) -> EngineUnreachableError | None:
        """After libpq found no host fit for ``target_session_attrs=read-write``/``primary``: log in to each host
        that would take a session, for real (the same credential, without ``target_session_attrs``, a short
        timeout), ask it whether it is in recovery and whether its sessions are read-only, and close.

        :return: when any login worked, the retryable ``no_primary`` error naming each host's answer (a standby,
            a read-only server, or a primary by now, which libpq missed by a moment); None when no login worked,
            so the refusal is classified as any other.
        """
        kwargs = self._with_target(auth_kwargs, driver)
        for key in ("target_session_attrs", "load_balance_hosts"):
            kwargs.pop(key, None)
        kwargs["connect_timeout"] = str(_NO_PRIMARY_LOGIN_TIMEOUT)
        said: list[str] = []
        logged_in = False
        for (host, port), (where, answer) in zip(self.target.hosts, answers, strict=True):
            if not answer.takes_sessions:
                said.append(f"{where} {_unanswered(answer)}")
                continue
            try:
                conn = driver.connect(**{**kwargs, "host": host, "port": str(port)})
            except driver.Error as exc:
                said.append(f"{where} did not take the login ({first_line(exc)})")
                continue
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')")
                    row = cur.fetchone()
            except driver.Error as exc:
                said.append(f"{where} took the login, then failed ({first_line(exc)})")
                continue
            finally:
                with suppress(Exception):
                    conn.close()
            logged_in = True
            in_recovery, read_only = row if row is not None else (None, None)
            if in_recovery:
                said.append(f"{where} is a standby (in recovery)")
            elif read_only == "on":
                said.append(f"{where} takes no writes (transaction_read_only is on, not in recovery)")
            else:
                said.append(f"{where} takes writes now (a primary libpq missed by a moment)")
        if not logged_in:
            return None
        return failover_error(
            "no_primary",
            f"no primary among the hosts of the Engine DB {self.describe()} as {self.profile.user or 'the default role'}"
            f": {'; '.join(said)}; a failover may be under way: a retry may succeed once a primary is promoted; "
            f"if this persists, no host of {self.profile.setting('jdbc_url')} takes writes: point it at the "
            "primary (or turn default_transaction_read_only off for the role or database)",
        )

    def _refusal(self, exc: Exception, answer: pg_probe.ServerAnswer, hosts_note: str = "") -> Exception:
        """The error for a failed connect, given the server's answer to the probe (of several hosts, the one
        :func:`_deciding` chose, which ``hosts_note`` names): no answer, a session refused, a login refused by
        SQLSTATE, else a refusal libpq reports only in text."""
        lines = str(exc).strip().splitlines() or ["no detail"]
        profile = self.profile
        # libpq writes one unindented line per host it tried (hints indented): shown, never read.
        detail = (
            "; ".join(ln.strip() for ln in lines if ln[:1].strip()) if self.target.other_hosts else lines[0]
        )
        where = (
            f"{self.describe()}{hosts_note} as {profile.user or 'the default role'} ({profile.describe()})"
        )
        refused = _Refused(where=where, detail=detail, answer=answer)
        return (
            _not_answered(self, refused)
            or _session_refused(self, refused)
            or _login_refused(self, refused)
            or _refused_in_text(self, refused)
        )

    @contextmanager
    def _lock(self, name: str, timeout: float | None, conn: PgConnection | None) -> Iterator[None]:
        if conn is not None:
            with locks.advisory_lock(conn, self.profile.schema, name, timeout):
                yield
            return
        # A connection of its own: the lock is a transaction lock on it, held while the transaction is open,
        # so it is released by the same server session (also behind a transaction pooler) or when that dies.
        own = self.connect()
        try:
            with self.transaction(own, lock=name, lock_timeout=timeout):
                yield
        finally:
            own.close()

    def lock(
        self, name: str, timeout: float | None, conn: PgConnection | None = None
    ) -> AbstractContextManager[None]:
        """Hold ``name`` around code that is not one transaction.

        Without ``conn``: an advisory transaction lock on a connection of its own, open until the block ends.
        With ``conn``: a session lock on it (the caller keeps using ``conn`` in autocommit inside the block),
        whose unlock is checked (see :func:`~airflow_provider_etl_craft.engine.locks.advisory_lock`).
        """
        locks.check_lock_name(name)
        return self._lock(name, timeout, conn)

    def idle(self, conn: PgConnection) -> bool:
        """Open, in autocommit, and libpq's transaction status idle (no transaction or error state open)."""
        if conn.closed or not conn.autocommit:
            return False
        info: Any = getattr(conn, "info", None)  # psycopg2 and psycopg 3 both have connection.info
        return info is not None and info.transaction_status == _PQTRANS_IDLE

    def set_autocommit(self, conn: PgConnection, autocommit: bool) -> None:
        conn.autocommit = autocommit

    def get_autocommit(self, conn: PgConnection) -> bool:
        return bool(conn.autocommit)

    def execute_script(self, cursor: Cursor, text: str) -> None:
        cursor.execute(text)

    def write_at_once(
        self, conn: PgConnection, statement: OneStatement, params: Sequence[Any]
    ) -> StatementResult | None:
        """The statement alone, as its own transaction (a session lost under it leaves it in doubt)."""
        if not self.at_once_forms:
            return None
        if statement.notifies:
            params = (*params, CHANGE_CHANNEL, self._notice_prefix)
        return self.write_alone(conn, statement.text, params)

    # -- change notices: LISTEN/NOTIFY on CHANGE_CHANNEL, payload "<schema>:<PIPELINE_ID>" --------------------

    delivers_notices = True

    @property
    def _notice_prefix(self) -> str:
        return f"{self.profile.schema}:"

    def change_notice(
        self, pipeline_id: int | None = None, pipeline_run_id: int | None = None
    ) -> tuple[str, tuple[Any, ...]] | None:
        if pipeline_id is not None:
            return "SELECT pg_notify(?, ?)", (CHANGE_CHANNEL, f"{self._notice_prefix}{pipeline_id}")
        return (
            "SELECT pg_notify(?, ? || PIPELINE_ID) FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = ?",
            (CHANGE_CHANNEL, self._notice_prefix, pipeline_run_id),
        )

    def listen(self, conn: PgConnection) -> None:
        cur = conn.cursor()
        try:
            cur.execute(f"LISTEN {CHANGE_CHANNEL}")
        finally:
            cur.close()

    def received_notices(self, conn: PgConnection) -> set[int]:
        """Notices of this profile's schema only (several Engine schemas may share a database)."""
        if self.profile.auth.driver == "psycopg":
            payloads = [n.payload for n in conn.notifies(timeout=0)]  # type: ignore[attr-defined]
        else:
            conn.poll()  # type: ignore[attr-defined]
            payloads = [n.payload for n in conn.notifies]  # type: ignore[attr-defined]
            conn.notifies.clear()  # type: ignore[attr-defined]
        prefix = self._notice_prefix
        return {
            int(p[len(prefix) :]) for p in payloads if p.startswith(prefix) and p[len(prefix) :].isdigit()
        }

    def call_at_once(
        self,
        conn: PgConnection,
        function: ServerFunction,
        params: Sequence[Any],
        *,
        lock: str,
        lock_timeout: float | None,
    ) -> Row | None:
        """Call ``function`` by its schema-qualified name, as its own transaction: one round trip with either driver.

        The function keeps the Engine schema as its own ``search_path``, so nothing is set first: the call is one
        statement on the autocommit connection (psycopg2 and psycopg 3 alike), and the transaction lock it takes
        ends with it. The lock key and wait go first.
        """
        if not self.at_once_forms:
            return None
        key = locks.advisory_key(self.profile.schema, locks.check_lock_name(lock))
        text = self._at_once_cache.get(function.name)
        if text is None:
            # The actor and its kind (the last two parameters) are set for the call's transaction first: the
            # function takes them from the settings' values, so they are set before it writes anything.
            arguments = ", ".join(f"%s::{t}" for t in ("BIGINT", "TEXT", *function.types[:-2]))
            call = f"{self._quoted_schema()}.{function.name}({arguments}, s.actor, s.kind)"
            text = _SET_ACTOR_FOR_CALL + f"LATERAL {call} f"
            self._at_once_cache[function.name] = text
        *values, by, kind = params
        cur = conn.cursor()
        try:
            with self.committing():  # the call is its own transaction: a session lost under it is in doubt
                cur.execute(text, (by, kind, key, _lock_wait(lock_timeout), *values))
                return cur.fetchone()
        except self.database_error() as exc:
            code = locks.sqlstate(exc)
            if code == locks.LOCK_NOT_AVAILABLE:
                raise locks.lock_timeout_error(self.profile.schema, lock, lock_timeout) from None
            if code in _MISSING or code == _INSUFFICIENT_PRIVILEGE:
                return None
            raise
        finally:
            cur.close()

    def table_names_query(self) -> tuple[str, tuple[Any, ...]]:
        return (
            "SELECT upper(c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = ? AND c.relkind IN ('r', 'p')",
            (self.profile.schema,),
        )


#: Sets the actor of the transaction's writes (etl-craft's guards and defaults read these settings): ``true``
#: makes each setting end with the transaction, so nothing outlives it behind a transaction pooler.
_SET_ACTOR = (
    "SELECT set_config('etl_craft.actor', %s, true), set_config('etl_craft.actor_kind', %s, true), "
    "set_config('etl_craft.migration', %s, true)"
)


#: The actor and its kind set before a one-call function: it takes them as ``s.actor`` and ``s.kind``.
_SET_ACTOR_FOR_CALL = (
    "SELECT f.* FROM (SELECT set_config('etl_craft.actor', %s, true) AS actor, "
    "set_config('etl_craft.actor_kind', %s, true) AS kind) s, "
)


class _Failed(Struct, frozen=True):
    """A command the Engine DB failed, as :meth:`PostgresDialect.classify` describes it."""

    code: str | None  #: the SQLSTATE, if the driver gave one
    detail: str  #: the driver's first line (shown, never read)
    where: str  #: the Engine DB and the role

    @property
    def said(self) -> str:
        return f"SQLSTATE {self.code}: {self.detail}" if self.code else self.detail


def _session_lost(dialect: PostgresDialect, failed: _Failed, conn: PgConnection | None) -> EtlCraftError:
    # The server rolls back the open transaction of a session that ends before its COMMIT.
    return failover_error(
        "session_lost",
        f"lost the Engine DB {failed.where} in the middle of a command ({failed.said}); its transaction was not "
        "committed; a retry may succeed once the server answers again",
    )


def _conflict(dialect: PostgresDialect, failed: _Failed, conn: PgConnection | None) -> EtlCraftError:
    return LockTimeoutError(
        f"the Engine DB {failed.where} gave up a command in a conflict with another session or a timeout "
        f"({failed.said}); nothing of it was committed; a retry may succeed"
    )


def _denied(dialect: PostgresDialect, failed: _Failed, conn: PgConnection | None) -> EtlCraftError:
    role, schema = dialect.profile.user or "the default role", dialect.profile.schema
    return ConfigurationError(
        f"role {role} lacks a privilege on the Engine DB {dialect.describe()} ({failed.said}); ask an administrator "
        f"to run: GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}; GRANT SELECT, INSERT, UPDATE, DELETE ON ALL "
        f"TABLES IN SCHEMA {schema} TO {role}; GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}"
    )


def _read_only(dialect: PostgresDialect, failed: _Failed, conn: PgConnection | None) -> EtlCraftError:
    # A standby, or a primary demoted under the session, answered a write; nothing of it was written.
    return failover_error(
        "read_only_answer",
        f"the Engine DB {failed.where} refused a write as read-only ({failed.said}); nothing of that command was "
        "written: a failover may be under way (a demoted primary or a standby answered), and a retry may "
        f"succeed once the new primary takes over; if this persists, {dialect.profile.setting('jdbc_url')} "
        "reaches a standby or a read-only database: point it at the primary (with several hosts add "
        "targetServerType=primary, libpq's target_session_attrs=read-write)",
    )


def _missing(dialect: PostgresDialect, failed: _Failed, conn: PgConnection | None) -> EtlCraftError:
    if conn is not None:  # a table is "missing" too when the role may not use its schema
        try:
            dialect.verify_schema(conn)
        except ConfigurationError as denied:
            return denied
        except Exception:  # noqa: BLE001 - the session is unusable: keep the first answer
            pass
    role, schema = dialect.profile.user or "the default role", dialect.profile.schema
    return EngineDBError(
        f"the Engine DB {failed.where} lacks an Engine table or column in schema {schema} ({failed.said}); run "
        f"`etl-craft-airflow migrate` (or init-db) against it, or, if they exist, GRANT USAGE ON SCHEMA "
        f"{schema} TO {role}"
    )


#: What a failed command means, by SQLSTATE (codes, or classes of two characters), the first match winning.
_BY_SQLSTATE: tuple[
    tuple[tuple[str, ...], Callable[[PostgresDialect, _Failed, PgConnection | None], EtlCraftError]], ...
] = (
    (_GONE, _session_lost),
    (_CONFLICT, _conflict),
    ((_INSUFFICIENT_PRIVILEGE,), _denied),
    ((_READ_ONLY_TRANSACTION,), _read_only),
    (_MISSING, _missing),
)


class _Refused(Struct, frozen=True):
    """A connect libpq failed, and what the server answered the probe, as :meth:`PostgresDialect._refusal`
    describes it."""

    where: str  #: the Engine DB (the host that decided), the role and the profile
    detail: str  #: libpq's text (shown, never read)
    answer: pg_probe.ServerAnswer

    @property
    def code(self) -> str | None:
        return self.answer.sqlstate

    @property
    def said(self) -> str:
        return f"SQLSTATE {self.code}: {self.answer.message}" if self.code else self.detail

    @property
    def stage(self) -> str:
        return "after the login" if self.answer.logged_in else "before the login"


def _not_answered(dialect: PostgresDialect, refused: _Refused) -> Exception | None:
    """Nothing took the connection, or it said nothing, or its certificate did not verify (else None)."""
    where, detail, answer = refused.where, refused.detail, refused.answer
    if not answer.reachable:
        return failover_error(
            "unreachable",
            f"cannot reach the Engine DB {where}: {detail}; nothing accepted the connection (a server stopped, "
            "or a new primary not promoted yet); check host, port and network (a retry may succeed)",
        )
    if answer.said_nothing == "closed":
        return failover_error(
            "peer_closed",
            f"the Engine DB {where} accepted the connection, then closed it without answering ({detail}); a "
            "proxy (HAProxy, a load balancer) does so while no primary is up behind it, as during a failover: "
            "a retry may succeed; if this persists, check that the port is a PostgreSQL server or pooler and "
            "that the proxy has a healthy primary behind it",
        )
    if answer.said_nothing == "silent":
        return failover_error(
            "peer_silent",
            f"the Engine DB {where} accepted the connection, then never answered within {answer.waited:g} s "
            f"({detail}); a proxy whose backend is down, or a server hung in a failover, does so: a retry may "
            "succeed; if this persists, check that the port is a PostgreSQL server or pooler and that it "
            "answers (connect_timeout in jdbc_url bounds the wait)",
        )
    if answer.tls_error:
        return ConfigurationError(
            f"the Engine DB {where} presented a certificate that does not verify ({answer.tls_error}); check "
            f"{dialect.profile.setting('jdbc_url')}'s sslmode and sslrootcert (the CA that signed the server's "
            "certificate)"
        )
    return None


def _session_refused(dialect: PostgresDialect, refused: _Refused) -> Exception | None:
    """The server takes no session now (full, starting, stopping), or has no such database (else None)."""
    where, code, said = refused.where, refused.code, refused.said
    if code == _TOO_MANY_CONNECTIONS:
        return failover_error(
            "server_full",
            f"the Engine DB {where} is full: it has no connection slot free for this login, {refused.stage} "
            f"({said}); every connection the server allows (max_connections less its reserved slots), or the "
            "CONNECTION LIMIT of the role or of the database, is taken; a retry may succeed once other sessions "
            "end; if this persists, raise that limit or open fewer sessions (Airflow pools, deferred waits, other "
            "clients of the role)",
        )
    if code is not None and (code.startswith("53") or code in ("57P01", "57P02", "57P03")):
        return failover_error(
            "not_accepting",
            f"the Engine DB {where} does not take sessions now ({said}): it is starting up, shutting down, "
            "in recovery (a standby being promoted) or short of a resource; a retry may succeed",
        )
    if code == _INVALID_CATALOG:
        return ConfigurationError(
            f"the Engine DB {where} refused the session ({said}): database {dialect.target.database!r} does not "
            f"exist there; fix {dialect.profile.setting('jdbc_url')} or ask an administrator to create it"
        )
    return None


def _login_refused(dialect: PostgresDialect, refused: _Refused) -> Exception | None:
    """A startup parameter a pooler refuses, or a login or session the server refused by SQLSTATE (else None)."""
    where, code, said = refused.where, refused.code, refused.said
    startup_refused = sorted(POOLER_REFUSED_STARTUP & dialect.target.settings.keys())
    if startup_refused and (code is None or not code.startswith("28")):
        return ConfigurationError(
            f"the Engine DB refused the connection to {where}: {refused.detail}; jdbc_url sends the startup "
            f"parameter {', '.join(startup_refused)}, which connection poolers (PgBouncer, RDS Proxy) refuse unless "
            "their ignore_startup_parameters lists it: remove it from jdbc_url (the provider sets the Engine schema "
            "in every transaction itself); if no pooler is in between, check user, auth_mode and its secret or files"
        )
    if code == _INVALID_PASSWORD:  # the server checked the credential and refused it
        return ConfigurationError(
            f"the Engine DB refused the login to {where} ({said}): the secret is wrong for this role, or the "
            "role does not exist or may not log in; check user, auth_mode and its secret"
        )
    if code is not None and code.startswith("28"):  # no pg_hba.conf entry (or method) for this login
        return ConfigurationError(
            f"the Engine DB refused the login to {where} ({said}); check user, auth_mode, sslmode and the "
            "server's pg_hba.conf entry for this role and database"
        )
    if code is not None:  # refused for a reason of its own
        return ConfigurationError(f"the Engine DB {where} refused the session {refused.stage} ({said})")
    return None


def _refused_in_text(dialect: PostgresDialect, refused: _Refused) -> Exception:
    """A refusal with no SQLSTATE: passed already (the probe got in), or at or after a login the probe could
    not finish (no password; GSSAPI, OAuth), which PostgreSQL reports then only in text."""
    where, detail, target = refused.where, refused.detail, dialect.target
    if refused.answer.took_session and not any(k in target.settings for k in _STRICTER_THAN_PROBE):
        # The same login opened a session a moment after libpq's failed: what refused it has passed.
        return failover_error(
            "refusal_passed",
            f"the Engine DB {where} refused the session ({detail}), then took the same login a moment later: "
            "what refused it has passed (connection slots freed, a server restarted); a retry may succeed",
        )
    several = (
        "; or no host that took the login is the primary (libpq's message says which refused and why)"
        if target.other_hosts
        else ""
    )
    return ConfigurationError(
        f"the Engine DB refused the login to {where}: {detail}; check user, auth_mode and its secret or files, "
        f"the database name, and the role's and database's connection limits{several}"
    )


def _actor_params() -> tuple[str, str, str]:
    who = actor.current()
    return who.name, who.kind, who.migration


def _deciding(answers: list[tuple[str, pg_probe.ServerAnswer]]) -> tuple[pg_probe.ServerAnswer, str]:
    """Of the probe's answers (one per host, in the URL's order), the one that explains the failure, and a note
    naming its host and the hosts not reached (empty for a single host).

    libpq failed on every host. A host that refused outright (a SQLSTATE, a certificate) says more than one that
    asked for a login (the login may have been refused, or the server was a standby libpq skipped); none reached:
    unreachable.
    """
    if len(answers) == 1:
        return answers[0][1], ""
    reached = [(host, a) for host, a in answers if a.reachable]
    if not reached:
        return answers[0][1], " (no host reachable)"
    host, answer = next(
        ((h, a) for h, a in reached if a.sqlstate or a.tls_error),
        next(((h, a) for h, a in reached if a.takes_sessions), reached[0]),
    )
    missed = [h for h, a in answers if not a.reachable]
    return answer, f" (answer of {host}" + (f"; not reachable: {', '.join(missed)})" if missed else ")")


def failover_error(case: str, message: str, in_doubt: bool = False) -> EngineUnreachableError:
    """The retryable error of one failover case (docs/failover-errors.md), logged as one warning line that
    names the case, so operators read in the task log what happened; the error carries it as ``case``."""
    log.warning("etl-craft Engine DB failover case %s: %s", case, message)
    return EngineUnreachableError(message, case=case, in_doubt=in_doubt)


def _matches(code: str | None, codes: tuple[str, ...]) -> bool:
    """``code`` is one of ``codes``, or in the class of a two-character one."""
    return code is not None and any(code == c or (len(c) == 2 and code.startswith(c)) for c in codes)


def _unanswered(answer: pg_probe.ServerAnswer) -> str:
    """What a host that would not take a session answered the probe, for a message."""
    if not answer.reachable:
        return "not reachable"
    if answer.said_nothing == "closed":
        return "accepted the connection, then closed it without answering"
    if answer.said_nothing == "silent":
        return f"accepted the connection, then never answered within {answer.waited:g} s"
    if answer.tls_error:
        return f"presented a certificate that does not verify ({answer.tls_error})"
    if answer.sqlstate:
        return f"refused the session (SQLSTATE {answer.sqlstate}: {answer.message})"
    return "gave no answer the provider reads"


def _libpq_version(driver: PgDriver) -> int:
    """The libpq the driver is built with (psycopg2) or loaded (psycopg 3), as ``PQlibVersion`` gives it."""
    version = getattr(driver, "__libpq_version__", None)
    if version is None:
        version = driver.pq.version()  # type: ignore[attr-defined]
    return int(version)


def _lock_wait(lock_timeout: float | None) -> str:
    """``lock_timeout`` for a lock wait of ``lock_timeout`` seconds: 0 waits forever, so a bound rounds up to 1ms."""
    return f"{0 if lock_timeout is None else max(1, int(lock_timeout * 1000))}ms"
