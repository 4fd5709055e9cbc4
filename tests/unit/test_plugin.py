"""The plugin loads on every supported line; the "Engine run" link points at the UI page of the DAG run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import airflow
import pytest

from airflow_provider_etl_craft.operators.pipeline_run import (
    ClaimPipelineRunOperator,
    FinishPipelineRunOperator,
)
from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator, recorded
from airflow_provider_etl_craft.plugins.links import EngineRunLink
from airflow_provider_etl_craft.plugins.routes import run_page

pytestmark = pytest.mark.smoke
AIRFLOW_LINE = tuple(int(part) for part in airflow.__version__.split(".")[:2])


def airflow(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    script = Path(sys.executable).with_name("airflow")
    return subprocess.run([str(script), *args], env=env, capture_output=True, text=True, timeout=300)


def test_airflow_lists_the_plugin_and_still_lists_providers(tmp_path: Path) -> None:
    done = airflow(tmp_path, "plugins", "-o", "json")
    assert done.returncode == 0, done.stderr
    # Airflow 3.0 logs to stdout before the document: the document is the line that parses as a list.
    plugins = next(json.loads(line) for line in done.stdout.splitlines() if line.startswith("[{"))
    (plugin,) = [p for p in plugins if p["name"] == "etl_craft"]
    assert [(a["url_prefix"], a["name"]) for a in plugin["fastapi_apps"]] == [("/etl-craft", "etl-craft")]
    if AIRFLOW_LINE >= (3, 1):  # 3.0 has no external views (nor lists them)
        assert {(v["destination"], v["href"]) for v in plugin["external_views"]} == {
            ("nav", "etl-craft/ui/"),
            ("dag_run", "etl-craft/ui/?dag_id={DAG_ID}&run_id={RUN_ID}"),
        }
    assert "Failed to" not in done.stderr and "Traceback" not in done.stderr
    listed = airflow(tmp_path, "providers", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert "airflow-provider-etl-craft" in listed.stdout
    links = airflow(tmp_path, "providers", "links", "-o", "json")
    assert "airflow_provider_etl_craft.plugins.links.EngineRunLink" in links.stdout


def test_the_api_app_imports_on_this_line() -> None:
    """Airflow 3.0 has no plugin UI, but the API (and its auth-manager dependencies) must import there too."""
    from airflow_provider_etl_craft.plugins.api import app

    paths = {route.path for route in app.routes}  # type: ignore[attr-defined]
    assert {
        "/api/v1/pipelines",
        "/api/v1/runs/{pipeline_run_id}",
        "/openapi.json",
        "/ui/{name:path}",
    } <= paths


def test_the_link_is_relative_to_the_base_url_and_encodes_its_values() -> None:
    assert run_page("d", "manual__2026-01-01T00:00:00+00:00") == (
        "etl-craft/ui/?dag_id=d&run_id=manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    )
    assert run_page("d", "r", "etl_craft_pg", "https://airflow.example/prefix/") == (
        "https://airflow.example/prefix/etl-craft/ui/?dag_id=d&run_id=r&conn_id=etl_craft_pg"
    )
    claim = ClaimPipelineRunOperator(task_id="claim", pipeline_code="SALES", etl_craft_conn_id="etl_craft_pg")
    key = SimpleNamespace(dag_id="sales_dag", run_id="r&1")
    assert (
        EngineRunLink()
        .get_link(claim, ti_key=key)
        .endswith("etl-craft/ui/?dag_id=sales_dag&run_id=r%261&conn_id=etl_craft_pg")
    )


@pytest.mark.parametrize("operator_class", [ClaimPipelineRunOperator, FinishPipelineRunOperator])
def test_the_claim_and_the_finish_carry_the_engine_run_link(operator_class: type) -> None:
    assert [link.name for link in operator_class.operator_extra_links] == ["Engine run"]


def test_recorded_operators_keep_their_own_links_and_add_none_by_default() -> None:
    from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator

    from airflow_provider_etl_craft.decorators.etl_craft_task import _EtlCraftDecoratedOperator

    own = [link.name for link in SQLExecuteQueryOperator.operator_extra_links]
    assert [link.name for link in recorded(SQLExecuteQueryOperator).operator_extra_links] == own
    assert [link.name for link in EtlCraftPythonOperator.operator_extra_links] == []
    assert [link.name for link in _EtlCraftDecoratedOperator.operator_extra_links] == []


def test_recorded_task_link_adds_the_engine_run_link_to_recorded_operators(tmp_path: Path) -> None:
    # Read when the classes are made, at import: a fresh interpreter with the option set.
    script = """
import json
from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator
from airflow_provider_etl_craft.decorators.etl_craft_task import _EtlCraftDecoratedOperator
from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator, recorded
names = lambda cls: [link.name for link in cls.operator_extra_links]
print(json.dumps([names(SQLExecuteQueryOperator), names(recorded(SQLExecuteQueryOperator)),
                  names(EtlCraftPythonOperator), names(_EtlCraftDecoratedOperator)]))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__ETL_CRAFT__")}
    env.update(AIRFLOW_HOME=str(tmp_path), AIRFLOW__ETL_CRAFT__RECORDED_TASK_LINK="True")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    own, sql, python, decorated = json.loads(done.stdout.strip().splitlines()[-1])
    assert sql == [*own, "Engine run"]
    assert python == decorated == ["Engine run"]


def test_the_plugin_and_recorded_tasks_load_no_operator_link_class_while_the_link_is_off(
    tmp_path: Path,
) -> None:
    """Every task process loads every plugin, plain tasks' included: ours needs only its routes. A recorded
    task with ``recorded_task_link`` off (the default) has no link to make either, and the claim and the finish
    (parsed by every task process of a pipeline DAG) make theirs when Airflow reads them (docs/performance.md)."""
    script = """
import sys
import airflow.plugins_manager, airflow.sdk
from airflow.providers.standard.operators.python import PythonOperator
before = set(sys.modules)
from airflow_provider_etl_craft.plugins.plugin import EtlCraftPlugin
from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator
from airflow_provider_etl_craft.operators.pipeline_run import ClaimPipelineRunOperator
from airflow_provider_etl_craft.task_groups.pipeline import etl_craft_pipeline
ClaimPipelineRunOperator(task_id="claim", pipeline_code="SALES")
link_modules = lambda: sorted(m for m in set(sys.modules) - before if m.endswith(("operatorlink", "plugins.links")))
print(link_modules())
assert [link.name for link in ClaimPipelineRunOperator.operator_extra_links] == ["Engine run"]
print(link_modules())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__ETL_CRAFT__")}
    env.update(AIRFLOW_HOME=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    before_read, after_read = done.stdout.strip().splitlines()[-2:]
    assert before_read == "[]"
    assert "airflow_provider_etl_craft.plugins.links" in after_read  # Airflow reading the links loads them
