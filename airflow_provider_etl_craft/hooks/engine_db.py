"""EngineDBHook: a common-sql DbApiHook onto the etl-craft Engine DB (SQLite or PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.providers.common.sql.hooks.sql import DbApiHook

from airflow_provider_etl_craft.config import EngineProfile, load_engine_profile
from airflow_provider_etl_craft.config.connection import profile_from_connection
from airflow_provider_etl_craft.engine.dbapi import Connection
from airflow_provider_etl_craft.engine.dialects import EngineDialect, dialect_for
from airflow_provider_etl_craft.engine.migrations import MigrateResult, find_migrations_dir, migrate
from airflow_provider_etl_craft.engine.schema import (
    MIGRATE_LOCK_TIMEOUT,
    InitResult,
    init_db,
)
from airflow_provider_etl_craft.engine.url import PostgresTarget
from airflow_provider_etl_craft.errors import EtlCraftError
from airflow_provider_etl_craft.runs.lifecycle import RUN_LOCK_TIMEOUT, RunLifecycle


class EngineDBHook(DbApiHook):
    """Connections, locks, init-db and migrate for an etl-craft Engine DB.

    The Engine profile comes from an Airflow connection of type ``etl_craft`` — file-backed::

        {"conn_type": "etl_craft", "extra": {"config_path": "/opt/etl/craft-connector.yml", "profile": "prod"}}

    or inline (no file on disk; the password field is the secret)::

        {"conn_type": "etl_craft", "host": "db.internal", "port": 5432, "schema": "etl_craft",
         "login": "etl_user", "password": "…", "extra": {"engine_schema": "etl_craft", "auth_mode": "password"}}

    — or straight from a craft-connector.yml with :meth:`from_config` (the CLI does this).

    Because it is a ``DbApiHook``, ``SQLExecuteQueryOperator(conn_id=…)`` runs SQL on the Engine DB too.
    Connections are in autocommit mode; Engine code opens explicit transactions through the dialect.
    On PostgreSQL the Engine schema is set per transaction (``SET LOCAL`` semantics), never on the session
    and never as a startup parameter, so the provider works behind a transaction-mode pooler. That holds
    for SQL of your own too: every transaction that ``get_conn()``'s cursors open (``run``, ``get_records``,
    ``get_first``, ``insert_rows``, ``SQLExecuteQueryOperator``, :meth:`get_sqlalchemy_engine`) has the
    Engine schema first on its search path, so ``SELECT … FROM CFG_PIPELINES`` works unqualified; see
    :mod:`~airflow_provider_etl_craft.engine.dialects.pg_user_sql` and docs/etl-craft-parity.md ("Your own
    SQL") for how, and why not otherwise.

    :param etl_craft_conn_id: the Airflow connection (default ``etl_craft_default``).
    :param profile: the profile to use from a file-backed connection or config file (overrides the file's).
    :param config_path: read this craft-connector.yml instead of an Airflow connection.
    """

    conn_name_attr = "etl_craft_conn_id"
    default_conn_name = "etl_craft_default"
    conn_type = "etl_craft"
    hook_name = "etl-craft Engine DB"
    supports_autocommit = True

    def __init__(
        self,
        *args: Any,
        profile: str | None = None,
        config_path: str | Path | None = None,
        use_config_file: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._profile_name = profile
        self._config_path = config_path
        self._use_config_file = use_config_file or config_path is not None

    @classmethod
    def from_config(cls, config_path: str | Path | None = None, profile: str | None = None) -> EngineDBHook:
        """A hook on a craft-connector.yml profile (explicit path, ``$ETL_CRAFT_CONFIG`` or upward search)."""
        return cls(config_path=config_path, profile=profile, use_config_file=True)

    @cached_property
    def engine_profile(self) -> EngineProfile:
        """The resolved profile (reads the file or the connection on first use, never at DAG parse time)."""
        if self._use_config_file:
            return load_engine_profile(self._config_path, self._profile_name)
        return profile_from_connection(self.connection, self._profile_name)

    @property
    def connection_extra(self) -> dict[str, Any]:
        """The Airflow connection's extras; none for a hook on a craft-connector.yml (no connection to read:
        common-sql's ``insert_rows`` asks for them)."""
        return {} if self._use_config_file else dict(self.connection.extra_dejson)

    @cached_property
    def engine(self) -> EngineDialect:
        return dialect_for(self.engine_profile)

    @cached_property
    def dialect_name(self) -> str:
        return self.engine_profile.dialect_name

    @cached_property
    def placeholder(self) -> str:
        return self.engine.placeholder

    def get_conn(self) -> Connection:
        """A new DB-API connection to the Engine DB for SQL of your own (autocommit; SQLite pragmas set;
        PostgreSQL: schema checked, and the Engine schema first on the search path of each transaction)."""
        return self.engine.connect_for_sql()

    def get_sqlalchemy_engine(self, engine_kwargs: dict[str, Any] | None = None) -> Any:
        """A SQLAlchemy engine on the Engine DB (SQLAlchemy, and pandas through it, for SQL of your own).

        PostgreSQL: its connections come from :meth:`get_conn` (the profile's auth mode, TLS and credentials;
        no URL carries a secret), out of autocommit as SQLAlchemy expects, so each transaction SQLAlchemy
        begins has the Engine schema first on its search path. SQLite: common-sql's engine on the file.
        """
        if not isinstance(self.engine_profile.target, PostgresTarget):
            return super().get_sqlalchemy_engine(engine_kwargs)
        from sqlalchemy import create_engine

        def connect() -> Connection:
            conn = self.get_conn()
            self.set_autocommit(conn, False)
            return conn

        driver = "psycopg" if self.engine_profile.auth.driver == "psycopg" else "psycopg2"
        return create_engine(f"postgresql+{driver}://", creator=connect, **(engine_kwargs or {}))

    def set_autocommit(self, conn: Connection, autocommit: bool) -> None:
        self.engine.set_autocommit(conn, autocommit)

    def get_autocommit(self, conn: Connection) -> bool:
        return self.engine.get_autocommit(conn)

    def get_uri(self) -> str:
        """A URI without any credential (common-sql calls this for display and dialect detection)."""
        target = self.engine_profile.target
        if isinstance(target, PostgresTarget):
            user = f"{self.engine_profile.user}@" if self.engine_profile.user else ""
            return f"postgresql://{user}{target.servers()}/{target.database}"
        return f"sqlite:///{target.path}"

    # -- OpenLineage: what common-sql's SQL operators ask of a hook for their lineage (docs/lineage.md) --------

    def get_openlineage_database_info(self, connection: Any) -> Any:
        """Where the Engine tables live, in OpenLineage's naming: ``postgres://{host}:{port}`` (the first server
        of a multi-host URL) with the database, or ``sqlite://{path}`` for a SQLite file; never a credential.

        Read from the Engine profile (the connection common-sql passes is the one the profile came from).
        """
        from airflow.providers.openlineage.sqlparser import DatabaseInfo

        from airflow_provider_etl_craft.lineage.memo import place

        scheme, authority, database = place(self.engine_profile.target)
        return DatabaseInfo(scheme=scheme, authority=authority, database=database)

    def get_openlineage_database_dialect(self, connection: Any) -> str:
        """The SQL parser's dialect: ``postgres`` or ``sqlite``."""
        return "postgres" if isinstance(self.engine_profile.target, PostgresTarget) else "sqlite"

    def get_openlineage_default_schema(self) -> str | None:
        """The Engine schema: unqualified names in SQL of your own resolve there first (see the class)."""
        return self.engine_profile.schema

    def lock(
        self, name: str, timeout: float | None = None, conn: Connection | None = None
    ) -> AbstractContextManager[None]:
        """Hold the named cross-process Engine DB lock (docs/locks.md) as a context manager.

        :param timeout: seconds to wait (None: wait forever).
        :param conn: PostgreSQL connection to hold a session advisory lock on (needs a direct connection or a
            session-mode pooler). Default: a new connection holding an advisory transaction lock for the
            block, which works behind a transaction-mode pooler too.
        :raises LockTimeoutError: not acquired in time; the message names the lock.
        :raises ConfigurationError: with ``conn``, the unlock found the lock not held by its session.
        """
        return self.engine.lock(name, timeout, conn)

    def init_db(self, lock_timeout: float | None = MIGRATE_LOCK_TIMEOUT) -> InitResult:
        """Create the Engine tables (idempotent). See :func:`~airflow_provider_etl_craft.engine.schema.init_db`."""
        with self.engine.classified(), closing(self.engine.connect(create=True)) as conn:
            return init_db(self.engine, conn, lock_timeout)

    def migrate(
        self, migrations_dir: str | Path | None = None, lock_timeout: float | None = MIGRATE_LOCK_TIMEOUT
    ) -> MigrateResult:
        """init-db if needed, then packaged and project migrations. See :func:`~…engine.migrations.migrate`."""
        project_dir = find_migrations_dir(migrations_dir, self.engine_profile.base_dir)
        with self.engine.classified(), closing(self.engine.connect(create=True)) as conn:
            return migrate(self.engine, conn, project_dir, lock_timeout)

    @contextmanager
    def lifecycle(self, lock_timeout: float | None = RUN_LOCK_TIMEOUT) -> Iterator[RunLifecycle]:
        """The run lifecycle (claim, task attempts, finish) on a fresh connection, closed on exit.

        Driver errors, the connect's included, leave the block as the provider's typed errors
        (``EngineDialect.classify``). A step whose session is lost is sent once more on a new connection
        (docs/high-availability.md, "In-doubt commits").
        """
        with self.engine.classified():
            conn = self.engine.connect()
        lifecycle = RunLifecycle(self.engine, conn, lock_timeout, self.engine.reconnect)
        try:
            with self.engine.classified(conn):
                yield lifecycle
        finally:
            lifecycle.conn.close()

    # common-sql's sql.pyi declares -> None, while its own test_connection returns (status, message) too.
    def test_connection(self) -> tuple[bool, str]:  # type: ignore[override]
        """Airflow's Test button: the Engine DB checks of ``etl-craft-airflow check`` on this connection.

        It passes when none of them fails (connection, schema, tables, migrations), so an empty Engine DB or a
        pending migration fails here as in ``check``; the message is the first failed check's.
        """
        from airflow_provider_etl_craft.engine.doctor import Status, engine_db_checks

        try:
            checks = engine_db_checks(self.engine)
        except EtlCraftError as exc:  # the profile itself (settings, secret)
            return False, str(exc)
        failed = next((c for c in checks if c.status is Status.FAIL), None)
        if failed is not None:
            return False, failed.message
        where = f"{self.engine.describe()} schema {self.engine_profile.schema}"
        return True, f"Connected to {where}; no migration pending; the Engine tables exist"

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The form's extra fields as WTForms fields: what Airflow 3.0 and 3.1 read (3.2+ read the provider info).

        Built from ``provider_info_source.CONN_FIELDS``, the one declaration the provider info's ``conn-fields``
        are written from. The UI of those lines renders them only where ``wtforms`` is installed (it ships with
        the FAB auth manager that MWAA and Cloud Composer use); without it Airflow logs that the widgets are
        missing and the fields stay in Extra.
        """
        from wtforms import StringField
        from wtforms.validators import Optional, any_of

        from airflow_provider_etl_craft.provider_info_source import CONN_FIELDS

        widgets = {}
        for name, field in CONN_FIELDS.items():
            choices = [c for c in field["schema"].get("enum", []) if c is not None]
            validators = [Optional(), *([any_of(choices)] if choices else [])]
            widgets[name] = StringField(
                field["label"], description=field.get("description", ""), validators=validators
            )
        return widgets

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Shape of the connection form (also declared in the provider info)."""
        from airflow_provider_etl_craft.provider_info_source import UI_FIELD_BEHAVIOUR

        return {
            "hidden_fields": UI_FIELD_BEHAVIOUR["hidden-fields"],
            "relabeling": UI_FIELD_BEHAVIOUR["relabeling"],
            "placeholders": UI_FIELD_BEHAVIOUR["placeholders"],
        }
