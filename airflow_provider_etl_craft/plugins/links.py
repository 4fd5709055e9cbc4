"""The "Engine run" extra link of the provider's operators: the UI page of the DAG run's Engine run."""

from __future__ import annotations

from typing import Any

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft._compat import BaseOperatorLink
from airflow_provider_etl_craft.plugins.routes import run_page
from airflow_provider_etl_craft.settings import setting


class EngineRunLink(BaseOperatorLink):
    """ "Engine run" on the claim and the finish (and recorded tasks, see
    :func:`~airflow_provider_etl_craft.operators.task_run.recorded_task_links`): the UI
    page of the DAG run's Engine run.

    Airflow computes it on the worker when the task ends and stores it (an XCom), so the link shows for every
    finished try. The URL is absolute when ``[api] base_url`` is set, else relative to Airflow's base URL.
    """

    name = "Engine run"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        conn_id = getattr(operator, "etl_craft_conn_id", None) or setting("default_conn_id")
        base_url = str(_compat.conf.get("api", "base_url", fallback="") or "")
        return run_page(ti_key.dag_id, ti_key.run_id, conn_id, base_url)
