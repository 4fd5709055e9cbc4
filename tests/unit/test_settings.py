"""The ``[etl_craft]`` Airflow configuration: declared once, shown by ``airflow config list``, overridable by
``AIRFLOW__ETL_CRAFT__…``, and always beaten by an operator argument."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timedelta

import pytest

from airflow_provider_etl_craft._compat import DAG
from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.get_provider_info import get_provider_info
from airflow_provider_etl_craft.operators.pipeline_run import (
    ClaimPipelineRunOperator,
    FinishPipelineRunOperator,
)
from airflow_provider_etl_craft.settings import OPTIONS, setting
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline
from harness.airflow_home import airflow_cli


def test_the_provider_info_declares_every_option_with_its_default() -> None:
    options = get_provider_info()["config"]["etl_craft"]["options"]
    assert {name: o["default"] for name, o in options.items()} == {n: o.default for n, o in OPTIONS.items()}
    assert all(
        o["description"] and o["type"] in ("string", "integer", "float", "boolean") for o in options.values()
    )


@pytest.mark.parametrize(("raw", "expected"), [("True", True), ("false", False), ("1", True), ("off", False)])
def test_a_boolean_option_takes_airflows_spellings(
    raw: str, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__ETL_CRAFT__WAIT_LISTEN", raw)
    assert setting("wait_listen") is expected


def test_a_boolean_option_that_is_not_one_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__ETL_CRAFT__WAIT_LISTEN", "maybe")
    with pytest.raises(ValueError, match="wait_listen = 'maybe' is not a valid boolean"):
        setting("wait_listen")


def test_defaults_apply_when_nothing_is_configured() -> None:
    claim = ClaimPipelineRunOperator(task_id="claim", pipeline_code="SALES")
    assert (claim.poke_interval, claim.timeout, claim.mode, claim.etl_craft_lock_timeout, claim.etl_craft_conn_id) == (
        60.0, 21600.0, "reschedule", 60.0, "etl_craft_default",
    )  # fmt: skip


@pytest.mark.smoke
def test_airflow_configuration_overrides_the_defaults_and_operator_arguments_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {"DEFAULT_CONN_ID": "engine_prod", "CLAIM_POKE_INTERVAL": "5", "WAIT_MODE": "poke",
                        "LOCK_TIMEOUT": "12.5", "GATE_TIMEOUT": "30", "GATE_POKE_INTERVAL": "2"}.items():  # fmt: skip
        monkeypatch.setenv(f"AIRFLOW__ETL_CRAFT__{name}", value)
    claim = ClaimPipelineRunOperator(task_id="claim", pipeline_code="SALES")
    assert (claim.poke_interval, claim.mode, claim.etl_craft_lock_timeout, claim.etl_craft_conn_id) == (
        5.0, "poke", 12.5, "engine_prod",
    )  # fmt: skip
    finish = FinishPipelineRunOperator(task_id="finish", pipeline_code="SALES", etl_craft_lock_timeout=3)
    assert (finish.etl_craft_conn_id, finish.etl_craft_lock_timeout) == ("engine_prod", 3)
    assert [o.uri for o in finish.outlets] == ["etl-craft://engine_prod/SALES"]
    with (
        DAG("configured", schedule=None, start_date=datetime(2026, 1, 1)) as dag,
        etl_craft_pipeline("SALES"),
    ):

        @etl_craft_task(etl_craft_gate_poke_interval=7)
        def load():
            return 1

        load()
    task = dag.get_task("sales.load")
    assert (task.etl_craft_conn_id, task.etl_craft_gate_timeout, task.etl_craft_gate_poke_interval) == (
        "engine_prod", 30.0, 7.0,
    )  # fmt: skip
    assert dag.get_task("sales.claim").etl_craft_conn_id == "engine_prod"


def test_a_value_of_the_wrong_type_names_the_option_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__ETL_CRAFT__CLAIM_TIMEOUT", "six hours")
    with pytest.raises(ValueError, match=r"\[etl_craft\] claim_timeout = 'six hours' is not a valid float "
                                         r"\(AIRFLOW__ETL_CRAFT__CLAIM_TIMEOUT\)"):  # fmt: skip
        setting("claim_timeout")


@pytest.mark.smoke
def test_airflow_config_list_shows_the_section_with_an_override() -> None:
    env = {**os.environ, "AIRFLOW__ETL_CRAFT__GATE_TIMEOUT": "99"}
    command = [*airflow_cli(), "config", "list", "--section", "etl_craft", "--include-descriptions"]
    # Airflow 3.2 hides values unless asked (--show-values); 3.0 and 3.1 always show them and lack the flag.
    done = subprocess.run([*command, "--show-values"], env=env, capture_output=True, text=True, timeout=120)
    if done.returncode == 2 and "--show-values" in done.stderr:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[etl_craft]" in done.stdout and "gate_timeout = 99" in done.stdout
    assert "claim_poke_interval = 60" in done.stdout and "Seconds a claim may wait" in done.stdout


def test_the_docs_table_lists_every_option_as_declared() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text(encoding="utf-8")
    for option in OPTIONS.values():
        default = f"`{option.default}`" if option.default else "(empty)"
        row = f"| `{option.name}` | {option.type} | {default} | {option.description} |"
        assert row in page, row


def test_a_recorded_task_reads_its_defaults_when_a_try_uses_them_not_when_it_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A DAG parse builds every task of the file: a recorded task's lock and gate defaults are looked up in
    Airflow's configuration where the try reads them, so building one costs no lookup of them, and the value
    is the configuration of the process that runs the try. An argument still wins."""
    from airflow_provider_etl_craft import settings
    from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator

    looked_up: list[str] = []
    read = settings.setting
    monkeypatch.setattr(settings, "setting", lambda name: looked_up.append(name) or read(name))
    from airflow_provider_etl_craft.operators import task_run

    monkeypatch.setattr(task_run, "setting", settings.setting)
    task = EtlCraftPythonOperator(task_id="load", pipeline_code="SALES", python_callable=lambda: 1)
    given = EtlCraftPythonOperator(
        task_id="given", pipeline_code="SALES", python_callable=lambda: 1, etl_craft_lock_timeout=4,
        etl_craft_gate_timeout=timedelta(minutes=2), etl_craft_gate_poke_interval=3,
    )  # fmt: skip
    assert looked_up == []
    for name, value in {"LOCK_TIMEOUT": "12.5", "GATE_TIMEOUT": "30", "GATE_POKE_INTERVAL": "2"}.items():
        monkeypatch.setenv(f"AIRFLOW__ETL_CRAFT__{name}", value)
    timeouts = ("etl_craft_lock_timeout", "etl_craft_gate_timeout", "etl_craft_gate_poke_interval")
    assert [getattr(task, name) for name in timeouts] == [12.5, 30.0, 2.0]
    assert looked_up == ["lock_timeout", "gate_timeout", "gate_poke_interval"]
    assert [getattr(given, name) for name in timeouts] == [4.0, 120.0, 3.0]
