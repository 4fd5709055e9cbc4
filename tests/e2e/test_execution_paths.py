"""Every Airflow execution path a DAG author uses gives exact AUD_ rows (issue 11), under dag.test().

Skips, rescheduling sensors, deferrable operators (triggers run inline by dag.test()), mapped tasks, branch
and short-circuit operators, setup/teardown tasks inside a pipeline, an Engine DB without tables, and
``airflow tasks test``; on SQLite and PostgreSQL Engine DBs.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from airflow_provider_etl_craft.testing import run_dag_test
from harness.airflow_home import airflow_cli
from harness.engines import EngineSetup
from tests.e2e.pipeline_dags import load_dag, write_dag
from tests.e2e.test_pipeline_lifecycle import Pipeline, dag_id

pytestmark = pytest.mark.e2e


def _pipeline_sql(code: str, *tasks: str) -> str:
    rows = "\n".join(
        f"INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY) SELECT '{t}', 'ETL', "
        f"PIPELINE_ID, 'PYTHON', 't' FROM CFG_PIPELINES WHERE PIPELINE_CODE = '{code}';"
        for t in tasks
    )
    return (
        "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) "
        f"VALUES ('{code}', '{code}', 'FULL', 't');\n{rows}\n"
    )


MIGRATION = "".join(
    (
        _pipeline_sql("SKIP_P", "WORK", "AFTER"),
        _pipeline_sql("SENSE_P", "WAIT_FOR", "AFTER"),
        _pipeline_sql("DEFER_P", "WAIT_ASYNC", "DEFER_COUNT"),
        _pipeline_sql("MAP_P", "LOAD_FILE", "SUMMARY"),
        _pipeline_sql("BRANCH_P", "PICK", "LEFT", "RIGHT"),
        _pipeline_sql("SHORT_P", "GATE", "LATER"),
        _pipeline_sql("SETUP_P", "PREPARE", "WORK", "CLEANUP"),
        _pipeline_sql("SENSOR_END_P", "NEVER_READY", "OPTIONAL"),
        _pipeline_sql("MAP_GROUP_P", "FETCH", "STORE", "COPY"),
        _pipeline_sql("TEARDOWN_P", "PREPARE", "WORK", "CLEANUP"),
        _pipeline_sql("NESTED_P", "INNER", "STOP"),
    )
)

_HEADER = """
import json, os
from datetime import datetime, timedelta
from pathlib import Path

from airflow_provider_etl_craft._compat import DAG, AirflowSkipException, BaseOperator
from airflow.providers.standard.operators.python import BranchPythonOperator, PythonOperator, ShortCircuitOperator
from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
from airflow.providers.standard.sensors.python import PythonSensor
from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.operators.task_run import recorded
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline

FAST = {"retries": 0, "retry_delay": timedelta(seconds=1)}
CLAIM = {"poke_interval": 1, "timeout": 60}


def control():
    return json.loads(Path(os.environ["E2E_CONTROL"]).read_text())
"""

SKIP_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=FAST) as dag:
    with etl_craft_pipeline("SKIP_P", claim_kwargs=CLAIM):
        @etl_craft_task
        def work():
            raise AirflowSkipException("nothing to do today")

        @etl_craft_task
        def after():
            return 1

        work() >> after()
"""
)

SENSOR_DAG = (
    _HEADER
    + """
def poke():
    marker = Path(control()["marker"])
    if marker.exists():
        return True
    marker.touch()  # the first poke says no: Airflow reschedules the try
    return False


with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=FAST) as dag:
    with etl_craft_pipeline("SENSE_P", claim_kwargs=CLAIM):
        wait = recorded(PythonSensor)(task_id="wait_for", python_callable=poke, mode="reschedule", poke_interval=1,
                                      timeout=120)

        @etl_craft_task
        def after():
            return 1

        wait >> after()
"""
)

DEFER_DAG = (
    _HEADER
    + """
class CountAfterWaiting(BaseOperator):
    \"\"\"Defers to a trigger, then reports counts from the resumed method.\"\"\"

    def execute(self, context):
        Path(control()["deferred"]).touch()
        self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=1)), method_name="done_waiting")

    def done_waiting(self, context, event=None):
        return {"rows_written": 7, "insert_count": 7}


with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=FAST) as dag:
    with etl_craft_pipeline("DEFER_P", claim_kwargs=CLAIM):
        wait = recorded(DateTimeSensorAsync)(
            task_id="wait_async", target_time="{{ (macros.datetime.utcnow() + macros.timedelta(seconds=2)).isoformat() }}")
        wait >> recorded(CountAfterWaiting)(task_id="defer_count")
"""
)

MAPPED_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 1, "retry_delay": timedelta(seconds=1)}) as dag:
    with etl_craft_pipeline("MAP_P", claim_kwargs=CLAIM):
        @etl_craft_task
        def load_file(name):
            if name == "bad":
                raise ValueError(f"cannot read {name}")
            return {"rows_written": len(name)}

        @etl_craft_task(trigger_rule="all_done")
        def summary():
            return 1

        # The file list comes from an upstream task at run time (XCom), as in most mapped DAGs.
        files = PythonOperator(task_id="list_files", python_callable=lambda: control()["files"])
        load_file.expand(name=files.output) >> summary()
"""
)

BRANCH_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=FAST) as dag:
    with etl_craft_pipeline("BRANCH_P", claim_kwargs=CLAIM):
        pick = recorded(BranchPythonOperator)(task_id="pick", python_callable=lambda: "branch_p.left")

        @etl_craft_task
        def left():
            return 2

        @etl_craft_task
        def right():
            return 3

        pick >> [left(), right()]
"""
)

SHORT_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=FAST) as dag:
    with etl_craft_pipeline("SHORT_P", claim_kwargs=CLAIM):
        gate = recorded(ShortCircuitOperator)(task_id="gate", python_callable=lambda: False,
                                              ignore_downstream_trigger_rules=True)

        @etl_craft_task
        def later():
            return 1

        gate >> later()
"""
)

SETUP_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=FAST) as dag:
    with etl_craft_pipeline("SETUP_P", claim_kwargs=CLAIM):
        @etl_craft_task
        def prepare():
            return 1

        @etl_craft_task
        def work():
            return 2

        @etl_craft_task
        def cleanup():
            return 3

        setup = prepare().as_setup()
        setup >> work() >> cleanup().as_teardown(setups=setup)
"""
)


# A sensor that times out (TIMED_OUT, the task fails) beside one that soft-fails (skipped).
SENSOR_END_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=FAST) as dag:
    with etl_craft_pipeline("SENSOR_END_P", claim_kwargs=CLAIM):
        recorded(PythonSensor)(task_id="never_ready", python_callable=lambda: False, mode="reschedule",
                               poke_interval=1, timeout=2)
        recorded(PythonSensor)(task_id="optional", python_callable=lambda: False, mode="reschedule",
                               poke_interval=1, timeout=2, soft_fail=True)
"""
)

# A mapped task group (each task of the group runs once per map index) and a recorded operator mapped
# with .partial().expand_kwargs().
MAP_GROUP_DAG = (
    _HEADER
    + """
from airflow_provider_etl_craft._compat import task_group
from airflow.providers.standard.operators.python import PythonOperator

RecordedPython = recorded(PythonOperator)

with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=FAST) as dag:
    with etl_craft_pipeline("MAP_GROUP_P", claim_kwargs=CLAIM):
        @task_group
        def per_region(region):
            @etl_craft_task
            def fetch(region):
                return {"source_count": len(region)}

            @etl_craft_task
            def store(region):
                return {"rows_written": 10}

            fetch(region) >> store(region)

        copies = RecordedPython.partial(task_id="copy", counts=lambda n: {"rows_written": n}).expand_kwargs(
            [{"python_callable": (lambda: 1)}, {"python_callable": (lambda: 2)}])
        per_region.expand(region=["north", "south"]) >> copies
"""
)


# The user's own teardown fails: Airflow does not fail the DAG run for it, and neither does the Engine run.
TEARDOWN_FAIL_DAG = (
    _HEADER
    + """
with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, default_args=FAST) as dag:
    with etl_craft_pipeline("TEARDOWN_P", claim_kwargs=CLAIM):
        @etl_craft_task
        def prepare():
            return 1

        @etl_craft_task
        def work():
            return 2

        @etl_craft_task
        def cleanup():
            raise RuntimeError("cleanup could not drop the scratch table")

        setup = prepare().as_setup()
        setup >> work() >> cleanup().as_teardown(setups=setup)
"""
)

# A recorded task in a nested TaskGroup (its code has no group prefix), and AirflowFailException with
# retries left: one FAILED attempt, no retry.
NESTED_DAG = (
    _HEADER
    + """
from airflow_provider_etl_craft._compat import AirflowFailException, TaskGroup

with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 2, "retry_delay": timedelta(seconds=1)}) as dag:
    with etl_craft_pipeline("NESTED_P", claim_kwargs=CLAIM):
        with TaskGroup("outer"), TaskGroup("inner_group"):
            @etl_craft_task
            def inner():
                return 4

            first = inner()

        @etl_craft_task
        def stop():
            raise AirflowFailException("the source file is corrupt; retrying cannot help")

        first >> stop()
"""
)


@pytest.fixture
def paths(engine: EngineSetup, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    return Pipeline(engine, airflow_db, tmp_path, monkeypatch, migration=MIGRATION)


def _run(paths: Pipeline, request: pytest.FixtureRequest, template: str, name: str):  # noqa: ANN202 - a DagRun
    dag = load_dag(write_dag(paths.dags, template, dag_id(request, name)))
    run = run_dag_test(dag)
    [(run_id, status, *_)] = paths.runs()
    return dag, run, run_id, status


def _attempts(paths: Pipeline, run_id: int, code: str) -> list[tuple]:
    return paths.rows(
        "SELECT a.MAP_INDEX, a.ATTEMPT_NUMBER, a.STATUS, a.ROWS_WRITTEN, a.ERROR_MESSAGE, a.TASK_LOG "
        "FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "
        "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID WHERE tr.PIPELINE_RUN_ID = ? AND t.TASK_CODE = ? "
        "ORDER BY COALESCE(a.MAP_INDEX, -1), a.ATTEMPT_NUMBER",
        (run_id, code),
    )


def _task_run(paths: Pipeline, run_id: int, code: str) -> tuple:
    [row] = paths.rows(
        "SELECT tr.STATUS, tr.ATTEMPT_COUNT, tr.ROWS_WRITTEN, tr.ERROR_MESSAGE, tr.TASK_LOG FROM AUD_TASK_RUN_LOG tr "
        "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID WHERE tr.PIPELINE_RUN_ID = ? AND t.TASK_CODE = ?",
        (run_id, code),
    )
    return row


@pytest.mark.smoke
def test_a_task_that_skips_itself_is_skipped_not_failed(paths: Pipeline, request) -> None:
    dag, run, run_id, status = _run(paths, request, SKIP_DAG, "skip")
    assert run.state == "success"
    assert paths.ti(dag.dag_id, run.run_id, "skip_p.work")[0] == "skipped"
    assert _attempts(paths, run_id, "WORK") == [
        (None, 1, "CANCELLED", None, None, "skipped: nothing to do today")
    ]
    assert _task_run(paths, run_id, "WORK") == ("SKIPPED", 1, None, None, "skipped: nothing to do today")
    assert _task_run(paths, run_id, "AFTER")[0] == "SKIPPED" and _attempts(paths, run_id, "AFTER") == []
    assert status == "SKIPPED"  # every task skipped: the run is SKIPPED, never FAILED


@pytest.mark.smoke
def test_a_rescheduling_sensor_is_one_attempt_however_many_pokes(
    paths: Pipeline, request, tmp_path: Path
) -> None:
    paths.set(marker=str(tmp_path / "poked"))
    dag, run, run_id, status = _run(paths, request, SENSOR_DAG, "sensor")
    assert run.state == "success" and status == "SUCCESS"
    assert paths.rescheduled(dag.dag_id, "sense_p.wait_for") >= 1  # it really was rescheduled
    [(map_index, number, attempt_status, _, error, log)] = _attempts(paths, run_id, "WAIT_FOR")
    assert (map_index, number, attempt_status, error, log) == (None, 1, "SUCCESS", None, None)
    assert _task_run(paths, run_id, "WAIT_FOR")[:2] == ("SUCCESS", 1)  # ATTEMPT_COUNT counts tries, not pokes


@pytest.mark.smoke
def test_a_deferred_task_keeps_its_attempt_and_the_resumed_method_records_the_end(paths: Pipeline, request,
                                                                                  tmp_path: Path) -> None:  # fmt: skip
    paths.set(deferred=str(tmp_path / "deferred"))
    dag, run, run_id, status = _run(paths, request, DEFER_DAG, "defer")
    assert run.state == "success" and status == "SUCCESS"
    assert (tmp_path / "deferred").exists()
    assert _attempts(paths, run_id, "WAIT_ASYNC") == [(None, 1, "SUCCESS", None, None, None)]
    assert _attempts(paths, run_id, "DEFER_COUNT") == [(None, 1, "SUCCESS", 7, None, None)]
    assert _task_run(paths, run_id, "DEFER_COUNT") == ("SUCCESS", 1, 7, None, None)


@pytest.mark.smoke
def test_a_mapped_task_is_one_task_run_whose_failing_index_fails_the_run(paths: Pipeline, request) -> None:
    paths.set(files=["a", "bb", "bad"])
    dag, run, run_id, status = _run(paths, request, MAPPED_DAG, "mapped")
    assert run.state == "failed"
    assert status == "FAILED"  # never a SUCCESS run over failed work
    attempts = _attempts(paths, run_id, "LOAD_FILE")
    assert [a[:4] for a in attempts] == [
        (0, 1, "SUCCESS", 1), (1, 1, "SUCCESS", 2), (2, 1, "FAILED", None), (2, 2, "FAILED", None),
    ]  # fmt: skip
    assert attempts[-1][4] == "ValueError: cannot read bad"
    task_status, count, rows, error, log = _task_run(paths, run_id, "LOAD_FILE")
    assert (task_status, count, rows) == ("FAILED", 4, 3)
    assert error == "map index 2 FAILED: ValueError: cannot read bad"
    assert log == "3 map indexes: 2 SUCCESS, 0 SKIPPED, 1 FAILED"
    assert _task_run(paths, run_id, "SUMMARY")[0] == "SUCCESS"


@pytest.mark.parametrize(("files", "expected"), [
    (["a", "bb", "ccc"], ("SUCCESS", 3, 6, None, "3 map indexes: 3 SUCCESS, 0 SKIPPED, 0 FAILED")),
    ([], ("SKIPPED", 0, None, None, "not run by Airflow (Airflow state: skipped)")),
])  # fmt: skip
def test_a_mapped_task_sums_its_indexes_or_skips_when_empty(
    paths: Pipeline, request, files, expected
) -> None:
    paths.set(files=files)
    dag, run, run_id, status = _run(paths, request, MAPPED_DAG, f"mapped_{len(files)}")
    assert run.state == "success" and status == "SUCCESS"
    assert _task_run(paths, run_id, "LOAD_FILE") == expected
    assert [a[:3] for a in _attempts(paths, run_id, "LOAD_FILE")] == [
        (i, 1, "SUCCESS") for i in range(len(files))
    ]


def test_a_branch_operator_succeeds_and_the_branch_not_taken_is_skipped(paths: Pipeline, request) -> None:
    dag, run, run_id, status = _run(paths, request, BRANCH_DAG, "branch")
    assert run.state == "success" and status == "SUCCESS"
    assert [a[:3] for a in _attempts(paths, run_id, "PICK")] == [(None, 1, "SUCCESS")]
    assert _task_run(paths, run_id, "PICK")[0] == "SUCCESS"
    assert _task_run(paths, run_id, "LEFT")[0] == "SUCCESS"
    assert _task_run(paths, run_id, "RIGHT")[0] == "SKIPPED" and _attempts(paths, run_id, "RIGHT") == []


def test_a_short_circuit_never_strands_the_run(paths: Pipeline, request) -> None:
    dag, run, run_id, status = _run(paths, request, SHORT_DAG, "short")
    assert run.state == "success"
    assert paths.ti(dag.dag_id, run.run_id, "short_p.finish")[0] == "success"  # a teardown is never skipped
    assert status == "SUCCESS"
    assert _task_run(paths, run_id, "GATE")[0] == "SUCCESS"
    assert _task_run(paths, run_id, "LATER")[0] == "SKIPPED"


def test_setup_and_teardown_tasks_inside_a_pipeline(paths: Pipeline, request) -> None:
    dag, run, run_id, status = _run(paths, request, SETUP_DAG, "setup")
    assert run.state == "success" and status == "SUCCESS"
    assert {
        code: _task_run(paths, run_id, code)[0] for code in ("PREPARE", "WORK", "CLEANUP")
    } == dict.fromkeys(("PREPARE", "WORK", "CLEANUP"), "SUCCESS")


def test_an_engine_db_without_tables_fails_the_claim_naming_init_db(engine: EngineSetup, airflow_db: Path,
                                                                    monkeypatch, request, capfd) -> None:  # fmt: skip
    conn = f'{{"conn_type": "etl_craft", "extra": {{"config_path": "{engine.config_path}"}}}}'
    monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_DEFAULT", conn)
    monkeypatch.setenv("E2E_CONTROL", "/nonexistent")
    dag = load_dag(write_dag(airflow_db / "dags", SKIP_DAG, dag_id(request, "no_tables")))
    run = run_dag_test(dag)
    assert run.state == "failed"
    claim = next(ti for ti in run.get_task_instances() if ti.task_id == "skip_p.claim")
    assert (claim.state, claim.try_number) == ("failed", 1)  # permanent: no retries
    logged = capfd.readouterr()
    text = logged.out + logged.err
    if engine.dialect == "sqlite":  # only init-db creates the file
        assert "does not exist on this machine" in text and "run `etl-craft-airflow init-db`" in text
    else:
        assert "has no Engine tables; create them with `etl-craft-airflow init-db`" in text
    assert "no such table" not in text.lower() and "UndefinedTable" not in text


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_airflow_tasks_test_runs_a_recorded_task_unrecorded(paths: Pipeline, request) -> None:
    path = write_dag(paths.dags, BRANCH_DAG, dag_id(request, "tasks_test"))
    env = {**os.environ, **paths.engine.env, **paths.env}
    done = subprocess.run(
        [*airflow_cli(), "tasks", "test", path.stem, "branch_p.left"], env=env, capture_output=True, text=True,
        timeout=300, cwd=str(paths.dags),
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "runs unrecorded" in output and "nothing is written to the Engine DB" in output
    assert paths.rows("SELECT COUNT(*) FROM AUD_TASK_ATTEMPTS") == [(0,)]
    assert paths.rows("SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG") == [(0,)]


def test_a_sensor_timeout_is_timed_out_and_a_soft_fail_is_skipped(paths: Pipeline, request) -> None:
    dag, run, run_id, status = _run(paths, request, SENSOR_END_DAG, "sensor_end")
    assert run.state == "failed" and status == "FAILED"
    [never] = _attempts(paths, run_id, "NEVER_READY")
    assert never[:3] == (None, 1, "TIMED_OUT") and never[4].startswith("AirflowSensorTimeout")
    assert _task_run(paths, run_id, "NEVER_READY")[:2] == ("FAILED", 1)
    [optional] = _attempts(paths, run_id, "OPTIONAL")
    assert optional[:3] == (None, 1, "CANCELLED") and optional[5].startswith("skipped: ")
    assert _task_run(paths, run_id, "OPTIONAL")[:2] == ("SKIPPED", 1)


def test_a_mapped_task_group_and_expand_kwargs_record_one_task_run_per_task(paths: Pipeline, request) -> None:
    dag, run, run_id, status = _run(paths, request, MAP_GROUP_DAG, "map_group")
    assert run.state == "success" and status == "SUCCESS"
    for code in ("FETCH", "STORE", "COPY"):
        assert [a[:3] for a in _attempts(paths, run_id, code)] == [(0, 1, "SUCCESS"), (1, 1, "SUCCESS")]
    assert _task_run(paths, run_id, "STORE")[:3] == ("SUCCESS", 2, 20)
    assert _task_run(paths, run_id, "COPY")[:3] == ("SUCCESS", 2, 3)


def test_a_failing_teardown_of_yours_follows_airflows_rule_for_the_run(paths: Pipeline, request) -> None:
    dag, run, run_id, status = _run(paths, request, TEARDOWN_FAIL_DAG, "teardown_fail")
    assert run.state == "success"  # Airflow: a teardown's failure does not fail the DAG run
    assert status == "SUCCESS"
    assert _task_run(paths, run_id, "CLEANUP")[0] == "FAILED"
    assert _task_run(paths, run_id, "WORK")[0] == "SUCCESS"


def test_a_nested_task_group_task_and_airflow_fail_exception_without_retries(
    paths: Pipeline, request
) -> None:
    dag, run, run_id, status = _run(paths, request, NESTED_DAG, "nested")
    assert run.state == "failed" and status == "FAILED"
    assert _task_run(paths, run_id, "INNER")[:3] == ("SUCCESS", 1, 4)
    [stop] = _attempts(paths, run_id, "STOP")  # retries were left, but AirflowFailException takes none
    assert stop[1:3] == (1, "FAILED") and stop[4].startswith(
        "AirflowFailException: the source file is corrupt"
    )
