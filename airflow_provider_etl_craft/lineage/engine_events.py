"""The Engine run's own OpenLineage events: START when the claim gets the run, its end when the finish ends it.

Sent from the claim's and the finish's ``get_openlineage_facets_on_complete`` / ``…_on_failure``, which
Airflow's OpenLineage listener calls only when lineage is on for that operator (``[openlineage] disabled``,
``disabled_for_operators``, selective enable), and through the listener's own adapter, so its transport
applies. The job and run id: :mod:`.engine_job`; the parent and root: the Airflow DAG run, as the listener
names it for the task's own events. A transport that is down, or anything else failing here, is a warning:
never a failed task (docs/lineage.md). Imported by :mod:`.facets` only: it imports OpenLineage at its top.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter
from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
from openlineage.client.facet_v2 import RunFacet, job_type_job, parent_run

from airflow_provider_etl_craft.lineage import FACET_NAME
from airflow_provider_etl_craft.lineage.engine_job import EngineRun
from airflow_provider_etl_craft.lineage.memo import DagRunRef
from airflow_provider_etl_craft.runs.vocabulary import RunStatus

log = logging.getLogger(__name__)

#: The end event of a run by its final ``AUD_PIPELINES_RUN_LOG.STATUS``.
END_STATES = {
    RunStatus.SUCCESS: RunState.COMPLETE,
    RunStatus.SKIPPED: RunState.COMPLETE,
    RunStatus.FAILED: RunState.FAIL,
    RunStatus.CANCELLED: RunState.ABORT,
}
#: The Engine job's ``jobType`` facet: a finite batch job of etl-craft's integration, a pipeline.
JOB_TYPE = {"processingType": "BATCH", "integration": "ETL_CRAFT", "jobType": "PIPELINE"}


def run_started(run: EngineRun, facet: RunFacet, dag_run: DagRunRef | None, status: str) -> None:
    """The claim got ``run``: its START (and, for a run the claim recorded SKIPPED, its COMPLETE too)."""
    send(event(run, RunState.START, facet, dag_run))
    if status == RunStatus.SKIPPED:
        send(event(run, RunState.COMPLETE, facet, dag_run))


def run_ended(run: EngineRun, facet: RunFacet, dag_run: DagRunRef | None, status: str) -> None:
    """The finish ended ``run`` with ``status``: COMPLETE (SUCCESS, SKIPPED), FAIL (FAILED) or ABORT."""
    state = END_STATES.get(RunStatus(status))
    if state is None:  # not an end: nothing to say
        return
    send(event(run, state, facet, dag_run))


def event(run: EngineRun, state: RunState, facet: RunFacet, dag_run: DagRunRef | None) -> RunEvent:
    """The Engine run's event: its ``etl_craft_run`` facet, and the DAG run as parent and root."""
    from airflow_provider_etl_craft.lineage.facets import PRODUCER

    facets: dict[str, RunFacet] = {FACET_NAME: facet}
    if dag_run is not None:
        facets.update(parent_facets(dag_run))
    job_type = job_type_job.JobTypeJobFacet(producer=PRODUCER, **JOB_TYPE)
    return RunEvent(
        eventType=state,
        eventTime=datetime.now(UTC).isoformat(),
        run=Run(runId=run.run_id, facets=facets),
        job=Job(namespace=run.namespace, name=run.name, facets={"jobType": job_type}),
        producer=PRODUCER,
        inputs=[],
        outputs=[],
    )


def parent_facets(dag_run: DagRunRef) -> dict[str, Any]:
    """``parent`` naming the DAG run as Airflow's integration does (its run id; its root from the DAG run's
    conf when a parent triggered it, else the DAG run itself)."""
    parent_id = OpenLineageAdapter.build_dag_run_id(
        dag_id=dag_run.dag_id, logical_date=dag_run.run_date, clear_number=dag_run.clear_number
    )
    try:
        from airflow.providers.openlineage.utils.utils import get_task_parent_run_facet

        found: dict[str, Any] = get_task_parent_run_facet(
            parent_run_id=parent_id, parent_job_name=dag_run.dag_id, dr_conf=dict(dag_run.conf or {})
        )
        return found
    except (ImportError, TypeError):  # an integration before the root-aware helper: the DAG run is the root
        from airflow.providers.openlineage import conf

        namespace = conf.namespace()
        facet = parent_run.ParentRunFacet(
            run=parent_run.Run(runId=parent_id),
            job=parent_run.Job(namespace=namespace, name=dag_run.dag_id),
            root=parent_run.Root(
                run=parent_run.RootRun(runId=parent_id),
                job=parent_run.RootJob(namespace=namespace, name=dag_run.dag_id),
            ),
        )
        return {"parent": facet}


def send(run_event: RunEvent) -> None:
    """Through the listener's adapter (its transport, its redaction); a failure is a warning, never raised."""
    try:
        from airflow.providers.openlineage.plugins.listener import get_openlineage_listener

        get_openlineage_listener().adapter.emit(run_event)
    except Exception as exc:  # noqa: BLE001 - lineage never fails a task
        log.warning(
            "etl-craft: the OpenLineage %s event of Engine run %s (%s) was not sent: %s",
            run_event.eventType.value if run_event.eventType else "?",
            run_event.run.runId,
            run_event.job.name,
            exc,
        )
