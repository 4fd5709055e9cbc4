"""Deferred waits under dag.test(): a claim behind another run and a gate behind a pause, woken by the change.

Each DAG run is a ``dag.test()`` in a process of its own; the test ends the run (or the pause) the DAG
waits for through the run lifecycle, as another DAG or the CLI would. The claim's and gate's recheck
interval and the trigger's poll interval are 600 s, beyond the test's timeouts, so only the change notice
(PostgreSQL) or SQLite's data version can wake them in time. The task instances must show ``deferred``,
never ``up_for_reschedule``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_etl_craft.runs import RunIdentity
from tests.e2e import pipeline_dags
from tests.e2e.pipeline_dags import PIPELINE_DAG, write_dag
from tests.e2e.test_pipeline_lifecycle import Pipeline, dag_id, wait_for

pytestmark = pytest.mark.e2e

DEFERRED_DAG = PIPELINE_DAG.replace(
    'etl_craft_pipeline("E2E_PIPE", claim_kwargs={"poke_interval": 1,',
    'etl_craft_pipeline("E2E_PIPE", deferrable=True, claim_kwargs={"poke_interval": 600,',
)
assert DEFERRED_DAG != PIPELINE_DAG
QUIET = {"AIRFLOW__ETL_CRAFT__WAIT_POLL_INTERVAL": "600", "AIRFLOW__ETL_CRAFT__GATE_POKE_INTERVAL": "600"}


@pytest.fixture
def pipeline(engine, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pipeline:  # noqa: ANN001
    return Pipeline(engine, airflow_db, tmp_path, monkeypatch)


class DagTest:
    """One ``dag.test()`` in a process of its own, its output in a file (read while it runs)."""

    def __init__(self, pipeline: Pipeline, path: Path) -> None:
        self.out = path.with_suffix(".out")
        env = {**os.environ, **pipeline.engine.env, **pipeline.env, **QUIET}
        with self.out.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, pipeline_dags.__file__, str(path), "2026-05-01T00:00:00+00:00"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def deferred(self, task_id: str) -> bool:
        """Whether the task said it defers (dag.test() keeps that state uncommitted while the trigger runs)."""
        return any(
            "Pausing task as DEFERRED" in line and f"task_id={task_id}" in line
            for line in self.text().splitlines()
        )

    def wait(self, check, what: str) -> None:  # noqa: ANN001 - a predicate
        try:
            wait_for(check, what)
        except AssertionError:
            self.proc.kill()
            raise AssertionError(f"timed out waiting for {what}:\n{self.text()[-6000:]}") from None

    def end(self) -> str:
        self.proc.wait(timeout=180)
        return self.text()


def states(pipeline: Pipeline, dag: str, task_id: str) -> set[str]:
    """Every state the task instance is in now, and whether it was ever rescheduled."""
    import sqlite3

    with sqlite3.connect(pipeline.airflow_db, timeout=30) as db:
        found = {r[0] for r in db.execute(
            "SELECT state FROM task_instance WHERE dag_id = ? AND task_id = ?", (dag, task_id))}  # fmt: skip
    if pipeline.rescheduled(dag, task_id):
        found.add("rescheduled")
    return found


@pytest.mark.smoke
def test_a_deferred_claim_wakes_when_the_blocking_run_ends(pipeline: Pipeline, request) -> None:  # noqa: ANN001
    # A run etl-craft started itself: the claim waits for it (never closes it as abandoned).
    pipeline.rows(
        "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, START_DATE, STATUS, RUN_KEY, TRIGGER_KIND) "
        "SELECT PIPELINE_ID, '2026-01-01T00:00:00.000Z', 'IN-PROGRESS', 'etl-craft:manual:1', 'MANUAL' "
        "FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'E2E_PIPE'"
    )
    path = write_dag(pipeline.dags, DEFERRED_DAG, dag_id(request, "deferred_claim"), claim_timeout=900)
    run = DagTest(pipeline, path)
    try:
        run.wait(lambda: run.deferred("e2e_pipe.claim"), "the claim to defer")
        with pipeline.engine.hook().lifecycle(lock_timeout=10) as lc:
            assert lc.close_abandoned("E2E_PIPE", 1, RunIdentity("operator", "cli"), "ended by the test")
        out = run.end()
    finally:
        run.proc.kill()
    assert "STATE=success" in out, out[-3000:]
    assert "rescheduled" not in states(pipeline, path.stem, "e2e_pipe.claim")
    assert [r[1] for r in pipeline.runs()] == ["CANCELLED", "SUCCESS"]


def test_a_deferred_gate_wakes_when_the_pipeline_is_resumed(
    pipeline: Pipeline, request, tmp_path: Path
) -> None:  # noqa: ANN001
    release = tmp_path / "release"
    pipeline.set(flaky="ok", hold=str(release))
    path = write_dag(pipeline.dags, DEFERRED_DAG, dag_id(request, "deferred_gate"), claim_timeout=900)
    run = DagTest(pipeline, path)
    try:
        run.wait(
            lambda: pipeline.runs() and "PREPARE" in pipeline.task_runs(1), "prepare to start (and hold)"
        )
        with pipeline.engine.hook().lifecycle(lock_timeout=10) as lc:
            lc.pause("E2E_PIPE", "maintenance", "tester")
        release.touch()  # prepare ends; flaky's gate finds the pipeline paused
        run.wait(lambda: run.deferred("e2e_pipe.flaky"), "flaky's gate to defer")
        assert pipeline.task_runs(1).get("FLAKY") is None  # nothing recorded while the gate waits
        with pipeline.engine.hook().lifecycle(lock_timeout=10) as lc:
            lc.resume("E2E_PIPE", "done", "tester")
        out = run.end()
    finally:
        run.proc.kill()
    assert "STATE=success" in out, out[-3000:]
    assert "rescheduled" not in states(pipeline, path.stem, "e2e_pipe.flaky")
    assert [r[1] for r in pipeline.runs()] == ["SUCCESS"]
    assert pipeline.attempts(1, "FLAKY") == [(1, "SUCCESS")]
