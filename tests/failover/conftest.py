"""The failover tier: an Engine DB on a primary + synchronous standby (``pg_pair``), reached through a
multi-host jdbc_url, while spawned workers claim, record and finish runs (docs/failover-tier.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

from harness.engines import EngineSetup, write_config
from tests.failover.floating import FloatingAddress
from tests.fixtures.fix_pg_standby import PgPair
from tests.reliability.conftest import Pool, pipeline_sql

#: Worker processes of the workload (each its own OS process, spawned once for the module).
WORKERS = 4
SECRET_VAR = "FAILOVER_ENGINE_SECRET"
SCHEMA = "etl_craft"
USER = "etl_password"
#: Eight pipelines of three tasks; FO2's T3 depends on FO1's T3 and FO4's T3 on FO3's T1 (cross-pipeline
#: task edges, so a successful attempt writes AUD_DEPENDENCY_CONSUMPTION rows that must not double).
PIPELINES = {f"FO{i}": ["T1", "T2", "T3"] for i in range(1, 9)}
TASK_EDGES = [("FO2", "T3", "FO1", "T3", "ALWAYS"), ("FO4", "T3", "FO3", "T1", "SUCCESS")]


def _task_edge(down: str, task: str, up: str, up_task: str, kind: str) -> str:
    return (
        "INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_PIPELINE_ID, DEPENDS_ON_TASK_ID, "
        "DEPENDENCY_TYPE, CONSUME_REPAIRS, CREATED_BY) SELECT t.PIPELINE_ID, t.TASK_ID, u.PIPELINE_ID, u.TASK_ID, "
        f"'{kind}', 'N', 'failover' FROM CFG_TASKS t JOIN CFG_PIPELINES dp ON dp.PIPELINE_ID = t.PIPELINE_ID, "
        "CFG_TASKS u JOIN CFG_PIPELINES up ON up.PIPELINE_ID = u.PIPELINE_ID "
        f"WHERE dp.PIPELINE_CODE = '{down}' AND t.TASK_CODE = '{task}' "
        f"AND up.PIPELINE_CODE = '{up}' AND u.TASK_CODE = '{up_task}';\n"
    )


def migration_sql() -> str:
    return "".join(pipeline_sql(code, tasks) for code, tasks in PIPELINES.items()) + "".join(
        _task_edge(*edge) for edge in TASK_EDGES
    )


def jdbc_url(pair: PgPair, database: str, floating: FloatingAddress | None = None) -> str:
    """Both nodes in PgJDBC's multi-host form, only the primary taken (a standby is skipped); or the one
    floating address."""
    if floating is not None:
        return f"jdbc:postgresql://127.0.0.1:{floating.port}/{database}?sslmode=require&connect_timeout=3"
    return f"jdbc:postgresql://{pair.hosts}/{database}?targetServerType=primary&sslmode=require&connect_timeout=3"


def profile_yaml(pair: PgPair, database: str, floating: FloatingAddress | None = None) -> str:
    """A craft-connector.yml profile ``failover`` on :func:`jdbc_url`."""
    return (
        "Engine:\n  failover:\n"
        f"    jdbc_url: {jdbc_url(pair, database, floating)}\n"
        f"    schema: {SCHEMA}\n    user: {USER}\n    auth_mode: password\n    secret: {SECRET_VAR}\n"
    )


@dataclass
class FailoverEngine:
    """An Engine profile on a fresh database of the pair, seeded with PIPELINES; its jdbc_url names both
    nodes, or (``floating``) one address that the test moves to the new primary."""

    pair: PgPair
    database: str
    setup: EngineSetup
    floating: FloatingAddress | None = None

    def follow_primary(self) -> None:
        """After a promotion: the floating address moves to the new primary (multi-host needs nothing)."""
        if self.floating is not None:
            self.floating.move(self.pair.primary.port)

    def admin(self) -> psycopg2.extensions.connection:
        """The current primary as its superuser, in this database, search_path on the Engine schema."""
        conn = psycopg2.connect(
            host=self.pair.primary.cluster.host,
            port=self.pair.primary.port,
            user=self.pair.primary.cluster.superuser,
            dbname=self.database,
            connect_timeout=3,
            options=f"-c search_path={SCHEMA}",
        )
        conn.autocommit = True
        return conn

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        conn = self.admin()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params or None)
                return [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()


def _engine(pair: PgPair, folder: Path, monkeypatch: pytest.MonkeyPatch, floating: bool) -> FailoverEngine:
    """A healthy pair (primary + synchronous standby), a fresh Engine DB on it, init-db and the pipelines
    migrated through the provider over the profile's URL."""
    pair.healthy()
    database = pair.primary.cluster.create_database(owner=USER, schema=SCHEMA)
    pair.caught_up()  # the first host of the URL may be the standby: it must know the database
    env = {SECRET_VAR: pair.passwords[USER]}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    address = FloatingAddress(pair.primary.port) if floating else None
    config = write_config(folder / "project", profile_yaml(pair, database, address))
    setup = EngineSetup("postgresql", config, env)
    migrations = folder / "project" / "migrations"
    migrations.mkdir()
    (migrations / "0001_failover.sql").write_text(migration_sql(), encoding="utf-8")
    result = setup.hook().migrate(migrations)
    assert result.applied[-1] == "PROJECT 0001_failover.sql", result
    return FailoverEngine(pair, database, setup, address)


@pytest.fixture(params=["multi-host", "floating"])
def failover_engine(
    request: pytest.FixtureRequest, pg_pair: PgPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FailoverEngine]:
    """An Engine DB on the pair through each URL form in turn: both hosts (PgJDBC's multi-host form, primary
    only), then one floating address that follows the primary."""
    engine = _engine(pg_pair, tmp_path, monkeypatch, floating=request.param == "floating")
    try:
        yield engine
    finally:
        if engine.floating is not None:
            engine.floating.close()


@pytest.fixture(scope="module")
def failover_pool() -> Iterator[Pool]:
    """WORKERS spawned processes for this module (Airflow imported once each)."""
    pool = Pool.start(size=WORKERS)
    try:
        yield pool
    finally:
        pool.close()
