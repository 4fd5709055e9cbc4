"""The ``etl_craft_run`` run facet and the ``OperatorLineage`` each operator answers with (docs/lineage.md).

Imported only by the operators' ``get_openlineage_facets_on_*`` methods, which Airflow's OpenLineage listener
calls: this module imports the OpenLineage client and provider at its top.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlparse

from airflow.providers.openlineage.extractors import OperatorLineage
from attrs import define
from openlineage.client.event_v2 import OutputDataset
from openlineage.client.facet_v2 import RunFacet, output_statistics_output_dataset

from airflow_provider_etl_craft import __version__
from airflow_provider_etl_craft.lineage import FACET_NAME, engine_events
from airflow_provider_etl_craft.lineage.engine_job import EngineRun, engine_run
from airflow_provider_etl_craft.lineage.memo import Claimed, Ended, EngineDb, Finished
from airflow_provider_etl_craft.runs.vocabulary import TaskRunStatus

log = logging.getLogger(__name__)

#: The project's repository; the facet's ``_producer`` and ``_schemaURL`` name it (OpenLineage custom-facet rules).
REPOSITORY = "https://github.com/etl-craft/airflow-provider-etl-craft"
#: Who produced the facet: this provider at this release.
PRODUCER = f"{REPOSITORY}/tree/v{__version__}"
#: The facet's JSON schema: the file shipped beside this module, at its path in the repository's main branch
#: (its ``$id``); a change to the facet is additive, as OpenLineage asks of a facet schema.
SCHEMA_FILE = "EtlCraftRunFacet.json"
SCHEMA_URL = (
    f"https://raw.githubusercontent.com/{REPOSITORY.removeprefix('https://github.com/')}/main/"
    f"airflow_provider_etl_craft/lineage/{SCHEMA_FILE}#/$defs/EtlCraftRunFacet"
)
#: ``TaskCounts`` field order -> the facet's count keys.
COUNT_KEYS = ("sourceCount", "targetCount", "insertCount", "updateCount", "deleteCount", "rowsWritten")


@define
class EtlCraftRunFacet(RunFacet):
    """What the Engine DB recorded for this Airflow task try (the schema: ``EtlCraftRunFacet.json``).

    ``operation`` says which step: ``claim`` (the pipeline run), ``task`` (a recorded task's attempt) or
    ``finish`` (the pipeline run's end, with its task totals). ``status`` is the STATUS of the row the event
    is about: ``AUD_PIPELINES_RUN_LOG`` for a claim or a finish, ``AUD_TASK_ATTEMPTS`` for a task.
    ``engineRun`` names the Engine run's own OpenLineage job and run (:mod:`.engine_job`).
    """

    operation: str
    pipelineCode: str
    engineDb: dict[str, str] | None = None
    pipelineRunId: int | None = None
    runKey: str | None = None
    taskCode: str | None = None
    taskRunId: int | None = None
    attemptNumber: int | None = None
    mapIndex: int | None = None
    status: str | None = None
    taskRunStatus: str | None = None
    slaStatus: str | None = None
    counts: dict[str, int] | None = None
    tasks: dict[str, int] | None = None
    engineRun: dict[str, str] | None = None

    _additional_skip_redact = [
        "operation",
        "pipelineCode",
        "runKey",
        "taskCode",
        "status",
        "taskRunStatus",
        "engineRun",
    ]

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_URL


def _facet(**fields: Any) -> EtlCraftRunFacet:
    """The facet, produced by this provider (``_producer``; its ``_schemaURL`` is :data:`SCHEMA_URL`)."""
    return EtlCraftRunFacet(**{"producer": PRODUCER, **fields})


def operator_lineage(operator: Any, when: str, task_instance: Any) -> OperatorLineage:
    """The lineage of ``operator``'s try: its ``etl_craft_run`` facet, plus what the wrapped operator reports.

    :param when: ``start``, ``complete`` or ``failure`` (the listener's call).
    """
    own: OperatorLineage
    records = getattr(operator, "etl_craft_records_task", False)
    if getattr(operator, "etl_craft_claims_pipeline", False):
        own = OperatorLineage(run_facets={FACET_NAME: _claim_facet(operator, when)})
    elif records:
        own = _task_lineage(operator, when)
    else:
        own = OperatorLineage(run_facets={FACET_NAME: _finish_facet(operator, when)})
    wrapped = _wrapped_lineage(operator, when, task_instance)
    if records and when != "start":
        ended: Ended | None = getattr(operator, "_etl_craft_ended", None)
        if ended is not None:
            own, wrapped = _with_target(operator, ended, own, wrapped)
    return own if wrapped is None else _merged(own, wrapped)


def _merged(own: OperatorLineage, wrapped: OperatorLineage) -> OperatorLineage:
    """Both lineages in one: datasets of both, facets of both, ours winning a name both give. Done here, not by
    ``OperatorLineage.merge``, which the OpenLineage provider releases of the 3.0 and 3.1 managed images
    (2.6.1, 2.10.1) lack (docs/lineage.md)."""
    return OperatorLineage(
        inputs=[*own.inputs, *wrapped.inputs],
        outputs=[*own.outputs, *wrapped.outputs],
        run_facets={**wrapped.run_facets, **own.run_facets},
        job_facets={**wrapped.job_facets, **own.job_facets},
    )


def _engine_db(memo: EngineDb) -> dict[str, str]:
    return {"dialect": memo.dialect, "schema": memo.schema}


def _engine_run(run: EngineRun | None) -> dict[str, str] | None:
    return None if run is None else run.as_facet()


def _claim_facet(operator: Any, when: str) -> EtlCraftRunFacet:
    """The claim's facet; once the claim got (or skipped) its run, the Engine run's START goes out too."""
    claimed: Claimed | None = getattr(operator, "_etl_craft_claimed", None)
    if claimed is None or when == "start":  # the start event: nothing claimed yet
        return _facet(operation="claim", pipelineCode=operator.pipeline_code)
    run = engine_run(claimed.engine_db, operator.pipeline_code, claimed.pipeline_run_id)
    facet = _facet(
        operation="claim",
        pipelineCode=operator.pipeline_code,
        engineDb=_engine_db(claimed.engine_db),
        pipelineRunId=claimed.pipeline_run_id,
        runKey=claimed.run_key,
        status=claimed.status,
        engineRun=_engine_run(run),
    )
    if run is not None:
        engine_events.run_started(run, facet, claimed.dag_run, claimed.status)
    return facet


def _task_lineage(operator: Any, when: str) -> OperatorLineage:
    ended: Ended | None = None if when == "start" else getattr(operator, "_etl_craft_ended", None)
    code = operator.task_code
    if ended is None:  # the start event, or a try that opened no attempt (a gate skip, an unrecorded run)
        facet = _facet(operation="task", pipelineCode=operator.pipeline_code or "", taskCode=code)
        return OperatorLineage(run_facets={FACET_NAME: facet})
    counts = {key: value for key, value in zip(COUNT_KEYS, ended.counts, strict=True) if value is not None}
    facet = _facet(
        operation="task",
        pipelineCode=operator.pipeline_code or "",
        engineDb=_engine_db(ended.engine_db),
        pipelineRunId=ended.pipeline_run_id,
        runKey=getattr(operator, "_etl_craft_run_key", None),
        taskCode=code,
        taskRunId=ended.task_run_id,
        attemptNumber=ended.attempt_number,
        mapIndex=ended.map_index,
        status=ended.attempt_status,
        taskRunStatus=ended.task_run_status,
        counts=counts or None,
        engineRun=_engine_run(
            engine_run(ended.engine_db, operator.pipeline_code or "", ended.pipeline_run_id)
        ),
    )
    rows = _rows_written(ended)
    outputs = [_output(outlet, rows) for outlet in getattr(operator, "outlets", None) or ()]
    return OperatorLineage(outputs=[o for o in outputs if o is not None], run_facets={FACET_NAME: facet})


def _rows_written(ended: Ended) -> int | None:
    """The attempt's ``ROWS_WRITTEN`` (``TaskCounts.values()`` order: the last count)."""
    return ended.counts[COUNT_KEYS.index("rowsWritten")]


def _statistics(rows: int | None) -> dict[str, Any]:
    """The output facets of a dataset the attempt wrote: OpenLineage's output statistics, when it counted rows."""
    if rows is None:
        return {}
    facet = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(rowCount=rows)
    return {"outputStatistics": facet}


def _output(outlet: Any, rows: int | None) -> OutputDataset | None:
    """An ``outlets`` Asset as an output dataset carrying the rows the attempt wrote (OpenLineage's
    output-statistics facet). Named as Airflow's integration names the Asset (its providers' converters:
    ``postgres://host:port/db/schema/table`` becomes ``db.schema.table``), else ``scheme://authority`` and
    the path."""
    uri = getattr(outlet, "uri", None)
    if not isinstance(uri, str) or not uri:
        return None
    namespace, name, facets = _dataset_name(outlet, uri)
    return OutputDataset(namespace=namespace, name=name, facets=facets, outputFacets=_statistics(rows))


def _with_target(
    operator: Any, ended: Ended, own: OperatorLineage, wrapped: OperatorLineage | None
) -> tuple[OperatorLineage, OperatorLineage | None]:
    """The task's declared target (its active ``TARGET_OBJECT``) as an output dataset with the rows the
    attempt wrote: on the wrapped operator's output dataset of that table where it reports one, else added to
    ours, in ``[etl_craft] lineage_target_namespace`` or else the wrapped operator's datasets' namespace."""
    target = ended.target_object
    if not target:
        return own, wrapped
    rows = _rows_written(ended)
    if wrapped is not None and any(_same_table(d.name, target) for d in wrapped.outputs):
        outputs = [_counted(d, rows) if _same_table(d.name, target) else d for d in wrapped.outputs]
        return own, OperatorLineage(
            inputs=wrapped.inputs,
            outputs=outputs,
            run_facets=wrapped.run_facets,
            job_facets=wrapped.job_facets,
        )
    from airflow_provider_etl_craft.settings import setting

    namespace = str(setting("lineage_target_namespace") or "").strip()
    if not namespace and wrapped is not None:
        reported = [*wrapped.outputs, *wrapped.inputs]
        namespace = reported[0].namespace if reported else ""
    if not namespace:
        log.debug(
            "etl-craft: %s's TARGET_OBJECT %s is not reported: no [etl_craft] lineage_target_namespace, and the "
            "operator reports no dataset to take one from",
            operator.task_code,
            target,
        )
        return own, wrapped
    if any(d.namespace == namespace and _same_table(d.name, target) for d in own.outputs):
        return own, wrapped  # an outlets Asset names it already, with the rows
    dataset = OutputDataset(namespace=namespace, name=target, facets={}, outputFacets=_statistics(rows))
    return OperatorLineage(outputs=[*own.outputs, dataset], run_facets=own.run_facets), wrapped


def _table_parts(name: str) -> list[str]:
    return name.strip().lower().split(".")


def _same_table(reported: str, target: str) -> bool:
    """Whether a dataset name names the ``schema.table`` a TARGET_OBJECT names: equal but for case, or with a
    leading database part (``warehouse.sales.orders`` names ``sales.orders``)."""
    got, wanted = _table_parts(reported), _table_parts(target)
    if len(got) == len(wanted) + 1:
        got = got[1:]
    elif len(wanted) == len(got) + 1:
        wanted = wanted[1:]
    return got == wanted


def _counted(dataset: Any, rows: int | None) -> Any:
    """``dataset`` (the wrapped operator's) as an output dataset carrying the rows the attempt wrote."""
    if rows is None:
        return dataset
    facets = dict(getattr(dataset, "outputFacets", None) or {})
    return OutputDataset(
        namespace=dataset.namespace,
        name=dataset.name,
        facets=dict(dataset.facets or {}),
        outputFacets={**facets, **_statistics(rows)},
    )


def _dataset_name(outlet: Any, uri: str) -> tuple[str, str, dict[str, Any]]:
    try:
        from airflow.providers.openlineage.extractors.manager import ExtractorManager

        found = ExtractorManager.convert_to_ol_dataset(outlet)
    except Exception:  # noqa: BLE001 - an integration without the converter: name it from the URI
        found = None
    if found is not None:
        return found.namespace, found.name, dict(found.facets or {})
    parsed = urlparse(uri)
    namespace = f"{parsed.scheme}://{parsed.netloc}" if parsed.scheme else "default"
    return namespace, parsed.path.lstrip("/") or parsed.netloc or uri, {}


#: The finish's task totals: task runs of the run by status, and their attempts. One read on the run's task
#: runs (IX_AUD_TASK_RUN_LOG_PIPELINE_RUN) and their attempts (UQ_AUD_TASK_ATTEMPTS_NUMBER); parameter: run id.
TOTALS_SQL = (
    "SELECT tr.STATUS, COUNT(DISTINCT tr.TASK_RUN_ID), COUNT(a.ATTEMPT_ID) FROM AUD_TASK_RUN_LOG tr "
    "LEFT JOIN AUD_TASK_ATTEMPTS a ON a.TASK_RUN_ID = tr.TASK_RUN_ID WHERE tr.PIPELINE_RUN_ID = ? "
    "GROUP BY tr.STATUS"
)
#: Task-run statuses -> the totals' keys.
TOTAL_KEYS = {
    TaskRunStatus.SUCCESS: "succeeded",
    TaskRunStatus.FAILED: "failed",
    TaskRunStatus.SKIPPED: "skipped",
    TaskRunStatus.CANCELLED: "cancelled",
}


def run_totals(engine: Any, pipeline_run_id: int) -> dict[str, int] | None:
    """The run's task totals (succeeded, failed, skipped, cancelled task runs; attempts), read on a connection
    of its own (never the process's lent one: the listener may call from a fork); None when it cannot."""
    from contextlib import closing

    try:
        with closing(engine.connect()) as conn:
            rows = engine.query(conn, TOTALS_SQL, (pipeline_run_id,))
    except Exception as exc:  # noqa: BLE001 - a facet never fails the task; the event goes out without totals
        log.warning("etl-craft: no task totals for run %s in its OpenLineage facet: %s", pipeline_run_id, exc)
        return None
    totals = dict.fromkeys(("succeeded", "failed", "skipped", "cancelled", "attempts"), 0)
    for status, task_runs, attempts in rows:
        key = TOTAL_KEYS.get(status)
        if key is not None:
            totals[key] += int(task_runs)
        totals["attempts"] += int(attempts)
    return totals


def _finish_facet(operator: Any, when: str) -> EtlCraftRunFacet:
    """The finish's facet; once the finish ended its run, the Engine run's end event goes out too."""
    finished: Finished | None = getattr(operator, "_etl_craft_finished", None)
    if finished is None or when == "start":  # the start event, or a finish that could not end the run
        return _facet(operation="finish", pipelineCode=operator.pipeline_code)
    engine_db = EngineDb.of(finished.engine)
    run = engine_run(engine_db, operator.pipeline_code, finished.pipeline_run_id)
    facet = _facet(
        operation="finish",
        pipelineCode=operator.pipeline_code,
        engineDb=_engine_db(engine_db),
        pipelineRunId=finished.pipeline_run_id,
        runKey=finished.run_key,
        status=finished.status,
        slaStatus=finished.sla_status,
        tasks=run_totals(finished.engine, finished.pipeline_run_id),
        engineRun=_engine_run(run),
    )
    if run is not None:
        engine_events.run_ended(run, facet, finished.dag_run, finished.status)
    return facet


def _wrapped_lineage(operator: Any, when: str, task_instance: Any) -> OperatorLineage | None:
    """What the operator a recorded task wraps reports itself (``recorded(SQLExecuteQueryOperator)``'s SQL
    lineage, say): the same method further along the class's MRO, past the provider's lineage mixin."""
    from airflow_provider_etl_craft.operators._lineage import LineageMixin

    name = f"get_openlineage_facets_on_{when}"
    method = getattr(super(LineageMixin, operator), name, None)
    if not callable(method):
        return None
    try:
        found = method() if when == "start" else method(task_instance)
    except Exception as exc:  # noqa: BLE001 - as the listener's own extractor does: the event goes out without it
        log.warning("etl-craft: %s of %s failed: %s", name, type(operator).__name__, exc)
        return None
    if found is None:
        return None
    return OperatorLineage(
        inputs=list(found.inputs or []),
        outputs=list(found.outputs or []),
        run_facets=dict(found.run_facets or {}),
        job_facets=dict(found.job_facets or {}),
    )
