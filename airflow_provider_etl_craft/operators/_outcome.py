"""Map the provider's typed errors to Airflow outcomes: permanent → no retry, transient → ordinary failure.

Each one is counted by its class (``etl_craft.engine_error.<status>``, docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from airflow_provider_etl_craft import _compat, metrics
from airflow_provider_etl_craft.errors import EtlCraftError


@contextmanager
def airflow_outcome() -> Iterator[None]:
    """Re-raise an :class:`EtlCraftError` as ``AirflowFailException`` (permanent) or ``AirflowException``."""
    try:
        yield
    except EtlCraftError as exc:
        metrics.engine_error(exc.status_name, exc.retryable)
        kind = _compat.retry_exception() if exc.retryable else _compat.fail_exception()
        raise kind(f"[{exc.status_name}] {exc}") from exc
