"""The shape every auth mode shares: which profile fields it needs and what it sends to the driver."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from airflow_provider_etl_craft.config.profile import EngineProfile


class AuthMode:
    """One PostgreSQL login method. Mostly data: the fields it takes, and ``connect_kwargs``."""

    name: ClassVar[str]
    #: Profile fields (besides jdbc_url and schema) that must be set.
    required_fields: ClassVar[tuple[str, ...]] = ()
    #: Profile fields that may be set.
    optional_fields: ClassVar[tuple[str, ...]] = ()
    #: Fields that name a variable holding a secret (resolved from the secrets source and masked).
    secret_fields: ClassVar[tuple[str, ...]] = ()
    #: Fields that are file paths (resolved beside craft-connector.yml).
    path_fields: ClassVar[tuple[str, ...]] = ()
    #: The driver that opens its connections: psycopg2, or psycopg (3) where libpq ≥ 18 is needed.
    driver: ClassVar[str] = "psycopg2"

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return cls.required_fields + cls.optional_fields

    def connect_kwargs(self, profile: EngineProfile) -> dict[str, Any]:
        """Driver keyword arguments for a new connection (called once per connection)."""
        raise NotImplementedError

    def local_problem(self, profile: EngineProfile) -> Exception | None:
        """After a failed connect: what on this machine libpq would have refused (a key, a file), if anything.

        Asked only on the failure path, so a working login pays nothing for it.
        """
        return None
