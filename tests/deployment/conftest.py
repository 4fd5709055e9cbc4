"""The deployment tier's fixtures: one real Airflow deployment per session (see ``harness.py``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deployment.harness import AirflowDeployment
from tests.fixtures.fix_pg import PgCluster

KEEP_ENV = "ETL_CRAFT_DEPLOYMENT_KEEP"


@pytest.fixture(scope="session")
def airflow_deployment(pg_cluster: PgCluster) -> Iterator[AirflowDeployment]:
    """api-server, scheduler, dag-processor and triggerer (LocalExecutor), started once per session.

    Skipped (or failed, with ETL_CRAFT_REQUIRE_POSTGRES=1) through ``pg_cluster`` when PostgreSQL is missing.
    With ETL_CRAFT_DEPLOYMENT_KEEP=1 its folder (logs, DAG files, SQLite files) is left behind for a look.
    """
    root = Path(tempfile.mkdtemp(prefix="etl-craft-deployment-", dir="/tmp"))
    try:
        deployment = AirflowDeployment.start(pg_cluster, root)
        try:
            yield deployment
        finally:
            deployment.stop()
    finally:
        if os.environ.get(KEEP_ENV) != "1":
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def deployment(airflow_deployment: AirflowDeployment) -> AirflowDeployment:
    """The session's deployment, with this test's DAG ids tracked for the failure report."""
    airflow_deployment.test_dag_ids.clear()
    airflow_deployment.check_alive()
    return airflow_deployment


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On a failed test, attach the component logs and the test's task logs to its report."""
    outcome = yield
    report = outcome.get_result()
    deployment = getattr(item, "funcargs", {}).get("deployment")
    if report.failed and call.when == "call" and isinstance(deployment, AirflowDeployment):
        report.sections.append(("airflow deployment logs", deployment.report()))
