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
import inspect
import os
import sys
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
    "BaseHook": (_SDK, "airflow.hooks.base"),
    "Connection": (_SDK,),
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


def channel_serializes_threads() -> bool:
    """Whether this task process's channel to Airflow's supervisor lets several threads use it, one request and
    its answer at a time (Airflow 3.2 and later hold a lock around each; 3.0's, 3.1's and ``dag.test()``'s
    in-process one do not). False outside a task process."""
    runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    comms = getattr(runner, "SUPERVISOR_COMMS", None)
    return comms is not None and hasattr(getattr(comms, "_thread_lock", None), "acquire")


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


#: Where Airflow's ``Stats`` lives: the Task SDK's copy (3.2+), core's copy (3.2+: what the triggerer, scheduler
#: and dag processor set up), and the one module of 3.0 and 3.1 (on 3.2+ only a deprecated re-export).
STATS_HOMES = ("airflow.sdk.observability.stats", "airflow.observability.stats", "airflow.stats")

_stats: tuple[int, Any] | None = None


def stats() -> Any:
    """Airflow's ``Stats`` for this process: whatever its ``[metrics]`` section configures (StatsD, Datadog,
    OpenTelemetry, or nothing).

    3.0 and 3.1 have one ``Stats``, configured from ``[metrics]`` on first use. From 3.2 the Task SDK and core
    each keep their own copy, and an Airflow process sets up the copy it uses (a task its SDK copy, the
    triggerer its core copy): the first copy set up in this process is taken, else the SDK copy is set up
    here with Airflow's own factory for this configuration, as Airflow's task runner does. Looked up once
    per process (a forked child looks again).
    """
    global _stats
    if _stats is None or _stats[0] != os.getpid():
        _stats = os.getpid(), _find_stats()
    return _stats[1]


def _find_stats() -> Any:
    first = None
    for home in STATS_HOMES[:2]:  # a copy is imported only when the one before it is not set up
        try:
            candidate = importlib.import_module(home).Stats
        except ImportError:
            continue
        if _stats_set_up(candidate):
            return candidate
        first = first or candidate
    if first is None:  # 3.0 / 3.1
        return importlib.import_module(STATS_HOMES[2]).Stats
    return _set_up_sdk_stats(first)


def _stats_set_up(candidate: Any) -> bool:
    """Whether Airflow gave this ``Stats`` copy its backend factory in this process.

    Read without touching the copy's attributes the normal way: on 3.2 that alone would fix it to "no
    metrics". 3.3 keeps the factory in the module its static methods come from, 3.2 on the class.
    """
    incr = inspect.getattr_static(candidate, "incr", None)
    if isinstance(incr, staticmethod):  # 3.3: module-level state behind a class of static methods
        return getattr(sys.modules.get(incr.__func__.__module__), "_factory", None) is not None
    return inspect.getattr_static(candidate, "factory", None) is not None  # 3.2: class-level state


def _set_up_sdk_stats(candidate: Any) -> Any:
    """Give the Task SDK's ``Stats`` Airflow's factory for this ``[metrics]`` configuration (3.2 takes the
    ``Stats`` class, 3.3 nothing; 3.3 also asks whether to send its legacy names)."""
    utils = importlib.import_module("airflow.sdk.observability.metrics.stats_utils")
    takes_class = bool(inspect.signature(utils.get_stats_factory).parameters)
    factory = utils.get_stats_factory(candidate) if takes_class else utils.get_stats_factory()
    if "export_legacy_names" in inspect.signature(candidate.initialize).parameters:
        legacy = resolve("conf").getboolean("metrics", "legacy_names_on", fallback=True)
        candidate.initialize(factory=factory, export_legacy_names=legacy)
    else:
        candidate.initialize(factory=factory)
    return candidate
