"""Engine DBs for the benchmark: a throwaway PostgreSQL cluster (never the machine's server), SQLite files,
init-db, and the CFG_ rows the benchmark's pipelines need.

The cluster is the test suite's, :class:`harness.postgres.PgCluster` (TLS, scram-sha-256 roles, fsync and
synchronous_commit off, on 127.0.0.1 and a free port). The benchmark restarts it once with
``pg_stat_statements`` preloaded, when the server has that module, to check the client-side counts against
the server's own.
"""

from __future__ import annotations

import os
import platform
import sqlite3
from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2.extensions

from harness.engines import pg_profile_yaml, write_config
from harness.postgres import PgCluster, PgDatabase, _server_os_user, find_bindir

# Waits run without the hand-back delay, as in the test suite (tests/conftest.py): dag.test() runs each task in
# its own process with no executor, so there is no executor event to race (docs/deferred-waits.md). The bench's
# child processes inherit it; the real-scheduler part's deployment starts Airflow without this process's
# AIRFLOW__ variables, so it runs with the default.
os.environ.setdefault("AIRFLOW__ETL_CRAFT__WAIT_HAND_BACK_DELAY", "0")

#: Environment variable holding the Engine DB password (craft-connector.yml names it; child processes inherit it).
SECRET_VAR = "ETL_CRAFT_BENCH_SECRET"
SQLITE_PROFILE = "Engine:\n  bench:\n    jdbc_url: jdbc:sqlite:engine/etl-craft.db\n    schema: main\n"


def sqlite_engine(folder: Path) -> Path:
    """A craft-connector.yml for a fresh SQLite Engine DB under ``folder``; returns the config path."""
    return write_config(folder, SQLITE_PROFILE)


@dataclass
class PgServer:
    """The throwaway cluster, one database in it for the Engine DB, and whether statements can be counted."""

    cluster: PgCluster
    database: PgDatabase
    config_path: Path
    statements_view: bool
    version_string: str

    @classmethod
    def start(cls, folder: Path) -> PgServer:
        """Create and start the cluster, a database with an ``etl_craft`` schema, and the config file.

        :raises harness.postgres.PostgresUnavailable: no PostgreSQL server binaries on this machine.
        """
        bindir = find_bindir()
        cluster = PgCluster.create(bindir, _server_os_user())
        try:
            statements_view = _preload_pg_stat_statements(cluster)
            database = PgDatabase(cluster, cluster.create_database())
            with closing(cluster.admin_connect(database.name)) as admin, admin.cursor() as cur:
                if statements_view:
                    cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                cur.execute("SELECT version()")
                version_string = scalar(cur)
            os.environ[SECRET_VAR] = database.password
            profile = pg_profile_yaml(database, secret_var=SECRET_VAR).replace("  test:\n", "  bench:\n")
            config_path = write_config(folder, profile)
        except BaseException:
            cluster.destroy()
            raise
        return cls(cluster, database, config_path, statements_view, str(version_string))

    def another_database(self, folder: Path) -> tuple[str, Path]:
        """One more Engine database in the same cluster, owned by the same role: its name and config path
        (the password is the same, so :data:`SECRET_VAR` serves both)."""
        database = PgDatabase(self.cluster, self.cluster.create_database())
        profile = pg_profile_yaml(database, secret_var=SECRET_VAR).replace("  test:\n", "  bench:\n")
        return database.name, write_config(folder, profile)

    def stop(self) -> None:
        """Stop the cluster and delete its files."""
        self.cluster.destroy()

    def statement_count(self) -> int | None:
        """Statements the Engine role has run in the Engine database so far, as the server counts them
        (``pg_stat_statements``: every top-level statement, BEGIN/COMMIT included); None without the view."""
        if not self.statements_view:
            return None
        with closing(self.cluster.admin_connect(self.database.name)) as admin, admin.cursor() as cur:
            cur.execute(
                "SELECT COALESCE(SUM(s.calls), 0) FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid "
                "WHERE r.rolname = %s AND s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
                (self.database.user,),
            )
            count = scalar(cur)
        return int(count)


def scalar(cur: psycopg2.extensions.cursor) -> Any:
    """The one value of the one row the statement just run returned.

    :raises RuntimeError: it returned no row.
    """
    row = cur.fetchone()
    if row is None:
        raise RuntimeError(f"no row from: {cur.query!r}")
    return row[0]


def _preload_pg_stat_statements(cluster: PgCluster) -> bool:
    """Restart ``cluster`` with pg_stat_statements loaded.

    :raises RuntimeError: the server does not ship it: the round-trip cross-check needs it (no weaker check).
    """
    with closing(cluster.admin_connect()) as admin, admin.cursor() as cur:
        cur.execute("SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'")
        pkglibdir = scalar(cur)
        cur.execute("SELECT setting FROM pg_config WHERE name = 'SHAREDIR'")
        sharedir = scalar(cur)
    library = Path(pkglibdir) / "pg_stat_statements.so"
    control = Path(sharedir) / "extension" / "pg_stat_statements.control"
    if not (library.exists() and control.exists()):
        raise RuntimeError(
            f"pg_stat_statements is missing ({library} or {control}): the benchmark checks its round-trip "
            "counts against it; install the PostgreSQL server's contrib modules (Debian: postgresql-<version>)"
        )
    with closing(cluster.admin_connect()) as admin, admin.cursor() as cur:
        cur.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    cluster.stop()
    cluster.start()
    return True


# --------------------------------------------------------------------------- Engine DB content


def init_engine(config_path: Path) -> Any:
    """init-db on the Engine DB of ``config_path``; returns a fresh (uninstrumented) hook on it."""
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

    hook = EngineDBHook.from_config(config_path)
    hook.init_db()
    return hook


def seed_pipelines(hook: Any, pipelines: Iterable[tuple[str, Sequence[str]]]) -> None:
    """Insert one active CFG_PIPELINES row per pipeline code and one CFG_TASKS row per task code (plain INSERTs)."""
    engine = hook.engine
    # In the dialect's transaction: on PostgreSQL it sets the Engine schema (connections keep no search_path).
    with closing(engine.connect()) as conn, engine.transaction(conn) as cur:
        for code, task_codes in pipelines:
            cur.execute(
                engine.sql("INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, "
                           "CREATED_BY) VALUES (?, ?, 24, 'FULL', 'bench')"),
                (code, f"bench pipeline {code}"),
            )  # fmt: skip
            for task_code in task_codes:
                cur.execute(
                    engine.sql("INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY) "
                               "SELECT ?, 'ETL', PIPELINE_ID, 'PYTHON', 'bench' FROM CFG_PIPELINES "
                               "WHERE PIPELINE_CODE = ? AND ACTIVE_FLAG = 'Y'"),
                    (task_code, code),
                )  # fmt: skip


def task_codes(n: int) -> tuple[str, ...]:
    """``T01`` … ``Tnn``."""
    return tuple(f"T{i:02d}" for i in range(1, n + 1))


# --------------------------------------------------------------------------- the machine


def machine(pg: PgServer | None) -> dict[str, Any]:
    """What the figures were measured on."""
    import psycopg2

    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from importlib.metadata import version

        airflow_version = version("apache-airflow")
    except Exception:  # informational only
        airflow_version = "unknown"
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "postgresql": pg.cluster.version if pg else None,
        "postgresql_build": pg.version_string if pg else None,
        "postgresql_settings": "fsync=off, synchronous_commit=off, full_page_writes=off, TLS (sslmode=require), "
        "scram-sha-256 login (the test cluster's settings)",
        # types-psycopg2 declares no __version__ (psycopg2 has it: "2.9.10 (dt dec pq3 ext lo64)").
        "psycopg2": psycopg2.__version__.split()[0],  # type: ignore[attr-defined]
        "airflow": airflow_version,
    }
