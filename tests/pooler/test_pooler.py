"""The Engine DB through PgBouncer, in transaction and in session pool mode (issue 13).

PgBouncer keeps three server connections per database here, fewer than the eight worker processes of the
contention test, so in transaction mode consecutive transactions of one client land on different server
connections. What must hold there: the Engine tables go into the profile's schema, never ``public``; the
pipeline lock really serialises claims and leaves nothing behind; no startup parameter PgBouncer refuses
(``options``) is sent; and the example pipeline runs end to end.
"""

from __future__ import annotations

import io
import json
import shutil
import time
from contextlib import closing
from pathlib import Path

import psycopg2
import pytest

from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.engine.schema import ENGINE_TABLES
from airflow_provider_etl_craft.runs import RunIdentity
from airflow_provider_etl_craft.testing import run_dag_test
from harness.engines import EngineSetup
from harness.postgres import PgDatabase
from tests.e2e.test_example_dags import EXAMPLES, load_dag
from tests.fixtures.fix_pgbouncer import PgBouncer
from tests.pooler import workers
from tests.pooler.conftest import (
    WORKERS,
    admin_rows,
    advisory_locks,
    objects_in_public,
    pollute_search_path,
    tables_in,
)
from tests.reliability.conftest import Pool, seed

pytestmark = [pytest.mark.postgres, pytest.mark.pooler]

SCHEMA = "etl_craft"
PIPELINE, TASK = "POOLED", "WORK"
#: How long each worker process keeps claiming runs of the one pipeline.
CONTENTION_SECONDS = 15.0
#: Pipeline-lock timeout of the workers' steps (a step holds the lock for milliseconds).
LOCK_TIMEOUT = 3.0
#: Seconds a worker keeps retrying the finish of a run it created once its loop is over.
FINISH_GRACE = 20.0
#: Outcomes a worker may count: a busy pipeline blocks claims or makes the lock wait time out.
ALLOWED = {"CREATED", "BLOCKED", "CLAIM_LOCK_TIMEOUT", "FINISH_LOCK_TIMEOUT"}
#: The lone claim after the workload: the lock must be free, so it is granted well within this.
LONE_CLAIM_TIMEOUT = 5.0


def cli(setup: EngineSetup, *args: str) -> tuple[int, str, str]:
    """Run the ``etl-craft-airflow`` CLI in-process on the setup's craft-connector.yml."""
    out, err = io.StringIO(), io.StringIO()
    status = main([*args, "--config", str(setup.config_path)], out, err)
    return status, out.getvalue(), err.getvalue()


def database(setup: EngineSetup) -> PgDatabase:
    assert isinstance(setup.database, PgDatabase)
    return setup.database


# -- the tier itself ----------------------------------------------------------------------------------------


def test_the_pooler_refuses_startup_options_like_a_production_pgbouncer(
    pooler: PgBouncer, pg_database: PgDatabase
) -> None:
    """The tier is only worth something if PgBouncer is configured like production: a plain client gets
    through to the test database, and a client sending ``options`` is refused (no ignore_startup_parameters)."""
    with closing(pooler.connect(pg_database)) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_database(), current_user")
        assert cur.fetchone() == (pg_database.name, pg_database.user)
    with pytest.raises(psycopg2.OperationalError, match="unsupported startup parameter: options"):
        pooler.connect(pg_database, options="-c search_path=etl_craft")


def test_a_jdbc_url_with_startup_options_is_reported_as_the_pooler_refusing_them(
    pooled_engine: EngineSetup,
) -> None:
    """Regression: a refused ``options`` startup parameter used to read "refused the login … check user,
    auth_mode and its secret"; it now names the parameter and the pooler setting (exit 3, CONFIGURATION)."""
    text = pooled_engine.config_path.read_text()
    url = next(line for line in text.splitlines() if "jdbc_url:" in line)
    pooled_engine.config_path.write_text(text.replace(url, url + "&options=-c%20statement_timeout%3D0"))
    status, out, err = cli(pooled_engine, "check")
    assert status == 1 and "[FAIL] Engine DB connection: " in out, (out, err)
    assert "jdbc_url sends the startup parameter options" in out + err
    assert "ignore_startup_parameters" in out + err and "Traceback" not in out + err


# -- (a) init-db and migrate --------------------------------------------------------------------------------

MIGRATION = (
    "CREATE TABLE T_POOLED (N INTEGER NOT NULL);\n"
    "INSERT INTO T_POOLED (N) VALUES (1);\n"
    "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE) VALUES ('POOLED', 'Pooled', 'FULL');\n"
)


def test_init_db_and_migrate_through_the_pooler_create_the_tables_in_the_profile_schema(
    pooled_engine: EngineSetup, pooler: PgBouncer
) -> None:
    """init-db, then migrate with a project migration, through PgBouncer (server connections left with
    ``search_path = public`` beforehand): every Engine table and the project's table are in ``etl_craft``,
    nothing is in ``public``, and a second init-db finds the schema complete."""
    db = database(pooled_engine)
    pollute_search_path(pooler, db)
    status, out, err = cli(pooled_engine, "init-db")
    assert status == 0, out + err
    folder = pooled_engine.config_path.parent / "project-migrations"
    folder.mkdir()
    (folder / "0001_pooled.sql").write_text(MIGRATION, encoding="utf-8")
    pollute_search_path(pooler, db)
    status, out, err = cli(pooled_engine, "migrate", "--migrations-dir", str(folder))
    assert status == 0, out + err

    assert objects_in_public(db) == [], "the provider created objects in public through the pooler"
    assert tables_in(db, SCHEMA) >= ENGINE_TABLES | {"T_POOLED"}
    ledger = admin_rows(
        db, f"SELECT SOURCE, VERSION FROM {SCHEMA}.SCHEMA_MIGRATIONS ORDER BY SOURCE, VERSION"
    )
    assert ("PROJECT", "0001_pooled.sql") in ledger and ledger[0][0] == "ENGINE", ledger
    assert admin_rows(db, f"SELECT PIPELINE_CODE FROM {SCHEMA}.CFG_PIPELINES") == [("POOLED",)]
    assert admin_rows(db, f"SELECT N FROM {SCHEMA}.T_POOLED") == [(1,)]

    pollute_search_path(pooler, db)
    status, out, err = cli(pooled_engine, "init-db")
    assert status == 0 and "already at" in out, out + err
    assert objects_in_public(db) == []


# -- (b) one pipeline, eight processes ----------------------------------------------------------------------


def test_eight_processes_claiming_one_pipeline_through_the_pooler_never_overlap(
    pooled_engine: EngineSetup, pooler: PgBouncer, pooler_pool: Pool
) -> None:
    """Eight OS processes claim, run and finish runs of one pipeline for 15 s, each step on a fresh connection
    through PgBouncer (three server connections). No process fails; the runs follow one another without
    overlapping in time (the pipeline lock serialised them, not only the one-IN-PROGRESS index); no advisory
    lock is left on any server connection; and a lone claim afterwards gets the lock at once."""
    db = database(pooled_engine)
    seed(pooled_engine, {PIPELINE: [TASK]})
    job = pooler_pool.send(
        workers.contend,
        pooled_engine,
        range(WORKERS),
        pipeline=PIPELINE,
        task=TASK,
        seconds=CONTENTION_SECONDS,
        lock_timeout=LOCK_TIMEOUT,
        finish_grace=FINISH_GRACE,
    )
    most_servers = 0
    while not job.finished:
        most_servers = max(most_servers, pooler.server_connections(db))
        job.pump(0.1)
    job.wait(timeout=CONTENTION_SECONDS + FINISH_GRACE + 60)

    tallies = [payload for _, payload in job.of_kind("TALLY")]
    assert len(tallies) == WORKERS
    totals: dict[str, int] = {}
    for tally in tallies:
        for outcome, count in tally.items():
            totals[outcome] = totals.get(outcome, 0) + count
    assert set(totals) <= ALLOWED, totals
    assert totals.get("BLOCKED", 0) > 0, f"no claim was ever blocked: no contention happened ({totals})"
    assert most_servers <= pooler.pool_size, (most_servers, pooler.pool_size)

    reported = sorted(payload for _, payload in job.of_kind("RUN"))
    assert len(reported) >= WORKERS and len(reported) == totals["CREATED"], (len(reported), totals)
    assert {status for _, _, status in reported} == {"SUCCESS"}
    stored = admin_rows(
        db,
        f"SELECT r.RUN_KEY, r.PIPELINE_RUN_ID, r.STATUS, r.START_DATE, r.END_DATE FROM {SCHEMA}.AUD_PIPELINES_RUN_LOG r "
        f"JOIN {SCHEMA}.CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = %s "
        "ORDER BY r.START_DATE, r.PIPELINE_RUN_ID",
        PIPELINE,
    )
    assert sorted((key, run_id, status) for key, run_id, status, _, _ in stored) == reported
    overlaps = [
        (before[0], before[3], before[4], after[0], after[3])
        for before, after in zip(stored, stored[1:], strict=False)
        if before[4] is None or after[3] < before[4]
    ]
    assert overlaps == [], f"{len(overlaps)} runs started before the previous one ended: {overlaps[:5]}"

    assert advisory_locks(db) == [], "an advisory lock outlived the workload on a server connection"
    started = time.monotonic()
    identity = RunIdentity("pooler_dag", "lone")
    with pooled_engine.hook().lifecycle(lock_timeout=LONE_CLAIM_TIMEOUT) as lc:
        outcome = lc.claim(PIPELINE, identity)
    waited = time.monotonic() - started
    assert outcome.action == "CREATED", outcome
    assert waited < LONE_CLAIM_TIMEOUT, waited
    with pooled_engine.hook().lifecycle(lock_timeout=LONE_CLAIM_TIMEOUT) as lc:
        assert lc.finish_run(PIPELINE, identity, {}).status == "SKIPPED"
    assert advisory_locks(db) == []
    print(
        f"\n[{pooler.mode}] {WORKERS} processes, {len(reported)} runs in {CONTENTION_SECONDS:g}s; outcomes "
        f"{dict(sorted(totals.items()))}; at most {most_servers} server connections"
    )


# -- (c) the example pipeline end to end --------------------------------------------------------------------


@pytest.mark.e2e
def test_the_example_pipeline_runs_end_to_end_through_the_pooler(
    pooled_engine: EngineSetup,
    pooler: PgBouncer,
    airflow_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The example daily-sales DAG with ``run_dag_test`` and the Engine profile pointing at PgBouncer: the
    DAG run succeeds, the run and task rows land in ``etl_craft`` (read straight from the cluster), nothing in
    ``public``, and no advisory lock is left behind."""
    db = database(pooled_engine)
    shutil.copytree(EXAMPLES / "project" / "migrations", pooled_engine.config_path.parent / "migrations")
    pooled_engine.hook().migrate()
    conn = {"conn_type": "etl_craft", "extra": {"config_path": str(pooled_engine.config_path)}}
    monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_DEFAULT", json.dumps(conn))
    warehouse = tmp_path / "warehouse.db"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ETL_CRAFT_WAREHOUSE", json.dumps({"conn_type": "sqlite", "host": str(warehouse)})
    )
    dag = load_dag(airflow_db / "dags", EXAMPLES / "example_etl_craft_daily_sales.py")
    pollute_search_path(pooler, db)
    run = run_dag_test(dag)
    assert run.state == "success"
    assert admin_rows(db, f"SELECT STATUS FROM {SCHEMA}.AUD_PIPELINES_RUN_LOG") == [("SUCCESS",)]
    tasks = dict(
        admin_rows(
            db,
            f"SELECT t.TASK_CODE, tr.STATUS FROM {SCHEMA}.AUD_TASK_RUN_LOG tr "
            f"JOIN {SCHEMA}.CFG_TASKS t ON t.TASK_ID = tr.TASK_ID",
        )
    )
    assert tasks == {
        "EXTRACT_ORDERS": "SUCCESS",
        "LOAD_ORDERS": "SUCCESS",
        "BUILD_SALES_MART": "SUCCESS",
        "NOTIFY_FAILURE": "SKIPPED",
    }
    assert objects_in_public(db) == []
    assert advisory_locks(db) == []


# -- (d) no refused startup parameter; the schema in every transaction --------------------------------------


def test_a_connection_through_the_pooler_works_in_the_profile_schema_in_every_transaction(
    pooled_engine: EngineSetup, pooler: PgBouncer
) -> None:
    """The provider's connection gets through PgBouncer (it sends no ``options`` startup parameter, which
    PgBouncer refuses), and each transaction on it runs in the profile's schema, whichever server connection
    it lands on, even one left with ``search_path = public`` by another client."""
    db = database(pooled_engine)
    pollute_search_path(pooler, db)
    hook = pooled_engine.hook()
    with closing(hook.get_conn()) as conn:
        for _ in range(2 * pooler.pool_size):
            with hook.engine.transaction(conn) as cur:
                cur.execute("SELECT current_schema()")
                assert cur.fetchone() == (SCHEMA,)
