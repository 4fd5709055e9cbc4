"""Count the round trips the provider makes to its Engine DB, per operation, by wrapping DB-API objects.

**What one round trip is.** One message the client sends to the database and then waits for the answer
to: one SQL statement or one transaction-control message. Concretely, with psycopg2 in autocommit mode
(how the provider's connections run) every ``cursor.execute`` is exactly one round trip (one simple-query
message, one reply), including ``BEGIN``, ``COMMIT`` and ``ROLLBACK`` sent as statements and advisory-lock
calls (``SELECT pg_advisory_lock(…)`` is just a statement). ``executemany`` is one round trip per
parameter set (psycopg2 loops over ``execute``). ``connection.commit()``/``rollback()`` are one round trip
only when a transaction is open (in autocommit mode the driver sends nothing). Fetching rows from a
client-side cursor, ``close()`` (psycopg2 sends a one-way Terminate) and reading attributes are free.

Opening a connection is counted apart, under the operation ``connect``: one ``connect`` (PostgreSQL: the
login, itself several network exchanges for TLS and SCRAM that DB-API cannot see, counted as one) plus
each ``setup`` statement the dialect runs before handing the connection over (PostgreSQL:
``SELECT current_schema()``; SQLite: its PRAGMAs). Those setup statements run inside the dialect's own
``connect()``, before any proxy exists, so they are counted by a probe on the driver: while the dialect
connects, ``psycopg2.connect`` is given a counting ``cursor_factory`` and ``sqlite3.connect`` a connection
class with a trace callback; both are removed as soon as the dialect returns the connection.

SQLite has no server: its "round trips" are statements handed to the in-process library, counted by the
same rule, so the two dialects compare like with like.

How it is wired: :func:`instrument` replaces ``hook.engine.connect`` (the dialect instance's method) with
a function returning a :class:`CountingConnection`; everything the provider does through
``hook.lifecycle()``, ``hook.get_conn()`` and the dialect's locks then goes through the proxies.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: The operation name connection setup is counted under.
CONNECT_OP = "connect"
#: Round-trip kinds; ``connect`` is the login (or file open), the rest are statements/messages.
STATEMENT_KINDS = ("setup", "execute", "executemany", "callproc", "commit", "rollback")


class RoundTripCounter:
    """Round trips by operation (``claim``, ``start_task``, …, and ``connect``) and by kind."""

    def __init__(self) -> None:
        self.current = "unlabelled"
        self.counts: defaultdict[str, Counter[str]] = defaultdict(Counter)
        #: How many times each operation ran (for ``connect``: how many connections were opened).
        self.calls: Counter[str] = Counter()
        #: Which operation opened how many connections.
        self.connections_by_op: Counter[str] = Counter()
        #: Seconds each connection took to open, and to close (SQLite checkpoints when its last one closes).
        self.connect_seconds: list[float] = []
        self.close_seconds: list[float] = []
        #: The statements each operation sent (their first words), to show where the round trips go.
        self.texts: defaultdict[str, Counter[str]] = defaultdict(Counter)
        #: SQL statements inside the round trips, as a server counts them: one round trip may carry several
        #: (the PostgreSQL dialect sends ``SET LOCAL search_path …; <statement>`` in one execute).
        self.server_statements = 0

    @contextmanager
    def operation(self, name: str) -> Iterator[None]:
        """Attribute the round trips made inside the block to ``name``."""
        previous, self.current = self.current, name
        self.calls[name] += 1
        try:
            yield
        finally:
            self.current = previous

    def hit(self, kind: str, n: int = 1, statement: Any = None) -> None:
        """Count ``n`` round trips of ``kind`` for the current operation (``statement``: the SQL sent)."""
        self.counts[self.current][kind] += n
        if kind != "connect":
            self.server_statements += n * (sql_statements(statement) if statement is not None else 1)
        if statement is not None:
            self.texts[self.current][_head(statement)] += n

    def statements(self, op: str) -> int:
        """Statements and transaction-control messages of ``op`` (everything but logins)."""
        return sum(n for kind, n in self.counts[op].items() if kind != "connect")

    def round_trips(self, op: str) -> int:
        """All round trips of ``op`` (for ``connect`` that includes the logins)."""
        return sum(self.counts[op].values())

    def total_statements(self) -> int:
        """Statements over every operation, connection setup included (what a server would count)."""
        return sum(self.statements(op) for op in self.counts)

    def statements_per_call(self, op: str) -> dict[str, float]:
        """What one call of ``op`` sent: statement heads and how often, in first-seen order."""
        calls = self.calls[op] or 1
        return {text: n / calls for text, n in self.texts[op].items()}

    def per_call(self, op: str) -> dict[str, float]:
        """Average round trips of one call of ``op``, by kind and in total."""
        calls = self.calls[op] or 1
        out = {kind: n / calls for kind, n in sorted(self.counts[op].items())}
        out["statements"] = self.statements(op) / calls
        out["total"] = self.round_trips(op) / calls
        return out


def sql_statements(statement: Any) -> int:
    """How many SQL statements one text holds: its ``;``-separated non-empty parts outside quotes."""
    text = statement.decode(errors="replace") if isinstance(statement, bytes) else str(statement)
    parts, quote, current = 0, "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == ";":
            parts += bool(current.strip())
            current = ""
            continue
        current += char
    return max(1, parts + bool(current.strip()))


def _head(statement: Any) -> str:
    """The first words of a statement, enough to tell the statements of one operation apart."""
    text = statement.decode(errors="replace") if isinstance(statement, bytes) else str(statement)
    words = " ".join(text.split())
    return words if len(words) <= 72 else words[:71] + "…"


def _in_transaction(raw: Any) -> bool:
    """Whether ``raw`` has a transaction open, so that commit/rollback would talk to the server."""
    flag = getattr(raw, "in_transaction", None)  # sqlite3
    if isinstance(flag, bool):
        return flag
    info = getattr(raw, "info", None)  # psycopg2 ≥ 2.8 and psycopg 3: 0 = idle
    status = getattr(info, "transaction_status", None)
    if status is not None:
        return int(status) != 0
    return True  # unknown driver: assume the message is sent


class CountingCursor:
    """A DB-API cursor that counts its executes; everything else (fetch*, rowcount, description, with-block,
    iteration) behaves as the wrapped cursor's."""

    def __init__(self, raw: Any, counter: RoundTripCounter) -> None:
        self._raw = raw
        self._counter = counter

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self._counter.hit("execute", statement=args[0] if args else kwargs.get("query"))
        result = self._raw.execute(*args, **kwargs)
        return self if result is self._raw else result

    def executemany(self, operation: Any, seq_of_parameters: Any) -> Any:
        params = list(seq_of_parameters)
        self._counter.hit("executemany", len(params), statement=operation)
        result = self._raw.executemany(operation, params)
        return self if result is self._raw else result

    def callproc(self, *args: Any, **kwargs: Any) -> Any:
        self._counter.hit("callproc")
        return self._raw.callproc(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._raw)

    def __enter__(self) -> CountingCursor:
        enter = getattr(self._raw, "__enter__", None)
        if enter is not None:
            enter()
        return self

    def __exit__(self, *exc: Any) -> Any:
        exit_ = getattr(self._raw, "__exit__", None)
        if exit_ is not None:
            return exit_(*exc)
        self._raw.close()  # sqlite3 cursors are no context managers; closing is what the block means
        return None


class CountingConnection:
    """A DB-API connection whose cursors count, and whose own statements and commits count too.

    Attribute reads and writes (``autocommit``, ``isolation_level``, ``closed``, …) go to the wrapped
    connection.
    """

    def __init__(self, raw: Any, counter: RoundTripCounter) -> None:
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "_counter", counter)

    @property
    def raw(self) -> Any:
        """The driver's connection."""
        return self._raw

    def cursor(self, *args: Any, **kwargs: Any) -> CountingCursor:
        return CountingCursor(self._raw.cursor(*args, **kwargs), self._counter)

    # sqlite3's shortcuts on the connection
    def execute(self, *args: Any, **kwargs: Any) -> CountingCursor:
        self._counter.hit("execute", statement=args[0] if args else kwargs.get("sql"))
        return CountingCursor(self._raw.execute(*args, **kwargs), self._counter)

    def executemany(self, operation: Any, seq_of_parameters: Any) -> CountingCursor:
        params = list(seq_of_parameters)
        self._counter.hit("executemany", len(params), statement=operation)
        return CountingCursor(self._raw.executemany(operation, params), self._counter)

    def executescript(self, script: str) -> CountingCursor:
        self._counter.hit(
            "execute", statement=script
        )  # one call with the whole script, like one multi-statement PG message
        return CountingCursor(self._raw.executescript(script), self._counter)

    def commit(self) -> None:
        if _in_transaction(self._raw):
            self._counter.hit("commit", statement="commit()")
        self._raw.commit()

    def rollback(self) -> None:
        if _in_transaction(self._raw):
            self._counter.hit("rollback", statement="rollback()")
        self._raw.rollback()

    def close(self) -> None:
        started = time.perf_counter()
        self._raw.close()
        self._counter.close_seconds.append(time.perf_counter() - started)

    def __enter__(self) -> CountingConnection:
        self._raw.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        if _in_transaction(self._raw):  # both drivers end an open transaction here
            kind = "commit" if exc_type is None else "rollback"
            self._counter.hit(kind, statement=f"{kind}() on leaving a with-block")
        return self._raw.__exit__(exc_type, exc, tb)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._raw, name, value)


# --------------------------------------------------------------------------- connection setup probe


@contextmanager
def _probe_setup_statements(counter: RoundTripCounter) -> Iterator[Callable[[Any], None]]:
    """While the block runs, count what the drivers execute on connections they open (see module doc).

    Yields ``detach(raw)``, to call on the connection the dialect returned: it removes the probe from it.
    """
    import psycopg2
    import psycopg2.extensions

    class SetupCursor(psycopg2.extensions.cursor):
        def execute(self, query: Any, params: Any = None) -> Any:
            counter.hit("setup", statement=query)
            return super().execute(query, params)

    def tracer(statement: str) -> None:
        if not statement.lstrip().startswith("--"):  # a trigger's sub-program, not a statement
            counter.hit("setup", statement=statement)

    class TracedSqliteConnection(sqlite3.Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.set_trace_callback(tracer)

    pg_connect, sqlite_connect = psycopg2.connect, sqlite3.connect

    def probed_pg_connect(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cursor_factory", SetupCursor)
        return pg_connect(*args, **kwargs)

    def probed_sqlite_connect(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("factory", TracedSqliteConnection)
        return sqlite_connect(*args, **kwargs)

    def detach(raw: Any) -> None:
        if isinstance(raw, psycopg2.extensions.connection) and raw.cursor_factory is SetupCursor:
            # Back to the plain cursor; types-psycopg2 leaves None out of cursor_factory's type.
            raw.cursor_factory = None  # type: ignore[assignment]
        elif isinstance(raw, TracedSqliteConnection):
            raw.set_trace_callback(None)

    psycopg2.connect, sqlite3.connect = probed_pg_connect, probed_sqlite_connect
    try:
        yield detach
    finally:
        psycopg2.connect, sqlite3.connect = pg_connect, sqlite_connect


def instrument(hook: Any, counter: RoundTripCounter,
               on_raw_connection: Callable[[Any], None] | None = None) -> Callable[[], None]:  # fmt: skip
    """Make every connection ``hook`` opens a :class:`CountingConnection` reporting to ``counter``.

    Replaces ``hook.engine.connect`` on the dialect instance. ``on_raw_connection`` is called with each new
    driver connection after setup (used to attach a server-independent tracer when checking the counts).
    Returns a function that undoes the wrapping.
    """
    dialect = hook.engine
    original = dialect.connect

    def counting_connect() -> CountingConnection:
        counter.connections_by_op[counter.current] += 1
        started = time.perf_counter()
        with counter.operation(CONNECT_OP), _probe_setup_statements(counter) as detach:
            counter.hit("connect", statement="(login / open)")
            raw = original()
            detach(raw)
        counter.connect_seconds.append(time.perf_counter() - started)
        if on_raw_connection is not None:
            on_raw_connection(raw)
        return CountingConnection(raw, counter)

    dialect.connect = counting_connect

    def restore() -> None:
        if dialect.__dict__.get("connect") is counting_connect:
            del dialect.connect

    return restore
