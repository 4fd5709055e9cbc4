"""The hand-back delay of waits (docs/deferred-waits.md): what a deferral hands its trigger, how soon a
reschedule may be due, and what a claim's wait is woken by."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_provider_etl_craft.operators import _wait
from airflow_provider_etl_craft.operators.pipeline_run import ClaimPipelineRunOperator
from airflow_provider_etl_craft.runs.changes import ENDED_TASK_RUNS, moved
from airflow_provider_etl_craft.triggers.engine_change import EngineChangeTrigger


class Deferred(Exception):
    """Raised by :meth:`Deferring.defer`, as Airflow's ``defer`` raises ``TaskDeferred``."""


class Deferring:
    """What ``_wait.defer`` needs of a task: ``defer()``, which keeps what it was given and raises."""

    def __init__(self) -> None:
        self.deferred: dict[str, Any] = {}

    def defer(self, **kwargs: Any) -> None:
        self.deferred = kwargs
        raise Deferred


def deferral(claim: bool) -> tuple[datetime, EngineChangeTrigger]:
    task = Deferring()
    before = datetime.now(UTC)
    until = before + timedelta(hours=1)
    wait = _wait.Wait(
        engine_db=("etl_craft_default", None),
        pipeline_code="SALES",
        recheck_after=60.0,
        method_name="execute_complete",
        claim=claim,
    )
    with pytest.raises(Deferred):
        _wait.defer(task, wait, [1, 2, 0, 0, 2], until=until)
    trigger = task.deferred["trigger"]
    assert isinstance(trigger, EngineChangeTrigger)
    return before, trigger


@pytest.mark.parametrize("delay", ["5", "12.5"])
def test_a_deferral_holds_its_trigger_for_the_hand_back_delay(
    monkeypatch: pytest.MonkeyPatch, delay: str
) -> None:
    monkeypatch.setenv("AIRFLOW__ETL_CRAFT__WAIT_HAND_BACK_DELAY", delay)
    before, trigger = deferral(claim=False)
    assert trigger.hold_until is not None
    assert datetime.fromisoformat(trigger.hold_until) >= before + timedelta(seconds=float(delay))
    assert trigger.serialize()[1]["hold_until"] == trigger.hold_until  # it survives a triggerer restart


def test_a_claims_deferral_ignores_task_ends_and_a_gates_does_not() -> None:
    assert deferral(claim=True)[1].ignore_task_ends is True
    assert deferral(claim=False)[1].ignore_task_ends is False


def test_a_rescheduled_claim_is_never_due_before_the_hand_back_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__ETL_CRAFT__WAIT_HAND_BACK_DELAY", raising=False)  # the default, 5 s
    assert ClaimPipelineRunOperator(task_id="c", pipeline_code="SALES", poke_interval=1).poke_interval == 5.0
    assert (
        ClaimPipelineRunOperator(task_id="c", pipeline_code="SALES", poke_interval=30).poke_interval == 30.0
    )
    # A claim that pokes keeps its process: no executor event between two looks, nothing to wait out.
    poking = ClaimPipelineRunOperator(task_id="c", pipeline_code="SALES", poke_interval=1, mode="poke")
    assert poking.poke_interval == 1.0
    monkeypatch.setenv("AIRFLOW__ETL_CRAFT__WAIT_HAND_BACK_DELAY", "8")
    assert ClaimPipelineRunOperator(task_id="c", pipeline_code="SALES", poke_interval=1).poke_interval == 8.0
    assert _wait.reschedule_interval(2) == 8.0


def test_a_claims_wait_moves_on_runs_pauses_and_new_runs_but_not_on_task_ends() -> None:
    seen = [1, 7, 0, 0, 7]
    task_ended = list(seen)
    task_ended[ENDED_TASK_RUNS] += 1
    assert moved(task_ended, seen) and not moved(task_ended, seen, ignore_task_ends=True)
    for changed in ([0, 0, 1, 0, 7], [1, 7, 0, 1, 7], [2, 15, 0, 0, 8], []):
        assert moved(changed, seen, ignore_task_ends=True)
