"""The etl-craft page in the real Airflow UI, driven by a real browser (Debian's chromium, headless).

Sign in, open the etl-craft navigation entry, open a pipeline, pause it with a reason, see the pause,
resume it, open a run, open the Engine run tab of a DAG run; a viewer's pause is refused; the pipeline
page's duration chart and the run page's timeline are drawn (docs/ui.md). Each page is
checked by its text and saved as a PNG under the test's tmp_path. With ``ETL_CRAFT_SCREENSHOTS=<dir>``
the screenshots of the README and docs/ui.md are written there too (``make screenshots``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_etl_craft.runs.counts import TaskCounts
from airflow_provider_etl_craft.runs.gates import GateSkipped
from airflow_provider_etl_craft.runs.identity import RunIdentity
from harness.airflow_home import airflow_cli
from harness.deployment import AirflowDeployment
from harness.engines import engine_rows
from tests.web.conftest import needs_plugin_ui, shot, sign_in

if TYPE_CHECKING:
    from playwright.sync_api import FrameLocator, Locator, Page

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


#: The history before the test's run: daily runs of DAILY_SALES (SLA 2 hours) in November, their durations
#: in minutes; two failed, two took longer than the SLA.
HISTORY_DAYS = 30
FAILED_DAYS = {14, 26}
BREACH_MINUTES = {9: 141, 22: 156}
IDLE = "WEB_IDLE"
#: A pipeline whose one run took a moment against an SLA of a day.
QUICK = "WEB_QUICK"


def history_minutes(day: int) -> int:
    return BREACH_MINUTES.get(day, 46 + (day * 53) % 29 + (day * 17) % 13)


def execute(setup: Any, sql: str, params: tuple[Any, ...]) -> None:
    hook = setup.hook()
    with closing(hook.engine.connect()) as conn:
        hook.engine.execute(conn, sql, params)


def write_history(setup: Any) -> dict[int, int]:
    """HISTORY_DAYS runs of DAILY_SALES through the lifecycle (FAILED_DAYS: LOAD_ORDERS failed), then moved to
    November's mornings with their durations and SLA verdicts (the lifecycle takes its times from the
    database clock, so a test's runs would all last a few milliseconds); their ids by day. And WEB_IDLE, a
    pipeline without runs."""
    ids = {}
    with setup.hook().lifecycle() as lc:
        for day in range(1, HISTORY_DAYS + 1):
            who = RunIdentity(
                "web_ui_history", f"scheduled__2026-11-{day:02}", datetime(2026, 11, day, 6, tzinfo=UTC)
            )
            ids[day] = lc.claim(PIPELINE, who).pipeline_run_id
            lc.finish_task(
                lc.start_task(PIPELINE, "EXTRACT_ORDERS", who, 1), "SUCCESS", TaskCounts(rows_written=9)
            )
            failed = day in FAILED_DAYS
            lc.finish_task(
                lc.start_task(PIPELINE, "LOAD_ORDERS", who, 1),
                "FAILED" if failed else "SUCCESS",
                TaskCounts(rows_written=0 if failed else 9),
                error="timeout" if failed else None,
            )
            lc.finish_run(PIPELINE, who, {"EXTRACT_ORDERS": "success", "LOAD_ORDERS": "failed" if failed else "success",
                                          "BUILD_SALES_MART": "upstream_failed" if failed else "skipped",
                                          "NOTIFY_FAILURE": "success" if failed else "skipped"})  # fmt: skip
    engine = setup.hook().engine
    for day, run_id in ids.items():
        start = datetime(2026, 11, day, 6, 0, tzinfo=UTC)
        end = start + timedelta(minutes=history_minutes(day))
        sla = "BREACHED" if end - start > timedelta(hours=2) else "MET"
        execute(setup, "UPDATE AUD_PIPELINES_RUN_LOG SET START_DATE = ?, END_DATE = ?, SLA_STATUS = ? "
                "WHERE PIPELINE_RUN_ID = ?", (engine.to_db_time(start), engine.to_db_time(end), sla, run_id))  # fmt: skip
    execute(setup, "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE) VALUES (?, ?, ?)",
            (IDLE, "Never run", "FULL"))  # fmt: skip
    execute(setup, "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, SLA_IN_HOURS) "
            "VALUES (?, ?, ?, ?)", (QUICK, "Fast, with a day's SLA", "FULL", 24))  # fmt: skip
    who = RunIdentity("web_ui_quick", "manual__quick", datetime(2026, 11, 30, 6, tzinfo=UTC))
    with setup.hook().lifecycle() as lc:
        lc.claim(QUICK, who)
        lc.finish_run(QUICK, who, {})
    return ids


#: Where the test run's attempts lie, in seconds from the gate decision that skipped BUILD_SALES_MART (the gate's
#: rows are append-only, so the other times are placed around it): (task, attempt) -> (start, end, parked at).
TIMELINE = {
    ("EXTRACT_ORDERS", 1): (-2270, -1980, -2160),
    ("LOAD_ORDERS", 1): (-1970, -1800, None),
    ("LOAD_ORDERS", 2): (-1500, -10, None),
}


def spread_over_the_morning(setup: Any, run_id: int) -> None:
    """Place the test run's attempts, task runs and run on a realistic morning (see :data:`TIMELINE`)."""
    engine = setup.hook().engine
    ((decided,),) = engine_rows(setup.hook(), "SELECT MAX(DECIDED_AT) FROM AUD_GATE_DECISIONS WHERE PIPELINE_RUN_ID = ?",
                                (run_id,))  # fmt: skip
    anchor = engine.from_db_time(decided)
    assert anchor is not None

    def at(seconds: int | None) -> Any:
        return None if seconds is None else engine.to_db_time(anchor + timedelta(seconds=seconds))

    task_run = ("(SELECT tr.TASK_RUN_ID FROM AUD_TASK_RUN_LOG tr JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
                "WHERE tr.PIPELINE_RUN_ID = ? AND t.TASK_CODE = ?)")  # fmt: skip
    for (task, number), (start, end, parked) in TIMELINE.items():
        execute(setup, f"UPDATE AUD_TASK_ATTEMPTS SET CLAIMED_AT = ?, STARTED_AT = ?, ENDED_AT = ?, QUEUED_AT = ? "  # noqa: S608
                f"WHERE ATTEMPT_NUMBER = ? AND TASK_RUN_ID = {task_run}",
                (at(start), at(start), at(end), at(parked), number, run_id, task))  # fmt: skip
    for task in ("EXTRACT_ORDERS", "LOAD_ORDERS"):
        spans = [(s, e) for (t, _), (s, e, _) in TIMELINE.items() if t == task]
        execute(setup, f"UPDATE AUD_TASK_RUN_LOG SET START_DATE = ?, END_DATE = ? WHERE TASK_RUN_ID = {task_run}",  # noqa: S608
                (at(min(s for s, _ in spans)), at(max(e for _, e in spans)), run_id, task))  # fmt: skip
    execute(setup, "UPDATE AUD_PIPELINES_RUN_LOG SET START_DATE = ?, END_DATE = ? WHERE PIPELINE_RUN_ID = ?",
            (at(-2280), at(20), run_id))  # fmt: skip
    # Each gate decision to its attempt's start, where the lifecycle writes it; the table is append-only, so its
    # guard is lifted for this one statement (PostgreSQL: the Engine DB's owner may).
    guard = "TR_AUD_GATE_DECISIONS_APPEND_ONLY"
    execute(setup, f"ALTER TABLE AUD_GATE_DECISIONS DISABLE TRIGGER {guard}", ())
    try:
        execute(setup, "UPDATE AUD_GATE_DECISIONS g SET DECIDED_AT = (SELECT a.STARTED_AT FROM AUD_TASK_ATTEMPTS a "
                "WHERE a.ATTEMPT_ID = g.ATTEMPT_ID) WHERE g.PIPELINE_RUN_ID = ? AND g.ATTEMPT_ID IS NOT NULL",
                (run_id,))  # fmt: skip
    finally:
        execute(setup, f"ALTER TABLE AUD_GATE_DECISIONS ENABLE TRIGGER {guard}", ())


@pytest.fixture(scope="module")
def engine_run(airflow_web: AirflowDeployment) -> EngineRun:
    """A DAG run of a parsed DAG, and its Engine run of DAILY_SALES in ``etl_craft_default``: an EXTRACT_ORDERS
    parked once (a reschedule) and taken over, a retried LOAD_ORDERS that loaded nothing, so the mart's HAS_DATA
    gate skipped it; a month of older runs before it (:func:`write_history`)."""
    web = airflow_web
    setup = web.default.setup
    setup.hook().migrate(setup.config_path.parent / "migrations")
    write_history(setup)
    (web.dags / f"{DAG_ID}.py").write_text(DAG_FILE)
    done = subprocess.run([*airflow_cli(), "dags", "reserialize"], env=web.env, cwd=web.root,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    dag_run_id = web.trigger(DAG_ID)
    who = RunIdentity(DAG_ID, dag_run_id, datetime(2026, 12, 1, 6, 0, tzinfo=UTC))
    with setup.hook().lifecycle() as lc:
        run_id = lc.claim(PIPELINE, who).pipeline_run_id
        lc.park_task(lc.start_task(PIPELINE, "EXTRACT_ORDERS", who, 1), "waiting for the orders file")
        lc.finish_task(
            lc.start_task(PIPELINE, "EXTRACT_ORDERS", who, 1, resume=True),
            "SUCCESS",
            TaskCounts(rows_written=12),
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
    spread_over_the_morning(setup, run_id)
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


def keep_part(locator: Locator, folder: Path, name: str) -> Path:
    """Screenshot of one part of the page into ``folder`` and, with ETL_CRAFT_SCREENSHOTS, into that folder."""
    path = folder / f"{name}.png"
    locator.screenshot(path=str(path))
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

    # The same page on its own (its own URL works too), full height for the README and docs/ui.md.
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


#: Pixels of the chart's canvas near each mark's colour (the colours of app.js's CHART), counted in the page.
COUNT_COLOURS = """(canvas) => {
  const {data} = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height);
  const near = ([r, g, b]) => {
    let n = 0;
    for (let i = 0; i < data.length; i += 4) {
      if (data[i + 3] > 200 && Math.abs(data[i] - r) < 12 && Math.abs(data[i + 1] - g) < 12 && Math.abs(data[i + 2] - b) < 12) n++;
    }
    return n;
  };
  return {duration: near([21, 88, 176]), failed: near([179, 38, 30]), breached: near([217, 142, 0]), sla: near([123, 31, 162])};
}"""


def test_the_pipeline_page_charts_the_durations_of_recent_runs(
    web: AirflowDeployment, page: Page, engine_run: EngineRun, tmp_path: Path
) -> None:
    """The chart is drawn (a canvas with size, its legend), failed runs and SLA breaches are marked and listed,
    the SLA is a line; a pipeline without runs says so and its page still works."""
    from playwright.sync_api import expect

    sign_in(page, "viewer")
    page.goto(f"/etl-craft/ui/#/pipelines/{PIPELINE}")
    trend = page.get_by_test_id("trend")
    canvas = trend.locator("canvas")
    expect(canvas).to_be_visible()
    box = canvas.bounding_box()
    assert box is not None and box["width"] > 400 and box["height"] > 150
    for words in ("Duration", "Failed", "SLA breached", "SLA (2 h)"):  # the legend (the axes are drawn)
        expect(trend.locator(".u-legend")).to_contain_text(words)
    expect(trend.get_by_test_id("trend-chart")).to_have_attribute("data-unit", "min")
    runs = engine_rows(
        web.default.setup.hook(),
        "SELECT r.PIPELINE_RUN_ID, r.STATUS, r.SLA_STATUS FROM AUD_PIPELINES_RUN_LOG r "
        "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ? ORDER BY 1",
        (PIPELINE,),
    )
    failed = [f"#{run_id}" for run_id, status, _ in runs if status == "FAILED"]
    breached = [f"#{run_id}" for run_id, _, sla in runs if sla == "BREACHED"]
    assert (len(failed), len(breached)) == (len(FAILED_DAYS), len(BREACH_MINUTES))
    expect(page.get_by_test_id("trend-summary")).to_contain_text(
        f"The last {len(runs)} finished runs (at most 50): 2 failed, 2 breached the SLA (SLA 2 h)"
    )
    expect(page.get_by_test_id("trend-failed")).to_have_text("Failed: " + ", ".join(failed))
    expect(page.get_by_test_id("trend-breached")).to_have_text("SLA breached: " + ", ".join(breached))
    pixels = canvas.first.evaluate(COUNT_COLOURS)
    assert pixels["duration"] > 100 and pixels["failed"] > 20 and pixels["breached"] > 20, pixels
    assert pixels["sla"] > 100, pixels  # the dashed SLA line across the chart
    keep_part(page.get_by_test_id("trend").locator(".."), tmp_path, "pipeline-trend")

    # A point opens its run.
    page.get_by_test_id("trend-failed").get_by_role("link", name=failed[0]).click()
    expect(page.get_by_role("heading", name=f"Run {failed[0][1:]}")).to_be_visible()

    # An SLA far above every run: the axis follows the runs, the legend says where the SLA is.
    page.goto(f"/etl-craft/ui/#/pipelines/{QUICK}")
    quick = page.get_by_test_id("trend")
    expect(quick.locator(".u-legend")).to_contain_text("SLA (24 h)24 h, above the chart")  # the colon is CSS
    expect(quick.get_by_test_id("trend-chart")).to_have_attribute("data-unit", "s")
    # One run: one point, whose antialiased pixel count depends on where its time falls between pixels.
    pixels = quick.locator("canvas").first.evaluate(COUNT_COLOURS)
    assert pixels["duration"] > 0 and pixels["sla"] == 0, pixels

    page.goto(f"/etl-craft/ui/#/pipelines/{IDLE}")
    expect(page.get_by_role("heading", name=f"Pipeline {IDLE}")).to_be_visible()
    expect(page.get_by_test_id("trend-empty")).to_have_text("No finished run yet: nothing to chart.")
    expect(page.get_by_test_id("runs-table")).to_have_text("No run yet.")
    expect(page.get_by_test_id("pause-control")).to_be_visible()
    assert page.locator("canvas").count() == 0


def test_the_run_page_draws_each_attempt_on_a_timeline(
    web: AirflowDeployment, page: Page, engine_run: EngineRun, tmp_path: Path
) -> None:
    """A row per task run, a bar per attempt in time order coloured by status, the retry's gap, the parked
    attempt's mark and the gate decision that skipped the mart."""
    from playwright.sync_api import expect

    sign_in(page, "viewer")
    page.goto(f"/etl-craft/ui/#/runs/{engine_run.pipeline_run_id}")
    gantt = page.get_by_test_id("gantt")
    expect(gantt.get_by_test_id("gantt-svg")).to_be_visible()
    ((attempts,),) = engine_rows(
        web.default.setup.hook(),
        "SELECT COUNT(*) FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "
        "WHERE tr.PIPELINE_RUN_ID = ?",
        (engine_run.pipeline_run_id,),
    )
    bars = gantt.get_by_test_id("gantt-attempt")
    expect(bars).to_have_count(int(attempts))
    load = gantt.locator('[data-row="LOAD_ORDERS"]')
    tries = load.get_by_test_id("gantt-attempt")
    assert tries.evaluate_all("(bars) => bars.map((b) => b.dataset.status)") == ["FAILED", "SUCCESS"]
    first, second = (tries.nth(i).bounding_box() for i in range(2))
    assert first is not None and second is not None
    assert 0 < first["width"] < second["width"] and first["x"] + first["width"] < second["x"]
    assert tries.evaluate_all("(bars) => bars.map((b) => getComputedStyle(b).fill)") == [
        "rgb(198, 40, 40)",
        "rgb(46, 125, 50)",
    ]
    expect(load.get_by_test_id("gantt-retry")).to_have_count(1)
    expect(load.get_by_test_id("gantt-retry").locator("title")).to_contain_text(
        "Retry: attempt 2 started 5 min"
    )
    expect(gantt.locator('[data-row="EXTRACT_ORDERS"]').get_by_test_id("gantt-parked")).to_have_count(1)
    gate = gantt.locator('[data-row="BUILD_SALES_MART"]').get_by_test_id("gantt-gate")
    expect(gate).to_have_attribute("data-result", "UNSATISFIED")
    for words in ("success", "failed", "parked", "retry gap", "gate decision"):
        expect(gantt.get_by_test_id("gantt-legend")).to_contain_text(words)
    expect(gantt).to_contain_text("LOAD_ORDERS")
    keep_part(gantt.locator(".."), tmp_path, "run-gantt")
