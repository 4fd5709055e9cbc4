"""The Engine DB arguments have one name on every face; the 0.1 names still work for a release, with a warning."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_provider_etl_craft._compat import DAG, BaseOperator
from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.operators.init_db import EngineInitDbOperator
from airflow_provider_etl_craft.operators.pipeline_run import (
    ClaimPipelineRunOperator,
    FinishPipelineRunOperator,
)
from airflow_provider_etl_craft.operators.purge import EnginePurgeOperator
from airflow_provider_etl_craft.operators.task_run import recorded
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline

START = datetime(2026, 1, 1)

OPERATORS: dict[str, Callable[..., Any]] = {
    "claim": lambda **kw: ClaimPipelineRunOperator(task_id="claim", pipeline_code="SALES", **kw),
    "finish": lambda **kw: FinishPipelineRunOperator(task_id="finish", pipeline_code="SALES", **kw),
    "init_db": lambda **kw: EngineInitDbOperator(task_id="init_db", **kw),
    "purge": lambda **kw: EnginePurgeOperator(task_id="purge", older_than="90d", **kw),
}
#: (operator, new name, old name, value) for every renamed argument.
RENAMED = [
    *((op, "etl_craft_profile", "profile", "prod") for op in OPERATORS),
    *((op, "etl_craft_lock_timeout", "lock_timeout", 7.5) for op in ("claim", "finish", "init_db")),
]


@pytest.mark.parametrize(("op", "new", "old", "value"), RENAMED)
def test_the_new_name_is_taken_without_a_warning(op: str, new: str, old: str, value: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", AirflowProviderDeprecationWarning)
        task = OPERATORS[op](**{new: value})
    assert getattr(task, new) == value


@pytest.mark.parametrize(("op", "new", "old", "value"), RENAMED)
def test_the_old_name_warns_and_still_works(op: str, new: str, old: str, value: Any) -> None:
    with pytest.warns(AirflowProviderDeprecationWarning, match=rf"{old}= is deprecated.*use {new}="):
        task = OPERATORS[op](**{old: value})
    assert getattr(task, new) == value


@pytest.mark.parametrize(("op", "new", "old", "value"), RENAMED)
def test_both_names_are_refused_naming_them(op: str, new: str, old: str, value: Any) -> None:
    with pytest.raises(TypeError, match=rf"got both {new}= and {old}=, its deprecated name"):
        OPERATORS[op](**{new: value, old: value})


def test_the_init_db_lock_defaults_to_the_migrate_lock_and_the_claim_to_the_pipeline_lock() -> None:
    assert EngineInitDbOperator(task_id="init_db").etl_craft_lock_timeout == 300.0
    assert OPERATORS["claim"]().etl_craft_lock_timeout == 60.0


def _group_profiles(**group: Any) -> tuple[Any, Any, Any]:
    with DAG("renamed", schedule=None, start_date=START) as dag, etl_craft_pipeline("SALES", **group):

        @etl_craft_task
        def load():
            return 1

        load()
    return tuple(dag.get_task(f"sales.{t}").etl_craft_profile for t in ("claim", "load", "finish"))


def test_the_pipeline_group_takes_etl_craft_profile_for_claim_tasks_and_finish() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", AirflowProviderDeprecationWarning)
        assert _group_profiles(etl_craft_profile="prod") == ("prod", "prod", "prod")


def test_the_pipeline_group_still_takes_profile_with_a_warning() -> None:
    with pytest.warns(AirflowProviderDeprecationWarning, match="etl_craft_pipeline: profile= is deprecated"):
        assert _group_profiles(profile="prod") == ("prod", "prod", "prod")


def test_the_pipeline_group_refuses_both_profile_names() -> None:
    with pytest.raises(TypeError, match="etl_craft_pipeline got both etl_craft_profile= and profile="):
        _group_profiles(etl_craft_profile="prod", profile="prod")


class _ProfiledOperator(BaseOperator):
    """An operator of someone else's with a ``profile`` argument of its own (as dbt operators have)."""

    def __init__(self, *, profile: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.profile = profile


def test_a_wrapped_operators_own_profile_stays_its_own() -> None:
    task = recorded(_ProfiledOperator)(
        task_id="dbt_run", pipeline_code="SALES", profile="dbt_warehouse", etl_craft_profile="prod"
    )
    assert (task.profile, task.etl_craft_profile) == ("dbt_warehouse", "prod")
