"""The DAILY_SALES pipeline (CFG_ rows from the example project's migration), run by Airflow.

``claim → extract_orders → load_orders → build_sales_mart → finish``, plus ``notify_failure``, which runs
only when a task upstream of it failed. Every task is recorded in the Engine DB (AUD_TASK_RUN_LOG,
AUD_TASK_ATTEMPTS) with the counts it returns. The warehouse is a SQLite file reached through an Airflow
connection of type ``sqlite``; the Engine DB through ``etl_craft_default``::

    AIRFLOW_CONN_ETL_CRAFT_DEFAULT='{"conn_type": "etl_craft", "extra": {"config_path": "/path/craft-connector.yml"}}'
    AIRFLOW_CONN_ETL_CRAFT_WAREHOUSE='{"conn_type": "sqlite", "host": "/path/warehouse.db"}'

Every task works on the run's date (:func:`run_date`): the logical date when the DAG run has one, else its
``run_after``. A DAG run triggered from the UI, the CLI or the REST API has no logical date by default in
Airflow 3, so the ``ds`` template variable is undefined for it.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator
from airflow.sdk import DAG

from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.operators.task_run import recorded
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline

WAREHOUSE_CONN_ID = "etl_craft_warehouse"
RecordedSQLExecuteQueryOperator = recorded(SQLExecuteQueryOperator)


def run_date(dag_run: Any) -> str:
    """The day (``YYYY-MM-DD``) a DAG run loads: its logical date, or ``run_after`` when it has none.

    :raises ValueError: the DAG run has neither (rows are never written under a missing date).
    """
    when = getattr(dag_run, "logical_date", None) or getattr(dag_run, "run_after", None)
    if when is None:
        raise ValueError(
            f"DAG run {getattr(dag_run, 'run_id', dag_run)!r} has no logical date and no run_after"
        )
    return when.strftime("%Y-%m-%d")


#: The run's date in a templated field, e.g. a SQL parameter: :func:`run_date` as a DAG macro.
RUN_DATE = "{{ run_date(dag_run) }}"


def inserted_rows(results: Any) -> dict[str, int]:
    """Counts of a SQL task whose last statement is ``SELECT changes()`` (rows the INSERT before it wrote).

    With a list of statements, SQLExecuteQueryOperator returns one result per statement.
    """
    inserted = int(results[-1][0][0])
    return {"insert_count": inserted, "rows_written": inserted}


with DAG(  # noqa: SIM117 - the pipeline group reads better on its own line
    dag_id="example_etl_craft_daily_sales",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    tags=["etl-craft", "example"],
    user_defined_macros={"run_date": run_date},
    doc_md=__doc__,
) as dag:
    # [START howto_etl_craft_pipeline]
    with etl_craft_pipeline("DAILY_SALES", claim_kwargs={"poke_interval": 30}):

        @etl_craft_task
        def extract_orders(dag_run: Any = None) -> dict[str, int]:
            """Pull the day's orders from the 'source' (generated here) into raw_orders."""
            from airflow.providers.sqlite.hooks.sqlite import SqliteHook

            ds = run_date(dag_run)
            rng = random.Random(ds)
            rows = [
                (f"{ds}-{i:04d}", ds, rng.choice(["north", "south", "west"]), round(rng.uniform(5, 500), 2))
                for i in range(rng.randint(40, 60))
            ]
            hook = SqliteHook(sqlite_conn_id=WAREHOUSE_CONN_ID)
            hook.run(
                "CREATE TABLE IF NOT EXISTS raw_orders (order_id TEXT PRIMARY KEY, order_date TEXT, "
                "region TEXT, amount REAL)"
            )
            hook.run("DELETE FROM raw_orders WHERE order_date = ?", parameters=(ds,))
            hook.insert_rows("raw_orders", rows, target_fields=["order_id", "order_date", "region", "amount"])
            return {"source_count": len(rows), "rows_written": len(rows)}

        load_orders = RecordedSQLExecuteQueryOperator(
            task_id="load_orders",
            conn_id=WAREHOUSE_CONN_ID,
            sql=[
                "CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, order_date TEXT, region TEXT, "
                "amount REAL)",
                "DELETE FROM orders WHERE order_date = :ds",
                "INSERT INTO orders SELECT order_id, order_date, region, amount FROM raw_orders "
                "WHERE order_date = :ds AND amount > 0",
                "SELECT changes()",
            ],
            parameters={"ds": RUN_DATE},
            counts=inserted_rows,
        )

        build_sales_mart = RecordedSQLExecuteQueryOperator(
            task_id="build_sales_mart",
            conn_id=WAREHOUSE_CONN_ID,
            sql=[
                "CREATE TABLE IF NOT EXISTS sales_mart (sales_date TEXT, region TEXT, orders INTEGER, revenue REAL, "
                "PRIMARY KEY (sales_date, region))",
                "DELETE FROM sales_mart WHERE sales_date = :ds",
                "INSERT INTO sales_mart SELECT order_date, region, COUNT(*), ROUND(SUM(amount), 2) FROM orders "
                "WHERE order_date = :ds GROUP BY order_date, region",
                "SELECT changes()",
            ],
            parameters={"ds": RUN_DATE},
            counts=inserted_rows,
        )

        @etl_craft_task(trigger_rule="one_failed", retries=0)
        def notify_failure() -> None:
            """The EMAIL_ALERT task: runs only when an upstream task failed (its own failure never fails the run)."""
            print("DAILY_SALES failed: an alert would be sent here")

        extracted = extract_orders()
        extracted >> load_orders >> build_sales_mart
        [extracted, load_orders, build_sales_mart] >> notify_failure()
    # [END howto_etl_craft_pipeline]
