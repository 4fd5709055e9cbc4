"""The provider dict is valid for Airflow, and Airflow's own CLI discovers the provider and its hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources

import jsonschema
import pytest

from airflow_provider_etl_craft.get_provider_info import get_provider_info
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from harness.airflow_home import airflow_cli

pytestmark = pytest.mark.smoke


def test_provider_info_validates_against_airflows_schema() -> None:
    schema = json.loads((resources.files("airflow") / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_connection_type_points_at_the_hook_and_declares_its_form() -> None:
    (conn_type,) = get_provider_info()["connection-types"]
    assert conn_type["connection-type"] == EngineDBHook.conn_type == "etl_craft"
    module, _, name = conn_type["hook-class-name"].rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) is EngineDBHook
    assert {"config_path", "profile", "jdbc_url", "engine_schema", "auth_mode"} <= set(
        conn_type["conn-fields"]
    )
    assert conn_type["ui-field-behaviour"]["relabeling"]["schema"] == "Database"


def test_the_ui_connection_form_shows_the_extra_fields_and_the_relabelled_standard_ones() -> None:
    """What the UI's hook metadata endpoint serves: 3.0/3.1 from the hook's WTForms, 3.2+ from conn-fields."""
    from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService

    HookMetaService.hook_meta_data.cache_clear()
    (meta,) = [m for m in HookMetaService.hook_meta_data() if m.connection_type == "etl_craft"]
    extra = meta.extra_fields or {}
    assert {"config_path", "profile", "jdbc_url", "engine_schema", "auth_mode"} <= set(extra)
    assert extra["config_path"]["schema"]["title"] == "craft-connector.yml path"
    assert "oauth" in extra["auth_mode"]["schema"]["enum"]
    assert meta.standard_fields is not None
    titles = {field["title"] for field in meta.standard_fields.model_dump().values() if field}
    assert {"Database", "User"} <= titles


def json_array(stdout: str) -> list[dict]:
    """The JSON array a CLI command printed; Airflow 3.0 may print log lines (``[2026-…] {…} INFO``) first."""
    decoder = json.JSONDecoder()
    for line in stdout.splitlines():
        if line.startswith("[{") or line.strip() == "[]":
            rows, _ = decoder.raw_decode(stdout[stdout.index(line) :])
            return rows
    raise AssertionError(f"no JSON array in the output: {stdout[-2000:]}")


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["providers", "list", "--output", "json"], "airflow-provider-etl-craft"),
        (["providers", "hooks", "--output", "json"], "etl_craft"),
    ],
    ids=["providers-list", "providers-hooks"],
)
def test_airflow_cli_discovers_the_provider(command: list[str], expected: str) -> None:
    done = subprocess.run(
        [*airflow_cli(), *command], capture_output=True, text=True, env=os.environ.copy(), timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json_array(done.stdout)
    assert any(expected in json.dumps(row) for row in rows), done.stdout[-2000:]
    if "hooks" in command:
        (row,) = [r for r in rows if r.get("connection_type") == "etl_craft"]
        assert row["class"] == "airflow_provider_etl_craft.hooks.engine_db.EngineDBHook"


def test_every_listed_module_imports_and_the_task_decorator_is_reachable_as_task_etl_craft() -> None:
    import importlib

    from airflow.sdk import DAG, task

    info = get_provider_info()
    for group in ("hooks", "operators"):
        for entry in info[group]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    (decorator,) = info["task-decorators"]
    with DAG("provider_info_decorator", schedule=None):

        @task.etl_craft(pipeline_code="DAILY_SALES")
        def load_orders() -> int:
            return 1

        operator = load_orders().operator
    assert (operator.pipeline_code, operator.task_code) == ("DAILY_SALES", "LOAD_ORDERS")
    assert decorator["name"] == "etl_craft"


def test_the_literals_airflow_reads_match_their_sources() -> None:
    """``_provider_info_derived.py`` is written by ``make provider-info``; rerun it when this fails."""
    from airflow_provider_etl_craft import _provider_info_derived
    from airflow_provider_etl_craft.provider_info_source import derived

    for name, value in derived().items():
        assert getattr(_provider_info_derived, name) == value, name
    assert get_provider_info()["config"] == derived()["CONFIG"]


def test_reading_the_provider_info_loads_no_other_module_of_the_provider() -> None:
    """Airflow reads it (and the ``[etl_craft]`` options) in every process it starts, plain tasks' included."""
    probe = (
        "import sys\n"
        "from airflow.configuration import conf\n"
        "assert conf.get('etl_craft', 'lock_timeout')\n"
        "from airflow.providers_manager import ProvidersManager\n"
        "assert 'airflow-provider-etl-craft' in ProvidersManager().providers\n"
        "print(sorted(m for m in sys.modules if m.startswith('airflow_provider_etl_craft')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=os.environ.copy(), timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = done.stdout.strip().splitlines()[-1]
    assert loaded == (
        "['airflow_provider_etl_craft', 'airflow_provider_etl_craft._provider_info_derived', "
        "'airflow_provider_etl_craft.get_provider_info']"
    )
