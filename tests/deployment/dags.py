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

from airflow_provider_etl_craft._compat import DAG

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

# A plain DAG scheduled on a pipeline's Asset: Airflow runs it after each SUCCESS run of the pipeline.
ASSET_SCHEDULED_DAG = """
from datetime import datetime

from airflow.sdk import task

from airflow_provider_etl_craft._compat import DAG
from airflow_provider_etl_craft.operators.pipeline_run import pipeline_asset

with DAG("__DAG_ID__", schedule=[pipeline_asset("__PIPELINE__", "__CONN_ID__")], start_date=datetime(2026, 1, 1),
         catchup=False) as dag:

    @task
    def downstream():
        return 1

    downstream()
"""

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

# The execution paths of docs/pipelines.md "Every Airflow execution path", under the real scheduler and triggerer.
_PATHS_HEADER = (
    _HEADER
    + """
from airflow_provider_etl_craft._compat import BaseOperator
from airflow.providers.standard.operators.python import PythonOperator
from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
from airflow.providers.standard.sensors.python import PythonSensor
from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

from airflow_provider_etl_craft.operators.task_run import recorded

CLAIM = {"poke_interval": 2}
"""
)

# DEFER_COUNT defers itself to a 2 s TimeDeltaTrigger and reports its counts from the resumed method;
# WAIT_ASYNC is the stock deferrable sensor, waiting for a moment 3 s after it first ran.
DEFER_DAG = (
    _PATHS_HEADER
    + """
class CountAfterWaiting(BaseOperator):
    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=2)), method_name="done_waiting")

    def done_waiting(self, context, event=None):
        return {"rows_written": 7}


with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 0}) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", claim_kwargs=CLAIM):
        recorded(CountAfterWaiting)(task_id="defer_count")
        recorded(DateTimeSensorAsync)(
            task_id="wait_async",
            target_time="{{ (macros.datetime.utcnow() + macros.timedelta(seconds=3)).isoformat() }}",
        )
"""
)

# PARKED defers for conf["wait"] seconds (default 2); two DAG runs of the pipeline may run at once.
DEFER_HELD_DAG = (
    _PATHS_HEADER
    + """
class DeferFor(BaseOperator):
    def execute(self, context):
        wait = (context["dag_run"].conf or {}).get("wait", 2)
        self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=wait)), method_name="done_waiting")

    def done_waiting(self, context, event=None):
        return {"rows_written": 1}


with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=2,
         default_args={"retries": 0}) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", claim_kwargs=CLAIM):
        recorded(DeferFor)(task_id="parked")
"""
)

# WAIT_TOO_LONG defers to a 120 s trigger with a 3 s deferral timeout: the scheduler fails it.
DEFER_TIMEOUT_DAG = (
    _PATHS_HEADER
    + """
class WaitTooLong(BaseOperator):
    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=120)), method_name="done_waiting",
                   timeout=timedelta(seconds=3))

    def done_waiting(self, context, event=None):
        return {"rows_written": 1}


with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", claim_kwargs=CLAIM):
        recorded(WaitTooLong)(task_id="wait_too_long", retries=0)
"""
)

# WAIT_FOR, a reschedule-mode sensor, says no on its first two pokes (counted in the file conf["pokes"]),
# then yes.
SENSOR_DAG = (
    _PATHS_HEADER
    + """
def poke(dag_run=None):
    counter = Path(dag_run.conf["pokes"])
    pokes = (int(counter.read_text()) if counter.exists() else 0) + 1
    counter.write_text(str(pokes))
    return pokes > 2


with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", claim_kwargs=CLAIM):
        recorded(PythonSensor)(task_id="wait_for", python_callable=poke, mode="reschedule",
                               poke_interval=__POKE_INTERVAL__, timeout=120, retries=0)
"""
)

# LOAD_FILE is mapped over the list an ordinary PythonOperator returns; its index 2 ("bad") always fails.
MAPPED_DAG = (
    _PATHS_HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 1, "retry_delay": timedelta(seconds=1)}) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", claim_kwargs=CLAIM):

        @etl_craft_task
        def load_file(name):
            if name == "bad":
                raise ValueError(f"cannot read {name}")
            return {"rows_written": len(name)}

        files = PythonOperator(task_id="list_files", python_callable=lambda: ["a", "bb", "bad"])
        load_file.expand(name=files.output)
"""
)

# SLOW writes its pid to __MARKER__, then sleeps (bounded) until Airflow stops it; the test marks it success.
MARKED_DAG = (
    _PATHS_HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", claim_kwargs=CLAIM):

        @etl_craft_task(retries=0)
        def slow():
            marker = Path("__MARKER__")
            tmp = marker.with_suffix(".tmp")
            tmp.write_text(str(os.getpid()))
            os.replace(tmp, marker)
            time.sleep(120)  # the test marks the task success long before
            raise RuntimeError("SLOW was never stopped")

        slow()
"""
)


# CeleryExecutor (tests/deployment/machines.py): every task of the DAG runs on a Celery worker, the claim and
# finish on __CLAIM_ON__; each recorded task on the machine its queue names, writing its hostname into its
# counts' log line. ON_A and ON_B hold until conf["release"] exists (when given), after writing conf["started"].
CELERY_SPREAD_DAG = (
    _HEADER
    + """
CELERY = {"executor": "CeleryExecutor", "queue": "__CLAIM_ON__"}

with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=2,
         default_args={**CELERY, "retries": 0}) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__",
                            claim_kwargs={"poke_interval": 2, "retries": 2, "retry_delay": timedelta(seconds=1)}):

        def hold(dag_run):
            conf = dag_run.conf or {}
            if conf.get("started"):
                Path(conf["started"]).write_text(dag_run.run_id)
            deadline = time.monotonic() + 180
            while conf.get("release") and not Path(conf["release"]).exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("never released")
                time.sleep(0.2)

        @etl_craft_task(task_code="ON_A", queue="machine-a")
        def on_a(dag_run=None):
            hold(dag_run)
            return {"rows_written": 1}

        @etl_craft_task(task_code="ON_B", queue="machine-b")
        def on_b(dag_run=None):
            hold(dag_run)
            return {"rows_written": 2}

        on_a() >> on_b()
"""
)

# VICTIM runs on machine-a first (queue "machine-a"); its first try writes its pid into __PID_FILE__ (after
# recording its attempt) and then sleeps until the machine is lost or cut off; a later try succeeds.
CELERY_VICTIM_DAG = (
    _HEADER
    + """
CELERY = {"executor": "CeleryExecutor", "queue": "machine-b"}

with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={**CELERY, "retries": 0}) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", claim_kwargs={"poke_interval": 2}):

        @etl_craft_task(task_code="VICTIM", queue="machine-a", retries=1, retry_delay=timedelta(seconds=1))
        def victim(ti=None):
            if ti.try_number == 1:
                pid_file = Path("__PID_FILE__")
                tmp = pid_file.with_suffix(".tmp")
                tmp.write_text(json.dumps({"task": os.getpid(), "supervisor": os.getppid()}))
                os.replace(tmp, pid_file)
                time.sleep(__SLEEP__)
                raise RuntimeError("VICTIM's first try outlived its machine")
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
