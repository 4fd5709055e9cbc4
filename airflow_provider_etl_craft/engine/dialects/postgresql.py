"""PostgreSQL Engine DBs: psycopg2 connections with ``search_path`` = the Engine schema, advisory locks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any

from airflow_provider_etl_craft.engine import locks
from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
from airflow_provider_etl_craft.engine.url import PostgresTarget
from airflow_provider_etl_craft.errors import ConfigurationError, EngineUnreachableError

DEFAULT_CONNECT_TIMEOUT = "10"
DEFAULT_APPLICATION_NAME = "etl-craft-airflow"
#: Driver messages that mean the server did not answer, or could not take a session yet: a retry may help.
#: Anything else (login refused, bad certificate or key, unknown database, …) is a configuration error.
_TRANSIENT = ("could not connect", "connection refused", "timeout expired", "timed out", "could not translate host",
              "no route to host", "network is unreachable", "server closed the connection", "starting up",
              "shutting down", "too many connections", "remaining connection slots", "connection reset")  # fmt: skip
#: libpq messages about the client's own key or certificate (key_file mode), not the server's answer.
_CLIENT_KEY = (
    "private key",
    "bad decrypt",
    "group or world access",
    "client certificate",
    "certificate file",
)


class PostgresDialect(EngineDialect):
    name = "postgresql"
    placeholder = "%s"
    writes_in_with = True

    def to_db_time(self, value: datetime) -> datetime:
        return value.astimezone(UTC)

    def from_db_time(self, value: Any) -> datetime | None:
        return None if value is None else value.astimezone(UTC)

    def integrity_error(self) -> type[Exception]:
        return self._driver_module().IntegrityError  # type: ignore[no-any-return]

    def database_error(self) -> type[Exception]:
        return self._driver_module().Error  # type: ignore[no-any-return]

    def _driver_module(self) -> Any:
        """psycopg2, or psycopg 3 for auth modes that need libpq ≥ 18 (sso); both speak DB-API with ``%s``."""
        if self.profile.auth().driver != "psycopg":
            import psycopg2

            return psycopg2
        from airflow_provider_etl_craft.auth.sso import check_libpq

        setting = self.profile.setting("auth_mode")
        try:
            import psycopg
        except ImportError:
            raise ConfigurationError(
                f"{self.profile.origin}: {setting} is '{self.profile.auth_mode}', which needs psycopg 3 with libpq 18 "
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
        """Everything passed to ``psycopg2.connect``; holds secrets, so never log it (use :meth:`describe`)."""
        target, profile = self.target, self.profile
        kwargs: dict[str, Any] = {
            "connect_timeout": DEFAULT_CONNECT_TIMEOUT,
            "application_name": DEFAULT_APPLICATION_NAME,
            **target.settings,
            "host": target.host,
            "port": target.port,
            "dbname": target.database,
        }
        search_path = f'-c search_path="{profile.schema}"'
        kwargs["options"] = f"{kwargs['options']} {search_path}" if kwargs.get("options") else search_path
        kwargs.update(profile.auth().connect_kwargs(profile))
        return kwargs

    def connect(self) -> Any:
        driver = self._driver_module()
        try:
            conn = driver.connect(**self.connect_kwargs())
        except driver.OperationalError as exc:
            raise self._connect_error(exc) from None
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT current_schema()")
            (found,) = cur.fetchone()
        if found is None:
            conn.close()
            raise ConfigurationError(
                f'schema "{self.profile.schema}" ({self.profile.setting("schema")}) does not exist in database '
                f'"{self.target.database}" on {self.target.host}:{self.target.port}; the provider never creates '
                f"schemas: ask an administrator to run CREATE SCHEMA {self.profile.schema}; and grant your role "
                "CREATE on it"
            )
        return conn

    def _connect_error(self, exc: Exception) -> Exception:
        detail = (str(exc).strip().splitlines() or ["no detail"])[0]
        where = f"{self.describe()} as {self.profile.user or 'the default role'} ({self.profile.describe()})"
        if any(marker in detail.lower() for marker in _TRANSIENT):
            return EngineUnreachableError(
                f"cannot reach the Engine DB {where}: {detail}; check host, port and network (a retry may succeed)"
            )
        if any(marker in detail.lower() for marker in _CLIENT_KEY):
            fields = ", ".join(self.profile.setting(f) for f in ("key_file", "cert_file", "secret"))
            return ConfigurationError(
                f"the client key or certificate for {where} could not be used: {detail}; check {fields} (the "
                "passphrase), and that the key file is readable by this user only (chmod 600)"
            )
        return ConfigurationError(
            f"the Engine DB refused the login to {where}: {detail}; check user, auth_mode and its secret or files"
        )

    @contextmanager
    def _lock(self, name: str, timeout: float | None, conn: Any | None) -> Iterator[None]:
        own = conn is None
        lock_conn = self.connect() if own else conn
        try:
            with locks.advisory_lock(lock_conn, self.profile.schema, name, timeout):
                yield
        finally:
            if own:
                lock_conn.close()

    def lock(self, name: str, timeout: float | None, conn: Any | None = None) -> AbstractContextManager[None]:
        locks.check_lock_name(name)
        return self._lock(name, timeout, conn)

    def set_autocommit(self, conn: Any, autocommit: bool) -> None:
        conn.autocommit = autocommit

    def get_autocommit(self, conn: Any) -> bool:
        return bool(conn.autocommit)

    def execute_script(self, cursor: Any, text: str) -> None:
        cursor.execute(text)

    def table_names(self, conn: Any) -> set[str]:
        rows = self.query(
            conn,
            "SELECT upper(c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')",
        )
        return {r[0] for r in rows}
