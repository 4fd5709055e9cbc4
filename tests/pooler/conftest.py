"""The pooler tier: the Engine DB reached through PgBouncer in transaction and in session pool mode.

Every test here runs once per pool mode (the ``pooler`` fixture). ``pooled_engine`` is an Engine profile
(a craft-connector.yml, as ``make_engine`` writes) on a fresh database of the session's cluster whose
jdbc_url points at PgBouncer; checks of what landed where go straight to the cluster as its superuser.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2.extensions
import pytest

from harness.engines import EngineSetup, write_config
from harness.postgres import PgDatabase
from tests.fixtures.fix_pgbouncer import MODES, PgBouncer, PgBouncers
from tests.fixtures.fix_pgbouncer import pgbouncers as pgbouncers  # the session fixture, shared here
from tests.reliability.conftest import Pool

#: Worker processes of the contention test (more than PgBouncer's server connections per database).
WORKERS = 8


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pooler: reaches the Engine DB through PgBouncer (transaction/session)"
    )


@pytest.fixture(params=MODES)
def pooler(request: pytest.FixtureRequest, pgbouncers: PgBouncers) -> PgBouncer:
    """The session's PgBouncer in each pool mode in turn (tests using it run twice)."""
    return pgbouncers(request.param)


@pytest.fixture
def pooled_engine(
    pooler: PgBouncer, pg_database: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> EngineSetup:
    """An Engine profile on a fresh database (schema ``etl_craft``) reached through ``pooler``."""
    env = {"ENGINE_SECRET": pg_database.password}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = write_config(tmp_path / "project", pooler.profile_yaml(pg_database))
    return EngineSetup("postgresql", config, env, pg_database)


@pytest.fixture(scope="module")
def pooler_pool() -> Iterator[Pool]:
    """Spawned worker processes for this module (Airflow imported once per process, reused by both modes)."""
    pool = Pool.start(size=WORKERS)
    try:
        yield pool
    finally:
        pool.close()


# -- looking at the cluster directly ------------------------------------------------------------------------


def admin_rows(database: PgDatabase, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` run in ``database`` as the cluster's superuser, not through PgBouncer."""
    conn = database.cluster.admin_connect(database.name)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params or None)
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def tables_in(database: PgDatabase, schema: str) -> set[str]:
    """Upper-cased names of the tables in ``schema`` of ``database``."""
    found = admin_rows(
        database,
        "SELECT upper(c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p')",
        schema,
    )
    return {r[0] for r in found}


def objects_in_public(database: PgDatabase) -> list[tuple[str, str]]:
    """Every relation and function in ``public`` of ``database`` (a fresh database has none)."""
    return admin_rows(
        database,
        "SELECT 'relation', c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' UNION ALL SELECT 'function', p.proname FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public' ORDER BY 1, 2",
    )


def advisory_locks(database: PgDatabase) -> list[tuple[int, bool]]:
    """(pid, granted) of every advisory lock in ``database`` as the cluster sees it right now."""
    return admin_rows(
        database,
        "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' AND database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY pid",
    )


def pollute_search_path(pooler: PgBouncer, database: PgDatabase) -> None:
    """Leave ``search_path = public`` on every server connection PgBouncer holds for ``database``.

    ``pool_size`` clients each open a transaction at once (so each holds its own server connection) and set
    ``search_path`` for the session. In transaction mode that setting stays on the server connection for
    whichever client gets it next; in session mode PgBouncer's ``DISCARD ALL`` clears it on release. A
    provider that relies on a session-level search_path (startup ``options``, a plain ``SET``) then works in
    ``public``; one that sets it with ``SET LOCAL`` in each transaction does not care.
    """
    conns: list[psycopg2.extensions.connection] = []
    try:
        for _ in range(pooler.pool_size):
            conn = pooler.connect(database)
            conns.append(conn)
            with conn.cursor() as cur:
                cur.execute("BEGIN")
                cur.execute("SET search_path = public")
        for conn in conns:
            with conn.cursor() as cur:
                cur.execute("COMMIT")
    finally:
        for conn in conns:
            conn.close()
