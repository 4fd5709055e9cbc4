"""docs/pipelines.md "Every Airflow execution path" under a real deployment: the triggerer resumes deferred tasks, the
scheduler reschedules sensors, times deferrals out and expands mapped tasks, and a task is marked success
through the REST API while it runs. Each test asserts the exact AUD_ rows (PostgreSQL Engine DB).

The same paths run under ``dag.test()`` in ``tests/e2e/test_execution_paths.py``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.deployment import AirflowDeployment, Engine
from tests.deployment.dags import (
    DEFER_DAG,
    DEFER_HELD_DAG,
    DEFER_TIMEOUT_DAG,
    MAPPED_DAG,
    MARKED_DAG,
    SENSOR_DAG,
    render,
)

pytestmark = [pytest.mark.deployment, pytest.mark.postgres]


def only_run(engine: Engine, code: str) -> dict[str, Any]:
    runs = engine.runs(code)
    assert len(runs) == 1, runs
    return runs[0]


def start(deployment: AirflowDeployment, template: str, dag_id: str, code: str, tasks: list[str],
          **values: object) -> str:  # fmt: skip
    """Seed the pipeline, write and parse its DAG, trigger it (no logical date); the run id."""
    engine = deployment.pg
    engine.add_pipeline(code, tasks)
    source = render(template, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id, **values)
    deployment.write_dag(dag_id, source)
    deployment.wait_parsed(dag_id)
    return deployment.trigger(dag_id)


class Sampler:
    """(TASK_CODE, Airflow TI state, attempt STATUS, TASK_LOG) of one DAG run, seen on each poll of a wait."""

    def __init__(self, deployment: AirflowDeployment, dag_id: str, run_id: str, code: str) -> None:
        self.deployment, self.dag_id, self.run_id, self.code = deployment, dag_id, run_id, code
        self.seen: set[tuple[str, str | None, str, str | None]] = set()
        self.trigger_rows = 0  # most rows seen in the metadata DB's trigger table at once

    def __call__(self) -> None:
        states = self.deployment.task_states(self.dag_id, self.run_id)
        group = self.code.lower()
        for task_code, _, _, status, log in self.deployment.pg.keyed_attempts(
            f"airflow:{self.dag_id}:{self.run_id}"
        ):
            self.seen.add((task_code, states.get(f"{group}.{task_code.lower()}"), status, log))
        ((triggers,),) = self.deployment.meta("SELECT COUNT(*) FROM trigger")
        self.trigger_rows = max(self.trigger_rows, int(triggers))

    def states(self, task_code: str) -> set[tuple[str | None, str]]:
        return {(ti_state, status) for code, ti_state, status, _ in self.seen if code == task_code}


def test_a_deferred_task_is_resumed_by_the_triggerer_in_its_one_attempt(
    deployment: AirflowDeployment,
) -> None:
    code, dag_id = "DEP_DEFER", "dep_defer"
    run_id = start(deployment, DEFER_DAG, dag_id, code, ["DEFER_COUNT", "WAIT_ASYNC"])
    sample = Sampler(deployment, dag_id, run_id, code)
    assert deployment.wait_run(dag_id, run_id, probe=sample) == "success"

    group = code.lower()
    assert deployment.task_states(dag_id, run_id) == {
        f"{group}.claim": "success",
        f"{group}.defer_count": "success",
        f"{group}.wait_async": "success",
        f"{group}.finish": "success",
    }
    assert deployment.try_numbers(dag_id, run_id)[f"{group}.defer_count"] == 1
    assert deployment.try_numbers(dag_id, run_id)[f"{group}.wait_async"] == 1
    # Both really went through the triggerer: each TI was seen deferred while its attempt was parked QUEUED.
    assert sample.trigger_rows >= 1
    assert ("deferred", "QUEUED") in sample.states("DEFER_COUNT"), sample.seen
    assert ("deferred", "QUEUED") in sample.states("WAIT_ASYNC"), sample.seen
    parked = {
        log for c, ti_state, status, log in sample.seen if status == "QUEUED" and ti_state == "deferred"
    }
    assert "deferred by Airflow to TimeDeltaTrigger; resumes in done_waiting" in parked
    assert "deferred by Airflow to DateTimeTrigger; resumes in execute_complete" in parked

    run = only_run(deployment.pg, code)
    assert run["STATUS"] == "SUCCESS" and run["RUN_KEY"] == f"airflow:{dag_id}:{run_id}"
    engine, pipeline_run_id = deployment.pg, run["PIPELINE_RUN_ID"]
    assert engine.attempt_rows(pipeline_run_id, "DEFER_COUNT") == [(None, 1, "SUCCESS", 7, None, None)]
    assert engine.attempt_rows(pipeline_run_id, "WAIT_ASYNC") == [(None, 1, "SUCCESS", None, None, None)]
    assert engine.task_run_row(pipeline_run_id, "DEFER_COUNT") == ("SUCCESS", 1, 7, None, None)
    assert engine.task_run_row(pipeline_run_id, "WAIT_ASYNC") == ("SUCCESS", 1, None, None, None)


def test_a_deferral_that_times_out_ends_its_attempt_timed_out(deployment: AirflowDeployment) -> None:
    code, dag_id = "DEP_DEFER_TIMEOUT", "dep_defer_timeout"
    run_id = start(deployment, DEFER_TIMEOUT_DAG, dag_id, code, ["WAIT_TOO_LONG"])
    sample = Sampler(deployment, dag_id, run_id, code)
    assert deployment.wait_run(dag_id, run_id, probe=sample) == "failed"

    group = code.lower()
    assert deployment.task_states(dag_id, run_id) == {
        f"{group}.claim": "success",
        f"{group}.wait_too_long": "failed",
        f"{group}.finish": "failed",  # a FAILED Engine run fails the finish, so the DAG run shows it
    }
    assert deployment.try_numbers(dag_id, run_id)[f"{group}.wait_too_long"] == 1
    assert ("deferred", "QUEUED") in sample.states("WAIT_TOO_LONG"), sample.seen

    run = only_run(deployment.pg, code)
    assert run["STATUS"] == "FAILED"
    engine, pipeline_run_id = deployment.pg, run["PIPELINE_RUN_ID"]
    [attempt] = engine.attempt_rows(pipeline_run_id, "WAIT_TOO_LONG")
    assert attempt[:4] == (None, 1, "TIMED_OUT", None), attempt
    assert attempt[4].startswith("TaskDeferralTimeout"), attempt
    status, count, rows, error, _ = engine.task_run_row(pipeline_run_id, "WAIT_TOO_LONG")
    assert (status, count, rows) == ("FAILED", 1, None)
    assert error.startswith("TaskDeferralTimeout"), error


#: Seconds between the sensor's pokes. Airflow 3.3 fails a reschedule-mode sensor when the executor event of
#: one poke reaches the scheduler after the next poke was queued (apache/airflow#71172); that event takes
#: about 1.5 s here after the poke ends, so a 1 s poke interval loses that race on most pokes.
SENSOR_POKE_INTERVAL = 2
#: DAG runs the sensor test may use: one that Airflow fails on that race is checked, then run again.
SENSOR_RUNS = 3


def test_a_rescheduling_sensor_is_one_attempt_parked_between_pokes(deployment: AirflowDeployment,
                                                                    tmp_path: Path) -> None:  # fmt: skip
    code, dag_id = "DEP_SENSOR", "dep_sensor"
    group = code.lower()
    sensor = f"{group}.wait_for"
    engine = deployment.pg
    engine.add_pipeline(code, ["WAIT_FOR"])
    source = render(SENSOR_DAG, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id,
                    poke_interval=SENSOR_POKE_INTERVAL)  # fmt: skip
    deployment.write_dag(dag_id, source)
    deployment.wait_parsed(dag_id)

    for n in range(1, SENSOR_RUNS + 1):
        pokes = tmp_path / f"pokes-{n}"
        run_id = deployment.trigger(dag_id, conf={"pokes": str(pokes)})
        sample = Sampler(deployment, dag_id, run_id, code)
        state = deployment.wait_run(dag_id, run_id, probe=sample)
        (run,) = [r for r in engine.runs(code) if r["RUN_KEY"] == f"airflow:{dag_id}:{run_id}"]
        if not deployment.executor_event_race(dag_id, run_id, sensor):
            break
        # Airflow failed the sensor between two pokes: its parked attempt is closed LOST by the finish.
        assert (state, run["STATUS"]) == ("failed", "FAILED")
        assert engine.attempts(run["PIPELINE_RUN_ID"], "WAIT_FOR") == [(1, "LOST")]
        warnings.warn(f"Airflow failed the sensor of DAG run {n} on a late executor event "
                      "(apache/airflow#71172); running the DAG again", stacklevel=1)  # fmt: skip
    else:
        pytest.fail(f"Airflow failed the sensor on a late executor event in all {SENSOR_RUNS} DAG runs "
                    "(apache/airflow#71172)")  # fmt: skip

    assert state == "success"
    assert deployment.task_states(dag_id, run_id) == {
        f"{group}.claim": "success",
        sensor: "success",
        f"{group}.finish": "success",
    }
    assert pokes.read_text() == "3"
    assert deployment.try_numbers(dag_id, run_id)[sensor] == 1
    assert deployment.reschedules(dag_id, run_id, sensor) >= 2
    parked = [(ti_state, log) for c, ti_state, status, log in sample.seen if status == "QUEUED"]
    assert parked, sample.seen  # between pokes its attempt was QUEUED, saying when the next poke is due
    assert all(log.startswith("rescheduled by Airflow: the next poke is due at ") for _, log in parked), (
        parked
    )

    assert run["STATUS"] == "SUCCESS"
    pipeline_run_id = run["PIPELINE_RUN_ID"]
    assert engine.attempt_rows(pipeline_run_id, "WAIT_FOR") == [(None, 1, "SUCCESS", None, None, None)]
    assert engine.task_run_row(pipeline_run_id, "WAIT_FOR") == ("SUCCESS", 1, None, None, None)


def test_a_mapped_task_with_a_failing_index_is_one_failed_task_run(deployment: AirflowDeployment) -> None:
    code, dag_id = "DEP_MAPPED", "dep_mapped"
    run_id = start(deployment, MAPPED_DAG, dag_id, code, ["LOAD_FILE"])
    assert deployment.wait_run(dag_id, run_id) == "failed"

    group = code.lower()
    states = deployment.task_states(dag_id, run_id)
    del states[f"{group}.load_file"]  # one of its three map indexes' states: they are read below
    assert states == {
        f"{group}.claim": "success",
        f"{group}.list_files": "success",
        f"{group}.finish": "failed",
    }
    assert deployment.meta(
        "SELECT map_index, state, try_number FROM task_instance WHERE dag_id = %s AND run_id = %s AND task_id = %s "
        "ORDER BY map_index",
        dag_id,
        run_id,
        f"{group}.load_file",
    ) == [(0, "success", 1), (1, "success", 1), (2, "failed", 2)]

    run = only_run(deployment.pg, code)
    assert run["STATUS"] == "FAILED"
    engine, pipeline_run_id = deployment.pg, run["PIPELINE_RUN_ID"]
    attempts = engine.attempt_rows(pipeline_run_id, "LOAD_FILE")
    assert [a[:4] for a in attempts] == [
        (0, 1, "SUCCESS", 1), (1, 1, "SUCCESS", 2), (2, 1, "FAILED", None), (2, 2, "FAILED", None),
    ]  # fmt: skip
    assert [a[4] for a in attempts[2:]] == ["ValueError: cannot read bad"] * 2
    assert engine.task_run_row(pipeline_run_id, "LOAD_FILE") == (
        "FAILED", 4, 3, "map index 2 FAILED: ValueError: cannot read bad",
        "3 map indexes: 2 SUCCESS, 0 SKIPPED, 1 FAILED",
    )  # fmt: skip
    assert engine.task_runs(pipeline_run_id) == {"LOAD_FILE": ("FAILED", 4, 3)}  # one row for the mapped task


def test_a_running_task_marked_success_through_the_api(deployment: AirflowDeployment, tmp_path: Path) -> None:
    code, dag_id = "DEP_MARKED", "dep_marked"
    marker = tmp_path / "slow.pid"
    run_id = start(deployment, MARKED_DAG, dag_id, code, ["SLOW"], marker=marker)
    group = code.lower()
    deployment.wait_until(marker.exists, 120, "SLOW to start")
    task = psutil.Process(int(marker.read_text()))
    deployment.extra_procs.append(task)
    pipeline_run_id = only_run(deployment.pg, code)["PIPELINE_RUN_ID"]
    assert deployment.pg.attempts(pipeline_run_id, "SLOW") == [(1, "RUNNING")]
    assert deployment.task_states(dag_id, run_id)[f"{group}.slow"] == "running"

    deployment.set_task_state(dag_id, run_id, f"{group}.slow", "success")
    assert deployment.wait_run(dag_id, run_id) == "success"
    deployment.wait_until(lambda: not _alive(task), 60, "Airflow to stop SLOW's process")
    assert deployment.task_states(dag_id, run_id) == {
        f"{group}.claim": "success",
        f"{group}.slow": "success",
        f"{group}.finish": "success",
    }

    engine = deployment.pg
    run = only_run(engine, code)
    assert run["STATUS"] == "SUCCESS"
    [(_, number, attempt_status, _, attempt_error, _)] = engine.attempt_rows(pipeline_run_id, "SLOW")
    status, count, rows, error, log = engine.task_run_row(pipeline_run_id, "SLOW")
    assert (number, status, count, rows, error) == (1, "SUCCESS", 1, None, None)
    assert log.startswith("marked success in Airflow (by hand in the UI or API) while the Engine DB had "), (
        log
    )
    [(action, from_status, to_status, kind)] = engine.interventions(pipeline_run_id)
    assert (action, to_status, kind) == ("MARK", "SUCCESS", "ORCHESTRATOR")
    # Airflow stops the task (SIGTERM: on_kill records CANCELLED) while the scheduler already runs the finish,
    # the task being done for Airflow. A finish that comes first closes the live attempt LOST (its task run
    # FAILED); either way the task run then follows Airflow's success with a MARK.
    if attempt_status == "LOST":
        assert from_status == "FAILED" and attempt_error.startswith("lost: "), (from_status, attempt_error)
    else:
        assert (attempt_status, from_status) == ("CANCELLED", "CANCELLED"), (attempt_status, from_status)
        assert attempt_error == "cancelled: Airflow killed the task (on_kill)"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_deferred_attempt_is_never_closed_by_another_runs_claim(deployment: AirflowDeployment) -> None:
    """While run 1's task is deferred (its attempt parked QUEUED), run 2's claim waits for it: Airflow still
    has the task, so the claim's abandonment check leaves run 1 alone, and nothing is closed LOST."""
    code, dag_id = "DEP_DEFER_HELD", "dep_defer_held"
    engine, group = deployment.pg, code.lower()
    engine.add_pipeline(code, ["PARKED"])
    deployment.write_dag(dag_id, render(DEFER_HELD_DAG, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id))
    deployment.wait_parsed(dag_id)
    first = deployment.trigger(dag_id, conf={"wait": 45})
    sample = Sampler(deployment, dag_id, first, code)
    deployment.wait_until(lambda: ("deferred", "QUEUED") in sample.states("PARKED"), 60,
                          "run 1's task to be deferred with its attempt parked", sample)  # fmt: skip
    second = deployment.trigger(dag_id)
    deployment.wait_until(lambda: deployment.reschedules(dag_id, second, f"{group}.claim") >= 1, 40,
                          "run 2's claim to wait for run 1", sample)  # fmt: skip
    # Run 2's claim has looked at run 1 and left it: still deferred, still parked, nothing closed.
    assert deployment.task_states(dag_id, first)[f"{group}.parked"] == "deferred"
    assert [r["STATUS"] for r in engine.runs(code)] == ["IN-PROGRESS"]
    assert engine.attempts(engine.runs(code)[0]["PIPELINE_RUN_ID"], "PARKED") == [(1, "QUEUED")]
    assert deployment.wait_run(dag_id, first, timeout=180, probe=sample) == "success"
    assert deployment.wait_run(dag_id, second, timeout=180) == "success"
    runs = engine.runs(code)
    assert [(r["RUN_KEY"], r["STATUS"]) for r in runs] == [
        (f"airflow:{dag_id}:{first}", "SUCCESS"),
        (f"airflow:{dag_id}:{second}", "SUCCESS"),
    ]
    for run in runs:
        assert engine.attempts(run["PIPELINE_RUN_ID"], "PARKED") == [(1, "SUCCESS")]
        assert engine.interventions(run["PIPELINE_RUN_ID"]) == []  # no CANCEL: nothing was abandoned
