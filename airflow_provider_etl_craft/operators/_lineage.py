"""The operators' OpenLineage methods: what Airflow's OpenLineage listener calls (docs/lineage.md).

The listener (``apache-airflow-providers-openlineage``) calls ``get_openlineage_facets_on_start`` when a try
starts and ``…_on_complete`` / ``…_on_failure`` with the task instance when it ends. Each imports
:mod:`airflow_provider_etl_craft.lineage.facets` (and so OpenLineage) only then: a DAG parse, a try without
the listener, or a process without the integration never loads it. Without the integration, or with one too
old for the facets, the methods answer None (no lineage of ours), as common-sql's operators do.

The listener calls each method in a process it forks for the call, so whatever the call imports is lost with
that fork. Where the listener runs in the task process (:func:`listening`), a try imports the facets module
once itself, when Airflow renders its templates (before the listener's first call): both forks then find it
loaded (docs/performance.md, "Lineage").
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_etl_craft._compat import BaseOperator

    # Type-checked as the operator it is mixed into; a plain class at run time.
    _MixinBase = BaseOperator
else:
    _MixinBase = object

log = logging.getLogger(__name__)

#: The listener's module: Airflow's OpenLineage plugin imports it only when lineage is enabled.
LISTENER_MODULE = "airflow.providers.openlineage.plugins.listener"
FACETS_MODULE = "airflow_provider_etl_craft.lineage.facets"


def listening() -> bool:
    """Whether Airflow's OpenLineage listener runs in this process (its plugin loaded it: lineage enabled,
    ``[openlineage] disabled`` not set). Checked without importing anything."""
    return LISTENER_MODULE in sys.modules


def warm() -> None:
    """Import the facets module in this process, where the listener will fork its calls from (when it runs
    here); a no-op without the listener, or with an integration too old for the facets."""
    if listening() and FACETS_MODULE not in sys.modules:
        try:
            importlib.import_module(FACETS_MODULE)
        except ImportError as exc:
            log.debug("etl-craft: no OpenLineage facets (%s)", exc)


class LineageMixin(_MixinBase):
    """``get_openlineage_facets_on_*`` for the claim, the finish and recorded tasks; a recorded task's wrapped
    operator keeps its own lineage (merged in, :func:`~airflow_provider_etl_craft.lineage.facets.operator_lineage`)."""

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Airflow's own rendering, then :func:`warm`: the task runner renders before its first listener call."""
        super().render_template_fields(context, jinja_env)
        warm()

    def get_openlineage_facets_on_start(self) -> Any:
        return _lineage(self, "start", None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return _lineage(self, "complete", task_instance)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return _lineage(self, "failure", task_instance)


def _lineage(operator: Any, when: str, task_instance: Any) -> Any:
    try:
        from airflow_provider_etl_craft.lineage.facets import operator_lineage  # loaded by warm(), else now
    except ImportError as exc:  # no OpenLineage integration, or one older than the facets need
        log.debug("etl-craft: no OpenLineage facets (%s)", exc)
        return None
    try:
        return operator_lineage(operator, when, task_instance)
    except Exception as exc:  # noqa: BLE001 - lineage never fails a task: the event goes out without ours
        log.warning("etl-craft: OpenLineage facets of %s failed: %s", getattr(operator, "task_id", "?"), exc)
        return None
