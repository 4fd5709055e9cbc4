"""The operators' OpenLineage methods: what Airflow's OpenLineage listener calls (docs/lineage.md).

The listener (``apache-airflow-providers-openlineage``) calls ``get_openlineage_facets_on_start`` when a try
starts and ``…_on_complete`` / ``…_on_failure`` with the task instance when it ends. Each imports
:mod:`airflow_provider_etl_craft.lineage.facets` (and so OpenLineage) only then: a DAG parse, a try without
the listener, or a process without the integration never loads it. Without the integration, or with one too
old for the facets, the methods answer None (no lineage of ours), as common-sql's operators do.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class LineageMixin:
    """``get_openlineage_facets_on_*`` for the claim, the finish and recorded tasks; a recorded task's wrapped
    operator keeps its own lineage (merged in, :func:`~airflow_provider_etl_craft.lineage.facets.operator_lineage`)."""

    def get_openlineage_facets_on_start(self) -> Any:
        return _lineage(self, "start", None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return _lineage(self, "complete", task_instance)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return _lineage(self, "failure", task_instance)


def _lineage(operator: Any, when: str, task_instance: Any) -> Any:
    try:
        from airflow_provider_etl_craft.lineage.facets import operator_lineage
    except ImportError as exc:  # no OpenLineage integration, or one older than the facets need
        log.debug("etl-craft: no OpenLineage facets (%s)", exc)
        return None
    try:
        return operator_lineage(operator, when, task_instance)
    except Exception as exc:  # noqa: BLE001 - lineage never fails a task: the event goes out without ours
        log.warning("etl-craft: OpenLineage facets of %s failed: %s", getattr(operator, "task_id", "?"), exc)
        return None
