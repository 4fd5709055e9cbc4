"""Engine profiles from an Airflow connection: file-backed (``config_path`` extra) or inline fields."""

from __future__ import annotations

from functools import cache
from typing import Any
from urllib.parse import quote, urlencode

from msgspec import Struct

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.config.profile import EngineProfile, build_profile, load_engine_profile
from airflow_provider_etl_craft.config.secrets import Resolver, SecretsSource
from airflow_provider_etl_craft.engine.url import DRIVER_SETTINGS
from airflow_provider_etl_craft.errors import ConfigurationError

FILE_EXTRAS = frozenset({"config_path", "profile"})


class InlineKeys(Struct, frozen=True):
    """What an inline connection's fields fill, from the auth registry (read on the first inline connection: a
    file-backed one never loads the registry for it)."""

    #: Extras, and the profile setting each one fills: the target's, then the modes'.
    extras: dict[str, str]
    #: The profile keys the connection's login and password fill (one each, whatever the mode).
    login: str
    password: str


@cache
def inline_keys() -> InlineKeys:
    """:class:`InlineKeys`, derived from the auth registry."""
    from airflow_provider_etl_craft.auth import keys_in

    (login,) = keys_in("login")
    (password,) = keys_in("password")
    target = {"engine_schema": "schema", "jdbc_url": "jdbc_url", "auth_mode": "auth_mode"}
    return InlineKeys(target | {key: key for key in keys_in("extra")}, login, password)


def profile_from_connection(conn: Any, profile: str | None = None) -> EngineProfile:
    """Resolve an ``etl_craft`` Airflow connection into an :class:`EngineProfile`.

    With an extra ``config_path`` the connection points at a craft-connector.yml (and ``profile``, or the
    ``profile`` extra, selects the profile). Otherwise the connection itself holds the settings: host, port,
    schema (= database), login, password (= the secret) and extras ``engine_schema``, ``auth_mode`` and the
    mode's fields — or an extra ``jdbc_url`` (SQLite, or a full PostgreSQL URL).

    A connection of type ``postgres`` goes through
    :func:`~airflow_provider_etl_craft.config.postgres_connection.profile_from_postgres_connection`.

    :raises ConfigurationError: unknown extras, missing fields, anything :func:`build_profile` refuses.
    """
    if getattr(conn, "conn_type", None) == "postgres":
        from airflow_provider_etl_craft.config.postgres_connection import profile_from_postgres_connection

        return profile_from_postgres_connection(conn)
    extras = {k: v for k, v in (conn.extra_dejson or {}).items() if v not in (None, "")}
    origin = f"Airflow connection '{conn.conn_id}'"
    if "config_path" in extras:
        return _file_backed(origin, extras, profile)
    return _inline(conn, origin, extras)


def _file_backed(origin: str, extras: dict[str, Any], profile: str | None) -> EngineProfile:
    """The profile of the craft-connector.yml the connection's ``config_path`` names (only it and ``profile``)."""
    unknown = sorted(k for k in extras if k not in FILE_EXTRAS)
    if unknown:
        raise ConfigurationError(
            f"{origin}: extra(s) {', '.join(unknown)} have no meaning beside config_path (the file holds the "
            "settings); a file-backed connection takes only config_path and profile"
        )
    for key in FILE_EXTRAS:
        if key in extras and not isinstance(extras[key], str):
            raise ConfigurationError(
                f"{origin}: extra {key} must be text (a {'path' if key == 'config_path' else 'profile name'}), "
                f"not {type(extras[key]).__name__}"
            )
    return load_engine_profile(extras["config_path"], profile or extras.get("profile"))


def _inline(conn: Any, origin: str, extras: dict[str, Any]) -> EngineProfile:
    """The profile the connection's own fields and extras hold (the password is the secret, as given)."""
    keys = inline_keys()
    allowed = set(keys.extras) | DRIVER_SETTINGS
    unknown = sorted(k for k in extras if k not in allowed)
    if unknown:
        raise ConfigurationError(
            f"{origin}: unknown extra(s) {', '.join(unknown)}; allowed: config_path, profile, "
            f"{', '.join(sorted(allowed))}"
        )
    settings: dict[str, Any] = {keys.extras[k]: v for k, v in extras.items() if k in keys.extras}
    if "jdbc_url" not in settings:
        settings["jdbc_url"] = _jdbc_url(conn, origin, extras)
    elif driver := sorted(k for k in extras if k in DRIVER_SETTINGS):
        raise ConfigurationError(
            f"{origin}: extra(s) {', '.join(driver)} beside jdbc_url; put driver settings in the jdbc_url query "
            "(…?sslmode=verify-full) or drop jdbc_url and use host/port/schema"
        )
    if conn.login:
        settings[keys.login] = conn.login
    secret_values = {}
    if conn.password:
        _compat.mask_secret(conn.password)
        secret_values[keys.password] = conn.password
    literal = Resolver(SecretsSource("connection", lambda _name: None), conn.conn_id, origin)
    return build_profile(
        conn.conn_id,
        settings,
        literal,
        origin=origin,
        prefix=f"connection '{conn.conn_id}'",
        base_dir=None,
        secret_values=secret_values,
    )


def _jdbc_url(conn: Any, origin: str, extras: dict[str, Any]) -> str:
    """The PostgreSQL URL of the connection's host, port and schema (= database), with its driver extras."""
    if not conn.host or not conn.schema:
        raise ConfigurationError(
            f"{origin}: set host and schema (= database), or an extra jdbc_url (e.g. jdbc:sqlite:/data/engine.db), "
            "or an extra config_path pointing at craft-connector.yml"
        )
    query = urlencode({k: str(v) for k, v in extras.items() if k in DRIVER_SETTINGS})
    return f"jdbc:postgresql://{conn.host}:{conn.port or 5432}/{quote(conn.schema)}" + (
        f"?{query}" if query else ""
    )


def profile_for_conn_id(conn_id: str, profile: str | None = None) -> EngineProfile:
    """The profile of the Airflow connection ``conn_id``, read as :class:`EngineDBHook` reads it, without the
    hook: a recorded task's try resolves its Engine DB without importing common-sql (docs/performance.md)."""
    return profile_from_connection(_compat.resolve("BaseHook").get_connection(conn_id), profile)
