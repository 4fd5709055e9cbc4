"""Airflow-version-dependent imports, resolved through the common-compat provider's lazy table."""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any


def mask_secret(value: str) -> None:
    """Register ``value`` with Airflow's secret masker so logs and rendered fields show ``***``."""
    if not value:
        return
    _masking("mask_secret")(value)


def redact(value: Any) -> Any:
    """Apply Airflow's masker to ``value`` (used by tests and by the CLI before printing)."""
    return _masking("redact")(value)


#: Where the masker's functions are: common-compat's table from 1.22, else the Task SDK's own modules.
_MASKER_MODULES = (
    "airflow.providers.common.compat.sdk",
    "airflow.sdk.log",
    "airflow.sdk.execution_time.secrets_masker",
)


@cache
def _masking(name: str) -> Any:
    for module in _MASKER_MODULES:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"this Airflow has no secret masker function {name}")


def get_variable(name: str) -> str | None:
    """Look ``name`` up through Airflow Variables (so any configured secrets backend serves it).

    Outside a task (the CLI, DAG parsing) Airflow 3.0's Task SDK Variable needs a task supervisor; there
    the core model, which asks the same secrets backends, answers instead.
    """
    from airflow.providers.common.compat.sdk import Variable

    try:
        value = Variable.get(name, default=None)
    except ImportError:
        from airflow.models.variable import Variable as CoreVariable

        value = CoreVariable.get(name, default_var=None)
    return None if value is None else str(value)


def fail_exception() -> type[Exception]:
    """Airflow's no-retry failure class."""
    from airflow.providers.common.compat.sdk import AirflowFailException

    return AirflowFailException


def retry_exception() -> type[Exception]:
    """Airflow's ordinary (retryable) failure class."""
    from airflow.providers.common.compat.sdk import AirflowException

    return AirflowException


@cache
def airflow_exception(name: str) -> type[BaseException]:
    """An Airflow exception class by name: the Task SDK's where this Airflow line has it, else the core one.

    Covers the control-flow signals (``TaskDeferred``, ``AirflowRescheduleException``,
    ``DownstreamTasksSkipped``) and deferral failures (``TaskDeferralError``, ``TaskDeferralTimeout``),
    which moved between modules across Airflow 3 lines.
    """
    for module in ("airflow.sdk.exceptions", "airflow.exceptions"):
        try:
            found = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        return found  # type: ignore[no-any-return]
    raise ImportError(f"this Airflow has no exception class {name}")
