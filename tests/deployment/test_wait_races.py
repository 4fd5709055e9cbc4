"""Waiting claims lose no try to Airflow's executor-event race (docs/deferred-waits.md), in either wait mode.

Six pipelines, each with a DAG of its own (claim -> LOAD -> TRANSFORM -> PUBLISH -> finish), get three DAG runs each, all triggered at
once: per pipeline one run claims and two wait, then hand the pipeline over one after the other. A deferred
claim that defers again right before the run it waits for ends (the usual case for the third run) is the one
whose trigger fires at once; a rescheduled claim pokes every ``poke_interval`` as in a real deployment.

Every claim must get its run on its first try (no "state mismatch", no retry), every Engine run must end
SUCCESS in trigger order, and in deferrable mode the hand-off (the next run's Engine START_DATE less the
previous run's END_DATE) must be no longer than Airflow's own task-to-task gap in the same DAG runs plus 1 s:
a hold that protects the deferral may cost little more than Airflow's own scheduling does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from harness.deployment import AirflowDeployment
from tests.deployment.dags import _HEADER, render

pytestmark = [pytest.mark.deployment, pytest.mark.postgres]

PIPELINES = 6
RUNS = 3
#: Each task's end inside the holding run wakes the waiting claims (their fingerprint counts ended task runs),
#: which look, find the run still IN-PROGRESS and defer again, right before the next change.
TASKS = ["LOAD", "TRANSFORM", "PUBLISH"]
#: Airflow's own task-to-task gap plus this may bound a deferred hand-off (seconds).
HAND_OFF_ALLOWANCE = 1.0

WAIT_DAG = (
    _HEADER
    + """
CLAIM = {"poke_interval": __POKE__, "timeout": 1800}

with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=3) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__", deferrable=__DEFERRABLE__,
                            claim_kwargs=CLAIM):

        @etl_craft_task(task_code="LOAD", retries=0)
        def load():
            return {"rows_written": 1}

        @etl_craft_task(task_code="TRANSFORM", retries=0)
        def transform():
            return {"rows_written": 1}

        @etl_craft_task(task_code="PUBLISH", retries=0)
        def publish():
            return {"rows_written": 1}

        load() >> transform() >> publish()
"""
)


def _seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def run_all(deployment: AirflowDeployment, prefix: str, deferrable: bool, poke: int) -> dict[str, Any]:
    """Trigger PIPELINES x RUNS DAG runs at once and wait for them; the measurements of the test."""
    engine = deployment.pg
    dags: dict[str, str] = {}
    for n in range(PIPELINES):
        code, dag_id = f"{prefix}_{n}".upper(), f"{prefix}_{n}".lower()
        engine.add_pipeline(code, TASKS)
        deployment.write_dag(
            dag_id,
            render(WAIT_DAG, dag_id=dag_id, pipeline=code, conn_id=engine.conn_id, deferrable=deferrable,
                   poke=poke),
        )  # fmt: skip
        dags[dag_id] = code
    for dag_id in dags:
        deployment.wait_parsed(dag_id)
    triggered = {dag_id: [] for dag_id in dags}  # type: dict[str, list[str]]
    for _ in range(RUNS):
        for dag_id in dags:
            triggered[dag_id].append(deployment.trigger(dag_id))
    states = {
        (dag_id, run_id): deployment.wait_run(dag_id, run_id, timeout=60 + RUNS * 3 * poke)
        for dag_id, run_ids in triggered.items()
        for run_id in run_ids
    }
    lost, hand_offs, t2t = [], [], []
    ordered = True
    for dag_id, code in dags.items():
        claim = f"{code.lower()}.claim"
        for run_id in triggered[dag_id]:
            tries = deployment.try_numbers(dag_id, run_id)
            if tries.get(claim) != 1 or deployment.executor_event_race(dag_id, run_id, claim):
                lost.append((dag_id, run_id, tries.get(claim)))
            rows = deployment.meta(
                "SELECT start_date, end_date FROM task_instance WHERE dag_id = %s AND run_id = %s "
                "AND start_date IS NOT NULL ORDER BY start_date",
                dag_id,
                run_id,
            )
            t2t += [
                _seconds(b[0], a[1]) for a, b in zip(rows, rows[1:], strict=False) if a[1] and b[0] > a[1]
            ]
        runs = engine.runs(code)
        keys = [r["RUN_KEY"] for r in runs]
        ordered = ordered and all(r["STATUS"] == "SUCCESS" for r in runs) and len(runs) == RUNS
        ordered = ordered and sorted(keys) == sorted(f"airflow:{dag_id}:{r}" for r in triggered[dag_id])
        dates = engine.rows(
            "SELECT r.START_DATE, r.END_DATE FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p "
            "ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ? ORDER BY r.PIPELINE_RUN_ID",
            code,
        )
        for (_, a_end), (b_start, _) in zip(dates, dates[1:], strict=False):
            ordered = ordered and b_start >= a_end
            hand_offs.append(_seconds(b_start, a_end))
    found = {
        "states": sorted(set(states.values())),
        "lost": lost,
        "ordered": ordered,
        "hand_off_max": max(hand_offs),
        "task_to_task_max": max(t2t),
    }
    print(f"\n{prefix}: {found}")  # the numbers a reader wants, with -s
    return found


def test_deferred_claims_lose_no_try_and_hand_off_as_fast_as_airflow(deployment: AirflowDeployment) -> None:
    found = run_all(deployment, "dep_race_deferred", deferrable=True, poke=60)
    assert found["states"] == ["success"]
    assert found["lost"] == []
    assert found["ordered"]
    assert found["hand_off_max"] <= found["task_to_task_max"] + HAND_OFF_ALLOWANCE


def test_rescheduled_claims_lose_no_try(deployment: AirflowDeployment) -> None:
    """A short poke interval (10 s, twice the hand-back delay): the next poke is due soonest after the
    reschedule, so a late executor event is likeliest to meet it, and the test takes a minute, not three."""
    found = run_all(deployment, "dep_race_resched", deferrable=False, poke=10)
    assert found["states"] == ["success"]
    assert found["lost"] == []
    assert found["ordered"]
