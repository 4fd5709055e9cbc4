"""Parsing ``jdbc_url`` into a connection target; the password never appears in a URL or description."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.paths import checked_path

SQLITE_PREFIX = "jdbc:sqlite:"
POSTGRES_PREFIX = "jdbc:postgresql:"
DEFAULT_PG_PORT = 5432

#: libpq settings a URL query may carry; they go to the driver as they are.
DRIVER_SETTINGS = frozenset(
    {
        "sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "sslcrldir", "sslnegotiation", "sslsni",
        "sslcompression", "ssl_min_protocol_version", "ssl_max_protocol_version", "connect_timeout",
        "application_name", "options", "target_session_attrs", "keepalives", "keepalives_idle",
        "keepalives_interval", "keepalives_count", "tcp_user_timeout", "gssencmode", "krbsrvname",
        "channel_binding", "requirepeer", "require_auth", "load_balance_hosts", "client_encoding",
    }
)  # fmt: skip
#: Keys that would put a credential into the URL; credentials belong in user/auth_mode/secret.
CREDENTIAL_KEYS = frozenset(
    {"password", "passwd", "pwd", "passfile", "user", "username", "token", "access_token", "secret",
     "client_secret", "sslpassword", "api_key", "apikey"}
)  # fmt: skip
#: Query settings naming files: relative paths resolve beside craft-connector.yml.
PATH_SETTINGS = frozenset({"sslrootcert", "sslcert", "sslkey", "sslcrl", "sslcrldir"})


@dataclass(frozen=True)
class SqliteTarget:
    """A SQLite Engine DB file."""

    path: Path

    dialect_name = "sqlite"

    def describe(self) -> str:
        return f"sqlite:{self.path}"


@dataclass(frozen=True)
class PostgresTarget:
    """A PostgreSQL database; ``settings`` are libpq parameters from the URL query."""

    host: str
    port: int
    database: str
    settings: dict[str, str] = field(default_factory=dict)

    dialect_name = "postgresql"

    def describe(self) -> str:
        """Shown in logs and messages: host, port and database, never credentials."""
        return f"postgresql://{self.host}:{self.port}/{self.database}"


Target = SqliteTarget | PostgresTarget


def resolve_beside(value: str | os.PathLike[str], base_dir: Path | None) -> Path:
    """A path from craft-connector.yml: ``~`` expanded, relative ones resolved beside the file (else the cwd)."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base_dir or Path.cwd()) / path


def parse_jdbc_url(url: str, setting: str, base_dir: Path | None) -> Target:
    """Parse a ``jdbc:sqlite:`` or ``jdbc:postgresql:`` URL.

    :param setting: the dotted setting, for messages (``Engine.prod.jdbc_url``).
    :param base_dir: folder relative paths resolve against (None: the working directory).
    :raises ConfigurationError: unknown scheme, in-memory SQLite, credentials or unknown query keys, …
    """
    # The engine is told by its prefix in any case, as etl-craft tells it.
    if url.lower().startswith(SQLITE_PREFIX):
        return _sqlite(url[len(SQLITE_PREFIX) :], setting, base_dir)
    if url.lower().startswith(POSTGRES_PREFIX):
        if not url.startswith("jdbc:"):  # etl-craft's PostgreSQL driver URL parser wants it in lower case
            raise ConfigurationError(f"{setting}: write the prefix jdbc: in lower case (jdbc:postgresql://…)")
        return _postgres(url[len("jdbc:") :], setting, base_dir)
    raise ConfigurationError(
        f"{setting} must start with 'jdbc:sqlite:' or 'jdbc:postgresql://'; "
        "e.g. jdbc:sqlite:engine/etl-craft.db or jdbc:postgresql://host:5432/database"
    )


def _sqlite(rest: str, setting: str, base_dir: Path | None) -> SqliteTarget:
    name = rest  # everything after the prefix is the file name, as etl-craft takes it
    if name in ("", ":memory:") or "mode=memory" in name or name.startswith("file::memory:"):
        raise ConfigurationError(
            f"{setting}: in-memory SQLite is refused: each Airflow task runs in its own process and would "
            "see an empty database; use a file, e.g. jdbc:sqlite:engine/etl-craft.db"
        )
    if name.startswith("file:") or "?" in name:
        raise ConfigurationError(
            f"{setting}: give a plain file path after jdbc:sqlite: (no file: URI, no query)"
        )
    return SqliteTarget(path=checked_path(resolve_beside(name, base_dir), setting, must_exist=False))


def _postgres(rest: str, setting: str, base_dir: Path | None) -> PostgresTarget:
    if not rest.lower().startswith("postgresql://"):
        raise ConfigurationError(f"{setting}: write jdbc:postgresql://host[:port]/database[?settings]")
    try:
        parts = urlsplit(rest)
    except ValueError:  # urlsplit's only complaint: an unbalanced or malformed [IPv6] host
        raise ConfigurationError(
            f"{setting}: the host is not a valid bracketed IPv6 address; write "
            "jdbc:postgresql://[2001:db8::1]:5432/database (brackets around the address only)"
        ) from None
    try:
        port = DEFAULT_PG_PORT if parts.port is None else parts.port
        if not 0 < port < 65536:
            raise ValueError(port)
    except ValueError:
        raise ConfigurationError(f"{setting}: the port is not a number between 1 and 65535") from None
    if "@" in parts.netloc:
        raise ConfigurationError(
            f"{setting}: credentials in the URL are refused; remove 'user@'/'user:password@' "
            "and use the profile's user, auth_mode and secret"
        )
    if not parts.hostname:
        raise ConfigurationError(f"{setting}: no host; write jdbc:postgresql://host[:port]/database")
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise ConfigurationError(f"{setting}: no database name; write jdbc:postgresql://host[:port]/database")
    if parts.fragment:
        raise ConfigurationError(f"{setting}: a '#' fragment has no meaning in a jdbc_url; remove it")
    return PostgresTarget(parts.hostname, port, database, _query(parts.query, setting, base_dir))


def _query(query: str, setting: str, base_dir: Path | None) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConfigurationError(
            f"{setting}: the query string is malformed; write ?key=value&key=value"
        ) from None
    settings: dict[str, str] = {}
    for key, value in pairs:
        if key.lower() in CREDENTIAL_KEYS:
            raise ConfigurationError(
                f"{setting}: the query holds the credential key '{key}'; remove it and use the profile's "
                "user, auth_mode and secret"
            )
        if key not in DRIVER_SETTINGS:
            raise ConfigurationError(
                f"{setting}: unknown query setting '{key}'; allowed: {', '.join(sorted(DRIVER_SETTINGS))}"
            )
        if key in settings:
            raise ConfigurationError(f"{setting}: query setting '{key}' is given twice; keep one")
        if key in PATH_SETTINGS and value not in ("", "system"):
            value = str(resolve_beside(value, base_dir))
        settings[key] = value
    return settings
