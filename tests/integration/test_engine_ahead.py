"""A try's Engine DB work begins when Airflow's task runner prepares the task (``prepare_for_execution``),
so it runs while the runner renders the task and stores the rendered fields (docs/performance.md, "In the
task process"): the try's modules load in a thread, and where Airflow's task-process channel serializes its
threads the profile is read and the login started too. The try then takes that work: one profile read."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.version import Version

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.engine import reuse
from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.operators.pipeline_run import FinishPipelineRunOperator
from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator
from harness.engines import EngineSetup
from tests.reliability.conftest import seed

ROOT = Path(__file__).resolve().parents[2]
CONN_ID = "etl_craft_ahead"


def file_conn(config: Path) -> str:
    return json.dumps({"conn_type": "etl_craft", "extra": {"config_path": str(config)}})


def recorded_task() -> EtlCraftPythonOperator:
    return EtlCraftPythonOperator(
        task_id="load", pipeline_code="SALES", etl_craft_conn_id=CONN_ID, python_callable=lambda: 1
    )


def test_the_task_channel_serializes_threads_from_airflow_3_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Judged on Airflow's own channel class: from 3.2 it holds a lock around each request and its answer."""
    from airflow.sdk.execution_time import comms, task_runner

    assert _compat.channel_serializes_threads() is False  # no task process here
    mine, _theirs = socket.socketpair()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms.CommsDecoder(socket=mine), raising=False)
    expected = Version(version("apache-airflow-task-sdk")) >= Version("1.2")  # Airflow 3.2's Task SDK
    assert _compat.channel_serializes_threads() is expected


CHILD = textwrap.dedent(
    """
    import json, sys
    from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator

    TRY = ("config.connection", "engine.reuse", "runs.lifecycle", "runs.gates", "runs.attempts", "runs.start")
    names = [f"airflow_provider_etl_craft.{name}" for name in TRY]
    task = EtlCraftPythonOperator(task_id="load", pipeline_code="SALES", etl_craft_conn_id=sys.argv[1],
                                  python_callable=lambda: 1)
    before = [name for name in names if name in sys.modules]
    prepared = task.prepare_for_execution()
    ahead = prepared._etl_craft_ahead
    ahead.join()
    after = [name for name in names if name in sys.modules]
    engine = prepared._etl_craft_try_engine()
    print(json.dumps({"before": before, "after": after, "thread": ahead.name, "dialect": engine.name,
                      "copy": prepared is not task}))
    """
)


def test_a_recorded_try_loads_its_modules_while_airflow_prepares_it(make_engine, tmp_path: Path) -> None:  # noqa: ANN001
    """In a fresh interpreter (a task process): none of the try's modules is loaded by the parse; preparing
    the task loads them all in a thread, and the try then takes its Engine DB."""
    setup: EngineSetup = make_engine("sqlite")
    env = {**setup.subprocess_env(), f"AIRFLOW_CONN_{CONN_ID.upper()}": file_conn(setup.config_path)}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, CONN_ID],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == []
    assert len(seen["after"]) == 6
    assert seen["thread"] == f"etl-craft-ahead-{CONN_ID}"
    assert seen["dialect"] == "sqlite"
    assert seen["copy"] is True  # Airflow's own preparation still runs (a copy for the try)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_where_the_channel_serializes_threads_the_profile_is_read_once_ahead(
    dialect: str,
    make_engine,
    profile_reads: list[str],
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """The profile is read when the task is prepared (the login started then, on PostgreSQL); the try takes
    that Engine DB without reading the profile again, and its start and end run on it."""
    setup: EngineSetup = make_engine(dialect)
    seed(setup, {"SALES": ["LOAD"]})
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", file_conn(setup.config_path))
    monkeypatch.setattr(_compat, "channel_serializes_threads", lambda: True)
    prepared = recorded_task().prepare_for_execution()
    assert profile_reads == [CONN_ID]  # read on the preparing thread
    ahead = prepared._etl_craft_ahead
    engine = prepared._etl_craft_try_engine()
    assert engine is ahead.engine
    assert profile_reads == [CONN_ID]  # the try took it: no second read
    assert prepared._etl_craft_ahead is None  # taken once: a later try of this object begins its own
    slot = reuse._slot(engine.profile)
    assert (slot.login is not None) is (dialect == "postgresql")  # the login under way, to be taken
    with reuse.borrowed(engine) as loan:
        assert loan.conn is not None
    assert slot.login is None and slot.conn is not None  # taken, and kept idle for the attempt's end


@pytest.mark.parametrize("serialized", [True, False])
def test_a_profile_that_fails_ahead_fails_the_try_typed(
    serialized: bool, tmp_path: Path, profile_reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Preparing never raises: the try reads the profile again and raises the typed error there."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", file_conn(tmp_path / "missing.yml"))
    monkeypatch.setattr(_compat, "channel_serializes_threads", lambda: serialized)
    prepared = recorded_task().prepare_for_execution()
    with pytest.raises(ConfigurationError, match="missing.yml"):
        prepared._etl_craft_try_engine()
    assert profile_reads == [CONN_ID, CONN_ID] if serialized else profile_reads == [CONN_ID]


def test_the_finish_begins_its_engine_db_ahead(
    make_engine, profile_reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    """The claim and the finish begin their try's Engine DB the same way, with their step's module."""
    setup: EngineSetup = make_engine("sqlite")
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", file_conn(setup.config_path))
    monkeypatch.setattr(_compat, "channel_serializes_threads", lambda: True)
    finish = FinishPipelineRunOperator(task_id="finish", pipeline_code="SALES", etl_craft_conn_id=CONN_ID)
    prepared = finish.prepare_for_execution()
    ahead = prepared._etl_craft_ahead
    assert ahead is not None and ahead.steps == ("finish",)
    assert finish._etl_craft_ahead is None  # carried by the copy Airflow runs, not by the DAG's task
    assert prepared._engine("finish") is ahead.engine
    assert profile_reads == [CONN_ID]
