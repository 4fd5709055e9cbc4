"""Tasks on several machines: the deployment's CeleryExecutor with workers in network namespaces of their own
(``machines.py``), recording into the PostgreSQL Engine DB over the network.

Each test pins its tasks to machines by queue, and checks the machine that ran each attempt
(``AUD_TASK_ATTEMPTS.HOST``, the worker's hostname) and the exact AUD_ rows: on both machines at once, with
one machine lost (every process SIGKILLed) and with one cut off the network and coming back late.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.deployment import HEARTBEAT_TIMEOUT, AirflowDeployment, Engine
from tests.deployment.dags import CELERY_SPREAD_DAG, CELERY_VICTIM_DAG, render
from tests.deployment.machines import CeleryMachines

pytestmark = [pytest.mark.deployment, pytest.mark.postgres, pytest.mark.machines]


def attempt_hosts(engine: Engine, pipeline_run_id: int) -> list[tuple[Any, ...]]:
    """``[(TASK_CODE, ATTEMPT_NUMBER, STATUS, HOST), …]`` of one Engine run, in attempt order."""
    return engine.rows(
        "SELECT t.TASK_CODE, a.ATTEMPT_NUMBER, a.STATUS, a.HOST FROM AUD_TASK_ATTEMPTS a "
        "JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
        "WHERE tr.PIPELINE_RUN_ID = ? ORDER BY a.ATTEMPT_ID",
        pipeline_run_id,
    )


def ti_hosts(deployment: AirflowDeployment, dag_id: str, run_id: str) -> dict[str, str]:
    """``{task_id: hostname}`` of one DAG run, as Airflow recorded where each task instance ran."""
    return dict(deployment.meta("SELECT task_id, hostname FROM task_instance WHERE dag_id = %s AND run_id = %s",
                                dag_id, run_id))  # fmt: skip


def write_spread_dag(
    deployment: AirflowDeployment, engine: Engine, code: str, dag_id: str, claim_on: str
) -> None:
    """Write CELERY_SPREAD_DAG for ``code`` (claim and finish on ``claim_on``) and wait until it is parsed."""
    source = render(
        CELERY_SPREAD_DAG, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id, claim_on=claim_on
    )
    deployment.write_dag(dag_id, source)
    deployment.wait_parsed(dag_id)


def test_tasks_of_one_pipeline_run_on_both_machines(deployment: AirflowDeployment,
                                                    machines: CeleryMachines) -> None:  # fmt: skip
    engine = deployment.pg
    code, dag_id = "DEP_CEL_SPREAD", "dep_cel_spread"
    engine.add_pipeline(code, ["ON_A", "ON_B"])
    write_spread_dag(deployment, engine, code, dag_id, claim_on="machine-b")

    run_id = deployment.trigger(dag_id)
    assert deployment.wait_run(dag_id, run_id, timeout=180) == "success"
    group = code.lower()
    assert ti_hosts(deployment, dag_id, run_id) == {
        f"{group}.claim": "machine-b",
        f"{group}.on_a": "machine-a",
        f"{group}.on_b": "machine-b",
        f"{group}.finish": "machine-b",
    }
    (run,) = engine.runs(code)
    assert run["STATUS"] == "SUCCESS"
    assert attempt_hosts(engine, run["PIPELINE_RUN_ID"]) == [
        ("ON_A", 1, "SUCCESS", "machine-a"),
        ("ON_B", 1, "SUCCESS", "machine-b"),
    ]
    assert engine.task_runs(run["PIPELINE_RUN_ID"]) == {"ON_A": ("SUCCESS", 1, 1), "ON_B": ("SUCCESS", 1, 2)}


def test_two_dag_runs_of_one_pipeline_on_two_machines_never_two_in_progress(
    deployment: AirflowDeployment, machines: CeleryMachines, tmp_path: Path
) -> None:
    """Two DAGs of one pipeline, claiming from different machines at once: the second claim waits."""
    engine = deployment.pg
    code = "DEP_CEL_TWO"
    engine.add_pipeline(code, ["ON_A", "ON_B"])
    dags = {machine: f"dep_cel_two_{machine[-1]}" for machine in ("machine-a", "machine-b")}
    for machine, dag_id in dags.items():
        write_spread_dag(deployment, engine, code, dag_id, claim_on=machine)
    in_progress: list[int] = []

    def sample() -> None:
        in_progress.append(engine.in_progress(code))

    started, release = tmp_path / "started", tmp_path / "release"
    first_dag, second_dag = dags["machine-a"], dags["machine-b"]
    first = deployment.trigger(first_dag, conf={"started": str(started), "release": str(release)})
    deployment.wait_until(started.exists, 120, "the first run's ON_A to start", sample)
    second = deployment.trigger(second_dag)
    claim = f"{code.lower()}.claim"
    deployment.wait_until(lambda: deployment.reschedules(second_dag, second, claim) >= 1, 120,
                          "the second run's claim (machine-b) to wait", sample)  # fmt: skip
    assert deployment.dag_run(first_dag, first)["state"] == "running"
    release.touch()
    assert deployment.wait_run(first_dag, first, timeout=180, probe=sample) == "success"
    assert deployment.wait_run(second_dag, second, timeout=180, probe=sample) == "success"

    assert len(in_progress) > 3 and max(in_progress) == 1, in_progress
    assert ti_hosts(deployment, first_dag, first)[claim] == "machine-a"
    assert ti_hosts(deployment, second_dag, second)[claim] == "machine-b"
    runs = engine.runs(code)
    assert [(r["RUN_KEY"], r["STATUS"]) for r in runs] == [
        (f"airflow:{first_dag}:{first}", "SUCCESS"),
        (f"airflow:{second_dag}:{second}", "SUCCESS"),
    ]
    ((first_end, second_start),) = engine.rows(
        "SELECT a.END_DATE, b.START_DATE FROM AUD_PIPELINES_RUN_LOG a, AUD_PIPELINES_RUN_LOG b "
        "WHERE a.PIPELINE_RUN_ID = ? AND b.PIPELINE_RUN_ID = ?",
        runs[0]["PIPELINE_RUN_ID"],
        runs[1]["PIPELINE_RUN_ID"],
    )
    assert second_start >= first_end
    for run in runs:
        assert attempt_hosts(engine, run["PIPELINE_RUN_ID"]) == [
            ("ON_A", 1, "SUCCESS", "machine-a"),
            ("ON_B", 1, "SUCCESS", "machine-b"),
        ]


def start_victim(deployment: AirflowDeployment, code: str, dag_id: str, pid_file: Path) -> tuple[str, int]:
    """Trigger the VICTIM DAG; once its first try runs on machine-a, its run id and Engine run id."""
    engine = deployment.pg
    engine.add_pipeline(code, ["VICTIM"])
    source = render(CELERY_VICTIM_DAG, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id, pid_file=pid_file,
                    sleep=600)  # fmt: skip
    deployment.write_dag(dag_id, source)
    deployment.wait_parsed(dag_id)
    run_id = deployment.trigger(dag_id)
    deployment.wait_until(pid_file.exists, 120, "VICTIM's first try to start on machine-a")
    (run,) = engine.runs(code)
    assert attempt_hosts(engine, run["PIPELINE_RUN_ID"]) == [("VICTIM", 1, "RUNNING", "machine-a")]
    return run_id, int(run["PIPELINE_RUN_ID"])


def check_retried_on_machine_b(deployment: AirflowDeployment, code: str, dag_id: str, run_id: str,
                               pipeline_run_id: int) -> None:  # fmt: skip
    engine = deployment.pg
    victim = f"{code.lower()}.victim"
    assert deployment.try_numbers(dag_id, run_id)[victim] == 2
    assert deployment.meta(
        "SELECT state, hostname FROM task_instance_history WHERE dag_id = %s AND run_id = %s AND task_id = %s",
        dag_id,
        run_id,
        victim,
    ) == [("failed", "machine-a")]  # try 1, failed by the scheduler for its missing heartbeat
    assert ti_hosts(deployment, dag_id, run_id)[victim] == "machine-b"
    (run,) = engine.runs(code)
    assert (run["PIPELINE_RUN_ID"], run["STATUS"]) == (pipeline_run_id, "SUCCESS")
    assert attempt_hosts(engine, pipeline_run_id) == [
        ("VICTIM", 1, "LOST", "machine-a"),
        ("VICTIM", 2, "SUCCESS", "machine-b"),
    ]
    assert engine.task_runs(pipeline_run_id) == {"VICTIM": ("SUCCESS", 2, 3)}
    assert engine.in_progress(code) == 0


def test_a_lost_machine_s_attempt_ends_lost_and_the_retry_succeeds_on_the_other(
    deployment: AirflowDeployment, machines: CeleryMachines, tmp_path: Path
) -> None:
    code, dag_id = "DEP_CEL_LOST", "dep_cel_lost"
    run_id, pipeline_run_id = start_victim(deployment, code, dag_id, tmp_path / "victim.json")

    killed = machines.kill("machine-a")  # worker, supervisor and task: nothing is left to tell anyone
    assert json.loads((tmp_path / "victim.json").read_text())["task"] in killed
    machines.take_over("machine-b", "machine-a")  # the surviving machine serves the lost one's queue
    assert deployment.pg.attempts(pipeline_run_id, "VICTIM") == [(1, "RUNNING")]  # nobody recorded the loss

    assert deployment.wait_run(dag_id, run_id, timeout=HEARTBEAT_TIMEOUT + 150) == "success"
    check_retried_on_machine_b(deployment, code, dag_id, run_id, pipeline_run_id)


def test_a_partitioned_machine_s_late_end_never_overwrites_the_retry(
    deployment: AirflowDeployment, machines: CeleryMachines, tmp_path: Path
) -> None:
    """machine-a is cut off mid-task for longer than the heartbeat timeout, then comes back: its first try
    learns it was superseded, and what it tries to record then is refused."""
    code, dag_id = "DEP_CEL_PARTITION", "dep_cel_partition"
    pid_file = tmp_path / "victim.json"
    run_id, pipeline_run_id = start_victim(deployment, code, dag_id, pid_file)
    task = psutil.Process(json.loads(pid_file.read_text())["task"])

    machines.partition("machine-a")
    machines.take_over("machine-b", "machine-a")
    assert deployment.wait_run(dag_id, run_id, timeout=HEARTBEAT_TIMEOUT + 150) == "success"
    assert task.is_running()  # still sleeping on the far side of the partition
    machines.heal("machine-a")
    # Back on the network, the first try's supervisor hears that its task instance moved on and stops it.
    deployment.wait_until(lambda: not task.is_running() or task.status() == psutil.STATUS_ZOMBIE, 180,
                          "the first try on machine-a to stop after the partition healed")  # fmt: skip

    check_retried_on_machine_b(deployment, code, dag_id, run_id, pipeline_run_id)
    # The stopped try recorded its end (on_kill: CANCELLED) on the way out; the Engine DB refused it, since
    # the retry had closed that attempt LOST: the rows above are what the retry left.
    log = next(deployment.logs.glob(f"dag_id={dag_id}/run_id=*/task_id={code.lower()}.victim/attempt=1.log"))
    refused = [line for line in log.read_text(errors="replace").splitlines()
               if "could not record CANCELLED for VICTIM" in line and "was closed by someone else" in line]  # fmt: skip
    assert len(refused) == 1, log.read_text(errors="replace")[-3000:]


def test_a_sqlite_engine_db_is_refused_when_the_claim_runs_on_another_machine(
    deployment: AirflowDeployment, machines: CeleryMachines
) -> None:
    """The SQLite file is on the scheduler's machine; the claim on machine-b stops before writing anything."""
    engine = deployment.sqlite
    code, dag_id = "DEP_CEL_SQLITE", "dep_cel_sqlite"
    engine.add_pipeline(code, ["ON_A", "ON_B"])
    write_spread_dag(deployment, engine, code, dag_id, claim_on="machine-b")

    run_id = deployment.trigger(dag_id)
    assert deployment.wait_run(dag_id, run_id, timeout=180) == "failed"
    group = code.lower()
    states = deployment.task_states(dag_id, run_id)
    assert states[f"{group}.claim"] == "failed"
    assert deployment.try_numbers(dag_id, run_id)[f"{group}.claim"] == 1  # a CONFIGURATION error: no retries
    assert ti_hosts(deployment, dag_id, run_id)[f"{group}.claim"] == "machine-b"
    assert engine.runs(code) == []
    log = next(deployment.logs.glob(f"dag_id={dag_id}/run_id=*/task_id={group}.claim/attempt=1.log"))
    assert (
        "the Engine DB is a SQLite file, but CeleryExecutor runs tasks on other machines" in log.read_text()
    )
