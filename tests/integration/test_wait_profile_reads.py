"""A waiting try reads its Engine profile once: its looks and its fingerprint read share the try's Engine DB
(docs/performance.md, "In the task process"). Each read asks Airflow for the connection and reads the
craft-connector.yml it names, so a deferring claim used to read it three times and a gate twice."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from airflow_provider_etl_craft.operators import _wait
from airflow_provider_etl_craft.operators.pipeline_run import ClaimPipelineRunOperator
from harness.engines import EngineSetup
from tests.reliability.conftest import seed


class Deferred(Exception):
    """Raised by :meth:`Deferring.defer`, as Airflow's ``defer`` raises ``TaskDeferred``."""


class Deferring:
    """What ``_wait.look_or_defer`` needs of a task: ``defer()`` (raises) and a log."""

    def __init__(self) -> None:
        self.deferred: dict[str, Any] = {}
        self.log = logging.getLogger("test")

    def defer(self, **kwargs: Any) -> None:
        self.deferred = kwargs
        raise Deferred


@pytest.fixture
def reads(make_engine, profile_reads: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:  # noqa: ANN001 - the factory fixture
    """A SQLite Engine DB behind ``etl_craft_default``; the profile reads of the test, by connection id."""
    setup: EngineSetup = make_engine("sqlite")
    seed(setup, {"SALES": ["LOAD"]})
    monkeypatch.setenv(
        "AIRFLOW_CONN_ETL_CRAFT_DEFAULT",
        json.dumps({"conn_type": "etl_craft", "extra": {"config_path": str(setup.config_path)}}),
    )
    return profile_reads


def claim_wait() -> _wait.Wait:
    return _wait.Wait(
        engine_db=("etl_craft_default", None),
        pipeline_code="SALES",
        recheck_after=60.0,
        method_name="execute_complete",
        claim=True,
    )


def test_a_deferring_claim_reads_its_profile_once_per_try(reads: list[str]) -> None:
    claim = ClaimPipelineRunOperator(task_id="claim", pipeline_code="SALES", deferrable=True)
    engines = []

    def look() -> _wait.Look[int]:  # what the claim's poke does before it asks the Engine DB
        engines.append(claim._claim_engine())
        return _wait.Look(done=False, reason="another run of SALES is IN-PROGRESS")

    task = Deferring()
    for _try in range(2):  # each try (execute, or execute_complete after a deferral) reads it again
        claim._try_engine = None
        with pytest.raises(Deferred):
            _wait.look_or_defer(task, look, claim_wait(), timeout=3600, carried=None,
                                timed_out=lambda _: AssertionError("timed out"), engine=claim._claim_engine)  # fmt: skip
        assert len(task.deferred["trigger"].seen) == 5  # the fingerprint was read (on the try's engine)
    assert reads == ["etl_craft_default"] * 2  # two looks and a fingerprint read per try
    assert len(engines) == 4 and len({id(e) for e in engines}) == 1  # the process's one dialect


def test_each_claim_try_starts_without_the_last_tries_engine(
    reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = ClaimPipelineRunOperator(task_id="claim", pipeline_code="SALES", deferrable=True)
    claim._claim_engine()
    monkeypatch.setattr(claim, "_look_or_defer", lambda *a, **k: None)  # the try itself is not the point here
    claim.execute({})
    assert claim._try_engine is None
    claim._claim_engine()
    claim.execute_complete({}, {"status": "changed"})
    assert claim._try_engine is None
    assert reads == ["etl_craft_default"] * 2
