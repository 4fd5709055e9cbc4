"""The PostgreSQL Engine DB restarts between two tasks of a running pipeline run (docs/lifecycle.md,
docs/errors.md).

Each task opens a short connection of its own, so the task after the restart reconnects; while the server is
down the connection fails with the retryable EngineUnreachableError, and Airflow's ordinary retry takes the
task over. The run must end SUCCESS with exactly one row per run, task run and recorded attempt.

The order is forced, not timed: the server is stopped (and waited for) before the task, and started again
(and waited for) only after the task's first try has failed, by that task's retry callback.

The server restarted here is a dedicated cluster (``PgCluster`` from harness/postgres.py) created for
this module, never the session's shared one.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from airflow_provider_etl_craft.errors import EngineUnreachableError
from airflow_provider_etl_craft.runs import RunIdentity, TaskCounts
from harness.engines import EngineSetup, pg_profile_yaml, write_config
from harness.postgres import PgCluster, PgDatabase, PostgresUnavailable, find_bindir
from tests.fixtures.fix_pg import REQUIRE_ENV
from tests.reliability.conftest import rows, seed

pytestmark = pytest.mark.postgres

PIPELINE = "RESTART"
RUN_DAG = Path(__file__).with_name("run_dag.py")
SERVER_OS_USER = "postgres"


def _server_user() -> str | None:
    """As the session fixture does: root runs the server binaries as the postgres OS user."""
    return SERVER_OS_USER if os.geteuid() == 0 else None


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[PgCluster]:
    """A PostgreSQL cluster of this module's own: its tests stop and start it."""
    try:
        bindir = find_bindir()
    except PostgresUnavailable as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{exc} (and {REQUIRE_ENV}=1)", pytrace=False)
        pytest.skip(str(exc))
    cluster = PgCluster.create(bindir, _server_user())
    try:
        yield cluster
    finally:
        cluster.destroy()


def wait_until_up(cluster: PgCluster, timeout: float = 90) -> None:
    """Wait for the server to accept connections (a background start may still be running); start it if not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            cluster.admin_connect().close()
            return
        except psycopg2.OperationalError:
            time.sleep(0.3)
    cluster.start()


@pytest.fixture
def restart_engine(
    own_cluster: PgCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[EngineSetup]:
    wait_until_up(own_cluster)
    db = PgDatabase(own_cluster, own_cluster.create_database())
    env = {"ENGINE_SECRET": db.password}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    engine = EngineSetup("postgresql", write_config(tmp_path / "engine", pg_profile_yaml(db)), env, db)
    seed(engine, {PIPELINE: ["TASK_A", "TASK_B"]})
    yield engine
    wait_until_up(own_cluster)
    own_cluster.drop_database(db.name)


def counts(engine: EngineSetup) -> tuple[int, int, int]:
    return rows(engine, "SELECT (SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG), (SELECT COUNT(*) FROM AUD_TASK_RUN_LOG), "
                        "(SELECT COUNT(*) FROM AUD_TASK_ATTEMPTS)")[0]  # fmt: skip


def test_the_task_after_a_restart_reconnects_through_the_lifecycle_api(own_cluster: PgCluster,
                                                                       restart_engine: EngineSetup) -> None:  # fmt: skip
    engine = restart_engine
    hook = engine.hook()
    identity = RunIdentity("restart_dag", "api")
    with hook.lifecycle(lock_timeout=10) as lc:
        assert lc.claim(PIPELINE, identity).action == "CREATED"
        lc.finish_task(lc.start_task(PIPELINE, "TASK_A", identity, 1), "SUCCESS", TaskCounts(rows_written=7))

    own_cluster.stop()
    try:
        # Task B's first try finds the server down: a typed, retryable error, and nothing is written.
        with pytest.raises(EngineUnreachableError) as info, hook.lifecycle(lock_timeout=10) as lc:
            lc.start_task(PIPELINE, "TASK_B", identity, 1)
        assert info.value.retryable, info.value
        assert "cannot reach the Engine DB" in str(info.value) and engine.env["ENGINE_SECRET"] not in str(
            info.value
        )
    finally:
        own_cluster.start()

    # Its retry (try 2) reconnects on a fresh connection and records normally.
    with hook.lifecycle(lock_timeout=10) as lc:
        handle = lc.start_task(PIPELINE, "TASK_B", identity, 2)
        lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=11))
        outcome = lc.finish_run(PIPELINE, identity, {"TASK_A": "success", "TASK_B": "success"})
    assert outcome.status == "SUCCESS"
    assert counts(engine) == (1, 2, 2)
    assert rows(engine, "SELECT t.TASK_CODE, tr.STATUS, tr.ATTEMPT_COUNT, tr.ROWS_WRITTEN FROM AUD_TASK_RUN_LOG tr "
                        "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID ORDER BY t.TASK_CODE") == [
        ("TASK_A", "SUCCESS", 1, 7), ("TASK_B", "SUCCESS", 1, 11)]  # fmt: skip
    assert rows(engine, "SELECT a.ATTEMPT_NUMBER, a.STATUS FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr "
                        "ON tr.TASK_RUN_ID = a.TASK_RUN_ID JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
                        "WHERE t.TASK_CODE = 'TASK_B'") == [(2, "SUCCESS")]  # fmt: skip


RESTART_DAG = """
import json, os, subprocess
from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline


def pg_ctl(*args):
    # pg_ctl on the module's own cluster (as the server OS user when root); returns when it is done.
    spec = json.loads(os.environ["RELIABILITY_PG"])
    command = [spec["pg_ctl"], "-D", spec["datadir"], *args]
    if spec["server_user"]:
        command = ["runuser", "-u", spec["server_user"], "--", *command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    subprocess.run(command, check=True, env=env, cwd=spec["workdir"], stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=180, start_new_session=True)


def start_engine_db(context):
    # task_b's on_retry_callback: its first try has just failed on the stopped server. Start the server
    # before the retry: dag.test() runs this callback, then the retry, one after the other in this process.
    spec = json.loads(os.environ["RELIABILITY_PG"])
    pg_ctl("-l", spec["logfile"], "-w", "-t", "120", "start")


with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 0}) as dag:
    with etl_craft_pipeline("RESTART", claim_kwargs={"poke_interval": 1, "timeout": 60}):

        @etl_craft_task
        def task_a():
            return {"rows_written": 7}

        @task
        def stop_engine_db():
            # Down until task_b's first try has failed on it (no clock involved): see start_engine_db.
            pg_ctl("-m", "fast", "-w", "stop")

        @etl_craft_task(retries=1, retry_delay=timedelta(seconds=1), on_retry_callback=start_engine_db)
        def task_b():
            return {"rows_written": 11}

        task_a() >> stop_engine_db() >> task_b()
"""


def test_a_dag_run_survives_an_engine_db_restart_between_two_tasks(own_cluster: PgCluster,
                                                                  restart_engine: EngineSetup,
                                                                  airflow_db: Path, tmp_path: Path) -> None:  # fmt: skip
    engine = restart_engine
    dag_id = "reliability_engine_db_restart"
    dag_file = airflow_db / "dags" / f"{dag_id}.py"
    dag_file.write_text(RESTART_DAG.replace("__DAG_ID__", dag_id), encoding="utf-8")
    spec = {"pg_ctl": str(own_cluster.bindir / "pg_ctl"), "datadir": str(own_cluster.datadir),
            "logfile": str(own_cluster.logfile), "workdir": str(own_cluster.workdir),
            "server_user": own_cluster.server_user}  # fmt: skip
    assert own_cluster.server_user is None or shutil.which("runuser")
    connection = {"conn_type": "etl_craft", "extra": {"config_path": str(engine.config_path)}}
    env = {**engine.subprocess_env(), "AIRFLOW_CONN_ETL_CRAFT_DEFAULT": json.dumps(connection),
           "RELIABILITY_PG": json.dumps(spec)}  # fmt: skip
    try:
        result = subprocess.run([sys.executable, str(RUN_DAG), str(dag_file)], env=env, capture_output=True,
                                text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    finally:
        wait_until_up(own_cluster)
        dag_file.unlink()
    output = result.stdout + result.stderr
    assert "STATE=success" in result.stdout, output[-6000:]
    run_id = next(line.split("=", 1)[1] for line in result.stdout.splitlines() if line.startswith("RUN_ID="))

    # Task B's first try failed while the server was down (retryable: Airflow retried it), its retry succeeded.
    with sqlite3.connect(airflow_db / "airflow.db", timeout=30) as db:
        (state, tries) = db.execute(
            "SELECT state, try_number FROM task_instance WHERE dag_id = ? AND run_id = ? AND task_id = ?",
            (dag_id, run_id, "restart.task_b"),
        ).fetchone()
    assert (state, tries) == ("success", 2), (state, tries, output[-6000:])
    assert "cannot reach the Engine DB" in output
    assert "[CONFIGURATION]" in output and "AirflowFailException" not in output

    # One run, one task-run row per task, one attempt per recorded try: no duplicates.
    key = f"airflow:{dag_id}:{run_id}"
    assert rows(engine, "SELECT RUN_KEY, STATUS FROM AUD_PIPELINES_RUN_LOG") == [(key, "SUCCESS")]
    assert rows(engine, "SELECT t.TASK_CODE, tr.STATUS, tr.ATTEMPT_COUNT, tr.ROWS_WRITTEN FROM AUD_TASK_RUN_LOG tr "
                        "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID ORDER BY t.TASK_CODE") == [
        ("TASK_A", "SUCCESS", 1, 7), ("TASK_B", "SUCCESS", 1, 11)]  # fmt: skip
    attempts = rows(engine, "SELECT t.TASK_CODE, a.ATTEMPT_NUMBER, a.STATUS FROM AUD_TASK_ATTEMPTS a "
                            "JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID JOIN CFG_TASKS t "
                            "ON t.TASK_ID = tr.TASK_ID ORDER BY t.TASK_CODE")  # fmt: skip
    # The tries that found the server down never reached it: the one attempt of B carries Airflow's final try.
    assert attempts == [("TASK_A", 1, "SUCCESS"), ("TASK_B", tries, "SUCCESS")]
    print(f"\n[restart] server down from TASK_A until TASK_B's first try failed; its try {tries} succeeded")
