"""Pipeline DAGs run by a real Airflow 3 deployment (api-server, scheduler, dag-processor, triggerer,
LocalExecutor; see ``harness/deployment.py``): the exact AUD_ rows each scenario leaves in the Engine DB.

Every test uses its own DAG ids and pipeline codes on the session's one deployment.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import warnings
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest

from airflow_provider_etl_craft.example_dags import demo
from airflow_provider_etl_craft.plugins.links import EngineRunLink
from airflow_provider_etl_craft.plugins.routes import run_page
from harness.deployment import HEARTBEAT_TIMEOUT, AirflowDeployment, Engine
from tests.deployment.dags import ASSET_SCHEDULED_DAG, HOLD_DAG, KILLED_DAG, RETRY_DAG, render

pytestmark = [pytest.mark.deployment, pytest.mark.postgres]

EXAMPLES = Path(demo.__file__).parent


def only_run(engine: Engine, code: str) -> dict:
    runs = engine.runs(code)
    assert len(runs) == 1, runs
    return runs[0]


def test_every_example_dag_has_a_deployment_test() -> None:
    """Each example DAG is triggered (with no logical date) by a test of this module; a new one needs its own."""
    assert sorted(p.stem for p in EXAMPLES.glob("example_*.py")) == [
        "example_etl_craft_daily_sales",  # test_the_example_pipeline_triggered_without_and_with_a_logical_date
        "example_etl_craft_init",  # test_the_example_init_dag_prepares_a_fresh_engine_db
        "example_etl_craft_purge",  # test_the_example_purge_dag_keeps_recent_history_and_leaves_an_audit_row
    ]


def test_the_example_init_dag_prepares_a_fresh_engine_db(deployment: AirflowDeployment) -> None:
    """etl_craft_default starts without tables; the init DAG creates them and applies the project's migrations
    (beside craft-connector.yml); triggered again it changes nothing. Runs before the daily-sales test, which
    uses the same Engine DB (and migrates it itself, so it also passes on its own)."""
    engine = deployment.default
    ok, message = engine.setup.hook().test_connection()
    assert not ok and "holds no Engine tables yet; create them with `etl-craft-airflow init-db`" in message
    dag_id = "example_etl_craft_init"
    deployment.write_dag(dag_id, (EXAMPLES / f"{dag_id}.py").read_text())
    deployment.wait_parsed(dag_id)

    results = []
    for _ in range(2):
        run_id = deployment.trigger(dag_id)
        dag_run = deployment.dag_run(dag_id, run_id)
        assert dag_run["logical_date"] is None and dag_run["run_type"] == "manual"
        assert deployment.wait_run(dag_id, run_id) == "success"
        assert deployment.task_states(dag_id, run_id) == {"init_engine_db": "success"}
        ((value,),) = deployment.meta(
            "SELECT value FROM xcom WHERE dag_id = %s AND run_id = %s AND task_id = 'init_engine_db' "
            "AND key = 'return_value'",
            dag_id,
            run_id,
        )
        results.append(value if isinstance(value, dict) else json.loads(value))

    first, second = results
    assert first["created"] is True and first["applied"] == [
        "PROJECT 0001_example_pipeline.sql",
        "PROJECT 0002_notify_failure_dependencies.sql",
    ], first
    assert second == {"created": False, "version": first["version"], "applied": []}
    ok, message = engine.setup.hook().test_connection()
    assert ok and message.endswith("the Engine tables exist"), message
    assert engine.rows(
        "SELECT t.TASK_CODE FROM CFG_TASKS t JOIN CFG_PIPELINES p ON p.PIPELINE_ID = t.PIPELINE_ID "
        "WHERE p.PIPELINE_CODE = 'DAILY_SALES' ORDER BY t.TASK_CODE"
    ) == [("BUILD_SALES_MART",), ("EXTRACT_ORDERS",), ("LOAD_ORDERS",), ("NOTIFY_FAILURE",)]


def test_the_example_pipeline_triggered_without_and_with_a_logical_date(
    deployment: AirflowDeployment,
) -> None:
    """The ordinary trigger of Airflow 3 gives the DAG run no logical date: the run's date is then run_after."""
    engine = deployment.default  # etl_craft_default, which the example DAGs use
    engine.setup.hook().migrate(EXAMPLES / "project" / "migrations")  # DAILY_SALES and its tasks (if not yet)
    dag_id = "example_etl_craft_daily_sales"
    deployment.write_dag(dag_id, (EXAMPLES / f"{dag_id}.py").read_text())
    deployment.wait_parsed(dag_id)

    plain = deployment.trigger(dag_id)
    dag_run = deployment.dag_run(dag_id, plain)
    assert dag_run["logical_date"] is None and dag_run["run_type"] == "manual"
    assert deployment.wait_run(dag_id, plain, timeout=180) == "success"
    check_example_run(deployment, dag_id, plain, dag_run["run_after"])

    dated = deployment.trigger(dag_id, logical_date=datetime(2026, 1, 15, 6, 0, tzinfo=UTC))
    assert deployment.wait_run(dag_id, dated, timeout=180) == "success"
    check_example_run(deployment, dag_id, dated, datetime(2026, 1, 15, 6, 0, tzinfo=UTC))

    assert [r["STATUS"] for r in engine.runs("DAILY_SALES")] == ["SUCCESS", "SUCCESS"]
    with sqlite3.connect(deployment.warehouse) as db:
        assert db.execute("SELECT COUNT(*) FROM raw_orders WHERE order_date IS NULL").fetchone() == (0,)
        dates = {d for (d,) in db.execute("SELECT DISTINCT order_date FROM raw_orders")}
    assert dates == {dag_run["run_after"].strftime("%Y-%m-%d"), "2026-01-15"}


def test_the_example_purge_dag_keeps_recent_history_and_leaves_an_audit_row(
    deployment: AirflowDeployment,
) -> None:
    """The maintenance example on etl_craft_default: nothing there is 90 days old, so nothing is deleted, and the
    purge leaves its DONE audit row, by the task, as a schedule."""
    engine = deployment.default
    engine.setup.hook().migrate(EXAMPLES / "project" / "migrations")
    runs_before = engine.rows("SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG")
    dag_id = "example_etl_craft_purge"
    deployment.write_dag(dag_id, (EXAMPLES / f"{dag_id}.py").read_text())
    deployment.wait_parsed(dag_id)
    run_id = deployment.trigger(dag_id)
    assert deployment.wait_run(dag_id, run_id) == "success"
    assert deployment.task_states(dag_id, run_id) == {"purge_engine_history": "success"}
    purges = engine.rows(  # the @daily schedule may add a run of its own once the DAG is unpaused
        "SELECT STATUS, REQUESTED_BY, REQUESTED_BY_KIND, RUNS_DELETED, ATTEMPTS_DELETED FROM AUD_ENGINE_PURGES "
        "WHERE REQUESTED_BY = ?",
        f"airflow:{dag_id}.purge_engine_history",
    )
    assert purges and set(purges) == {("DONE", f"airflow:{dag_id}.purge_engine_history", "SCHEDULE", 0, 0)}
    assert engine.rows("SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG") == runs_before


def check_example_run(deployment: AirflowDeployment, dag_id: str, run_id: str, run_date: datetime) -> None:
    """One successful DAG run of the example pipeline: its Airflow tasks, Engine rows and warehouse rows."""
    engine = deployment.default
    assert deployment.task_states(dag_id, run_id) == {
        "daily_sales.claim": "success",
        "daily_sales.extract_orders": "success",
        "daily_sales.load_orders": "success",
        "daily_sales.build_sales_mart": "success",
        "daily_sales.notify_failure": "skipped",
        "daily_sales.finish": "success",
    }
    (run,) = [r for r in engine.runs("DAILY_SALES") if r["RUN_KEY"] == f"airflow:{dag_id}:{run_id}"]
    stored_date = engine.setup.hook().engine.from_db_date(
        run["RUN_DATE"]
    )  # a DATE: the UTC date (ENGINE 0004)
    assert (run["STATUS"], stored_date, run["TRIGGER_KIND"]) == (
        "SUCCESS",
        run_date.astimezone(UTC).date(),
        "ORCHESTRATOR",
    )
    day = run_date.strftime("%Y-%m-%d")
    with sqlite3.connect(deployment.warehouse) as db:
        ((raw,),) = db.execute("SELECT COUNT(*) FROM raw_orders WHERE order_date = ?", (day,)).fetchall()
        ((orders,),) = db.execute("SELECT COUNT(*) FROM orders WHERE order_date = ?", (day,)).fetchall()
        ((mart,),) = db.execute("SELECT COUNT(*) FROM sales_mart WHERE sales_date = ?", (day,)).fetchall()
    assert raw > 0 and orders == raw and mart == 3  # every generated amount is positive; three regions
    assert engine.task_runs(run["PIPELINE_RUN_ID"]) == {
        "EXTRACT_ORDERS": ("SUCCESS", 1, raw),
        "LOAD_ORDERS": ("SUCCESS", 1, orders),
        "BUILD_SALES_MART": ("SUCCESS", 1, mart),
        "NOTIFY_FAILURE": ("SKIPPED", 0, None),
    }
    for code in ("EXTRACT_ORDERS", "LOAD_ORDERS", "BUILD_SALES_MART"):
        assert engine.attempts(run["PIPELINE_RUN_ID"], code) == [(1, "SUCCESS")]
    assert engine.attempts(run["PIPELINE_RUN_ID"], "NOTIFY_FAILURE") == []
    assert engine.rows(
        "SELECT t.TASK_CODE, g.RESULT FROM AUD_GATE_DECISIONS g JOIN AUD_TASK_ATTEMPTS a ON a.ATTEMPT_ID = g.ATTEMPT_ID "
        "JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
        "WHERE g.PIPELINE_RUN_ID = ? ORDER BY g.DECISION_ID",
        run["PIPELINE_RUN_ID"],
    ) == [("LOAD_ORDERS", "SATISFIED"), ("BUILD_SALES_MART", "SATISFIED")]
    # The "Engine run" extra link of the claim and the finish: the UI page of this DAG run. A recorded task
    # carries none by default ([etl_craft] recorded_task_link, docs/ui.md): no link XCom is written for it.
    page = run_page(dag_id, run_id, engine.conn_id, deployment.base_url)
    for task_id in ("daily_sales.claim", "daily_sales.finish"):
        assert deployment.extra_links(dag_id, run_id, task_id) == {"Engine run": page}, task_id
    assert deployment.extra_links(dag_id, run_id, "daily_sales.load_orders") == {}

    def keys(task_id: str) -> set[str]:
        rows = deployment.meta("SELECT key FROM xcom WHERE dag_id = %s AND run_id = %s AND task_id = %s",
                               dag_id, run_id, task_id)  # fmt: skip
        return {key for (key,) in rows}

    assert EngineRunLink().xcom_key in keys("daily_sales.claim")
    assert not any(key.startswith("_link_") for key in keys("daily_sales.load_orders"))


@pytest.mark.parametrize("dialect", ["pg", "sqlite"])
def test_a_task_that_fails_once_is_retried_by_airflow(deployment: AirflowDeployment, dialect: str) -> None:
    engine = deployment.engines[dialect]
    code, dag_id = f"DEP_RETRY_{dialect.upper()}", f"dep_retry_{dialect}"
    engine.add_pipeline(code, ["FLAKY"])
    deployment.write_dag(dag_id, render(RETRY_DAG, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id))
    deployment.wait_parsed(dag_id)

    run_id = deployment.trigger(dag_id)
    assert deployment.wait_run(dag_id, run_id) == "success"
    group = code.lower()
    assert deployment.task_states(dag_id, run_id) == {
        f"{group}.claim": "success",
        f"{group}.flaky": "success",
        f"{group}.finish": "success",
    }
    assert deployment.try_numbers(dag_id, run_id)[f"{group}.flaky"] == 2

    run = only_run(engine, code)
    assert run["STATUS"] == "SUCCESS" and run["RUN_KEY"] == f"airflow:{dag_id}:{run_id}"
    assert engine.attempts(run["PIPELINE_RUN_ID"], "FLAKY") == [(1, "FAILED"), (2, "SUCCESS")]
    assert engine.task_runs(run["PIPELINE_RUN_ID"]) == {"FLAKY": ("SUCCESS", 2, 7)}


def test_a_success_updates_the_pipeline_asset_and_runs_the_dag_scheduled_on_it(
    deployment: AirflowDeployment,
) -> None:
    """The finish makes its Asset only when its outlets are read (docs/performance.md): the dag-processor's
    serialization and the finish's own try still see it, so the scheduler runs the DAG scheduled on it."""
    engine = deployment.pg
    code, dag_id, downstream = "DEP_ASSET", "dep_asset", "dep_asset_downstream"
    engine.add_pipeline(code, ["FLAKY"])
    deployment.write_dag(downstream, render(ASSET_SCHEDULED_DAG, dag_id=downstream, pipeline=code,
                                            conn_id=engine.conn_id))  # fmt: skip
    deployment.write_dag(dag_id, render(RETRY_DAG, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id))
    deployment.wait_parsed(downstream)
    deployment.wait_parsed(dag_id)
    uri = f"etl-craft://{engine.conn_id}/{code}"
    assert deployment.meta(
        "SELECT a.uri FROM task_outlet_asset_reference r JOIN asset a ON a.id = r.asset_id WHERE r.dag_id = %s",
        dag_id,
    ) == [(uri,)]

    run_id = deployment.trigger(dag_id)
    assert deployment.wait_run(dag_id, run_id) == "success"
    assert deployment.meta(
        "SELECT e.source_task_id, e.source_run_id FROM asset_event e JOIN asset a ON a.id = e.asset_id "
        "WHERE a.uri = %s",
        uri,
    ) == [(f"{code.lower()}.finish", run_id)]

    [(downstream_run, run_type)] = deployment.wait_until(
        lambda: deployment.meta("SELECT run_id, run_type FROM dag_run WHERE dag_id = %s", downstream),
        90,
        "a run of the DAG scheduled on the pipeline's Asset",
    )
    assert run_type == "asset_triggered"
    assert deployment.wait_run(downstream, downstream_run) == "success"


def test_two_dag_runs_of_one_pipeline_at_once_the_second_claim_waits(deployment: AirflowDeployment,
                                                                     tmp_path: Path) -> None:  # fmt: skip
    engine = deployment.pg
    code, dag_id = "DEP_CONCURRENT", "dep_concurrent"
    engine.add_pipeline(code, ["HOLD"])
    deployment.write_dag(dag_id, render(HOLD_DAG, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id))
    deployment.wait_parsed(dag_id)
    claim = f"{code.lower()}.claim"
    started, release = tmp_path / "started", tmp_path / "release"
    in_progress: list[int] = []  # Engine runs IN-PROGRESS, sampled on every poll

    def sample() -> None:
        in_progress.append(engine.in_progress(code))

    first = deployment.trigger(dag_id, conf={"started": str(started), "release": str(release)})
    deployment.wait_until(started.exists, 120, "the first run's HOLD to start", sample)
    second = deployment.trigger(dag_id)
    # The second claim finds the first run IN-PROGRESS and gives its worker slot back: up_for_reschedule,
    # which Airflow records as a task_reschedule row. The first run is held until the test has seen that.
    deployment.wait_until(lambda: deployment.reschedules(dag_id, second, claim) >= 1, 120,
                          "the second run's claim to be rescheduled", sample)  # fmt: skip
    assert deployment.dag_run(dag_id, first)["state"] == "running"
    assert deployment.task_states(dag_id, first)[f"{code.lower()}.hold"] == "running"
    release.touch()
    assert deployment.wait_run(dag_id, first, probe=sample) == "success"
    assert deployment.wait_run(dag_id, second, probe=sample) == "success"

    tries = deployment.try_numbers(dag_id, second)[claim]
    if tries > 1:
        warnings.warn(f"the second claim needed {tries} tries (apache/airflow#71172)", stacklevel=1)
    assert deployment.reschedules(dag_id, first, claim) == 0
    assert len(in_progress) > 3 and max(in_progress) == 1, in_progress
    runs = engine.runs(code)
    assert [(r["RUN_KEY"], r["STATUS"]) for r in runs] == [
        (f"airflow:{dag_id}:{first}", "SUCCESS"),
        (f"airflow:{dag_id}:{second}", "SUCCESS"),
    ]
    ((first_end, second_start),) = engine.rows(
        "SELECT a.END_DATE, b.START_DATE FROM AUD_PIPELINES_RUN_LOG a, AUD_PIPELINES_RUN_LOG b "
        "WHERE a.PIPELINE_RUN_ID = ? AND b.PIPELINE_RUN_ID = ?",
        runs[0]["PIPELINE_RUN_ID"],
        runs[1]["PIPELINE_RUN_ID"],
    )
    assert second_start >= first_end  # the second Engine run began only once the first had ended
    for run in runs:
        assert engine.task_runs(run["PIPELINE_RUN_ID"]) == {"HOLD": ("SUCCESS", 1, 1)}


def test_a_cleared_dag_run_reopens_its_engine_run(deployment: AirflowDeployment) -> None:
    engine = deployment.pg
    code, dag_id = "DEP_CLEARED", "dep_cleared"
    engine.add_pipeline(code, ["HOLD"])
    deployment.write_dag(dag_id, render(HOLD_DAG, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id))
    deployment.wait_parsed(dag_id)
    run_id = deployment.trigger(dag_id)
    assert deployment.wait_run(dag_id, run_id) == "success"
    before = only_run(engine, code)
    assert before["STATUS"] == "SUCCESS"
    assert engine.interventions(before["PIPELINE_RUN_ID"]) == []

    deployment.clear(dag_id, run_id)
    assert deployment.wait_run(dag_id, run_id) == "success"
    group = code.lower()
    assert deployment.try_numbers(dag_id, run_id) == {
        f"{group}.claim": 2,
        f"{group}.hold": 2,
        f"{group}.finish": 2,
    }
    after = only_run(engine, code)
    assert after["PIPELINE_RUN_ID"] == before["PIPELINE_RUN_ID"] and after["RUN_KEY"] == before["RUN_KEY"]
    assert (after["STATUS"], after["REPAIR_PENDING"]) == ("SUCCESS", "N")
    assert after["OUTPUT_REVISION"] == before["OUTPUT_REVISION"] + 1
    assert engine.interventions(after["PIPELINE_RUN_ID"]) == [
        ("REOPEN", "SUCCESS", "IN-PROGRESS", "ORCHESTRATOR")
    ]
    assert engine.attempts(after["PIPELINE_RUN_ID"], "HOLD") == [(1, "SUCCESS"), (2, "SUCCESS")]
    assert engine.task_runs(after["PIPELINE_RUN_ID"]) == {"HOLD": ("SUCCESS", 2, 1)}


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_worker_killed_mid_task_is_detected_and_the_task_retried(deployment: AirflowDeployment,
                                                                    tmp_path: Path) -> None:  # fmt: skip
    engine = deployment.pg
    code, dag_id = "DEP_KILLED", "dep_killed"
    pid_file = tmp_path / "victim.json"
    engine.add_pipeline(code, ["VICTIM"])
    source = render(KILLED_DAG, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id, pid_file=pid_file)
    deployment.write_dag(dag_id, source)
    deployment.wait_parsed(dag_id)
    run_id = deployment.trigger(dag_id)
    victim = f"{code.lower()}.victim"
    deployment.wait_until(pid_file.exists, 120, "VICTIM's first try to start")
    pids = json.loads(pid_file.read_text())
    task, supervisor = psutil.Process(pids["task"]), psutil.Process(pids["supervisor"])
    deployment.extra_procs += [task, supervisor]
    assert task.ppid() == supervisor.pid
    assert "LocalExecutor" in " ".join(supervisor.cmdline())  # the worker that supervises the task
    assert deployment.task_states(dag_id, run_id)[victim] == "running"

    # The whole worker dies at once: nothing is left to tell Airflow or the Engine DB what happened.
    supervisor.send_signal(signal.SIGKILL)  # psutil: never a process that took over the pid since
    task.send_signal(signal.SIGKILL)
    deployment.wait_until(lambda: _gone(task) and _gone(supervisor), 30, "the killed processes to die")
    pipeline_run_id = only_run(engine, code)["PIPELINE_RUN_ID"]
    assert engine.attempts(pipeline_run_id, "VICTIM") == [(1, "RUNNING")]  # nobody recorded the death

    assert deployment.wait_run(dag_id, run_id, timeout=HEARTBEAT_TIMEOUT + 150) == "success"
    assert deployment.try_numbers(dag_id, run_id)[victim] == 2
    assert deployment.meta(
        "SELECT state FROM task_instance_history WHERE dag_id = %s AND run_id = %s AND task_id = %s AND try_number = 1",
        dag_id,
        run_id,
        victim,
    ) == [("failed",)]  # try 1, failed by the scheduler for its missing heartbeat
    run = only_run(engine, code)
    assert (run["PIPELINE_RUN_ID"], run["STATUS"]) == (pipeline_run_id, "SUCCESS")
    assert engine.attempts(pipeline_run_id, "VICTIM") == [(1, "LOST"), (2, "SUCCESS")]
    assert engine.task_runs(pipeline_run_id) == {"VICTIM": ("SUCCESS", 2, 3)}
