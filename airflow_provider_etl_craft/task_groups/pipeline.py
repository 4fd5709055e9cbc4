"""``etl_craft_pipeline``: a task group that puts claim and finish around a pipeline's tasks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow_provider_etl_craft._compat import TaskGroup
from airflow_provider_etl_craft.operators._renamed import renamed
from airflow_provider_etl_craft.operators.pipeline_run import (
    ClaimPipelineRunOperator,
    FinishPipelineRunOperator,
)
from airflow_provider_etl_craft.operators.task_run import recorded_task
from airflow_provider_etl_craft.runs.identity import check_code
from airflow_provider_etl_craft.settings import setting


@contextmanager
def etl_craft_pipeline(
    pipeline_code: str,
    *,
    group_id: str | None = None,
    etl_craft_conn_id: str | None = None,
    etl_craft_profile: str | None = None,
    deferrable: bool | None = None,
    claim_kwargs: dict[str, Any] | None = None,
    finish_kwargs: dict[str, Any] | None = None,
    profile: str | None = None,
    **group_kwargs: Any,
) -> Iterator[TaskGroup]:
    """A TaskGroup ``claim → your tasks → finish`` for one etl-craft pipeline; you write only the work::

        with etl_craft_pipeline("DAILY_SALES"):
            extract = extract_orders()           # @etl_craft_task functions,
            load = RecordedSQL(task_id="load_orders", conn_id="warehouse", sql=...)  # wrapped operators
            extract >> load

    On exit the group adds ``claim`` upstream of its root tasks and ``finish`` downstream of every task, as
    Airflow setup and teardown tasks (``claim.as_setup()``, ``finish.as_teardown(setups=claim,
    on_failure_fail_dagrun=True)``): the finish runs whatever skips Airflow propagates (a short-circuit
    never skips a teardown), a FAILED Engine run still fails the DAG run, and clearing one task also clears
    the claim and finish, so the run is reopened and closed again. Your own setup/teardown tasks may sit
    inside the group. Because a setup's direct downstream tasks must use ``all_success`` (an Airflow rule),
    the group's root tasks must too.

    Recorded tasks created inside without ``pipeline_code`` / ``etl_craft_conn_id`` / ``etl_craft_profile``
    inherit the group's (mapped tasks too), and the claim and finish take them; one naming another
    pipeline is an error at DAG parse time. ``profile=`` is the deprecated name of ``etl_craft_profile=``
    (before 0.2; the same names on every face, see :mod:`airflow_provider_etl_craft.operators`). The group
    id defaults to the pipeline code in lower case. ``claim_kwargs`` and ``finish_kwargs`` go to the two
    operators (for example ``{"poke_interval": 30, "timeout": 3600}``). ``deferrable`` makes the claim's
    wait and the recorded tasks' gate waits deferred (default: Airflow's ``[operators] default_deferrable``);
    a task's own ``etl_craft_deferrable`` wins.
    """
    check_code("pipeline_code", pipeline_code)
    engine_db: dict[str, Any] = {
        "etl_craft_conn_id": etl_craft_conn_id or setting("default_conn_id"),
        "etl_craft_profile": renamed(
            "etl_craft_pipeline", ("etl_craft_profile", etl_craft_profile), ("profile", profile)
        ),
    }
    with TaskGroup(group_id or pipeline_code.lower(), **group_kwargs) as group:
        yield group
        work = list(group.iter_tasks())
        for task in work:
            if recorded_task(task) is not None:
                _inherit(task, pipeline_code, {**engine_db, "etl_craft_deferrable": deferrable})
        claim_kwargs = {
            **({"deferrable": deferrable} if deferrable is not None else {}),
            **(claim_kwargs or {}),
        }
        claim = ClaimPipelineRunOperator(
            task_id="claim", pipeline_code=pipeline_code, **engine_db, **claim_kwargs
        )
        finish = FinishPipelineRunOperator(
            task_id="finish", pipeline_code=pipeline_code, **engine_db, **(finish_kwargs or {})
        )
        _surround(pipeline_code, group, work, (claim, finish))


def _surround(pipeline_code: str, group: TaskGroup, work: list[Any], ends: tuple[Any, Any]) -> None:
    """Put ``claim`` (a setup) upstream of the group's root tasks and ``finish`` (its teardown) after all."""
    claim, finish = ends
    # has_task reads only task_id, which a MappedOperator upstream has too.
    roots = [task for task in work if not any(group.has_task(up) for up in task.upstream_list)]
    lenient = [
        f"{t.task_id} ({getattr(t.trigger_rule, 'value', t.trigger_rule)})"
        for t in roots
        if not t.is_teardown and t.trigger_rule != "all_success"
    ]
    if lenient:
        raise ValueError(
            f"etl_craft_pipeline {pipeline_code}: {', '.join(lenient)} start right after the claim, a setup task, "
            "so Airflow requires trigger_rule='all_success' for them; drop their trigger_rule, or put them "
            "downstream of another task of the pipeline"
        )
    claim >> (roots or [finish])
    if work:
        work >> finish
    finish.as_teardown(setups=claim, on_failure_fail_dagrun=True)


def _inherit(task: Any, pipeline_code: str, defaults: dict[str, Any]) -> None:
    """Give a recorded task the group's pipeline, connection and profile unless it names its own.

    A mapped task keeps its arguments in ``partial_kwargs`` until Airflow expands it, so they go there.
    """
    kwargs = task.partial_kwargs if getattr(task, "is_mapped", False) else None
    get = kwargs.get if kwargs is not None else (lambda key: getattr(task, key))
    put = kwargs.__setitem__ if kwargs is not None else (lambda key, value: setattr(task, key, value))
    own = get("pipeline_code")
    if own is None:
        put("pipeline_code", pipeline_code)
    elif own != pipeline_code:
        raise ValueError(
            f"task {task.task_id} records to pipeline {own} but sits in the etl_craft_pipeline group of "
            f"{pipeline_code}; move it out of the group or drop its pipeline_code"
        )
    for key, value in defaults.items():
        if get(key) is None:
            put(key, value)
