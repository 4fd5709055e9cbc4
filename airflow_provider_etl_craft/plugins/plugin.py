"""The Airflow plugin (entry point ``airflow.plugins``): the REST API and the UI views in the api-server.

Airflow 3.1+ shows ``external_views``; Airflow 3.0 loads the plugin (and mounts the API) but has no plugin UI,
so there the page is only reachable by its URL. The views point at relative paths: Airflow's UI resolves them
against its base URL, so they work behind a proxy prefix.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_etl_craft.plugins.routes import PREFIX, UI_PATH

NAME = "etl-craft"


class _ApiApp:
    """The API's ASGI app, imported on its first request.

    Every task process loads every plugin (for macros and listeners) and needs none of the API: importing it
    there would cost each task the FastAPI app and Airflow's API security modules.
    """

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from airflow_provider_etl_craft.plugins.api import app

        await app(scope, receive, send)

    def __repr__(self) -> str:
        return "airflow_provider_etl_craft.plugins.api.app"


class EtlCraftPlugin(AirflowPlugin):
    """REST API and UI of the Engine DB in the api-server (the operators' "Engine run" link is declared in the
    provider info's ``extra-links``)."""

    name = "etl_craft"
    fastapi_apps: list[dict[str, Any]] = [{"app": _ApiApp(), "url_prefix": f"/{PREFIX}", "name": NAME}]
    external_views: list[dict[str, Any]] = [
        {"name": NAME, "href": UI_PATH, "destination": "nav", "url_route": PREFIX},
        {
            "name": "Engine run",
            "href": f"{UI_PATH}?dag_id={{DAG_ID}}&run_id={{RUN_ID}}",
            "destination": "dag_run",
            "url_route": f"{PREFIX}-run",
        },
    ]
