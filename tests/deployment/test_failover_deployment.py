"""A deferred claim in the real deployment while the Engine DB's primary fails over (docs/failover-tier.md).

The Engine DB is on the failover pair (``pg_pair``: a primary and its synchronous standby), reached by the
deployment through an inline Airflow connection whose jdbc_url names both nodes (PgJDBC's multi-host form,
``targetServerType=primary``); the deployment's own metadata DB stays on the session's cluster. Run A holds
the pipeline, run B's claim defers behind it (only a change notice can wake it: the DAG sets the recheck
and poll interval to 600 s). The primary is crashed and the standby promoted; the trigger must open its
LISTEN connection again on the new primary and read the fingerprint again. Then A is released and finishes
on the new primary: B's claim wakes, and both DAG runs end exact in the Engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.deployment import AirflowDeployment, Engine
from harness.engines import EngineSetup, write_config
from tests.deployment.test_deferred_waits import check_handed_over, hold_then_wait, watching
from tests.failover.conftest import SCHEMA, SECRET_VAR, USER, jdbc_url, profile_yaml
from tests.fixtures.fix_pg_standby import PgPair

pytestmark = [pytest.mark.deployment, pytest.mark.postgres, pytest.mark.failover]

CONN_ID = "etl_craft_failover_pair"


@pytest.fixture
def pair_engine(
    deployment: AirflowDeployment, pg_pair: PgPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Engine]]:
    """A fresh Engine DB on the pair (migrated through the multi-host URL) and the deployment's connection to it."""
    pg_pair.healthy()
    database = pg_pair.primary.cluster.create_database(owner=USER, schema=SCHEMA)
    pg_pair.caught_up()
    password = pg_pair.passwords[USER]
    monkeypatch.setenv(SECRET_VAR, password)
    config = write_config(tmp_path / "pair-engine", profile_yaml(pg_pair, database))
    setup = EngineSetup("postgresql", config, {SECRET_VAR: password})
    setup.hook().migrate()
    deployment.add_connection(
        CONN_ID, "etl_craft", {"jdbc_url": jdbc_url(pg_pair, database), "engine_schema": SCHEMA, "auth_mode": "password"},
        login=USER, password=password,
    )  # fmt: skip
    yield database, Engine(setup, CONN_ID)


def test_a_deferred_claim_follows_the_primary_through_a_failover(
    deployment: AirflowDeployment, pg_pair: PgPair, pair_engine: tuple[str, Engine], tmp_path: Path
) -> None:
    database, engine = pair_engine
    code, dag_id = "DEP_FAILOVER_CLAIM", "dep_failover_claim"
    run_a, run_b, release = hold_then_wait(deployment, tmp_path, dag_id, code, engine)
    old = pg_pair.primary
    deployment.wait_until(lambda: watching(old.cluster, database), 60, "the trigger to watch the Engine DB")

    pg_pair.fail_over()
    new = pg_pair.primary
    assert new is not old
    # Nothing polls before 600 s: the trigger must reconnect by itself, to the new primary, and LISTEN again.
    deployment.wait_until(lambda: watching(new.cluster, database), 60, "the trigger to watch the new primary")
    release.touch()  # A's HOLD ends and A finishes on the new primary; its notice wakes B
    check_handed_over(deployment, dag_id, code, run_a, run_b, engine)

    # The Engine rows are exact: one run per DAG run, HOLD recorded once in each, one attempt each.
    rows = engine.rows(
        "SELECT r.RUN_KEY, r.STATUS, t.TASK_CODE, tr.STATUS, tr.ATTEMPT_COUNT, a.ATTEMPT_NUMBER, a.STATUS "
        "FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID "
        "JOIN AUD_TASK_RUN_LOG tr ON tr.PIPELINE_RUN_ID = r.PIPELINE_RUN_ID JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
        "JOIN AUD_TASK_ATTEMPTS a ON a.TASK_RUN_ID = tr.TASK_RUN_ID WHERE p.PIPELINE_CODE = ? "
        "ORDER BY r.PIPELINE_RUN_ID, a.ATTEMPT_ID",
        code,
    )
    assert [tuple(r) for r in rows] == [
        (f"airflow:{dag_id}:{run_a}", "SUCCESS", "HOLD", "SUCCESS", 1, 1, "SUCCESS"),
        (f"airflow:{dag_id}:{run_b}", "SUCCESS", "HOLD", "SUCCESS", 1, 1, "SUCCESS"),
    ]
    assert engine.in_progress(code) == 0
