"""The part of DB-API 2.0 (PEP 249) the provider uses, as structural types.

sqlite3, psycopg2 and psycopg 3 objects satisfy these protocols as they are (nothing wraps them), so the
type checker holds every driver to the same small surface: the dialects are the only code that knows which
driver it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, Protocol

#: A result row: every driver returns tuples (no row factories are set).
Row = tuple[Any, ...]


class Cursor(Protocol):
    """A cursor: one statement at a time, with ``?``/``%s`` parameters as a sequence."""

    @property
    def description(self) -> Sequence[Any] | None:
        """One entry per result column; None after a statement without results."""
        ...

    @property
    def rowcount(self) -> int: ...

    # The return value differs by driver (psycopg2: None; sqlite3, psycopg 3: the cursor): never use it.
    def execute(self, operation: str, parameters: Sequence[Any] = ..., /) -> object: ...

    def fetchone(self) -> Row | None: ...

    def fetchall(self) -> Sequence[Row]: ...

    def close(self) -> None: ...


class Connection(Protocol):
    """A connection, in autocommit mode as the dialects open it (transactions are explicit SQL)."""

    def cursor(self) -> Cursor: ...

    def close(self) -> None: ...


class PgCursor(Cursor, Protocol):
    """A psycopg2 or psycopg 3 cursor, which closes itself as a context manager."""

    def __enter__(self) -> PgCursor: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...


class PgConnection(Connection, Protocol):
    """A psycopg2 or psycopg 3 connection: autocommit is a property, ``closed`` is truthy once closed."""

    autocommit: bool
    #: What ``cursor()`` makes (a class, called with the connection; psycopg2 also passes a name).
    cursor_factory: Any

    def cursor(self) -> PgCursor: ...

    @property
    def closed(self) -> int: ...


class PgDriver(Protocol):
    """The ``psycopg2`` or ``psycopg`` module: the connect function and the exception classes read."""

    def connect(self, **kwargs: Any) -> PgConnection: ...

    @property
    def Error(self) -> type[Exception]: ...

    @property
    def IntegrityError(self) -> type[Exception]: ...

    @property
    def OperationalError(self) -> type[Exception]: ...

    @property
    def InterfaceError(self) -> type[Exception]: ...
