"""The etl-craft page in the real Airflow UI, driven by a real browser (Debian's chromium, headless).

Sign in, open the etl-craft navigation entry, open a pipeline, pause it with a reason, see the pause,
resume it, open a run, open the Engine run tab of a DAG run; a viewer's pause is refused. Each page is
checked by its text and saved as a PNG under the test's tmp_path. With ``ETL_CRAFT_SCREENSHOTS=<dir>``
the README's screenshots are written there too (``make screenshots``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_etl_craft.runs.counts import TaskCounts
from airflow_provider_etl_craft.runs.gates import GateSkipped
from airflow_provider_etl_craft.runs.identity import RunIdentity
from tests.conftest import engine_rows
from tests.deployment.harness import AirflowDeployment
from tests.fixtures.fix_airflow import airflow_cli
from tests.web.conftest import needs_plugin_ui, shot, sign_in

if TYPE_CHECKING:
    from playwright.sync_api import FrameLocator, Page

pytestmark = [pytest.mark.web, pytest.mark.postgres, pytest.mark.smoke, needs_plugin_ui]

DAG_ID = "web_ui_daily_sales"
PIPELINE = "DAILY_SALES"
SCREENSHOTS_ENV = "ETL_CRAFT_SCREENSHOTS"
DAG_FILE = f'''\
from datetime import datetime

from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG("{DAG_ID}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    EmptyOperator(task_id="noop")
'''


@dataclass
class EngineRun:
    dag_run_id: str
    pipeline_run_id: int


@pytest.fixture(scope="module")
def engine_run(airflow_web: AirflowDeployment) -> EngineRun:
    """A DAG run of a parsed DAG, and its Engine run of DAILY_SALES in ``etl_craft_default``: a retried
    LOAD_ORDERS that loaded nothing, so the mart's HAS_DATA gate skipped it."""
    web = airflow_web
    setup = web.default.setup
    setup.hook().migrate(setup.config_path.parent / "migrations")
    (web.dags / f"{DAG_ID}.py").write_text(DAG_FILE)
    done = subprocess.run([*airflow_cli(), "dags", "reserialize"], env=web.env, cwd=web.root,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    dag_run_id = web.trigger(DAG_ID)
    who = RunIdentity(DAG_ID, dag_run_id, datetime(2026, 12, 1, 6, 0, tzinfo=UTC))
    with setup.hook().lifecycle() as lc:
        run_id = lc.claim(PIPELINE, who).pipeline_run_id
        lc.finish_task(
            lc.start_task(PIPELINE, "EXTRACT_ORDERS", who, 1), "SUCCESS", TaskCounts(rows_written=12)
        )
        lc.finish_task(lc.start_task(PIPELINE, "LOAD_ORDERS", who, 1), "FAILED",
                       error="OperationalError: connection reset by the warehouse")  # fmt: skip
        lc.finish_task(lc.start_task(PIPELINE, "LOAD_ORDERS", who, 2), "SUCCESS", TaskCounts(rows_written=0))
        with pytest.raises(GateSkipped):
            lc.start_task(PIPELINE, "BUILD_SALES_MART", who, 1)
        states = {"EXTRACT_ORDERS": "success", "LOAD_ORDERS": "success", "BUILD_SALES_MART": "skipped",
                  "NOTIFY_FAILURE": "skipped"}  # fmt: skip
        lc.finish_run(PIPELINE, who, states)
    assert run_id is not None
    return EngineRun(dag_run_id, run_id)


def frame(page: Page) -> FrameLocator:
    """The etl-craft page inside Airflow's plugin frame."""
    return page.frame_locator("iframe")


def keep(page: Page, name: str) -> Path:
    """Screenshot into the test's tmp_path and, with ETL_CRAFT_SCREENSHOTS, into that folder."""
    path = shot(page, name)
    if folder := os.environ.get(SCREENSHOTS_ENV):
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(folder) / path.name)
    return path


def pause_rows(web: AirflowDeployment) -> list[tuple[Any, ...]]:
    return engine_rows(
        web.default.setup.hook(),
        "SELECT PAUSED_BY, PAUSED_BY_KIND, REASON, RESUMED_BY, RESUME_REASON FROM AUD_PIPELINE_PAUSES "
        "ORDER BY PIPELINE_PAUSE_ID",
    )


def confirm(ui: FrameLocator, button: str, reason: str) -> None:
    ui.get_by_role("button", name=button, exact=True).click()
    ui.get_by_label("Reason").fill(reason)
    ui.get_by_role("button", name="Confirm").click()


def test_an_operator_pauses_resumes_and_reads_runs_in_the_airflow_ui(
    web: AirflowDeployment, page: Page, engine_run: EngineRun
) -> None:
    from playwright.sync_api import expect

    sign_in(page, "admin")
    page.get_by_role("link", name="etl-craft").click()
    ui = frame(page)
    expect(ui.get_by_role("heading", name="Pipelines")).to_be_visible()
    expect(ui.get_by_test_id("pipelines-table")).to_contain_text(PIPELINE)
    expect(ui.get_by_test_id("pipelines-table")).to_contain_text("SUCCESS")
    keep(page, "pipelines")

    ui.get_by_role("link", name=PIPELINE).first.click()
    expect(ui.get_by_role("heading", name=f"Pipeline {PIPELINE}")).to_be_visible()
    expect(ui.get_by_test_id("runs-table")).to_contain_text(str(engine_run.pipeline_run_id))
    expect(ui.get_by_test_id("not-paused")).to_be_visible()

    confirm(ui, "Pause", "warehouse upgrade tonight")
    banner = ui.get_by_test_id("pause-banner")
    expect(banner).to_contain_text("warehouse upgrade tonight")
    expect(banner).to_contain_text("admin")
    keep(page, "pipeline")
    assert pause_rows(web) == [("admin", "HUMAN", "warehouse upgrade tonight", None, None)]

    confirm(ui, "Resume", "upgrade done")
    expect(ui.get_by_test_id("not-paused")).to_be_visible()
    assert pause_rows(web) == [("admin", "HUMAN", "warehouse upgrade tonight", "admin", "upgrade done")]

    ui.get_by_test_id("runs-table").get_by_role("link", name=str(engine_run.pipeline_run_id)).click()
    expect(ui.get_by_role("heading", name=f"Run {engine_run.pipeline_run_id}")).to_be_visible()
    expect(ui.get_by_test_id("task-runs-table")).to_contain_text("LOAD_ORDERS")
    failed_try = ui.get_by_test_id("attempts-table").filter(has_text="connection reset by the warehouse")
    expect(failed_try).to_have_count(1)
    expect(failed_try).to_contain_text("FAILED")
    gates = ui.get_by_test_id("gate-decisions-table")
    expect(gates).to_contain_text("BUILD_SALES_MART")
    expect(gates).to_contain_text("UNSATISFIED")
    keep(page, "run-in-airflow")

    # The same page on its own (its own URL works too), full height for the README.
    page.goto(f"/etl-craft/ui/#/runs/{engine_run.pipeline_run_id}")
    expect(page.get_by_test_id("gate-decisions-table")).to_contain_text("was not run")
    keep(page, "run")


def test_the_dag_run_page_has_an_engine_run_tab(
    web: AirflowDeployment, page: Page, engine_run: EngineRun
) -> None:
    from playwright.sync_api import expect

    sign_in(page, "viewer")
    page.goto(f"/dags/{DAG_ID}/runs/{engine_run.dag_run_id}")
    page.get_by_role("tab", name="Engine run").or_(page.get_by_role("link", name="Engine run")).first.click()
    expect(page).to_have_url(re.compile(r"/plugin/etl-craft-run$"))
    ui = frame(page)
    expect(ui.get_by_role("heading", name=f"Run {engine_run.pipeline_run_id}")).to_be_visible()
    expect(ui.get_by_test_id("run-summary")).to_contain_text(f"airflow:{DAG_ID}:{engine_run.dag_run_id}")
    keep(page, "dag-run")


def test_a_viewer_cannot_pause(web: AirflowDeployment, page: Page, engine_run: EngineRun) -> None:
    from playwright.sync_api import expect

    before = pause_rows(web)
    sign_in(page, "viewer")
    page.goto("/plugin/etl-craft")
    ui = frame(page)
    ui.get_by_role("link", name=PIPELINE).first.click()
    confirm(ui, "Pause", "should not happen")
    expect(ui.get_by_text(re.compile("HTTP 403"))).to_be_visible()
    assert pause_rows(web) == before
