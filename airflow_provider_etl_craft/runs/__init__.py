"""The run lifecycle (docs/lifecycle.md): claim, task attempts and finish, shared by the operators and the CLI.

The names below load on first use (PEP 562): a DAG file importing ``runs.identity`` or ``runs.counts`` does
not import every transition with it (docs/performance.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_etl_craft.runs.counts import TaskCounts
    from airflow_provider_etl_craft.runs.identity import RunIdentity
    from airflow_provider_etl_craft.runs.lifecycle import RunLifecycle
    from airflow_provider_etl_craft.runs.records import AttemptHandle, ClaimOutcome, FinishOutcome, RunRow

_HOMES = {
    "AttemptHandle": "records",
    "ClaimOutcome": "records",
    "FinishOutcome": "records",
    "RunIdentity": "identity",
    "RunLifecycle": "lifecycle",
    "RunRow": "records",
    "TaskCounts": "counts",
}

__all__ = [
    "AttemptHandle",
    "ClaimOutcome",
    "FinishOutcome",
    "RunIdentity",
    "RunLifecycle",
    "RunRow",
    "TaskCounts",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
