"""Run a pipeline DAG locally with ``dag.test()`` on every supported Airflow line.

Airflow 3.0's ``dag.test()`` does not write the DAG to the metadata database before it runs it, so the
DAG's assets are never activated and any task with an outlet fails before it starts with
``AirflowInactiveAssetInInletOrOutletException``; a pipeline's finish task has one by default
(``emit_asset=True``). From 3.1 ``dag.test()`` syncs the DAG itself. :func:`run_dag_test` does on 3.0
what the dag-processor (and later ``dag.test()``) does, then calls ``dag.test()``; on newer lines it is
``dag.test()`` unchanged. ``make demo`` and the test suite run DAGs through it.
"""

from __future__ import annotations

from typing import Any

#: The DAG bundle Airflow's default configuration puts the DAGs folder in.
DAGS_FOLDER_BUNDLE = "dags-folder"


def dag_test_syncs_the_dag() -> bool:
    """Whether this Airflow's ``dag.test()`` writes the DAG (and activates its assets) itself: 3.1 and later."""
    from airflow import __version__
    from packaging.version import Version

    return Version(__version__).release[:2] >= (3, 1)


def write_dag_to_db(dag: Any, bundle_name: str = DAGS_FOLDER_BUNDLE) -> None:
    """Record ``dag`` and its assets in the metadata DB, as the dag-processor does (Airflow 3.0 API)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.models.dag import DAG as SchedulerDAG
    from airflow.serialization.serialized_objects import SerializedDAG
    from airflow.utils.session import create_session

    # Airflow 3.0's API (only 3.0 calls this); the 3.3 types the lint checks against moved both methods.
    serialized = SerializedDAG.serialize_dag(dag)  # type: ignore[attr-defined]
    scheduler_dag = SerializedDAG.deserialize_dag(serialized)  # type: ignore[attr-defined]
    DagBundlesManager().sync_bundles_to_db()
    with create_session() as session:
        SchedulerDAG.bulk_write_to_db(bundle_name, None, [scheduler_dag], session=session)


def run_dag_test(dag: Any, **kwargs: Any) -> Any:
    """``dag.test(**kwargs)``, after writing the DAG to the metadata DB where this Airflow line needs it."""
    if not dag_test_syncs_the_dag():
        write_dag_to_db(dag)
    return dag.test(**kwargs)
