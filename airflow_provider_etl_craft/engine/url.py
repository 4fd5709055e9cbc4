"""Parsing ``jdbc_url`` into a connection target; the password never appears in a URL or description."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote

from msgspec import Struct, field

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
#: PgJDBC's spellings of libpq settings (a URL written for etl-craft's JDBC driver): translated, see
#: :data:`SERVER_TYPES` and :data:`LOAD_BALANCE`.
JDBC_SETTINGS = {"targetServerType": "target_session_attrs", "loadBalanceHosts": "load_balance_hosts"}
#: PgJDBC ``targetServerType`` (case-insensitive, its older names included) -> libpq ``target_session_attrs``;
#: None: libpq has no such mode.
SERVER_TYPES: dict[str, str | None] = {
    "any": "any",
    "primary": "read-write",  # PgJDBC's primary is a server whose sessions take writes, as libpq's read-write
    "master": "read-write",
    "secondary": "standby",
    "slave": "standby",
    "preferprimary": None,
    "prefersecondary": "prefer-standby",
    "preferslave": "prefer-standby",
}
#: libpq ``target_session_attrs`` values, and the oldest libpq that knows each (``PQlibVersion`` numbers).
SESSION_ATTRS = {
    "any": 100000, "read-write": 100000, "read-only": 140000, "primary": 140000, "standby": 140000,
    "prefer-standby": 140000,
}  # fmt: skip
#: Those that guarantee a server taking writes, whatever the host list.
WRITABLE_SESSION_ATTRS = frozenset({"read-write", "primary"})
#: PgJDBC ``loadBalanceHosts`` -> libpq ``load_balance_hosts``.
LOAD_BALANCE = {"true": "random", "false": "disable"}
LOAD_BALANCE_VALUES = frozenset({"random", "disable"})
#: The oldest libpq that knows ``load_balance_hosts``.
LOAD_BALANCE_LIBPQ = 160000
#: Keys that would put a credential into the URL; credentials belong in user/auth_mode/secret.
CREDENTIAL_KEYS = frozenset(
    {"password", "passwd", "pwd", "passfile", "user", "username", "token", "access_token", "secret",
     "client_secret", "sslpassword", "api_key", "apikey"}
)  # fmt: skip
#: Query settings naming files: relative paths resolve beside craft-connector.yml.
PATH_SETTINGS = frozenset({"sslrootcert", "sslcert", "sslkey", "sslcrl", "sslcrldir"})


class SqliteTarget(Struct, frozen=True):
    """A SQLite Engine DB file."""

    path: Path

    dialect_name = "sqlite"

    def describe(self) -> str:
        return f"sqlite:{self.path}"


class PostgresTarget(Struct, frozen=True):
    """A PostgreSQL database; ``settings`` are libpq parameters from the URL query (PgJDBC's translated).

    ``host``/``port`` is the first server; ``other_hosts`` the further ones of a multi-host URL, which libpq
    tries in order (or shuffled, with ``load_balance_hosts=random``) until one fits ``target_session_attrs``.
    """

    host: str
    port: int
    database: str
    settings: dict[str, str] = field(default_factory=dict)
    other_hosts: tuple[tuple[str, int], ...] = ()

    dialect_name = "postgresql"

    @property
    def hosts(self) -> tuple[tuple[str, int], ...]:
        """Every server, in the URL's order."""
        return ((self.host, self.port), *self.other_hosts)

    def servers(self) -> str:
        """``host:port[,host:port…]``, IPv6 addresses in brackets, as a URL writes them."""
        return ",".join(host_port(host, port) for host, port in self.hosts)

    def describe(self) -> str:
        """Shown in logs and messages: hosts, ports and database, never credentials."""
        return f"postgresql://{self.servers()}/{self.database}"

    def driver_hosts(self) -> dict[str, str]:
        """libpq's ``host`` and ``port``: comma-separated lists when there are several servers."""
        return {
            "host": ",".join(host for host, _ in self.hosts),
            "port": ",".join(str(port) for _, port in self.hosts),
        }


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
    after = rest[len("postgresql://") :]
    end = min((i for i in (after.find(c) for c in "/?#") if i >= 0), default=len(after))
    netloc, after = after[:end], after[end:]
    if "@" in netloc:
        raise ConfigurationError(
            f"{setting}: credentials in the URL are refused; remove 'user@'/'user:password@' "
            "and use the profile's user, auth_mode and secret"
        )
    after, hash_, fragment = after.partition("#")
    if hash_:
        raise ConfigurationError(f"{setting}: a '#' fragment has no meaning in a jdbc_url; remove it")
    path, _, query = after.partition("?")
    hosts = _hosts(netloc, setting)
    database = unquote(path.lstrip("/"))
    if not database or "/" in database:
        raise ConfigurationError(f"{setting}: no database name; write jdbc:postgresql://host[:port]/database")
    written: dict[str, str] = {}
    settings = _query(query, setting, base_dir, written)
    _check_writable(settings, written, len(hosts), setting)
    (host, port), *others = hosts
    return PostgresTarget(
        host=host, port=port, database=database, settings=settings, other_hosts=tuple(others)
    )


def _hosts(netloc: str, setting: str) -> list[tuple[str, int]]:
    """``host[:port][,host[:port]…]``; a host without a port takes 5432, as PgJDBC and libpq do."""
    if not netloc:
        raise ConfigurationError(f"{setting}: no host; write jdbc:postgresql://host[:port]/database")
    entries = netloc.split(",")
    several = len(entries) > 1
    hosts = []
    for number, entry in enumerate(entries, 1):
        which = f"host {number} of {len(entries)} ({entry!r})" if several else repr(entry)
        if not entry:
            raise ConfigurationError(
                f"{setting}: host {number} of {len(entries)} is empty (two commas in a row, or one at an end); "
                "write jdbc:postgresql://host1[:port1],host2[:port2]/database"
            )
        hosts.append(_host(entry, which, setting))
    return hosts


def _host(entry: str, which: str, setting: str) -> tuple[str, int]:
    """One ``host[:port]`` or ``[IPv6]:port``; an empty port is the default, as in a libpq URI."""
    if entry.startswith("["):
        address, closed, after = entry[1:].partition("]")
        try:
            if not closed or (after and not after.startswith(":")):
                raise ValueError(entry)
            ipaddress.IPv6Address(address)
        except ValueError:
            raise ConfigurationError(
                f"{setting}: {which}: the host is not a valid bracketed IPv6 address; write "
                "jdbc:postgresql://[2001:db8::1]:5432/database (brackets around the address only)"
            ) from None
        host, port_text = address.lower(), after[1:]
    else:
        host, _, port_text = entry.partition(":")
        if "]" in entry or ":" in port_text:
            raise ConfigurationError(
                f"{setting}: {which}: the host is not a valid bracketed IPv6 address; write an IPv6 address in "
                "brackets: jdbc:postgresql://[2001:db8::1]:5432/database"
            )
        if not host:
            raise ConfigurationError(f"{setting}: {which} has no host name; write host[:port]")
        host = host.lower()
    if not port_text:
        return host, DEFAULT_PG_PORT
    if not (port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536):
        raise ConfigurationError(f"{setting}: {which}: the port is not a number between 1 and 65535")
    return host, int(port_text)


def _check_writable(settings: dict[str, str], written: dict[str, str], host_count: int, setting: str) -> None:
    """The provider writes on every step: refuse settings that let libpq pick a standby."""
    attrs = settings.get("target_session_attrs")
    if attrs is None and host_count == 1:
        return  # one server, as before: the read-only classification tells a standby apart when it writes
    if attrs in WRITABLE_SESSION_ATTRS or (attrs == "any" and host_count == 1):
        return
    chosen = "no target server type" if attrs is None else written["target_session_attrs"]
    lands = (
        f"with {host_count} hosts and {chosen}, libpq may connect to a standby"
        if attrs in (None, "any")
        else f"{chosen} asks for (or falls back to) a standby"
    )
    raise ConfigurationError(
        f"{setting}: {lands}, which accepts no writes, and the provider writes to the Engine DB on every step "
        "(claims, heartbeats, finishes); use targetServerType=primary (libpq: target_session_attrs=read-write) "
        "so only the primary is used"
    )


def _query(
    query: str, setting: str, base_dir: Path | None, written: dict[str, str] | None = None
) -> dict[str, str]:
    """The query's libpq settings; ``written`` receives, per setting, ``key=value`` as the URL spells it."""
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
        spelled = f"{key}={value}"
        if key in JDBC_SETTINGS:
            key, value = JDBC_SETTINGS[key], _from_jdbc(key, value, setting)
        elif key in ("target_session_attrs", "load_balance_hosts"):
            value = _libpq_value(key, value, setting)
        if key not in DRIVER_SETTINGS:
            raise ConfigurationError(
                f"{setting}: unknown query setting '{key}'; allowed: {', '.join(sorted(DRIVER_SETTINGS))}"
            )
        if key in settings:
            if key in SPELLED_TWICE and _agree(settings[key], value):
                continue  # PgJDBC's and libpq's spellings of the same choice
            if key in SPELLED_TWICE:
                jdbc = next(k for k, v in JDBC_SETTINGS.items() if v == key)
                raise ConfigurationError(
                    f"{setting}: {jdbc} and {key} disagree ({settings[key]} against {value} in libpq's terms); "
                    "keep one of them"
                )
            raise ConfigurationError(f"{setting}: query setting '{key}' is given twice; keep one")
        if key in PATH_SETTINGS and value not in ("", "system"):
            value = str(resolve_beside(value, base_dir))
        settings[key] = value
        if written is not None:
            written[key] = spelled
    return settings


#: Settings PgJDBC and libpq both spell: given both ways, they must agree.
SPELLED_TWICE = frozenset(JDBC_SETTINGS.values())


def _agree(one: str, other: str) -> bool:
    """The same choice: equal, or PgJDBC's primary (libpq read-write) beside libpq's primary."""
    return one == other or {one, other} <= WRITABLE_SESSION_ATTRS


def _from_jdbc(key: str, value: str, setting: str) -> str:
    """A PgJDBC setting's value in libpq's terms."""
    if key == "loadBalanceHosts":
        if value.lower() not in LOAD_BALANCE:
            raise ConfigurationError(f"{setting}: loadBalanceHosts must be true or false, not {value!r}")
        return LOAD_BALANCE[value.lower()]
    if value.lower() not in SERVER_TYPES:
        raise ConfigurationError(
            f"{setting}: targetServerType {value!r} is not one of any, primary, secondary, preferPrimary, "
            "preferSecondary; write targetServerType=primary"
        )
    mapped = SERVER_TYPES[value.lower()]
    if mapped is None:
        raise ConfigurationError(
            f"{setting}: targetServerType={value} falls back to a standby when no primary answers, which accepts "
            "no writes, and the provider writes to the Engine DB on every step; write targetServerType=primary "
            "(libpq has no prefer-primary mode either)"
        )
    return mapped


def _libpq_value(key: str, value: str, setting: str) -> str:
    """A libpq multi-host setting, checked against the values libpq knows."""
    known = SESSION_ATTRS.keys() if key == "target_session_attrs" else LOAD_BALANCE_VALUES
    if value not in known:
        raise ConfigurationError(f"{setting}: {key} {value!r} is not one of {', '.join(sorted(known))}")
    return value
