"""OpenLineage events of Engine runs and recorded tasks (docs/lineage.md).

Airflow's OpenLineage integration (``apache-airflow-providers-openlineage``) emits an event for each task
try and calls the operators' ``get_openlineage_facets_on_start/complete/failure``; the operators answer
with what they recorded in the Engine DB, as an ``etl_craft_run`` run facet. This package's modules other
than :mod:`.memo` import OpenLineage: only those methods import them, and only once the integration calls
them, so a DAG parse, and any process without the integration, never loads OpenLineage.
"""

#: The run facet's key in an event's ``run.facets``.
FACET_NAME = "etl_craft_run"
