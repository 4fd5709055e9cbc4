"""The plugin's FastAPI app: the REST API and UI page, mounted by Airflow's api-server at ``/etl-craft``.

Every route, the OpenAPI document and the page's files included, goes through Airflow's auth manager with the
session the UI uses (the ``_token`` cookie, or ``Authorization: Bearer <jwt>``): reading needs read access
to DAGs, pause and resume need edit access (PUT) on DAGs. The JSON documents are those of
:mod:`~airflow_provider_etl_craft.runs.commands`, the same functions ``etl-craft-airflow … --format json``
prints. Handlers are plain ``def`` functions: FastAPI runs them in its thread pool, so a slow Engine DB
blocks no other request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Annotated

from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Body, Depends, FastAPI, Path, Query, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field

from airflow_provider_etl_craft import __version__, _compat, errors
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import commands
from airflow_provider_etl_craft.runs.identity import CODE_PATTERN
from airflow_provider_etl_craft.runs.queries import MAX_LIMIT
from airflow_provider_etl_craft.settings import setting

log = logging.getLogger(__name__)


class ConnectionChoiceError(errors.ConfigurationError):
    """The request named a connection that does not exist or is not an ``etl_craft`` connection."""


#: HTTP status of each typed error (most specific class first); anything else is a 500.
HTTP_STATUS: tuple[tuple[type[errors.EtlCraftError], int], ...] = (
    (ConnectionChoiceError, 404),
    (errors.EngineUnreachableError, 503),
    (errors.ConfigurationError, 500),
    (errors.MetadataError, 404),
    (errors.RunStateError, 409),
    (errors.StaleTransitionError, 409),
    (errors.LockTimeoutError, 503),
    (errors.MigrationError, 503),
    (errors.EngineDBError, 503),
)
#: Airflow's connection id rule (letters, digits, ``_ . -``); ids, like DAG and DAG run ids, are at most
#: :data:`MAX_ID` characters.
CONN_ID = r"^[A-Za-z0-9_.\-]+$"
#: Airflow's DAG id rule.
DAG_ID = r"^[\w.\-]+$"
#: A DAG run id: any printable text (no control characters).
PRINTABLE = r"^[^\x00-\x1f\x7f]+$"
MAX_ID = 250

ConnId = Annotated[
    str | None,
    Query(
        pattern=CONN_ID,
        description="An `etl_craft` Airflow connection (default `[etl_craft] default_conn_id`)",
    ),
]
Code = Annotated[str, Path(pattern=CODE_PATTERN.pattern, description="PIPELINE_CODE")]
RunId = Annotated[int, Path(ge=1, le=MAX_LIMIT, description="PIPELINE_RUN_ID")]

read = Depends(requires_access_dag("GET"))
edit = Depends(requires_access_dag("PUT"))


class ReasonBody(BaseModel):
    """Why the pipeline is paused or resumed (stored in ``AUD_PIPELINE_PAUSES``)."""

    reason: str = Field(min_length=1, max_length=2000, pattern=r"^[^\x00]*[^\x00\s][^\x00]*$")


app = FastAPI(
    title="etl-craft",
    version=__version__,
    description="Pipelines, runs, pauses of an etl-craft Engine DB (the `etl-craft-airflow` CLI's documents).",
    openapi_url=None,  # served below, behind the auth manager
    docs_url=None,
    redoc_url=None,
)


@app.exception_handler(errors.EtlCraftError)
def _typed_error(request: Request, exc: errors.EtlCraftError) -> JSONResponse:
    status = next((code for cls, code in HTTP_STATUS if isinstance(exc, cls)), 500)
    detail = {"error": type(exc).__name__, "exit_status": exc.exit_code, "message": commands.masked(str(exc))}
    return JSONResponse({"detail": detail}, status_code=status)


@app.exception_handler(Exception)
def _defect(request: Request, exc: Exception) -> JSONResponse:
    log.exception("etl-craft API: unexpected error on %s %s", request.method, request.url.path)
    message = f"unexpected internal error ({type(exc).__name__}); the api-server log has the traceback"
    return JSONResponse({"detail": {"error": "InternalError", "exit_status": 1, "message": message}}, 500)


@contextmanager
def _engine(conn_id: str | None) -> Iterator[EngineDBHook]:
    """A hook on the chosen ``etl_craft`` connection; driver errors leave as the provider's typed errors."""
    conn_id = conn_id or setting("default_conn_id")
    hook = EngineDBHook(etl_craft_conn_id=conn_id)
    try:
        conn = hook.connection
    except _compat.AirflowNotFoundException:
        raise ConnectionChoiceError(
            f"the Airflow connection {conn_id} does not exist; create it (type etl_craft) or choose another "
            "with ?conn_id="
        ) from None
    if conn.conn_type != EngineDBHook.conn_type:
        raise ConnectionChoiceError(
            f"the Airflow connection {conn_id} is of type {conn.conn_type}, not {EngineDBHook.conn_type}; "
            "choose an etl_craft connection with ?conn_id="
        )
    with commands.classified(hook):
        yield hook


def _document(conn_id: str | None, command: Callable[[EngineDBHook], commands.Document]) -> JSONResponse:
    """The JSON of ``command`` run on the Engine DB of ``conn_id``."""
    with _engine(conn_id) as hook:
        return JSONResponse(command(hook))


@app.get(
    "/api/v1/pipelines", dependencies=[read], summary="Every pipeline with its open pause and newest run"
)
def list_pipelines(conn_id: ConnId = None) -> JSONResponse:
    return _document(conn_id, commands.pipelines)


@app.get("/api/v1/pipelines/{code}", dependencies=[read], summary="A pipeline, its pause and current run")
def pipeline_status(code: Code, conn_id: ConnId = None) -> JSONResponse:
    return _document(conn_id, lambda hook: commands.status(hook, code))


@app.get("/api/v1/pipelines/{code}/runs", dependencies=[read], summary="A page of runs, newest first")
def pipeline_runs(
    code: Code,
    conn_id: ConnId = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = commands.DEFAULT_PAGE,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_LIMIT, description="next_before of the last page")
    ] = None,
) -> JSONResponse:
    return _document(conn_id, lambda hook: commands.history(hook, code, limit, before))


@app.get(
    "/api/v1/pipelines/{code}/trend",
    dependencies=[read],
    summary="The newest finished runs, oldest first, with durations and SLA verdicts (the duration chart)",
)
def pipeline_trend(
    code: Code,
    conn_id: ConnId = None,
    limit: Annotated[
        int, Query(ge=1, le=commands.MAX_TREND_RUNS, description="How many finished runs (newest ones)")
    ] = commands.TREND_RUNS,
) -> JSONResponse:
    return _document(conn_id, lambda hook: commands.trend(hook, code, limit))


@app.get("/api/v1/runs/{pipeline_run_id}", dependencies=[read], summary="One run by PIPELINE_RUN_ID")
def run_by_id(pipeline_run_id: RunId, conn_id: ConnId = None) -> JSONResponse:
    return _document(conn_id, lambda hook: commands.run_by_id(hook, pipeline_run_id))


@app.get("/api/v1/runs", dependencies=[read], summary="The Engine run(s) of an Airflow DAG run")
def run_by_dag_run(
    dag_id: Annotated[str, Query(pattern=DAG_ID, max_length=MAX_ID)],
    run_id: Annotated[str, Query(pattern=PRINTABLE, max_length=MAX_ID)],
    conn_id: ConnId = None,
) -> JSONResponse:
    return _document(conn_id, lambda hook: commands.run_by_dag_run(hook, dag_id, run_id))


@app.post("/api/v1/pipelines/{code}/pause", dependencies=[edit], summary="Pause a pipeline")
def pause(
    code: Code, body: Annotated[ReasonBody, Body()], user: GetUserDep, conn_id: ConnId = None
) -> JSONResponse:
    return _document(conn_id, lambda hook: commands.pause(hook, code, body.reason, user.get_name()))


@app.post("/api/v1/pipelines/{code}/resume", dependencies=[edit], summary="End a pipeline's pause")
def resume(
    code: Code, body: Annotated[ReasonBody, Body()], user: GetUserDep, conn_id: ConnId = None
) -> JSONResponse:
    return _document(conn_id, lambda hook: commands.resume(hook, code, body.reason, user.get_name()))


@app.get("/openapi.json", dependencies=[read], include_in_schema=False)
def openapi() -> JSONResponse:
    return JSONResponse(
        get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    )


#: The UI page's files and their media types (served from the package, behind the same auth); ``vendor/`` holds
#: the charting library, pinned and checked by ``tools/vendor_uplot.py`` (docs/ui.md).
UI_FILES = {
    "": "text/html",
    "index.html": "text/html",
    "app.js": "text/javascript",
    "app.css": "text/css",
    "vendor/uplot/uPlot.iife.min.js": "text/javascript",
    "vendor/uplot/uPlot.min.css": "text/css",
    "vendor/uplot/LICENSE": "text/plain",
}


@app.get("/ui/{name:path}", dependencies=[read], include_in_schema=False)
def ui_file(name: str) -> Response:
    if name not in UI_FILES:
        return JSONResponse({"detail": {"error": "NotFound", "message": f"no UI file {name}"}}, 404)
    text = resources.files(__package__).joinpath("ui", name or "index.html").read_bytes()
    return Response(text, media_type=UI_FILES[name], headers={"Cache-Control": "no-cache"})


@app.get("/ui", dependencies=[read], include_in_schema=False)
def ui_root(request: Request) -> RedirectResponse:
    """``ui`` → ``ui/`` (relative, query kept): the page's relative URLs need the trailing slash."""
    query = f"?{request.url.query}" if request.url.query else ""
    return RedirectResponse(f"ui/{query}", status_code=307)
