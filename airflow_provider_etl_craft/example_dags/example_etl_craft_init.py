"""Prepare an Engine DB from Airflow: init-db plus the project's migrations (which add the CFG_ rows).

Needs an ``etl_craft_default`` connection, e.g. file-backed::

    AIRFLOW_CONN_ETL_CRAFT_DEFAULT='{"conn_type": "etl_craft", "extra": {"config_path": "/path/craft-connector.yml"}}'
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_etl_craft.operators.init_db import EngineInitDbOperator

with DAG(
    dag_id="example_etl_craft_init",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["etl-craft", "example"],
    doc_md=__doc__,
) as dag:
    # [START howto_operator_engine_init_db]
    init_engine_db = EngineInitDbOperator(
        task_id="init_engine_db",
        etl_craft_conn_id="etl_craft_default",
        apply_migrations=True,  # migrations/ beside craft-connector.yml, or migrations_dir=…
    )
    # [END howto_operator_engine_init_db]
