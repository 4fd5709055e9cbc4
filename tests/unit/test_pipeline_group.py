"""How ``etl_craft_pipeline`` wires a DAG at parse time (no Engine DB, no Airflow run)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from airflow_provider_etl_craft._compat import DAG
from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.operators.pipeline_run import ClaimPipelineRunOperator
from airflow_provider_etl_craft.operators.task_run import is_mapped, pipeline_tasks
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline

START = datetime(2026, 1, 1)


def test_claim_and_finish_are_setup_and_teardown_around_the_work() -> None:
    with DAG("wiring", schedule=None, start_date=START) as dag, etl_craft_pipeline("SALES"):

        @etl_craft_task
        def extract():
            return 1

        @etl_craft_task
        def load():
            return 1

        extract() >> load()
    claim, finish = dag.get_task("sales.claim"), dag.get_task("sales.finish")
    assert claim.is_setup and finish.is_teardown and finish.on_failure_fail_dagrun
    assert finish.trigger_rule == "all_done_setup_success"
    assert claim.downstream_task_ids == {"sales.extract", "sales.finish"}
    assert finish.upstream_task_ids == {"sales.claim", "sales.extract", "sales.load"}


def test_a_root_task_with_a_lenient_trigger_rule_is_refused_naming_it() -> None:
    with (
        pytest.raises(ValueError, match=r"sales\.first \(all_done\) start right after the claim"),
        DAG("lenient_root", schedule=None, start_date=START),
        etl_craft_pipeline("SALES"),
    ):

        @etl_craft_task(trigger_rule="all_done")
        def first():
            return 1

        first()


def test_a_mapped_task_inherits_the_pipeline_and_counts_once() -> None:
    with (
        DAG("mapped", schedule=None, start_date=START) as dag,
        etl_craft_pipeline("SALES", etl_craft_profile="prod"),
    ):

        @etl_craft_task
        def load_file(name):
            return 1

        load_file.expand(name=["a", "b"])
    mapped = dag.get_task("sales.load_file")
    assert is_mapped(mapped)
    assert mapped.partial_kwargs["pipeline_code"] == "SALES"
    assert mapped.partial_kwargs["etl_craft_profile"] == "prod"
    assert pipeline_tasks(dag, "SALES") == {"LOAD_FILE": "sales.load_file"}


@pytest.mark.parametrize(
    ("default_args", "claim_kwargs", "expected"),
    [
        ({}, {}, 3),
        ({"retries": 0}, {}, 3),
        ({"retries": 5}, {}, 3),
        ({}, {"retries": 0}, 3),
        ({}, {"retries": 5}, 5),
    ],
)
def test_the_claim_has_its_own_retries_independent_of_the_dags(default_args: dict, claim_kwargs: dict,
                                                               expected: int) -> None:  # fmt: skip
    with DAG("claim_retries", schedule=None, start_date=START, default_args=default_args):
        claim = ClaimPipelineRunOperator(task_id="claim", pipeline_code="SALES", **claim_kwargs)
    assert claim.retries == expected
    assert claim.retry_delay == timedelta(seconds=10)
