"""Airflow names whose home differs across the supported lines (3.0 to 3.3), resolved in one place.

Every Airflow name the provider uses is looked up here, so one table says where each lives on each line::

    from airflow_provider_etl_craft._compat import BaseOperator, AirflowSkipException

A name resolves to the first module in :data:`WHERE` that has it (the Task SDK's home first, then the
home older lines use). The provider does not depend on ``apache-airflow-providers-common-compat``:
its ``sdk`` table only exists from 1.10, and the oldest managed images (Airflow 3.0.6) ship 1.7.3.
``tests/unit/test_compat.py`` resolves every entry on every line CI runs.
"""

from __future__ import annotations

import importlib
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import (  # noqa: F401
        DAG,
        Asset,
        BaseOperator,
        BaseOperatorLink,
        BaseSensorOperator,
        PokeReturnValue,
        TaskGroup,
        Variable,
    )

_SDK = "airflow.sdk"
_SDK_EXC = "airflow.sdk.exceptions"
_CORE_EXC = "airflow.exceptions"

#: name -> modules to try, in order. Task SDK homes first; Airflow 3.0/3.1 keep exceptions in core.
WHERE: dict[str, tuple[str, ...]] = {
    "DAG": (_SDK,),
    "Asset": (_SDK,),
    "BaseOperator": (_SDK,),
    "BaseOperatorLink": (_SDK,),
    "BaseSensorOperator": (_SDK,),
    "PokeReturnValue": (_SDK,),
    "TaskGroup": (_SDK,),
    "Variable": (_SDK,),
    "task_group": (_SDK,),
    # Triggers: core's module on every supported line.
    "BaseTrigger": ("airflow.triggers.base",),
    "TriggerEvent": ("airflow.triggers.base",),
    "DecoratedOperator": ("airflow.sdk.bases.decorator",),
    "TaskDecorator": ("airflow.sdk.bases.decorator",),
    "task_decorator_factory": ("airflow.sdk.bases.decorator",),
    # Airflow's configuration: the Task SDK's from 3.2, core's before.
    "conf": ("airflow.sdk.configuration", "airflow.configuration"),
    # The secret masker: airflow.sdk.log from 3.1, the execution-time module on 3.0.
    "mask_secret": ("airflow.sdk.log", "airflow.sdk.execution_time.secrets_masker"),
    "redact": ("airflow.sdk.log", "airflow.sdk.execution_time.secrets_masker"),
    **{
        name: (_SDK_EXC, _CORE_EXC)
        for name in (
            "AirflowException",
            "AirflowNotFoundException",
            "AirflowFailException",
            "AirflowSkipException",
            "AirflowSensorTimeout",
            "AirflowTaskTimeout",
            "AirflowRescheduleException",
            "TaskDeferred",
            "TaskDeferralError",
            "TaskDeferralTimeout",
            "DownstreamTasksSkipped",
        )
    },
}


@cache
def resolve(name: str) -> Any:
    """The Airflow object ``name`` from the first module in :data:`WHERE` that has it."""
    for module in WHERE[name]:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"this Airflow has no {name} (looked in {', '.join(WHERE[name])})")


def __getattr__(name: str) -> Any:
    if name in WHERE:
        return resolve(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def airflow_exception(name: str) -> type[BaseException]:
    """An Airflow exception class by name (control-flow signals and deferral failures included)."""
    return resolve(name)


def mask_secret(value: str) -> None:
    """Register ``value`` with Airflow's secret masker so logs and rendered fields show ``***``."""
    if value:
        resolve("mask_secret")(value)


def redact(value: Any) -> Any:
    """Apply Airflow's masker to ``value`` (used by tests and by the CLI before printing)."""
    return resolve("redact")(value)


def first_reschedule_date(context: Any) -> datetime | None:
    """When this try was first rescheduled, or ``None``.

    Airflow 3.0's in-process task runner (``dag.test()``) hands the date over as an ISO string; later lines
    and real workers give a datetime.
    """
    first = context["ti"].get_first_reschedule_date(context)
    if isinstance(first, str):
        first = datetime.fromisoformat(first.replace("Z", "+00:00"))
    return first


def get_variable(name: str) -> str | None:
    """Look ``name`` up through Airflow Variables (so any configured secrets backend serves it).

    Outside a task (the CLI, DAG parsing) Airflow 3.0's Task SDK Variable needs a task supervisor; there
    the core model, which asks the same secrets backends, answers instead.
    """
    try:
        value = resolve("Variable").get(name, default=None)
    except ImportError:
        from airflow.models.variable import Variable as CoreVariable

        value = CoreVariable.get(name, default_var=None)
    return None if value is None else str(value)


def fail_exception() -> type[Exception]:
    """Airflow's no-retry failure class."""
    return resolve("AirflowFailException")


def retry_exception() -> type[Exception]:
    """Airflow's ordinary (retryable) failure class."""
    return resolve("AirflowException")
