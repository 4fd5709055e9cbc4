"""``@etl_craft_task`` (also ``@task.etl_craft``): a TaskFlow function recorded as an etl-craft task."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow.providers.standard.operators.python import PythonOperator

from airflow_provider_etl_craft._compat import DecoratedOperator, TaskDecorator, task_decorator_factory
from airflow_provider_etl_craft.operators.task_run import (
    RecordedTaskMixin,
    recorded_task_links,
    with_recording_arguments,
)


class _EtlCraftDecoratedOperator(RecordedTaskMixin, DecoratedOperator, PythonOperator):
    """The operator behind ``@etl_craft_task``: a decorated Python callable, recorded."""

    template_fields: Sequence[str] = ("templates_dict", "op_args", "op_kwargs")
    template_fields_renderers = {"templates_dict": "json", "op_args": "py", "op_kwargs": "py"}
    custom_operator_name = "@task.etl_craft"
    ui_color = "#dff3e4"
    operator_extra_links = recorded_task_links()

    @with_recording_arguments
    def __init__(
        self, *, python_callable: Callable[..., Any], op_args: Any, op_kwargs: Any, **kwargs: Any
    ) -> None:
        super().__init__(
            kwargs_to_upstream={
                "python_callable": python_callable,
                "op_args": op_args,
                "op_kwargs": op_kwargs,
            },
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            **kwargs,
        )


def etl_craft_task(
    python_callable: Callable[..., Any] | None = None, multiple_outputs: bool | None = None, **kwargs: Any
) -> TaskDecorator:
    """Wrap a function into a recorded etl-craft task.

    Takes :class:`~airflow_provider_etl_craft.operators.task_run.RecordedTaskMixin`'s arguments
    (``pipeline_code``, ``task_code``, ``counts``, …) plus any operator argument; the function's return
    value gives the counts (an int of rows written, or a mapping such as ``{"insert_count": 10}``)::

        @etl_craft_task(pipeline_code="DAILY_SALES")
        def extract_orders() -> dict[str, int]:
            ...
            return {"source_count": 120, "rows_written": 120}
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_EtlCraftDecoratedOperator,
        **kwargs,
    )
