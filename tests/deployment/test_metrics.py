"""The provider's metrics arrive at the session's StatsD listener from a real deployment (docs/metrics.md).

Every Airflow process of the deployment has ``[metrics]`` pointed at the listener the harness bound before it
started (``deployment.statsd``; tags InfluxDB-style). Run A of a two-task pipeline (LOAD gated on HOLD's
success) holds the pipeline; run B's claim defers behind it in the triggerer, then both finish. The metrics
come from the task processes (claims, gates, locks, attempts, runs) and the triggerer (its deferred waits).
"""

from __future__ import annotations

import time
from contextlib import closing
from pathlib import Path

import pytest

from harness.deployment import AirflowDeployment
from harness.statsd import Metric, named
from tests.deployment.dags import render
from tests.deployment.test_deferred_waits import DEFERRED_HOLD_DAG, check_handed_over

pytestmark = [pytest.mark.deployment, pytest.mark.postgres]

CODE, DAG_ID = "DEP_METRICS", "dep_metrics"

#: The deferred HOLD pipeline with a second task, LOAD, whose Engine gate waits for HOLD's success.
METRICS_DAG = DEFERRED_HOLD_DAG.replace(
    "        hold()\n",
    """        @etl_craft_task(task_code="LOAD", retries=0)
        def load():
            return {"rows_written": 1}

        hold() >> load()
""",
)
assert "hold() >> load()" in METRICS_DAG

DEPENDENCY = (
    "INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_TASK_ID, DEPENDENCY_TYPE, CREATED_BY) "
    "SELECT p.PIPELINE_ID, t.TASK_ID, u.TASK_ID, 'SUCCESS', 'deployment-test' FROM CFG_PIPELINES p "
    "JOIN CFG_TASKS t ON t.PIPELINE_ID = p.PIPELINE_ID AND t.TASK_CODE = 'LOAD' "
    "JOIN CFG_TASKS u ON u.PIPELINE_ID = p.PIPELINE_ID AND u.TASK_CODE = 'HOLD' "
    f"WHERE p.PIPELINE_CODE = '{CODE}'"
)


def test_a_deployment_sends_the_metrics_of_its_pipeline_runs(
    deployment: AirflowDeployment, tmp_path: Path
) -> None:
    statsd = deployment.statsd
    assert statsd is not None
    engine = deployment.pg
    engine.add_pipeline(CODE, ["HOLD", "LOAD"])
    hook = engine.setup.hook()
    with closing(hook.get_conn()) as conn, hook.engine.transaction(conn) as cur:
        cur.execute(DEPENDENCY)
    deployment.write_dag(DAG_ID, render(METRICS_DAG, dag_id=DAG_ID, pipeline=CODE, conn_id=engine.conn_id))
    deployment.wait_parsed(DAG_ID)
    since = statsd.mark()
    started, release = tmp_path / "a-started", tmp_path / "a-release"
    run_a = deployment.trigger(DAG_ID, conf={"started": str(started), "release": str(release)})
    deployment.wait_until(started.exists, 120, "run A to hold the pipeline")
    run_b = deployment.trigger(DAG_ID)
    claim = f"{CODE.lower()}.claim"
    deployment.wait_until(
        lambda: deployment.task_states(DAG_ID, run_b).get(claim) == "deferred", 120, "run B's claim to defer"
    )
    deferred_at = time.monotonic()

    def held(found: list[Metric]) -> list[Metric]:
        """The triggerer's gauges (both names) that count at least one wait."""
        return [m for m in found if m.name.startswith("etl_craft.triggerer.deferred_waits") and m.value >= 1]

    waits = held(
        statsd.wait_for(
            lambda found: len(held(found)) >= 2, 60, "the triggerer's deferred-waits gauge", since
        )
    )
    host = waits[0].tags["hostname"]
    assert {m.name for m in waits} == {
        "etl_craft.triggerer.deferred_waits",
        f"etl_craft.triggerer.deferred_waits.{host}",
    }
    time.sleep(max(0.0, 2.0 - (time.monotonic() - deferred_at)))  # B waits at least 2 s
    release.touch()
    check_handed_over(deployment, DAG_ID, CODE, run_a, run_b)

    pipe = {"pipeline": CODE}

    def both_ended(found: list[Metric]) -> bool:
        return len(named(found, "etl_craft.run.success", **pipe)) == 2

    got = statsd.wait_for(both_ended, 30, "both runs' ends", since)
    # The triggerer let B's wait go: its gauge came back to 0 after having been at least 1.
    gauge = [m.value for m in named(got, "etl_craft.triggerer.deferred_waits")]
    assert max(gauge) >= 1 and gauge[-1] == 0, gauge

    claims = [m.tags["outcome"] for m in got if m.name.startswith("etl_craft.claim.") and "outcome" in m.tags
              and m.tags["pipeline"] == CODE and m.name != "etl_craft.claim.wait"]  # fmt: skip
    assert claims.count("CREATED") == 2 and "BLOCKED" in claims, claims
    waited = sorted(m.value for m in named(got, "etl_craft.claim.wait", outcome="CREATED", **pipe))
    assert len(waited) == 2 and waited[1] >= 2000, waited  # B's claim waited behind A (ms)

    attempts = sorted(m.tags["task"] for m in named(got, "etl_craft.attempt.success", **pipe))
    assert attempts == ["HOLD", "HOLD", "LOAD", "LOAD"]
    gates = named(got, "etl_craft.gate.satisfied", task="LOAD", level="task", **pipe)
    assert len(gates) == 2
    assert {m.tags["step"] for m in named(got, "etl_craft.lock.wait", **pipe)} >= {"claim", "finish_run"}

    durations = named(got, "etl_craft.run.duration", status="SUCCESS", **pipe)
    assert len(durations) == 2 and all(d.kind == "ms" and d.value > 0 for d in durations), sorted(
        {m.name for m in got}
    )
    assert len(named(got, f"etl_craft.pipeline.{CODE}.run_duration")) == 2
    assert not [m for m in got if m.name.startswith("etl_craft.engine_error.")]
