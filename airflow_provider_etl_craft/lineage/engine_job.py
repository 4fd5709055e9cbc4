"""The Engine run as an OpenLineage job of its own: its namespace, name and run id (docs/lineage.md).

A pipeline run in the Engine DB outlives any one Airflow task: the claim starts it and the finish ends it,
in different processes, maybe on different machines, maybe of Airflow deployments sharing the Engine DB.
Both name it the same way from what they know (the Engine DB and ``PIPELINE_RUN_ID``), with nothing stored:

* namespace: the Engine DB as OpenLineage names its data source (``postgres://{host}:{port}`` of its first
  server, ``sqlite://{path}``), the one its tables are in;
* name: the pipeline code, qualified as a table of the Engine schema is (``{database}.{schema}.{CODE}``,
  ``{schema}.{CODE}`` on SQLite);
* run id: a UUID version 5 (RFC 9562, the same on every machine and every OpenLineage release) of
  ``{namespace}/{name}#{PIPELINE_RUN_ID}``.

No OpenLineage import here: the facets of recorded tasks name their Engine run too.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from airflow_provider_etl_craft.lineage.memo import EngineDb


@dataclass(frozen=True)
class EngineRun:
    """An Engine run as OpenLineage names it."""

    namespace: str
    name: str
    run_id: str

    def as_facet(self) -> dict[str, str]:
        """The ``etl_craft_run`` facet's ``engineRun``: the job and run of the Engine run."""
        return {"namespace": self.namespace, "name": self.name, "runId": self.run_id}


def job_name(engine_db: EngineDb, pipeline_code: str) -> str:
    """The pipeline as a job of the Engine DB: qualified as the Engine tables are."""
    parts = [engine_db.database, engine_db.schema, pipeline_code]
    return ".".join(part for part in parts if part)


def run_id(namespace: str, name: str, pipeline_run_id: int) -> str:
    """The OpenLineage run id of Engine run ``pipeline_run_id``: deterministic, so claim and finish agree."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}#{pipeline_run_id}"))


def engine_run(engine_db: EngineDb, pipeline_code: str, pipeline_run_id: int | None) -> EngineRun | None:
    """Engine run ``pipeline_run_id`` of ``pipeline_code``; None without a run or the Engine DB's namespace."""
    if pipeline_run_id is None or not engine_db.namespace or not pipeline_code:
        return None
    name = job_name(engine_db, pipeline_code)
    return EngineRun(engine_db.namespace, name, run_id(engine_db.namespace, name, pipeline_run_id))
