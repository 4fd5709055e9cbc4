"""DAG files for the lifecycle end-to-end tests, written into the Airflow DAGs folder (dag.test() needs them there).

Task behaviour is read at run time from ``$E2E_CONTROL`` (a JSON file), never at parse time:
``{"flaky": "ok" | "fail_once" | "fail_always" | "timeout_once" | "sigterm_once", "hold": "<path>"}``: ``hold`` makes ``prepare`` wait until
that file exists (so a test can keep a DAG run open). ``prepare`` also writes what it saw in the Engine DB
to ``$E2E_PROBE_DIR/<run_id>.json``.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

from airflow_provider_etl_craft.testing import run_dag_test

PIPELINE_MIGRATION = """
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY)
VALUES ('E2E_PIPE', 'End-to-end pipeline', 24, 'FULL', 'test');
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'PREPARE', 'INGESTION', PIPELINE_ID, 'PYTHON', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'E2E_PIPE';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'FLAKY', 'ETL', PIPELINE_ID, 'PYTHON', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'E2E_PIPE';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'LOAD', 'ETL', PIPELINE_ID, 'SQL', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'E2E_PIPE';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'ALERT', 'ETL', PIPELINE_ID, 'EMAIL_ALERT', 'test' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'E2E_PIPE';
"""

_HEADER = """
import json, os, time
from datetime import datetime, timedelta
from pathlib import Path

from airflow_provider_etl_craft._compat import DAG
from airflow.providers.standard.operators.python import PythonOperator

from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.operators.pipeline_run import ClaimPipelineRunOperator
from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator, recorded
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline


def control():
    return json.loads(Path(os.environ["E2E_CONTROL"]).read_text())


def prepare(**context):
    hold = control().get("hold")
    hook = EngineDBHook()
    seen = hook.get_records(  # the hook's own SQL names the Engine schema
        f"SELECT RUN_KEY, STATUS FROM {hook.engine_profile.schema}.AUD_PIPELINES_RUN_LOG WHERE STATUS = 'IN-PROGRESS'")
    probe = Path(os.environ["E2E_PROBE_DIR"]) / (context["run_id"].replace(":", "_") + ".json")
    probe.write_text(json.dumps([list(r) for r in seen]))
    deadline = time.monotonic() + 120
    while hold and not Path(hold).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return {"rows_written": 3, "source_count": 3}


def flaky(**context):
    mode = control().get("flaky", "ok")
    first_try = context["ti"].try_number == 1
    if mode == "timeout_once" and first_try:
        time.sleep(30)  # execution_timeout (3 s) stops it
    if mode == "sigterm_once" and first_try:
        import signal
        os.kill(os.getpid(), signal.SIGTERM)  # what Airflow sends a task it kills; on_kill runs
        raise RuntimeError("terminated")
    if mode == "fail_always":
        raise RuntimeError("flaky failed for good")
    if mode == "fail_once" and context["ti"].try_number == 1:
        raise RuntimeError("flaky failed on its first try")
    return 5


DEFAULTS = {"retries": 1, "retry_delay": timedelta(seconds=1)}
"""

PIPELINE_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=DEFAULTS) as dag:
    with etl_craft_pipeline("E2E_PIPE", claim_kwargs={"poke_interval": 1, "timeout": __CLAIM_TIMEOUT__}):
        p = EtlCraftPythonOperator(task_id="prepare", python_callable=prepare)
        f = EtlCraftPythonOperator(task_id="flaky", python_callable=flaky, execution_timeout=timedelta(seconds=3))
        load = recorded(PythonOperator)(task_id="load", python_callable=lambda: None,
                                        counts=lambda _: {"insert_count": 2})

        @etl_craft_task(task_code="ALERT", trigger_rule="one_failed", retries=0)
        def alert():
            print("alert")

        p >> f >> load
        [p, f, load] >> alert()
"""
)

# Claim and one task, no finish: its Airflow DAG run ends while the Engine run stays IN-PROGRESS.
NO_FINISH_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    claim = ClaimPipelineRunOperator(task_id="claim", pipeline_code="E2E_PIPE", check_task_codes=False,
                                     poke_interval=1, timeout=30)
    claim >> EtlCraftPythonOperator(task_id="prepare", pipeline_code="E2E_PIPE", python_callable=prepare)
"""
)

# A task code that CFG_TASKS does not know.
UNKNOWN_TASK_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=DEFAULTS) as dag:
    with etl_craft_pipeline("E2E_PIPE", claim_kwargs={"poke_interval": 1, "timeout": 30}):
        p = EtlCraftPythonOperator(task_id="prepare", python_callable=prepare)
        f = EtlCraftPythonOperator(task_id="flaky", python_callable=flaky)
        load = EtlCraftPythonOperator(task_id="load", python_callable=lambda: 1)
        alert = EtlCraftPythonOperator(task_id="alert", python_callable=lambda: None)
        bogus = EtlCraftPythonOperator(task_id="bogus_step", python_callable=lambda: 1)
        p >> f >> load >> alert >> bogus
"""
)


def write_dag(dags_folder: Path, template: str, dag_id: str, **values: object) -> Path:
    path = dags_folder / f"{dag_id}.py"
    text = template.replace("__DAG_ID__", dag_id).replace(
        "__CLAIM_TIMEOUT__", str(values.get("claim_timeout", 60))
    )
    path.write_text(text)
    return path


def load_dag(path: Path):  # noqa: ANN201 - a DAG
    spec = importlib.util.spec_from_file_location(f"e2e_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module.dag


def clear_and_rerun(dag, run_id: str) -> str:  # noqa: ANN001 - a DAG
    """Clear every task of an ended DAG run, as the UI's *Clear* does, and run it again; return its state.

    The DAG run and its run id stay; Airflow raises each task's try number. The loop is dag.test()'s own
    minimal scheduler loop, minus the step that deletes and re-creates the DAG run.
    """
    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import clear_task_instances
    from airflow.sdk.definitions.dag import _run_task
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import select

    session = settings.Session()
    dr = session.scalar(select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id))
    clear_task_instances(
        list(dr.get_task_instances(session=session)), session, dag_run_state=DagRunState.RUNNING
    )
    session.commit()
    from tests.fixtures.fix_airflow import dag_serialization  # only the test process calls this

    serializer = dag_serialization()
    dr.dag = serializer.deserialize_dag(serializer.serialize_dag(dag))
    while dr.state == DagRunState.RUNNING:
        session.expire_all()
        schedulable, _ = dr.update_state(session=session)
        for ti in schedulable:
            if ti.state != TaskInstanceState.UP_FOR_RESCHEDULE:
                ti.try_number += 1
            ti.state = TaskInstanceState.SCHEDULED
        session.commit()
        scheduled = [
            ti for ti in dr.get_task_instances(session=session) if ti.state == TaskInstanceState.SCHEDULED
        ]
        if not scheduled:
            time.sleep(0.5)
        for ti in scheduled:
            _run_task(ti=ti, task=dag.task_dict[ti.task_id])
    state = str(dr.state)
    session.close()
    return state


def run_in_process(module: ModuleType | None = None) -> None:  # pragma: no cover - runs in a subprocess
    """``python pipeline_dags.py <dag file> <logical date ISO>``: dag.test() one run; print its state."""
    from datetime import datetime

    dag = load_dag(Path(sys.argv[1]))
    run = run_dag_test(dag, logical_date=datetime.fromisoformat(sys.argv[2]))
    print(f"STATE={run.state}", flush=True)


if __name__ == "__main__":
    run_in_process()
