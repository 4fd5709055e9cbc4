"""Engine profiles from an Airflow connection of type ``postgres`` (apache-airflow-providers-postgres).

A deployment that already keeps its database as a ``postgres`` connection reaches the Engine DB through it:
``PostgresHook`` reads the connection (its ``sqlalchemy_url`` holds host, port, database, login and
password as that provider resolves them), and the one extra of the provider's own, ``engine_schema``, names
the PostgreSQL schema of the Engine tables. The profile that comes out is an ordinary ``password`` profile,
so the provider's TLS settings, secret masking, error classification and per-transaction schema apply as
for any other connection.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.config.profile import EngineProfile, build_profile
from airflow_provider_etl_craft.config.secrets import Resolver, SecretsSource
from airflow_provider_etl_craft.engine.url import DRIVER_SETTINGS
from airflow_provider_etl_craft.errors import ConfigurationError

CONN_TYPE = "postgres"
#: The extra naming the Engine schema (PostgresHook has no setting of its own for a schema to use).
ENGINE_SCHEMA_EXTRA = "engine_schema"
#: PostgresHook extras that fetch a short-lived IAM token; the Engine's logins renew theirs through an
#: ``etl_craft`` connection's auth_mode ``sts`` instead, so these are refused rather than half-supported.
IAM_EXTRAS = frozenset({"iam", "redshift", "redshift-serverless", "aws_conn_id", "azure_conn_id"})


def profile_from_postgres_connection(conn: Any) -> EngineProfile:
    """Resolve a ``postgres`` Airflow connection into an :class:`EngineProfile` (auth_mode ``password``).

    Extras: ``engine_schema`` (required); libpq settings such as ``sslmode``, ``sslrootcert``,
    ``connect_timeout`` pass to the driver as on any profile; the extras PostgresHook keeps for itself
    (``cursor``, ``sqlalchemy_*``) are not connection settings and are left alone.

    :raises ConfigurationError: no ``engine_schema``, IAM extras, unknown extras, no host, database or password.
    """
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    conn_id = conn.conn_id
    origin = f"Airflow connection '{conn_id}' (type {CONN_TYPE})"
    extras = {k: v for k, v in (conn.extra_dejson or {}).items() if v not in (None, "")}
    schema = extras.pop(ENGINE_SCHEMA_EXTRA, None)
    if not schema:
        raise ConfigurationError(
            f"{origin}: set the extra {ENGINE_SCHEMA_EXTRA} to the PostgreSQL schema that holds the Engine tables, "
            f'e.g. {{"{ENGINE_SCHEMA_EXTRA}": "etl_craft"}} (the connection\'s schema field is the database)'
        )
    iam = sorted(IAM_EXTRAS & extras.keys())
    if iam:
        raise ConfigurationError(
            f"{origin}: extra(s) {', '.join(iam)} ask for an IAM token, which the Engine DB cannot renew through a "
            "postgres connection; use an etl_craft connection with auth_mode sts (or token) instead"
        )
    own = PostgresHook.ignored_extra_options
    unknown = sorted(k for k in extras if k not in DRIVER_SETTINGS and k not in own)
    if unknown:
        raise ConfigurationError(
            f"{origin}: extra(s) {', '.join(unknown)} are not libpq settings the Engine DB takes; allowed besides "
            f"{ENGINE_SCHEMA_EXTRA}: {', '.join(sorted(DRIVER_SETTINGS))}"
        )
    url = PostgresHook(postgres_conn_id=conn_id).sqlalchemy_url
    if not url.host or not url.database:
        raise ConfigurationError(f"{origin}: set host and schema (= the database)")
    if not url.password:
        raise ConfigurationError(
            f"{origin}: set the password (a postgres connection logs in with login and password; for the other "
            "auth modes use an etl_craft connection)"
        )
    _compat.mask_secret(url.password)
    query = urlencode({k: str(v) for k, v in extras.items() if k in DRIVER_SETTINGS})
    jdbc_url = f"jdbc:postgresql://{url.host}:{url.port or 5432}/{quote(url.database)}" + (
        f"?{query}" if query else ""
    )
    settings: dict[str, Any] = {"jdbc_url": jdbc_url, "schema": schema, "auth_mode": "password"}
    if url.username:
        settings["user"] = url.username
    literal = Resolver(SecretsSource("connection", lambda _name: None), conn_id, origin)
    return build_profile(
        conn_id,
        settings,
        literal,
        origin=origin,
        prefix=f"connection '{conn_id}'",
        base_dir=None,
        secret_values={"secret": url.password},
    )
