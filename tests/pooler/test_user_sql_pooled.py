"""SQL of the user's own through EngineDBHook, behind PgBouncer: the examples of docs/hook.md as written, and
nothing of the Engine schema left on the pooled server connection after the user's transaction.

The proof of the second uses a PgBouncer of its own in transaction mode with one server connection per
database and user: every client's transaction lands on that one server session, so a second client sees
exactly what the first one's transactions left there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from harness.engines import EngineSetup, write_config
from harness.postgres import PgCluster, PgDatabase
from tests.fixtures.fix_pgbouncer import PgBouncer, PgBouncerUnavailable, _unavailable, find_pgbouncer
from tests.integration.test_user_sql import (
    ACTIVE,
    DEFAULT_PATH,
    SCHEMA_FIRST,
    hook_example,
    operator_example,
    seeded,
)
from tests.pooler.conftest import pollute_search_path

pytestmark = [pytest.mark.postgres, pytest.mark.pooler]

FACTS = "SELECT pg_backend_pid(), current_setting('search_path')"


@pytest.fixture(scope="module")
def one_server_bouncer(pg_cluster: PgCluster) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode with a single server connection per database and user."""
    try:
        binary = find_pgbouncer()
    except PgBouncerUnavailable as exc:
        raise _unavailable(str(exc)) from None
    bouncer = PgBouncer.start_new(pg_cluster, binary, "transaction", pool_size=1)
    try:
        yield bouncer
    finally:
        bouncer.destroy()


def second_client(bouncer: PgBouncer, database: PgDatabase) -> tuple[Any, ...]:
    """(server pid, search_path) as another client of ``bouncer`` sees them, in an autocommit statement."""
    with closing(bouncer.connect(database)) as conn, conn.cursor() as cur:
        cur.execute(FACTS)
        row = cur.fetchone()
    assert row is not None
    return tuple(row)


# -- docs/hook.md's examples through PgBouncer (transaction and session mode) -----------------------------------


def test_docs_hook_example_through_the_pooler(
    pooled_engine: EngineSetup, pooler: PgBouncer, monkeypatch
) -> None:
    setup = seeded(pooled_engine)
    assert setup.database is not None
    pollute_search_path(pooler, setup.database)  # in transaction mode: search_path=public on every server
    assert hook_example(monkeypatch, setup) == ACTIVE


@pytest.mark.e2e
def test_docs_sql_execute_query_operator_example_through_the_pooler(
    pooled_engine: EngineSetup, pooler: PgBouncer, airflow_db: Path, monkeypatch
) -> None:
    setup = seeded(pooled_engine)
    assert setup.database is not None
    pollute_search_path(pooler, setup.database)
    rows = operator_example(monkeypatch, setup, airflow_db / "dags")
    assert sorted(tuple(r) for r in rows) == ACTIVE


# -- nothing outlives the user's transaction --------------------------------------------------------------------


@pytest.mark.parametrize("autocommit", [False, True])
def test_the_pooled_server_connection_keeps_no_schema_after_the_users_transaction(
    one_server_bouncer: PgBouncer, pg_database: PgDatabase, tmp_path: Path, monkeypatch, autocommit: bool
) -> None:
    bouncer = one_server_bouncer
    monkeypatch.setenv("ENGINE_SECRET", pg_database.password)
    config = write_config(tmp_path / "project", bouncer.profile_yaml(pg_database))
    setup = seeded(EngineSetup("postgresql", config, {"ENGINE_SECRET": pg_database.password}, pg_database))
    server, before = second_client(bouncer, pg_database)
    assert before == DEFAULT_PATH

    assert hook_example(monkeypatch, setup) == ACTIVE  # the docs' lines, through this PgBouncer
    assert second_client(bouncer, pg_database) == (server, DEFAULT_PATH)

    hook = EngineDBHook.from_config(config)
    with closing(hook.get_conn()) as conn:  # the hook's client stays connected while the other one asks
        hook.set_autocommit(conn, autocommit)
        cur = conn.cursor()
        cur.execute(FACTS)
        assert cur.fetchone() == (server, SCHEMA_FIRST)  # the same server session, inside the transaction
        cur.execute("SELECT COUNT(*) FROM CFG_PIPELINES")
        assert cur.fetchone() == (3,)
        cur.close()
        if not autocommit:
            conn.commit()
        assert second_client(bouncer, pg_database) == (server, DEFAULT_PATH)
    assert hook.run(FACTS, autocommit=autocommit, handler=lambda c: c.fetchone()) == (server, SCHEMA_FIRST)
    assert second_client(bouncer, pg_database) == (server, DEFAULT_PATH)
