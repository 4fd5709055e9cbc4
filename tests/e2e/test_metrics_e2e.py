"""A pipeline DAG run with dag.test() sends the provider's metrics to a real UDP StatsD listener (docs/metrics.md).

Airflow configures its StatsD logger from ``[metrics]`` in the process that runs the tasks, so the DAG runs in
a subprocess whose environment points at the test's listener (tags InfluxDB-style, so the test reads them).
In the smoke set, so every supported Airflow line proves its ``Stats`` is found and set up.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engines import EngineSetup
from harness.statsd import StatsdListener, named
from tests.conftest import SMOKE_ON_SQLITE
from tests.e2e import pipeline_dags
from tests.e2e.pipeline_dags import PIPELINE_DAG, UNKNOWN_TASK_DAG, write_dag
from tests.e2e.test_pipeline_lifecycle import Pipeline

pytestmark = pytest.mark.e2e

#: E2E_PIPE with an SLA of 0 hours (every run breaches it) and a gate: LOAD runs after PREPARE succeeded.
MIGRATION = (
    pipeline_dags.PIPELINE_MIGRATION.replace("'End-to-end pipeline', 24,", "'End-to-end pipeline', 0,")
    + """
INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_TASK_ID, DEPENDENCY_TYPE, CREATED_BY)
SELECT p.PIPELINE_ID, t.TASK_ID, u.TASK_ID, 'SUCCESS', 'test' FROM CFG_PIPELINES p
JOIN CFG_TASKS t ON t.PIPELINE_ID = p.PIPELINE_ID AND t.TASK_CODE = 'LOAD'
JOIN CFG_TASKS u ON u.PIPELINE_ID = p.PIPELINE_ID AND u.TASK_CODE = 'PREPARE'
WHERE p.PIPELINE_CODE = 'E2E_PIPE';
"""
)


@pytest.fixture
def statsd() -> Iterator[StatsdListener]:
    listener = StatsdListener()
    try:
        yield listener
    finally:
        listener.close()


@pytest.fixture
def pipeline(
    engine: EngineSetup, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Pipeline:
    return Pipeline(engine, airflow_db, tmp_path, monkeypatch, migration=MIGRATION)


def run_dag(pipeline: Pipeline, statsd: StatsdListener, template: str, dag_id: str) -> str:
    """dag.test() one run of ``template`` in a subprocess sending metrics to ``statsd``; its output."""
    path = write_dag(pipeline.dags, template, dag_id)
    env = {**os.environ, **pipeline.engine.env, **pipeline.env, **statsd.env()}
    done = subprocess.run(
        [sys.executable, pipeline_dags.__file__, str(path), "2026-05-01T00:00:00+00:00"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout + done.stderr


@SMOKE_ON_SQLITE
def test_a_pipeline_run_sends_claim_attempt_gate_lock_and_run_metrics(
    pipeline: Pipeline, statsd: StatsdListener, request: pytest.FixtureRequest
) -> None:
    pipeline.set(flaky="fail_once")
    out = run_dag(pipeline, statsd, PIPELINE_DAG, f"e2e_metrics_{request.node.callspec.id}")
    assert "STATE=success" in out, out[-3000:]
    pipe = {"pipeline": "E2E_PIPE"}
    got = statsd.wait_for(lambda found: bool(named(found, "etl_craft.run.success")), 10, "the run's end")

    assert len(named(got, "etl_craft.claim.created", outcome="CREATED", **pipe)) == 1
    [wait] = named(got, "etl_craft.claim.wait", outcome="CREATED", **pipe)
    assert wait.kind == "ms" and 0 <= wait.value < 60_000
    assert len(named(got, "etl_craft.pipeline.E2E_PIPE.claim_wait")) == 1

    attempts = sorted(
        (m.tags["task"], m.tags["status"]) for m in got if m.name.startswith("etl_craft.attempt.")
    )
    assert attempts == [
        ("FLAKY", "FAILED"),
        ("FLAKY", "SUCCESS"),
        ("LOAD", "SUCCESS"),
        ("PREPARE", "SUCCESS"),
    ]
    assert named(got, "etl_craft.attempt.failed", task="FLAKY", status="FAILED", **pipe)

    [gate] = [m for m in got if m.name.startswith("etl_craft.gate.")]
    assert (gate.name, gate.tags) == (
        "etl_craft.gate.satisfied",
        {"pipeline": "E2E_PIPE", "task": "LOAD", "level": "task", "result": "SATISFIED"},
    )

    steps = sorted(m.tags["step"] for m in named(got, "etl_craft.lock.wait", **pipe))
    assert steps == ["claim", "finish_run"]

    assert len(named(got, "etl_craft.run.success", status="SUCCESS", **pipe)) == 1
    assert len(named(got, "etl_craft.pipeline.E2E_PIPE.run.success")) == 1
    [duration] = named(got, "etl_craft.run.duration", status="SUCCESS", **pipe)
    [by_name] = named(got, "etl_craft.pipeline.E2E_PIPE.run_duration")
    assert duration.kind == "ms" and 0 < duration.value < 300_000 and by_name.value == duration.value
    assert len(named(got, "etl_craft.sla.breached", **pipe)) == 1
    assert not named(got, "etl_craft.engine_error.metadata")


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)  # the same operator code on both; one is enough
def test_an_engine_error_is_counted_by_its_class(
    pipeline: Pipeline, statsd: StatsdListener, request: pytest.FixtureRequest
) -> None:
    out = run_dag(pipeline, statsd, UNKNOWN_TASK_DAG, f"e2e_metrics_error_{request.node.callspec.id}")
    assert "STATE=failed" in out, out[-3000:]
    got = statsd.wait_for(
        lambda found: bool(named(found, "etl_craft.engine_error.metadata")), 10, "the claim's METADATA error"
    )
    [error] = named(got, "etl_craft.engine_error.metadata")
    assert error.tags == {"status": "METADATA", "retryable": "false"}
    assert not [m for m in got if m.name.startswith("etl_craft.claim.")]  # refused before any outcome
