"""``etl_craft_pipeline``: a task group that puts claim and finish around a pipeline's tasks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.providers.common.compat.sdk import TaskGroup

from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.operators.pipeline_run import (
    ClaimPipelineRunOperator,
    FinishPipelineRunOperator,
)
from airflow_provider_etl_craft.runs.identity import check_code


@contextmanager
def etl_craft_pipeline(pipeline_code: str, *, group_id: str | None = None,
                       etl_craft_conn_id: str = EngineDBHook.default_conn_name, profile: str | None = None,
                       claim_kwargs: dict[str, Any] | None = None, finish_kwargs: dict[str, Any] | None = None,
                       **group_kwargs: Any) -> Iterator[TaskGroup]:  # fmt: skip
    """A TaskGroup ``claim → your tasks → finish`` for one etl-craft pipeline; you write only the work::

        with etl_craft_pipeline("DAILY_SALES"):
            extract = extract_orders()           # @etl_craft_task functions,
            load = RecordedSQL(task_id="load_orders", conn_id="warehouse", sql=...)  # wrapped operators
            extract >> load

    On exit the group adds ``claim`` upstream of its root tasks and ``finish`` (``all_done``) downstream of
    every task. Recorded tasks created inside without ``pipeline_code`` / ``etl_craft_conn_id`` / profile
    inherit the group's; one naming another pipeline is an error at DAG parse time. The group id defaults
    to the pipeline code in lower case. ``claim_kwargs`` and ``finish_kwargs`` go to the two operators
    (for example ``{"poke_interval": 30, "timeout": 3600}``).
    """
    check_code("pipeline_code", pipeline_code)
    with TaskGroup(group_id or pipeline_code.lower(), **group_kwargs) as group:
        yield group
        work = list(group.iter_tasks())
        for task in work:
            if not getattr(task, "etl_craft_records_task", False):
                continue
            if task.pipeline_code is None:
                task.pipeline_code = pipeline_code
            elif task.pipeline_code != pipeline_code:
                raise ValueError(
                    f"task {task.task_id} records to pipeline {task.pipeline_code} but sits in the etl_craft_pipeline "
                    f"group of {pipeline_code}; move it out of the group or drop its pipeline_code"
                )
            if task.etl_craft_conn_id is None:
                task.etl_craft_conn_id = etl_craft_conn_id
            if task.etl_craft_profile is None:
                task.etl_craft_profile = profile
        common = {"pipeline_code": pipeline_code, "etl_craft_conn_id": etl_craft_conn_id, "profile": profile}
        claim = ClaimPipelineRunOperator(task_id="claim", **common, **(claim_kwargs or {}))
        finish = FinishPipelineRunOperator(task_id="finish", **common, **(finish_kwargs or {}))
        roots = [task for task in work if not any(group.has_task(up) for up in task.upstream_list)]
        claim >> (roots or [finish])
        if work:
            work >> finish  # type: ignore[operator]
