"""Where the plugin lives in the api-server, and the "Engine run" extra link of the provider's operators.

Paths are relative to Airflow's base URL (no leading ``/``): Airflow's UI pages carry ``<base href>`` set to
that URL, so the same path works behind a proxy prefix.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any
from urllib.parse import urlencode

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft._compat import BaseOperatorLink
from airflow_provider_etl_craft.settings import setting

#: The FastAPI app's mount point in the api-server.
PREFIX = "etl-craft"
#: The UI page; ``?dag_id=&run_id=`` opens the Engine run(s) of that DAG run, ``&conn_id=`` picks the Engine DB.
UI_PATH = f"{PREFIX}/ui/"


def run_page(dag_id: str, run_id: str, conn_id: str | None = None, base_url: str = "") -> str:
    """The UI page of the Engine run of an Airflow DAG run (relative to ``base_url`` when it is empty)."""
    query = {"dag_id": dag_id, "run_id": run_id, **({"conn_id": conn_id} if conn_id else {})}
    base = f"{base_url.rstrip('/')}/" if base_url else ""
    return f"{base}{UI_PATH}?{urlencode(query)}"


class EngineRunLink(BaseOperatorLink):
    """ "Engine run" on the claim and the finish (and recorded tasks, see :func:`recorded_task_links`): the UI
    page of the DAG run's Engine run.

    Airflow computes it on the worker when the task ends and stores it (an XCom), so the link shows for every
    finished try. The URL is absolute when ``[api] base_url`` is set, else relative to Airflow's base URL.
    """

    name = "Engine run"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        conn_id = getattr(operator, "etl_craft_conn_id", None) or setting("default_conn_id")
        base_url = str(_compat.conf.get("api", "base_url", fallback="") or "")
        return run_page(ti_key.dag_id, ti_key.run_id, conn_id, base_url)


def recorded_task_links(own: Collection[BaseOperatorLink] = ()) -> tuple[BaseOperatorLink, ...]:
    """A recorded operator class's extra links: its own, plus "Engine run" when ``[etl_craft]
    recorded_task_link`` is set.

    Off by default: Airflow 3 computes a link when a try ends and stores it as an XCom through its API (about
    17 ms per task in the deployment tier, and an ``xcom`` row per try), and the page is that of the DAG run,
    the same for every task, which the claim's and the finish's links and the DAG run's Engine run tab open
    already (docs/ui.md). Read when the class is made (an operator class is part of the serialized DAG).
    """
    return (*own, EngineRunLink()) if setting("recorded_task_link") else tuple(own)
