"""OpenLineage under the real deployment (docs/lineage.md): a pipeline DAG run by the scheduler and the
LocalExecutor, with every component's events going to the deployment's file transport.

Runs in the lineage tier only (``make test-lineage``): the deployment's processes come from the running
interpreter's venv, so the OpenLineage integration is there exactly when it is in this process. Every event
validates against the OpenLineage spec as pinned here, the tasks' events are the expected ones, and each
ended attempt's ``etl_craft_run`` facet matches its ``AUD_TASK_ATTEMPTS`` row.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.deployment import LINEAGE_TARGET_NAMESPACE, AirflowDeployment
from tests.deployment.dags import _HEADER, render
from tests.lineage_support import (
    expected_claim_and_finish,
    expected_task,
    lineage_required,
    normalise,
    validate_event,
)

pytestmark = [pytest.mark.deployment, pytest.mark.postgres, lineage_required]

# One task that fails once, then succeeds; one mapped over two indexes; an alert that its trigger rule skips.
LINEAGE_DAG = (
    _HEADER
    + """
def flaky(ti=None):
    if ti.try_number == 1:
        raise RuntimeError("FLAKY fails on its first try")
    return {"source_count": 5, "insert_count": 4, "update_count": 1}


with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 1, "retry_delay": timedelta(seconds=1)}) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", claim_kwargs={"poke_interval": 2}):

        @etl_craft_task(task_code="PREPARE")
        def prepare():
            return {"rows_written": 3}

        @etl_craft_task(task_code="SPREAD")
        def spread(n):
            return {"rows_written": n}

        @etl_craft_task(task_code="ALERT", trigger_rule="one_failed", retries=0)
        def alert():
            print("alert")

        first = prepare()
        f = etl_craft_task(task_code="FLAKY")(flaky)()
        fan = spread.expand(n=[2, 7])
        first >> f >> fan
        [first, f, fan] >> alert()
"""
)


def events_of(deployment: AirflowDeployment, dag_id: str) -> list[dict[str, Any]]:
    """The run's events, once the scheduler has written the DAG run's end (the last event of the run)."""

    def ended() -> list[dict[str, Any]] | None:
        if not deployment.lineage_events.exists():
            return None
        lines = deployment.lineage_events.read_text().splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        ours = [e for e in events if e["job"]["name"].split(".")[0] == dag_id]
        done = any(e["job"]["name"] == dag_id and e["eventType"] == "COMPLETE" for e in ours)
        return ours if done else None

    return deployment.wait_until(ended, 60, f"the OpenLineage events of {dag_id}'s run")


@pytest.mark.parametrize("dialect", ["pg"])
def test_a_deployed_pipeline_sends_valid_expected_events(deployment: AirflowDeployment, dialect: str) -> None:
    engine = deployment.engines[dialect]
    code, dag_id = "DEP_LINEAGE", "dep_lineage"
    group = code.lower()
    engine.add_pipeline(code, ["PREPARE", "FLAKY", "SPREAD", "ALERT"])
    engine.add_task_parameter(code, "FLAKY", "TARGET_OBJECT", "sales.orders_uk")
    deployment.write_dag(dag_id, render(LINEAGE_DAG, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id))
    deployment.wait_parsed(dag_id)

    run_id = deployment.trigger(dag_id)
    assert deployment.wait_run(dag_id, run_id, timeout=240) == "success"
    assert deployment.task_states(dag_id, run_id)[f"{group}.alert"] == "skipped"
    events = events_of(deployment, dag_id)

    for event in events:
        validate_event(event)
    attempt = {"status": "SUCCESS"}
    assert normalise(events, dag_id) == {
        **expected_claim_and_finish(group),
        f"{group}.prepare": expected_task("PREPARE", [("COMPLETE", {**attempt, "counts": {"rowsWritten": 3}})]),
        f"{group}.flaky": expected_task("FLAKY", [
            ("FAIL", {"status": "FAILED"}),
            ("COMPLETE", {**attempt, "counts": {"sourceCount": 5, "insertCount": 4, "updateCount": 1,
                                                "rowsWritten": 5}}),
        ]),
        **{f"{group}.spread[{i}]": expected_task("SPREAD", [("COMPLETE", {**attempt, "counts": {"rowsWritten": n}})], i)
           for i, n in enumerate((2, 7))},
    }  # fmt: skip
    # The DAG run's own events: its start and its end, sent by the scheduler.
    assert [e["eventType"] for e in events if e["job"]["name"] == dag_id] == ["START", "COMPLETE"]

    # Each ended attempt's facet carries its AUD_TASK_ATTEMPTS row, under the run's AUD_PIPELINES_RUN_LOG row.
    [run] = engine.runs(code)
    attempts = engine.rows(
        "SELECT t.TASK_CODE, a.ATTEMPT_NUMBER, a.MAP_INDEX, a.STATUS, tr.TASK_RUN_ID, a.ROWS_WRITTEN "
        "FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "
        "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID WHERE tr.PIPELINE_RUN_ID = ? "
        "ORDER BY t.TASK_CODE, a.MAP_INDEX, a.ATTEMPT_NUMBER",
        run["PIPELINE_RUN_ID"],
    )
    ends = [e["run"]["facets"] for e in events if e["eventType"] in ("COMPLETE", "FAIL")]
    facets = [f["etl_craft_run"] for f in ends if "etl_craft_run" in f]
    ended = sorted(
        (f["taskCode"], f["attemptNumber"], f.get("mapIndex"), f["status"], f["taskRunId"], f["counts"]["rowsWritten"] if "counts" in f and "rowsWritten" in f["counts"] else None)
        for f in facets
        if f["operation"] == "task"
    )  # fmt: skip
    assert ended == sorted(attempts)
    # FLAKY's declared target (read by each try's own process with its end): an output dataset in the
    # configured namespace, with the rows that attempt wrote (none for the failed one).
    written = {n: rows for c, n, _, _, _, rows in attempts if c == "FLAKY"}
    for event_type, number in (("FAIL", 1), ("COMPLETE", 2)):
        [event] = [
            e
            for e in events
            if e["job"]["name"] == f"{dag_id}.{group}.flaky" and e["eventType"] == event_type
        ]
        [output] = event["outputs"]
        assert (output["namespace"], output["name"]) == (LINEAGE_TARGET_NAMESPACE, "sales.orders_uk")
        assert output.get("outputFacets", {}).get("outputStatistics", {}).get("rowCount") == written[number]
    assert written == {1: None, 2: 5}
    assert {(f["pipelineRunId"], f["runKey"]) for f in facets} == {(run["PIPELINE_RUN_ID"], run["RUN_KEY"])}
    [finish] = [f for f in facets if f["operation"] == "finish"]
    assert finish["tasks"] == {"succeeded": 3, "failed": 0, "skipped": 1, "cancelled": 0, "attempts": 5}
