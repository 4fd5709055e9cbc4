"""The run lifecycle (SPEC §9): claim, task attempts and finish, shared by the operators and the CLI."""

from airflow_provider_etl_craft.runs.counts import TaskCounts
from airflow_provider_etl_craft.runs.identity import RunIdentity
from airflow_provider_etl_craft.runs.lifecycle import RunLifecycle
from airflow_provider_etl_craft.runs.records import (
    AttemptHandle,
    ClaimOutcome,
    FinishOutcome,
    RunRow,
)

__all__ = [
    "AttemptHandle",
    "ClaimOutcome",
    "FinishOutcome",
    "RunIdentity",
    "RunLifecycle",
    "RunRow",
    "TaskCounts",
]
