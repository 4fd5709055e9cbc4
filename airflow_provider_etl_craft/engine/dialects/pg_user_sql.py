"""Users' own SQL on PostgreSQL: every transaction it opens has the Engine schema first on its search path.

``EngineDBHook.get_conn()`` hands out connections whose cursors are these, so common-sql's ``run``,
``get_records``, ``get_first``, ``insert_rows``, ``SQLExecuteQueryOperator`` and a cursor of your own all
find the Engine tables unqualified. The schema is set with ``set_config('search_path', …, true)`` (what
``SET LOCAL`` does) inside the transaction the statement runs in, never on the session and never as a
startup parameter, so nothing outlives the user's transaction, also behind a transaction-mode pooler.
docs/etl-craft-parity.md ("Your own SQL") explains the choice and its one limit.

When a cursor sends something and no transaction is open:

- connection not in autocommit: the schema statement goes first, on its own cursor; the driver opens the
  transaction with it, and the user's commit or rollback ends it (with the setting);
- autocommit, ``execute`` on an unnamed cursor: the schema statement and the user's SQL go as one query
  string, which the server runs as one implicit transaction, exactly as it runs a string of several
  statements (an explicit ``BEGIN`` in the user's SQL turns it into the user's transaction block);
- autocommit, anything else (``executemany``, ``callproc``, ``COPY``, named cursors): an explicit
  transaction around the call, committed after it, rolled back on error.

Inside an open transaction a cursor adds nothing. A single statement that PostgreSQL refuses inside a
transaction block (``VACUUM``, ``CREATE INDEX CONCURRENTLY``, …: SQLSTATE 25001) cannot have a
transaction-scoped setting at all: after that refusal (which did nothing) it runs once more as written,
with the session's own search path, as it would on any PostgreSQL connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import lru_cache
from typing import Any, TypeVar

from airflow_provider_etl_craft.engine import locks

#: libpq's PQTRANS_IDLE, the value of psycopg2's and psycopg 3's ``connection.info.transaction_status``
#: when no transaction is open.
_IDLE = 0
#: active_sql_transaction: the statement refuses to run inside a transaction block.
_REFUSES_TRANSACTION_BLOCK = "25001"

T = TypeVar("T")


def schema_first_sql(quoted_schema: str) -> str:
    """The statement that puts ``quoted_schema`` (a validated, double-quoted identifier) first on the search
    path for the current transaction only, before whatever the session's path is."""
    return (
        f"SELECT set_config('search_path', concat_ws(', ', '{quoted_schema}', "  # noqa: S608 - validated
        "nullif(current_setting('search_path'), '')), true)"
    )


def _one_statement(query: object) -> bool:
    """Whether ``query`` is one SQL statement (only then may a refused one run again as written)."""
    text = query.decode() if isinstance(query, bytes) else query if isinstance(query, str) else None
    if text is None:  # a composed query: not inspected, not run twice
        return False
    import sqlparse  # here: only a refused statement of the user's own SQL is split

    return len([s for s in sqlparse.split(text) if s.strip()]) == 1


def _prefixed(scope: str, query: Any, sql_module: Any) -> Any:
    """``scope; query`` as one query string, for a str, bytes or a composed query of the driver's
    ``sql_module`` (psycopg2.sql or psycopg.sql); anything else goes as it is, for the driver to judge."""
    if isinstance(query, str):
        return f"{scope}; {query}"
    if isinstance(query, bytes):
        return f"{scope}; ".encode() + query
    if isinstance(query, sql_module.Composable):
        return sql_module.SQL(f"{scope}; ") + query
    return query


class _SchemaFirst:
    """What both drivers' cursors share; the subclasses below mix it into the driver's own cursor."""

    _scope: str  # the schema statement (set on each generated class)

    connection: Any  # the driver cursor's attribute

    def _plain_cursor(self) -> Any:
        raise NotImplementedError

    def _driver_error(self) -> type[Exception]:
        raise NotImplementedError

    def _run_plain(self, *statements: str) -> None:
        cur = self._plain_cursor()
        try:
            for statement in statements:
                cur.execute(statement)
        finally:
            cur.close()

    @contextmanager
    def _scoped(self) -> Iterator[None]:
        """Around anything that sends SQL: set the schema in the transaction it runs in (see the module)."""
        conn = self.connection
        if conn.info.transaction_status != _IDLE:
            yield
            return
        if not conn.autocommit:
            self._run_plain(self._scope)  # opens the driver's transaction; the user ends it
            yield
            return
        self._run_plain("BEGIN", self._scope)
        try:
            yield
        except BaseException:
            with suppress(Exception):
                self._run_plain("ROLLBACK")
            raise
        self._run_plain("COMMIT")

    def _call_scoped(self, call: Callable[[], T]) -> T:
        with self._scoped():
            return call()

    def _execute_scoped(self, query: Any, params: Any, send: Callable[[Any, Any], T], skip_first: bool) -> T:
        """``execute``: in autocommit with no transaction open, one query string (see the module)."""
        conn = self.connection
        # psycopg2's named cursors send DECLARE … FOR <query>: no room for a second statement
        named = getattr(self, "name", None) is not None
        if named or not conn.autocommit or conn.info.transaction_status != _IDLE:
            return self._call_scoped(lambda: send(query, params))
        try:
            result = send(self._prefix(query), params)
        except self._driver_error() as exc:
            if locks.sqlstate(exc) != _REFUSES_TRANSACTION_BLOCK or not _one_statement(query):
                raise
        else:
            if skip_first:  # psycopg 3 stands on the first statement's result: the schema statement's
                self.nextset()  # type: ignore[attr-defined]
            return result
        return send(query, params)

    def _prefix(self, query: Any) -> Any:
        raise NotImplementedError


@lru_cache(maxsize=64)
def psycopg2_cursor(scope: str) -> type:
    """A psycopg2 cursor class that puts the schema first (``scope`` from :func:`schema_first_sql`)."""
    import psycopg2
    import psycopg2.extensions
    import psycopg2.sql

    class SchemaFirstCursor(_SchemaFirst, psycopg2.extensions.cursor):
        """psycopg2's cursor, with the Engine schema first in each transaction it opens."""

        _scope = scope

        def _plain_cursor(self) -> Any:
            return self.connection.cursor(cursor_factory=psycopg2.extensions.cursor)

        def _driver_error(self) -> type[Exception]:
            return psycopg2.Error

        def _prefix(self, query: Any) -> Any:
            return _prefixed(self._scope, query, psycopg2.sql)

        def execute(self, query: Any, vars: Any = None) -> None:  # noqa: A002 - psycopg2's parameter name
            send = super().execute
            self._execute_scoped(query, vars, send, skip_first=False)

        def executemany(self, query: Any, vars_list: Any) -> None:
            send = super().executemany
            self._call_scoped(lambda: send(query, vars_list))

        def callproc(self, procname: Any, parameters: Any = None) -> Any:
            send = super().callproc
            return self._call_scoped(lambda: send(procname, parameters))

        def copy_expert(self, sql: Any, file: Any, size: int = 8192) -> None:
            send = super().copy_expert
            self._call_scoped(lambda: send(sql, file, size))

        def copy_from(self, file: Any, table: str, *args: Any, **kwargs: Any) -> None:
            send = super().copy_from
            self._call_scoped(lambda: send(file, table, *args, **kwargs))

        def copy_to(self, file: Any, table: str, *args: Any, **kwargs: Any) -> None:
            send = super().copy_to
            self._call_scoped(lambda: send(file, table, *args, **kwargs))

    return SchemaFirstCursor


@lru_cache(maxsize=64)
def psycopg_cursor(scope: str) -> type:
    """A psycopg 3 client-side-binding cursor class that puts the schema first (one query string with
    parameters needs client-side binding, as psycopg2 does it)."""
    import psycopg
    import psycopg.sql

    class SchemaFirstClientCursor(_SchemaFirst, psycopg.ClientCursor[Any]):
        """psycopg 3's ClientCursor, with the Engine schema first in each transaction it opens."""

        _scope = scope

        def _plain_cursor(self) -> Any:
            return psycopg.Cursor(self.connection)

        def _driver_error(self) -> type[Exception]:
            return psycopg.Error

        def _prefix(self, query: Any) -> Any:
            return _prefixed(self._scope, query, psycopg.sql)

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            send = super().execute
            return self._execute_scoped(query, params, lambda q, p: send(q, p, **kwargs), skip_first=True)

        def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
            send = super().executemany
            self._call_scoped(lambda: send(query, params_seq, **kwargs))

        @contextmanager
        def copy(self, statement: Any, params: Any = None, **kwargs: Any) -> Iterator[Any]:
            with self._scoped(), super().copy(statement, params, **kwargs) as copy:
                yield copy

        def stream(self, query: Any, params: Any = None, **kwargs: Any) -> Iterator[Any]:
            with self._scoped():
                yield from super().stream(query, params, **kwargs)

    return SchemaFirstClientCursor
