"""Where the plugin is mounted in the api-server, and the address of its UI page for a DAG run.

Paths are relative to Airflow's base URL (no leading ``/``): Airflow's UI pages carry ``<base href>`` set to
that URL, so the same path works behind a proxy prefix. A module of its own, with nothing of Airflow's in it:
every task process loads the plugin (:mod:`.plugin`), which needs only these names, and the "Engine run"
link (:mod:`.links`) needs Airflow's operator-link class, which a plain task never loads (docs/performance.md).
"""

from __future__ import annotations

from urllib.parse import urlencode

#: The FastAPI app's mount point in the api-server.
PREFIX = "etl-craft"
#: The UI page; ``?dag_id=&run_id=`` opens the Engine run(s) of that DAG run, ``&conn_id=`` picks the Engine DB.
UI_PATH = f"{PREFIX}/ui/"


def run_page(dag_id: str, run_id: str, conn_id: str | None = None, base_url: str = "") -> str:
    """The UI page of the Engine run of an Airflow DAG run (relative to ``base_url`` when it is empty)."""
    query = {"dag_id": dag_id, "run_id": run_id, **({"conn_id": conn_id} if conn_id else {})}
    base = f"{base_url.rstrip('/')}/" if base_url else ""
    return f"{base}{UI_PATH}?{urlencode(query)}"
