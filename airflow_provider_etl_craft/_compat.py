"""Airflow-version-dependent imports, resolved through the common-compat provider's lazy table."""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any


def mask_secret(value: str) -> None:
    """Register ``value`` with Airflow's secret masker so logs and rendered fields show ``***``."""
    if not value:
        return
    from airflow.providers.common.compat.sdk import mask_secret as _mask

    _mask(value)


def redact(value: Any) -> Any:
    """Apply Airflow's masker to ``value`` (used by tests and by the CLI before printing)."""
    from airflow.providers.common.compat.sdk import redact as _redact

    return _redact(value)


def get_variable(name: str) -> str | None:
    """Look ``name`` up through Airflow Variables (so any configured secrets backend serves it)."""
    from airflow.providers.common.compat.sdk import Variable

    value = Variable.get(name, default=None)
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
