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
#: Driver messages that mean the login itself was refused: retrying cannot help.
_LOGIN_REFUSED = ("authentication failed", "no pg_hba.conf entry", "certificate", "role", "does not exist",
                  "permission denied", "password")  # fmt: skip


class PostgresDialect(EngineDialect):
    name = "postgresql"
    placeholder = "%s"

    def to_db_time(self, value: datetime) -> datetime:
        return value.astimezone(UTC)

    def from_db_time(self, value: Any) -> datetime | None:
        return None if value is None else value.astimezone(UTC)

    def integrity_error(self) -> type[Exception]:
        import psycopg2

        return psycopg2.IntegrityError

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
        import psycopg2

        try:
            conn = psycopg2.connect(**self.connect_kwargs())
        except psycopg2.OperationalError as exc:
            raise self._connect_error(exc) from None
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT current_schema()")
            (found,) = cur.fetchone()
        if found is None:
            conn.close()
            raise ConfigurationError(
                f"schema \"{self.profile.schema}\" ({self.profile.setting('schema')}) does not exist in database "
                f"\"{self.target.database}\" on {self.target.host}:{self.target.port}; the provider never creates "
                f"schemas: ask an administrator to run CREATE SCHEMA {self.profile.schema}; and grant your role "
                "CREATE on it"
            )
        return conn

    def _connect_error(self, exc: Exception) -> Exception:
        detail = (str(exc).strip().splitlines() or ["no detail"])[0]
        where = f"{self.describe()} as {self.profile.user or 'the default role'} ({self.profile.describe()})"
        if any(marker in detail.lower() for marker in _LOGIN_REFUSED) and "timeout" not in detail.lower():
            return ConfigurationError(
                f"the Engine DB refused the login to {where}: {detail}; check user, auth_mode and the secret"
            )
        return EngineUnreachableError(
            f"cannot reach the Engine DB {where}: {detail}; check host, port and network (a retry may succeed)"
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
