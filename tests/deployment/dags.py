"""DAG-file templates for the deployment tests: ``render(TEMPLATE, dag_id=…, pipeline=…, …)``.

Each test renders its own file with its own DAG id, pipeline code and paths (``__NAME__`` placeholders),
so nothing is shared between tests. Task behaviour that a test must steer at run time is read from the
DAG run's ``conf`` or from files the test creates.
"""

from __future__ import annotations

import re

_HEADER = """
import json, os, time
from datetime import datetime, timedelta
from pathlib import Path

from airflow.providers.common.compat.sdk import DAG

from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline
"""

# One recorded task that fails on its first try and succeeds on its second.
RETRY_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", claim_kwargs={"poke_interval": 2}):

        @etl_craft_task(task_code="FLAKY", retries=1, retry_delay=timedelta(seconds=1))
        def flaky(ti=None):
            if ti.try_number == 1:
                raise RuntimeError("FLAKY fails on its first try")
            return {"rows_written": 7}

        flaky()
"""
)

# HOLD waits (bounded) for the file conf["release"] when the run's conf asks for it, after writing
# conf["started"]; so a test keeps one DAG run's Engine run IN-PROGRESS for as long as it needs.
# The claim gets retries: a reschedule-mode sensor that pokes every 2 s on a busy machine can be failed by
# the scheduler when the executor's success event for one poke arrives after the next poke was queued
# (apache/airflow#71172, open in Airflow 3.3); a retry of the claim carries on waiting.
HOLD_DAG = (
    _HEADER
    + """
CLAIM = {"poke_interval": 2, "retries": 2, "retry_delay": timedelta(seconds=1)}

with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=4) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", claim_kwargs=CLAIM):

        @etl_craft_task(task_code="HOLD", retries=0)
        def hold(dag_run=None):
            conf = dag_run.conf or {}
            if conf.get("started"):
                Path(conf["started"]).write_text(dag_run.run_id)
            deadline = time.monotonic() + 180
            while conf.get("release") and not Path(conf["release"]).exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("never released")
                time.sleep(0.2)
            return {"rows_written": 1}

        hold()
"""
)

# On its first try VICTIM records its pid and its parent's (the task supervisor, a LocalExecutor worker)
# in __PID_FILE__ and sleeps until it is killed; the second try succeeds.
KILLED_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", claim_kwargs={"poke_interval": 2}):

        @etl_craft_task(task_code="VICTIM", retries=1, retry_delay=timedelta(seconds=1))
        def victim(ti=None):
            if ti.try_number == 1:
                pid_file = Path("__PID_FILE__")
                tmp = pid_file.with_suffix(".tmp")
                tmp.write_text(json.dumps({"task": os.getpid(), "supervisor": os.getppid()}))
                os.replace(tmp, pid_file)
                time.sleep(600)  # the test kills this process long before
                raise RuntimeError("VICTIM outlived its kill")
            return {"rows_written": 3}

        victim()
"""
)


def render(template: str, **values: object) -> str:
    """Fill ``__NAME__`` placeholders (``dag_id`` → ``__DAG_ID__``); every placeholder must be filled."""
    text = template
    for key, value in values.items():
        text = text.replace(f"__{key.upper()}__", str(value))
    unfilled = re.findall(r"__[A-Z][A-Z_]*__", text)
    if unfilled:
        raise ValueError(f"unfilled placeholders in a DAG template: {unfilled}")
    return text
