"""The plugin's REST API in a real api-server, on both engines: the CLI's documents, Airflow's auth, hostile input."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_provider_etl_craft.cli.main import main
from harness.deployment import AirflowDeployment
from harness.engines import EngineSetup, engine_rows
from tests.fixtures.run_history import Runs, add_gate_and_intervention, write_runs

pytestmark = [pytest.mark.web, pytest.mark.postgres, pytest.mark.smoke]

API = "/etl-craft/api/v1"
ENGINES = ("pg", "sqlite")


def cli_doc(setup: EngineSetup, *args: str) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    status = main([*args, "--config", str(setup.config_path), "--format", "json"], out, err)
    assert (status, err.getvalue()) == (0, "")
    return json.loads(out.getvalue())


def cli_error(setup: EngineSetup, *args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main([*args, "--config", str(setup.config_path)], out, err)
    return status, err.getvalue().strip().removeprefix("error: ")


@pytest.fixture(scope="module")
def engine_runs(
    airflow_web: AirflowDeployment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[EngineSetup, Runs]]]:
    """The SALES/OTHER/IDLE runs of the CLI tests, written once into each Engine DB of the web tier."""
    found = {}
    for name in ENGINES:
        setup = airflow_web.engines[name].setup
        runs = write_runs(setup, tmp_path_factory.mktemp(f"runs-{name}"))
        add_gate_and_intervention(setup, runs.failed)
        found[name] = (setup, runs)
    yield found


@pytest.fixture(params=ENGINES)
def engine(
    request: pytest.FixtureRequest, engine_runs: dict[str, tuple[EngineSetup, Runs]], web: Any
) -> tuple[EngineSetup, Runs, str]:
    setup, runs = engine_runs[request.param]
    return setup, runs, web.engines[request.param].conn_id


@pytest.fixture
def admin(web: Any) -> Iterator[httpx.Client]:
    with web.client("admin") as client:
        yield client


@pytest.fixture
def viewer(web: Any) -> Iterator[httpx.Client]:
    with web.client("viewer") as client:
        yield client


@pytest.fixture
def nobody(web: Any) -> Iterator[httpx.Client]:
    with web.client(None) as client:
        yield client


def get(client: httpx.Client, path: str, **params: Any) -> dict[str, Any]:
    response = client.get(f"{API}{path}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_every_endpoint_returns_the_clis_json(
    engine: tuple[EngineSetup, Runs, str], viewer: httpx.Client
) -> None:
    setup, runs, conn = engine
    pairs = [
        (("/pipelines", {}), ["pipelines"]),
        (("/pipelines/SALES", {}), ["status", "--pipeline", "SALES"]),
        (("/pipelines/SALES/runs", {}), ["history", "--pipeline", "SALES"]),
        (("/pipelines/SALES/runs", {"limit": 2}), ["history", "--pipeline", "SALES", "--limit", "2"]),
        (("/pipelines/SALES/runs", {"limit": 2, "before": runs.failed}),
         ["history", "--pipeline", "SALES", "--limit", "2", "--before", str(runs.failed)]),
        ((f"/runs/{runs.failed}", {}), ["run", "--id", str(runs.failed)]),
        (("/runs", {"dag_id": "sales_dag", "run_id": "r2"}), ["run", "--dag-id", "sales_dag", "--run-id", "r2"]),
    ]  # fmt: skip
    for (path, params), args in pairs:
        assert get(viewer, path, conn_id=conn, **params) == cli_doc(setup, *args), path
    run = get(viewer, f"/runs/{runs.failed}", conn_id=conn)["runs"][0]["run"]
    assert [d["result"] for d in run["gate_decisions"]] == ["UNSATISFIED"]
    assert [i["action"] for i in run["interventions"]] == ["MARK"]


def pause_rows(setup: EngineSetup, code: str) -> list[tuple[Any, ...]]:
    return engine_rows(
        setup.hook(),
        "SELECT PAUSED_BY, PAUSED_BY_KIND, REASON, RESUMED_BY, RESUMED_BY_KIND, RESUME_REASON, "
        "CASE WHEN RESUMED_AT IS NULL THEN 'open' ELSE 'ended' END FROM AUD_PIPELINE_PAUSES p "
        "JOIN CFG_PIPELINES c ON c.PIPELINE_ID = p.PIPELINE_ID WHERE c.PIPELINE_CODE = ? ORDER BY PIPELINE_PAUSE_ID",
        (code,),
    )


def test_pause_and_resume_write_the_clis_rows_as_the_signed_in_user(
    engine: tuple[EngineSetup, Runs, str], admin: httpx.Client
) -> None:
    setup, _, conn = engine
    body = {"reason": "warehouse upgrade"}
    paused = admin.post(f"{API}/pipelines/OTHER/pause", params={"conn_id": conn}, json=body)
    assert paused.status_code == 200, paused.text
    assert {k: v for k, v in paused.json().items() if k != "pause_id"} == {
        "pipeline_code": "OTHER", "paused_by": "admin", "reason": "warehouse upgrade"}  # fmt: skip
    assert main(["pause", "--pipeline", "IDLE", "--reason", "warehouse upgrade", "--by", "admin",
                 "--config", str(setup.config_path)], io.StringIO(), io.StringIO()) == 0  # fmt: skip
    assert pause_rows(setup, "OTHER") == pause_rows(setup, "IDLE") == [
        ("admin", "HUMAN", "warehouse upgrade", None, None, None, "open")]  # fmt: skip

    again = admin.post(f"{API}/pipelines/OTHER/pause", params={"conn_id": conn}, json=body)
    status, message = cli_error(setup, "pause", "--pipeline", "OTHER", "--reason", "x", "--by", "admin")
    assert (again.status_code, again.json()["detail"]["exit_status"], status) == (409, 9, 9)
    assert again.json()["detail"]["message"] == message  # the same open pause, the same words

    resumed = admin.post(f"{API}/pipelines/OTHER/resume", params={"conn_id": conn}, json={"reason": "done"})
    assert resumed.status_code == 200, resumed.text
    assert (resumed.json()["resumed_by"], resumed.json()["resume_reason"]) == ("admin", "done")
    assert main(["resume", "--pipeline", "IDLE", "--reason", "done", "--by", "admin",
                 "--config", str(setup.config_path)], io.StringIO(), io.StringIO()) == 0  # fmt: skip
    assert pause_rows(setup, "OTHER") == pause_rows(setup, "IDLE") == [
        ("admin", "HUMAN", "warehouse upgrade", "admin", "HUMAN", "done", "ended")]  # fmt: skip
    not_paused = admin.post(f"{API}/pipelines/OTHER/resume", params={"conn_id": conn}, json={"reason": "x"})
    assert (not_paused.status_code, not_paused.json()["detail"]["exit_status"]) == (409, 9)


def finished_runs(setup: EngineSetup, code: str) -> list[tuple[Any, ...]]:
    """Every finished run of ``code`` read straight from the run table, oldest first: (id, status, SLA)."""
    return [
        (int(run_id), status, sla)
        for run_id, status, sla in engine_rows(
            setup.hook(),
            "SELECT r.PIPELINE_RUN_ID, r.STATUS, r.SLA_STATUS FROM AUD_PIPELINES_RUN_LOG r "
            "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ? "
            "AND r.STATUS <> 'IN-PROGRESS' AND r.END_DATE IS NOT NULL ORDER BY r.PIPELINE_RUN_ID",
            (code,),
        )
    ]


def test_the_trend_route_returns_the_newest_finished_runs_with_durations(
    engine: tuple[EngineSetup, Runs, str], viewer: httpx.Client
) -> None:
    """The duration chart's data: finished runs only (the IN-PROGRESS one left out), oldest first, each with
    END_DATE - START_DATE and its stored SLA verdict; ``limit`` keeps the newest; no runs is an empty list."""
    setup, runs, conn = engine
    doc = get(viewer, "/pipelines/SALES/trend", conn_id=conn)
    assert doc["pipeline"]["pipeline_code"] == "SALES" and doc["pipeline"]["sla_in_hours"] == 2
    assert doc["limit"] == 50
    got = [(r["pipeline_run_id"], r["status"], r["sla_status"]) for r in doc["runs"]]
    assert got == finished_runs(setup, "SALES") and [r[0] for r in got] == [runs.ok, runs.failed]
    assert runs.running not in {r["pipeline_run_id"] for r in doc["runs"]}
    for run in doc["runs"]:
        start = datetime.fromisoformat(run["start_date"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(run["end_date"].replace("Z", "+00:00"))
        assert run["duration_seconds"] == pytest.approx((end - start).total_seconds(), abs=0.001)
    newest = get(viewer, "/pipelines/SALES/trend", conn_id=conn, limit=1)
    assert (newest["limit"], [r["pipeline_run_id"] for r in newest["runs"]]) == (1, [runs.failed])
    assert get(viewer, "/pipelines/IDLE/trend", conn_id=conn)["runs"] == []
    unknown = viewer.get(f"{API}/pipelines/SALE/trend", params={"conn_id": conn})
    assert (unknown.status_code, unknown.json()["detail"]["error"]) == (404, "MetadataError")


GETS = [
    "/pipelines",
    "/pipelines/SALES",
    "/pipelines/SALES/runs",
    "/pipelines/SALES/trend",
    "/runs/1",
    "/runs?dag_id=d&run_id=r",
]


def test_every_route_needs_a_session_and_writes_need_edit_rights(
    web: Any, nobody: httpx.Client, viewer: httpx.Client, engine: tuple[EngineSetup, Runs, str]
) -> None:
    setup, _, conn = engine
    for path in [
        *(f"{API}{p}" for p in GETS),
        "/etl-craft/openapi.json",
        "/etl-craft/ui/",
        "/etl-craft/ui/app.js",
        "/etl-craft/ui/vendor/uplot/uPlot.iife.min.js",
    ]:
        assert nobody.get(path).status_code == 401, path
        assert nobody.get(path, headers={"Authorization": "Bearer not-a-token"}).status_code in (401, 403), (
            path
        )
    before = pause_rows(setup, "SALES")
    for action in ("pause", "resume"):
        url = f"{API}/pipelines/SALES/{action}"
        assert nobody.post(url, params={"conn_id": conn}, json={"reason": "x"}).status_code == 401
        assert viewer.post(url, params={"conn_id": conn}, json={"reason": "x"}).status_code == 403
        assert viewer.get(url).status_code == 405  # no state change on GET
    assert pause_rows(setup, "SALES") == before
    openapi = viewer.get("/etl-craft/openapi.json").json()
    paths = {f"/etl-craft{p}" for p in openapi["paths"]}
    assert {f"{API}{p}" for p in ("/pipelines", "/runs", "/pipelines/{code}/trend")} <= paths
    limit = next(p for p in openapi["paths"]["/api/v1/pipelines/{code}/trend"]["get"]["parameters"]
                 if p["name"] == "limit")  # fmt: skip
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 500)


HOSTILE_CODES = [
    "x'; DROP TABLE CFG_PIPELINES; --",
    "SALES%00",
    "../SALES",
    "S" * 300,
    "Ünïcode",
    "1SALES",
    "%20",
]
HOSTILE_QUERIES: list[tuple[str, dict[str, Any]]] = [
    ("/runs/0", {}), ("/runs/-1", {}), (f"/runs/{2**63}", {}), ("/runs/abc", {}), ("/runs/1.5", {}),
    ("/runs", {"dag_id": "a b", "run_id": "r"}), ("/runs", {"dag_id": "d", "run_id": "r\x00"}),
    ("/runs", {"dag_id": "d" * 300, "run_id": "r"}), ("/runs", {"dag_id": "d"}), ("/runs", {}),
    ("/pipelines/SALES/runs", {"limit": 0}), ("/pipelines/SALES/runs", {"limit": 10**6}),
    ("/pipelines/SALES/runs", {"before": 2**63}), ("/pipelines/SALES/trend", {"limit": 0}),
    ("/pipelines/SALES/trend", {"limit": 501}), ("/pipelines/SALES/trend", {"limit": "x"}),
    ("/pipelines", {"conn_id": "../../etc/passwd"}),
    ("/pipelines", {"conn_id": "no_such_conn"}), ("/pipelines", {"conn_id": "x" * 300}),
]  # fmt: skip


def test_hostile_input_gets_4xx_and_no_secret(web: Any, admin: httpx.Client) -> None:
    secrets = [v for k, v in web.env.items() if "SECRET" in k or "PASSWORD" in k] + [
        web.foreign_conn_password
    ]
    responses = [admin.get(f"{API}/pipelines/{code}") for code in HOSTILE_CODES]
    responses += [admin.get(f"{API}{path}", params=params) for path, params in HOSTILE_QUERIES]
    responses += [
        admin.post(f"{API}/pipelines/SALES/pause", params={"conn_id": "etl_craft_pg"}, json=body)
        for body in ({"reason": ""}, {"reason": "   "}, {"reason": "a\x00b"}, {"reason": "x" * 5000}, {},
                     {"reason": ["list"]}, {"why": "x"})
    ]  # fmt: skip
    responses.append(
        admin.post(f"{API}/pipelines/SALES/pause", params={"conn_id": "etl_craft_pg"}, content=b"reason=x",
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    )  # fmt: skip
    for response in responses:
        assert 400 <= response.status_code < 500, (response.request.url, response.status_code, response.text)
        assert not any(secret and secret in response.text for secret in secrets), response.request.url
    unknown = admin.get(f"{API}/pipelines", params={"conn_id": "no_such_conn"})
    assert unknown.status_code == 404
    assert unknown.json()["detail"]["message"].startswith(
        "the Airflow connection no_such_conn does not exist"
    )


def test_a_connection_of_another_type_is_refused_without_its_password(web: Any, admin: httpx.Client) -> None:
    response = admin.get(f"{API}/pipelines", params={"conn_id": web.foreign_conn_id})
    assert response.status_code == 404
    assert "not etl_craft" in response.json()["detail"]["message"]
    assert web.foreign_conn_password not in response.text


def test_an_unknown_pipeline_is_404_with_the_clis_message(
    engine: tuple[EngineSetup, Runs, str], admin: httpx.Client
) -> None:
    setup, _, conn = engine
    response = admin.get(f"{API}/pipelines/SALE", params={"conn_id": conn})
    status, message = cli_error(setup, "status", "--pipeline", "SALE")
    assert (response.status_code, status) == (404, 4)
    assert response.json()["detail"] == {"error": "MetadataError", "exit_status": 4, "message": message}


def test_the_ui_page_and_its_files_are_served_with_relative_urls(admin: httpx.Client) -> None:
    page = admin.get("/etl-craft/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    files = (("app.js", "text/javascript"), ("app.css", "text/css"),
             ("vendor/uplot/uPlot.iife.min.js", "text/javascript"), ("vendor/uplot/uPlot.min.css", "text/css"),
             ("vendor/uplot/LICENSE", "text/plain"))  # fmt: skip
    for name, kind in files:
        served = admin.get(f"/etl-craft/ui/{name}")
        assert served.status_code == 200 and served.headers["content-type"].startswith(kind)
        assert (
            served.content
            == (Path(__file__).parents[2] / "airflow_provider_etl_craft/plugins/ui" / name).read_bytes()
        )
    assert 'src="/' not in page.text and 'href="/' not in page.text
    redirect = admin.get("/etl-craft/ui", params={"dag_id": "d", "run_id": "r"}, follow_redirects=False)
    assert redirect.status_code == 307 and redirect.headers["location"] == "ui/?dag_id=d&run_id=r"
    assert admin.get("/etl-craft/ui/secret.txt").status_code == 404
    assert admin.get("/etl-craft/ui/vendor/uplot/..%2F..%2Fapp.js").status_code == 404  # only listed names
    assert admin.get("/etl-craft/ui/vendor/uplot/uPlot.esm.js").status_code == 404
    # The page loads the vendored library by a relative URL: nothing from another origin.
    assert 'src="vendor/uplot/uPlot.iife.min.js"' in page.text and "//" not in page.text.split("<body>")[0]
