"""Engine DB retention: a daily maintenance DAG that deletes run history older than 90 days.

It keeps every run a gate or a claim still reads (docs/retention.md), works in short batches while the
pipelines keep running, and leaves an ``AUD_ENGINE_PURGES`` row per run of the task. Set ``archive_dir`` to
keep a JSON Lines copy of everything it deletes. Needs an ``etl_craft_default`` connection (see
example_etl_craft_init).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_etl_craft.operators.purge import EnginePurgeOperator

with DAG(
    dag_id="example_etl_craft_purge",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["etl-craft", "example", "maintenance"],
    doc_md=__doc__,
) as dag:
    # [START howto_operator_engine_purge]
    purge_engine_history = EnginePurgeOperator(
        task_id="purge_engine_history",
        etl_craft_conn_id="etl_craft_default",
        older_than="90d",
        batch_size=500,
        archive_dir=None,  # e.g. "/data/etl-craft-archive/{{ ds }}"
    )
    # [END howto_operator_engine_purge]
