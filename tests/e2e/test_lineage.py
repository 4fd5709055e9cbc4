"""OpenLineage under dag.test(): a pipeline's events carry what the Engine DB recorded (docs/lineage.md).

Airflow's OpenLineage listener runs in the dag.test() process with a file transport (one JSON event per line),
as the OpenLineage provider's own system tests capture events. The DAG runs in a subprocess of its own: the
provider reads its ``[openlineage]`` settings once per process, and this one has loaded Airflow without them.
Each ``etl_craft_run`` facet is compared with the ``AUD_`` rows and validated against the facet's shipped
JSON schema; ``SQLExecuteQueryOperator`` on the Engine connection reports the Engine tables it read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harness.engines import EngineSetup
from tests.conftest import SMOKE_ON_SQLITE
from tests.e2e import pipeline_dags
from tests.e2e.test_pipeline_lifecycle import Pipeline
from tests.lineage_support import (
    OPENLINEAGE,
    expected_claim_and_finish,
    expected_task,
    facet_validator,
    lineage_required,
    normalise,
    validate_event,
)

pytestmark = [pytest.mark.e2e, lineage_required]

#: Whether the OpenLineage provider names the DAG run with one run id: in its own events and as every task's
#: parent. The 3.3 line's release does; the older images' releases draw a new id each time a task names its
#: parent (and 2.14.0 sent no event of the DAG run itself under dag.test()), so there only names are compared.
DAG_RUN_IDENTIFIED = OPENLINEAGE and Version(
    metadata.version("apache-airflow-providers-openlineage")
) >= Version("2.20")

MIGRATION = """
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY)
VALUES ('OL_PIPE', 'Lineage pipeline', 24, 'FULL', 'test');
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'PREPARE', 'INGESTION', PIPELINE_ID, 'PYTHON', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'OL_PIPE';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'FLAKY', 'ETL', PIPELINE_ID, 'PYTHON', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'OL_PIPE';
INSERT INTO CFG_TASK_PARAMETERS (TASK_ID, PARAMETER_NAME, PARAMETER_VALUE, CREATED_BY)
SELECT TASK_ID, 'TARGET_OBJECT', 'sales.orders_uk', 'test' FROM CFG_TASKS WHERE TASK_CODE = 'FLAKY';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'SPREAD', 'ETL', PIPELINE_ID, 'PYTHON', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'OL_PIPE';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'ALERT', 'ETL', PIPELINE_ID, 'EMAIL_ALERT', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'OL_PIPE';
"""

# Three data tasks (one fails once, then succeeds; one mapped over two indexes), an alert that skips, and
# SQL of the user's own on the Engine connection.
LINEAGE_DAG = """
from datetime import datetime, timedelta

from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator

from airflow_provider_etl_craft._compat import DAG, Asset
from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline


def flaky(**context):
    if context["ti"].try_number == 1:
        raise RuntimeError("flaky failed on its first try")
    return {"source_count": 5, "insert_count": 4, "update_count": 1}


with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 1, "retry_delay": timedelta(seconds=1)}) as dag:
    with etl_craft_pipeline("OL_PIPE", claim_kwargs={"poke_interval": 1, "timeout": 60}):
        prepare = EtlCraftPythonOperator(task_id="prepare", python_callable=lambda: {"rows_written": 3},
                                         outlets=[Asset("file:///warehouse/orders")])
        f = EtlCraftPythonOperator(task_id="flaky", python_callable=flaky)

        @etl_craft_task(task_code="SPREAD")
        def spread(n):
            return {"rows_written": n}

        @etl_craft_task(task_code="ALERT", trigger_rule="one_failed", retries=0)
        def alert():
            print("alert")

        fan = spread.expand(n=[2, 7])
        prepare >> f >> fan
        [prepare, f, fan] >> alert()
    prepare >> SQLExecuteQueryOperator(task_id="own_sql", conn_id="etl_craft_default",
                                       sql="SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG")
"""


#: ``[etl_craft] lineage_target_namespace`` of the DAG run: the warehouse FLAKY's TARGET_OBJECT names a table of.
WAREHOUSE = "postgres://warehouse:5432"


@pytest.fixture
def lineage(
    engine: EngineSetup, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Pipeline:
    return Pipeline(engine, airflow_db, tmp_path, monkeypatch, migration=MIGRATION)


def run_with_lineage(pipeline: Pipeline, dag_id: str, tmp_path: Path) -> list[dict[str, Any]]:
    """dag.test() the lineage DAG in a subprocess whose OpenLineage listener writes to a file; its events."""
    path = pipeline_dags.write_dag(pipeline.dags, LINEAGE_DAG, dag_id)
    events = tmp_path / "events.jsonl"
    env = {
        **pipeline.engine.subprocess_env(),
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "etl-craft-tests",
        "AIRFLOW__ETL_CRAFT__LINEAGE_TARGET_NAMESPACE": WAREHOUSE,
    }
    done = subprocess.run(
        [sys.executable, pipeline_dags.__file__, str(path), "2026-03-01T00:00:00+00:00"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0 and "STATE=success" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in events.read_text().splitlines() if line.strip()]


def facet(event: dict[str, Any]) -> dict[str, Any] | None:
    return event["run"]["facets"].get("etl_craft_run")


def task_of(event: dict[str, Any]) -> str:
    """The task id of a task's event ("<dag_id>.<task_id>"); "" for the DAG run's own events."""
    return event["job"]["name"].partition(".")[2]


def expected_events() -> dict[str, list[tuple[Any, ...]]]:
    """LINEAGE_DAG's task events, normalised (``tests.lineage_support.normalise``). The alert's trigger rule
    skips it without a try, so Airflow sends no event of it."""
    return {
        **expected_claim_and_finish("ol_pipe"),
        "ol_pipe.prepare": expected_task("PREPARE", [("COMPLETE", {"status": "SUCCESS", "counts": {"rowsWritten": 3}})]),
        "ol_pipe.flaky": expected_task("FLAKY", [
            ("FAIL", {"status": "FAILED"}),
            ("COMPLETE", {"status": "SUCCESS",
                          "counts": {"sourceCount": 5, "insertCount": 4, "updateCount": 1, "rowsWritten": 5}}),
        ]),
        **{f"ol_pipe.spread[{i}]": expected_task("SPREAD", [("COMPLETE", {"status": "SUCCESS", "counts": {"rowsWritten": n}})], i)
           for i, n in enumerate((2, 7))},
        "own_sql": [("START", 1, None), ("COMPLETE", 1, None)],
    }  # fmt: skip


def check_whole_events(events: list[dict[str, Any]], dag_id: str) -> None:
    """Every event validates against the OpenLineage spec as pinned here, and the tasks' events are the
    expected ones; the DAG run's end closes the file."""
    for event in events:
        validate_event(event)
    assert normalise(events, dag_id) == expected_events()
    if DAG_RUN_IDENTIFIED:
        assert [(e["eventType"], e["job"]["name"]) for e in events if e["job"]["name"] == dag_id][-1:] == [
            ("COMPLETE", dag_id)
        ]


# In the smoke set (SQLite) too: every older line's Airflow listener and OpenLineage provider, as its managed
# image ships them, emit the pipeline's events.
@SMOKE_ON_SQLITE
def test_events_carry_what_the_engine_recorded(lineage: Pipeline, request, tmp_path: Path) -> None:
    dag_id = f"ol_pipe_{request.node.callspec.id}"
    events = run_with_lineage(lineage, dag_id, tmp_path)
    check_whole_events(events, dag_id)
    validate = facet_validator()
    ours = [e for e in events if facet(e) is not None]
    assert ours, [e["eventType"] for e in events]
    for event in ours:
        validate(event["run"]["facets"])
        # Airflow's own parent facet stays: the DAG run is parent (and root) of every task's run.
        parent = event["run"]["facets"]["parent"]
        assert parent["job"]["name"] == dag_id
        assert parent.get("root", parent)["job"]["name"] == dag_id

    [(run_id, status, run_key, *_)] = lineage.runs()
    assert status == "SUCCESS"
    engine_db = {"dialect": lineage.engine.dialect, "schema": lineage.engine.hook().engine_profile.schema}

    [claim] = [facet(e) for e in ours if task_of(e) == "ol_pipe.claim" and e["eventType"] == "COMPLETE"]
    assert claim == {**claim, "operation": "claim", "pipelineCode": "OL_PIPE", "pipelineRunId": run_id,
                     "runKey": run_key, "status": "IN-PROGRESS", "engineDb": engine_db}  # fmt: skip

    # Every ended attempt: one event with its AUD_TASK_ATTEMPTS row's values.
    attempts = lineage.rows(
        "SELECT t.TASK_CODE, a.ATTEMPT_NUMBER, a.MAP_INDEX, a.STATUS, tr.TASK_RUN_ID, a.SOURCE_COUNT, "
        "a.TARGET_COUNT, a.INSERT_COUNT, a.UPDATE_COUNT, a.DELETE_COUNT, a.ROWS_WRITTEN FROM AUD_TASK_ATTEMPTS a "
        "JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
        "WHERE tr.PIPELINE_RUN_ID = ? ORDER BY t.TASK_CODE, a.MAP_INDEX, a.ATTEMPT_NUMBER",
        (run_id,),
    )
    expected = []
    keys = ("sourceCount", "targetCount", "insertCount", "updateCount", "deleteCount", "rowsWritten")
    for code, number, map_index, attempt_status, task_run_id, *values in attempts:
        counts = dict(zip(keys, values, strict=True))
        expected.append({"operation": "task", "pipelineCode": "OL_PIPE", "taskCode": code, "engineDb": engine_db,
                         "pipelineRunId": run_id, "runKey": run_key, "taskRunId": task_run_id,
                         "attemptNumber": number, "status": attempt_status, "engineRun": engine_run_of(lineage, run_id),
                         **({} if map_index is None else {"mapIndex": map_index}),
                         **({"counts": c} if (c := {k: v for k, v in counts.items() if v is not None}) else {})})  # fmt: skip
    ended = [
        facet(e) for e in ours if e["eventType"] in ("COMPLETE", "FAIL") and facet(e).get("attemptNumber")
    ]
    got = sorted(({k: v for k, v in f.items() if not k.startswith("_") and k != "taskRunStatus"} for f in ended),
                 key=lambda f: (f["taskCode"], f.get("mapIndex", -1), f["attemptNumber"]))  # fmt: skip
    assert got == expected
    assert [(c, n, s) for c, n, _, s, *_ in attempts if c == "FLAKY"] == [("FLAKY", 1, "FAILED"),
                                                                            ("FLAKY", 2, "SUCCESS")]  # fmt: skip
    assert sorted(m for c, _, m, *_ in attempts if c == "SPREAD") == [0, 1]

    # The declared target of PREPARE: an output dataset with the rows it wrote.
    [prepare] = [e for e in ours if task_of(e) == "ol_pipe.prepare" and e["eventType"] == "COMPLETE"]
    [output] = prepare["outputs"]
    assert output["namespace"].startswith("file") and output["name"].endswith("warehouse/orders")
    assert output["outputFacets"]["outputStatistics"]["rowCount"] == 3

    # The declared target of FLAKY (its TARGET_OBJECT): an output dataset in the configured namespace, with the
    # rows its successful attempt wrote; its failed try counted none.
    written = {(n, s): counts[-1] for c, n, _, s, _, *counts in attempts if c == "FLAKY"}  # ROWS_WRITTEN
    for event_type, (number, status) in (("COMPLETE", (2, "SUCCESS")), ("FAIL", (1, "FAILED"))):
        [flaky] = [e for e in ours if task_of(e) == "ol_pipe.flaky" and e["eventType"] == event_type]
        [output] = flaky["outputs"]
        assert (output["namespace"], output["name"]) == (WAREHOUSE, "sales.orders_uk")
        rows = written[number, status]
        statistics = output["outputFacets"].get("outputStatistics")
        assert (statistics or {}).get("rowCount") == rows
        assert rows == (5 if event_type == "COMPLETE" else None)

    # The alert skipped: its event names the task, and no attempt.
    skipped = [facet(e) for e in ours if task_of(e) == "ol_pipe.alert" and e["eventType"] != "START"]
    assert all("attemptNumber" not in f and f["taskCode"] == "ALERT" for f in skipped)

    [finish] = [facet(e) for e in ours if task_of(e) == "ol_pipe.finish" and e["eventType"] == "COMPLETE"]
    (sla,) = lineage.rows(
        "SELECT SLA_STATUS FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = ?", (run_id,)
    )[0]
    by_status = dict(lineage.rows("SELECT STATUS, COUNT(*) FROM AUD_TASK_RUN_LOG WHERE PIPELINE_RUN_ID = ? "
                                  "GROUP BY STATUS", (run_id,)))  # fmt: skip
    assert finish == {**finish, "operation": "finish", "pipelineRunId": run_id, "runKey": run_key,
                      "status": "SUCCESS", "slaStatus": sla, "engineDb": engine_db}  # fmt: skip
    assert finish["tasks"] == {
        "succeeded": by_status.get("SUCCESS", 0),
        "failed": by_status.get("FAILED", 0),
        "skipped": by_status.get("SKIPPED", 0),
        "cancelled": by_status.get("CANCELLED", 0),
        "attempts": len(attempts),
    }
    assert finish["tasks"]["succeeded"] == 3 and finish["tasks"]["skipped"] == 1

    # SQL of the user's own on the Engine connection: the Engine table it read, named as OpenLineage names
    # tables (the table as the SQL writes it, as for any common-sql hook).
    [sql] = [e for e in events if task_of(e) == "own_sql" and e["eventType"] == "COMPLETE"]
    target = lineage.engine.hook().engine_profile.target
    if lineage.engine.dialect == "sqlite":
        namespace, name = f"sqlite://{target.path}", "main.AUD_PIPELINES_RUN_LOG"
    else:
        namespace = f"postgres://{target.host}:{target.port}"
        name = f"{target.database}.{lineage.engine.hook().engine_profile.schema}.AUD_PIPELINES_RUN_LOG"
    # The 3.0 image's OpenLineage provider (2.6.1) drops the SQL's datasets when its information_schema read
    # fails, as it does on the Engine connection (later releases keep the tables, without column schemas).
    installed = Version(metadata.version("apache-airflow-providers-openlineage"))
    expected = [(namespace, name)] if installed >= Version("2.10") else []
    assert [(d["namespace"], d["name"]) for d in sql["inputs"]] == expected
    assert "etl_craft_run" not in sql["run"]["facets"]

    # The Engine run: a job of the Engine DB's own, started by the claim and ended by the finish; its
    # parent and root are the DAG run; the claim's and the finish's own events name it.
    dag_run = dag_run_of(events, dag_id)
    assert engine_events(events, lineage, run_id) == ["START", "COMPLETE"]
    [start, end] = [e for e in events if e["job"]["namespace"] == namespace]
    assert facet(start) == {**facet(start), "operation": "claim", "pipelineRunId": run_id}
    assert facet(end) == {**facet(end), "operation": "finish", "status": "SUCCESS", "tasks": finish["tasks"]}
    for event in (start, end):
        assert_parent_and_root(event, dag_id, dag_run)
    assert claim["engineRun"] == finish["engineRun"] == engine_run_of(lineage, run_id)

    # Every task's event (Airflow's listener's own work): the DAG run, by its run id, is parent and root.
    tasks = [
        e for e in events if e["job"]["name"].startswith(f"{dag_id}.") and ".query." not in e["job"]["name"]
    ]
    assert {task_of(e) for e in tasks} >= {"ol_pipe.claim", "ol_pipe.prepare", "ol_pipe.finish", "own_sql"}
    for event in tasks:
        assert_parent_and_root(event, dag_id, dag_run)


# -- the Engine run as a job of its own ------------------------------------------------------------------------


def engine_run_of(pipeline: Pipeline, pipeline_run_id: int) -> dict[str, str]:
    """The Engine run's job and run id, as docs/lineage.md derives them: the Engine DB's OpenLineage namespace,
    the pipeline qualified as an Engine table is, a UUID v5 of ``{namespace}/{name}#{PIPELINE_RUN_ID}``."""
    profile = pipeline.engine.hook().engine_profile
    target = profile.target
    if pipeline.engine.dialect == "sqlite":
        namespace, name = f"sqlite://{target.path}", f"{profile.schema}.OL_PIPE"
    else:
        namespace, name = (
            f"postgres://{target.host}:{target.port}",
            f"{target.database}.{profile.schema}.OL_PIPE",
        )
    run_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}#{pipeline_run_id}"))
    return {"namespace": namespace, "name": name, "runId": run_id}


def engine_events(events: list[dict[str, Any]], pipeline: Pipeline, pipeline_run_id: int) -> list[str]:
    """The event types of the Engine run's events, checked to name its job and run, and to carry its facet."""
    run = engine_run_of(pipeline, pipeline_run_id)
    found = [e for e in events if e["job"]["namespace"] == run["namespace"]]
    validate = facet_validator()
    for event in found:
        assert (event["job"]["name"], event["run"]["runId"]) == (run["name"], run["runId"])
        assert event["job"]["facets"]["jobType"] == {**event["job"]["facets"]["jobType"], "jobType": "PIPELINE",
                                                     "integration": "ETL_CRAFT", "processingType": "BATCH"}  # fmt: skip
        validate(event["run"]["facets"])
        assert facet(event)["pipelineRunId"] == pipeline_run_id and facet(event)["engineRun"] == run
    return [e["eventType"] for e in found]


def dag_run_of(events: list[dict[str, Any]], dag_id: str) -> str | None:
    """The DAG run's OpenLineage run id: its own event's (the listener's, as the DAG run ends); None where the
    provider names it with no one id (:data:`DAG_RUN_IDENTIFIED`)."""
    if not DAG_RUN_IDENTIFIED:
        return None
    ids = {e["run"]["runId"] for e in events if e["job"]["name"] == dag_id}
    assert len(ids) == 1, ids
    return ids.pop()


def assert_parent_and_root(event: dict[str, Any], dag_id: str, dag_run: str | None) -> None:
    """The DAG run (job ``dag_id`` in Airflow's namespace, run ``dag_run`` where it has one id) is the event's
    parent and root (a root where the provider gives one: the older images' releases give tasks none)."""
    parent = event["run"]["facets"]["parent"]
    dag = ("etl-craft-tests", dag_id)
    for named in (parent, parent.get("root") if dag_run is not None else parent.get("root", parent)):
        assert (named["job"]["namespace"], named["job"]["name"]) == dag, event["job"]
        assert dag_run is None or named["run"]["runId"] == dag_run, event["job"]


def test_a_failed_run_ends_its_engine_job_failed(lineage: Pipeline, request, tmp_path: Path) -> None:
    """FLAKY fails for good (no retry): the finish ends the run FAILED, and the Engine run's end is a FAIL."""
    dag_id = f"ol_fail_{request.node.callspec.id}"
    path = pipeline_dags.write_dag(lineage.dags, LINEAGE_DAG.replace('"retries": 1', '"retries": 0'), dag_id)
    events = tmp_path / "events.jsonl"
    env = {
        **lineage.engine.subprocess_env(),
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "etl-craft-tests",
    }
    done = subprocess.run([sys.executable, pipeline_dags.__file__, str(path), "2026-03-01T00:00:00+00:00"],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert "STATE=failed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    found = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]

    [(run_id, status, *_)] = lineage.runs()
    assert status == "FAILED"
    assert engine_events(found, lineage, run_id) == ["START", "FAIL"]
    dag_run = dag_run_of(found, dag_id)
    namespace = engine_run_of(lineage, run_id)["namespace"]
    [start, end] = [e for e in found if e["job"]["namespace"] == namespace]
    assert facet(end)["status"] == "FAILED" and facet(end)["tasks"]["failed"] >= 1
    for event in (start, end):
        assert_parent_and_root(event, dag_id, dag_run)
    # The finish task's own FAIL names the same Engine run.
    [finish] = [facet(e) for e in found if task_of(e) == "ol_pipe.finish" and e["eventType"] == "FAIL"]
    assert finish["engineRun"] == engine_run_of(lineage, run_id)
