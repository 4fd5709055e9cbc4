"""What every auth mode declares: its profile keys (as :class:`Field`), its driver and what it sends to it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

from msgspec import Struct

if TYPE_CHECKING:
    from airflow_provider_etl_craft.engine.url import Target

#: Where an inline Airflow connection holds a key: its login, its password field, or an extra.
ConnSlot = Literal["login", "password", "extra"]


class Field(Struct, frozen=True):
    """One profile key of an auth mode, and how it appears in an Airflow connection and its form.

    ``secret``: the key names a variable holding a secret (resolved from the secrets source and masked);
    ``path``: a file path (relative ones resolve beside craft-connector.yml); ``label`` and
    ``description`` are the connection form's text.
    """

    key: str
    label: str
    description: str
    secret: bool = False
    path: bool = False
    required: bool = True
    conn: ConnSlot = "extra"

    def __post_init__(self) -> None:
        # A connection's password field is masked by Airflow and its login is not: they must match.
        if (self.conn == "password") != self.secret:
            raise ValueError(
                f"auth field {self.key}: a secret is the connection's password, and only a secret"
            )


#: The role every PostgreSQL mode logs in as: the connection's login.
USER = Field("user", "User", "the PostgreSQL role to log in as", conn="login")


class ProfileView(Protocol):
    """What a mode reads from a resolved profile to build its connection arguments and messages."""

    @property
    def origin(self) -> str: ...

    @property
    def user(self) -> str | None: ...

    @property
    def target(self) -> Target: ...

    @property
    def fields(self) -> Mapping[str, str]:
        """Resolved non-secret values of the mode's keys (paths made absolute)."""
        ...

    @property
    def secrets(self) -> Mapping[str, str]:
        """Resolved values of the mode's secret keys."""
        ...

    def setting(self, key: str) -> str:
        """Dotted name of a setting, for messages."""
        ...

    def describe(self) -> str: ...


class AuthMode(Struct, frozen=True):
    """One login method: the keys it takes, the driver that opens its connections, and ``connect_kwargs``.

    Subclasses add behaviour only; each registered instance is the one declaration of its mode's shape. Like
    :class:`Field`, a ``msgspec.Struct``: every Airflow process loads this module (the provider's connection form
    is derived from it), and a dataclass costs a process about half a millisecond to define
    (docs/performance.md, "In the task process").
    """

    name: str
    #: One line on what the mode sends, for the table of modes in docs/auth.md.
    summary: str
    fields: tuple[Field, ...] = ()
    #: psycopg2, or psycopg (3) where libpq ≥ 18 is needed.
    driver: str = "psycopg2"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    @property
    def required_keys(self) -> tuple[str, ...]:
        return tuple(f.key for f in self.fields if f.required)

    @property
    def optional_keys(self) -> tuple[str, ...]:
        return tuple(f.key for f in self.fields if not f.required)

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key the mode takes, required ones first (the order of checks and of messages)."""
        return self.required_keys + self.optional_keys

    @property
    def secret_keys(self) -> tuple[str, ...]:
        return tuple(f.key for f in self.fields if f.secret)

    @property
    def path_keys(self) -> tuple[str, ...]:
        return tuple(f.key for f in self.fields if f.path)

    def connect_kwargs(self, profile: ProfileView) -> dict[str, Any]:
        """Driver keyword arguments for a new connection (called once per connection); none by default."""
        return {}

    def renew_kwargs(self, profile: ProfileView, refused: Mapping[str, Any]) -> dict[str, Any] | None:
        """After the server refused the login made with ``refused`` (from :meth:`connect_kwargs`): arguments
        with a fresh credential for one more try, or ``None``.

        For modes that cache their credential in the process (:mod:`.cache`): the refused one may have gone
        stale before its time (revoked, rotated). ``None`` by default: nothing cached, nothing to renew.
        """
        return None

    def local_problem(self, profile: ProfileView) -> Exception | None:
        """After a failed connect: what on this machine libpq would have refused (a key, a file), if anything.

        Asked only on the failure path, so a working login pays nothing for it.
        """
        return None


#: The mode of a SQLite profile: no login, nothing sent. Not in the registry: PostgreSQL refuses it.
NO_AUTH = AuthMode("none", "no login: the SQLite file's permissions are the access control")
