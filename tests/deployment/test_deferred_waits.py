"""Deferred claims in the real deployment: woken by the finish of the run they wait for, across a triggerer
killed and started again, and across a restart of the Engine DB's PostgreSQL server.

Run A holds the pipeline (its HOLD task waits for a file); run B's claim defers. The DAG file sets the
claim's recheck and the trigger's poll interval to 600 s, so within the tests' timeouts only the change
notice that A's finish sends at COMMIT can wake B. B's claim must never be rescheduled.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from harness.deployment import AirflowDeployment, Engine
from harness.engines import EngineSetup, pg_profile_yaml, write_config
from harness.postgres import PgCluster, PgDatabase, find_bindir
from tests.deployment.dags import HOLD_DAG, render

pytestmark = [pytest.mark.deployment, pytest.mark.postgres]

DEFERRED_HOLD_DAG = HOLD_DAG.replace(
    'CLAIM = {"poke_interval": 2,',
    'os.environ["AIRFLOW__{}__WAIT_POLL_INTERVAL".format("ETL_CRAFT")] = "600"  # only a notice may wake it\n'
    'CLAIM = {"poke_interval": 600, "timeout": 900,',
).replace(
    'etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", claim_kwargs=CLAIM)',
    'etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", deferrable=True, claim_kwargs=CLAIM)',
)
assert DEFERRED_HOLD_DAG.count("600") == 2 and "deferrable=True" in DEFERRED_HOLD_DAG


def hold_then_wait(
    deployment: AirflowDeployment, tmp_path: Path, dag_id: str, code: str, engine: Engine | None = None
) -> tuple[str, str, Path]:
    """Run A holding the pipeline, run B's claim deferred behind it: (A's run id, B's run id, A's release file)."""
    engine = engine or deployment.pg
    engine.add_pipeline(code, ["HOLD"])
    deployment.write_dag(
        dag_id, render(DEFERRED_HOLD_DAG, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id)
    )
    deployment.wait_parsed(dag_id)
    started, release = tmp_path / "a-started", tmp_path / "a-release"
    run_a = deployment.trigger(dag_id, conf={"started": str(started), "release": str(release)})
    deployment.wait_until(started.exists, 120, "run A to hold the pipeline")
    run_b = deployment.trigger(dag_id)
    claim = f"{code.lower()}.claim"
    deployment.wait_until(
        lambda: deployment.task_states(dag_id, run_b).get(claim) == "deferred", 120, "run B's claim to defer"
    )
    return run_a, run_b, release


def check_handed_over(
    deployment: AirflowDeployment,
    dag_id: str,
    code: str,
    run_a: str,
    run_b: str,
    engine: Engine | None = None,
) -> None:
    engine = engine or deployment.pg
    assert deployment.wait_run(dag_id, run_a) == "success"
    assert deployment.wait_run(dag_id, run_b) == "success"
    assert deployment.reschedules(dag_id, run_b, f"{code.lower()}.claim") == 0
    runs = engine.runs(code)
    assert [(r["RUN_KEY"], r["STATUS"]) for r in runs] == [
        (f"airflow:{dag_id}:{run_a}", "SUCCESS"),
        (f"airflow:{dag_id}:{run_b}", "SUCCESS"),
    ]
    ((a_end, b_start),) = engine.rows(
        "SELECT a.END_DATE, b.START_DATE FROM AUD_PIPELINES_RUN_LOG a, AUD_PIPELINES_RUN_LOG b "
        "WHERE a.PIPELINE_RUN_ID = ? AND b.PIPELINE_RUN_ID = ?",
        runs[0]["PIPELINE_RUN_ID"],
        runs[1]["PIPELINE_RUN_ID"],
    )
    assert b_start >= a_end


def test_a_deferred_claim_is_woken_by_the_finish_it_waits_for(
    deployment: AirflowDeployment, tmp_path: Path
) -> None:
    code, dag_id = "DEP_DEFERRED_CLAIM", "dep_deferred_claim"
    run_a, run_b, release = hold_then_wait(deployment, tmp_path, dag_id, code)
    release.touch()
    check_handed_over(deployment, dag_id, code, run_a, run_b)


def test_a_deferred_claim_survives_a_killed_triggerer(deployment: AirflowDeployment, tmp_path: Path) -> None:
    code, dag_id = "DEP_DEFERRED_KILLED", "dep_deferred_killed"
    run_a, run_b, release = hold_then_wait(deployment, tmp_path, dag_id, code)
    deployment.kill_and_restart("triggerer")
    release.touch()
    check_handed_over(deployment, dag_id, code, run_a, run_b)


@pytest.fixture
def own_engine(
    deployment: AirflowDeployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[PgCluster, Engine]]:
    """An Engine DB on a PostgreSQL cluster of its own (the test restarts it), reached by the deployment through
    an inline connection stored in the metadata DB."""
    cluster = PgCluster.create(find_bindir(), "postgres" if os.geteuid() == 0 else None)
    try:
        db = PgDatabase(cluster, cluster.create_database())
        monkeypatch.setenv("ENGINE_SECRET", db.password)
        setup = EngineSetup("postgresql", write_config(tmp_path / "own-engine", pg_profile_yaml(db)),
                            {"ENGINE_SECRET": db.password}, db)  # fmt: skip
        setup.hook().migrate()
        conn_id = "etl_craft_restarted"
        deployment.add_connection(
            conn_id, "etl_craft", {"engine_schema": db.schema, "auth_mode": "password", "sslmode": "require"},
            host=cluster.host, port=cluster.port, schema=db.name, login=db.user, password=db.password,
        )  # fmt: skip
        yield cluster, Engine(setup, conn_id)
    finally:
        cluster.destroy()


def test_a_deferred_claim_survives_a_restart_of_the_engine_db(
    deployment: AirflowDeployment, own_engine: tuple[PgCluster, Engine], tmp_path: Path
) -> None:
    cluster, engine = own_engine
    code, dag_id = "DEP_DEFERRED_RESTART", "dep_deferred_restart"
    run_a, run_b, release = hold_then_wait(deployment, tmp_path, dag_id, code, engine)
    db: Any = engine.setup.database
    deployment.wait_until(lambda: watching(cluster, db.name), 60, "the trigger to watch the Engine DB")
    cluster.stop()  # a fast shutdown: the trigger's connection is cut
    cluster.start()
    # Nothing polls before 600 s: the trigger must open a connection again by itself (and LISTEN again).
    deployment.wait_until(lambda: watching(cluster, db.name), 60, "the trigger to watch the Engine DB again")
    release.touch()
    check_handed_over(deployment, dag_id, code, run_a, run_b, engine)


def watching(cluster: PgCluster, database: str) -> bool:
    """Whether a session of the Engine DB (the trigger's) has read a wait's fingerprint and sits idle."""
    try:
        with cluster.admin_connect(database) as admin, admin.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND state = 'idle' AND query LIKE %s",
                (database, "%SUM(r.PIPELINE_RUN_ID)%"),
            )
            return bool(cur.fetchone()[0])
    except psycopg2.OperationalError:
        return False
