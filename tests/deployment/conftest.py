"""The deployment tier's fixtures: one real Airflow deployment per session (see ``harness/deployment.py``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.deployment import AirflowDeployment, celery_unavailable
from harness.postgres import PgCluster
from tests.deployment.machines import CeleryMachines
from tests.fixtures.fix_netns import MachinesUnavailable, check_available

KEEP_ENV = "ETL_CRAFT_DEPLOYMENT_KEEP"
#: With 1 (as in CI), a missing piece of the several-machines tier fails its tests instead of skipping them.
REQUIRE_MACHINES_ENV = "ETL_CRAFT_REQUIRE_MACHINES"
MACHINES = ("machine-a", "machine-b")


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


@pytest.fixture(scope="session")
def celery_site(airflow_deployment: AirflowDeployment) -> Iterator[CeleryMachines]:
    """Two machines (network namespaces) each running a Celery worker of the session's deployment.

    Skipped when this host cannot make them (not root; no ip, unshare, socat, redis-server or the celery
    provider), or failed instead with ETL_CRAFT_REQUIRE_MACHINES=1.
    """
    reason = celery_unavailable()
    try:
        check_available()
    except MachinesUnavailable as exc:
        reason = reason or str(exc)
    if reason:
        if os.environ.get(REQUIRE_MACHINES_ENV) == "1":
            pytest.fail(
                f"the several-machines tier cannot run: {reason} (and {REQUIRE_MACHINES_ENV}=1)",
                pytrace=False,
            )
        pytest.skip(f"the several-machines tier cannot run: {reason}")
    site = CeleryMachines.start(airflow_deployment, MACHINES)
    try:
        yield site
    finally:
        site.stop()


@pytest.fixture
def machines(celery_site: CeleryMachines, deployment: AirflowDeployment) -> CeleryMachines:
    """The session's machines, each up, answering and consuming only its own queue."""
    celery_site.reset()
    return celery_site


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On a failed test, attach the component logs and the test's task logs to its report."""
    outcome = yield
    report = outcome.get_result()
    deployment = getattr(item, "funcargs", {}).get("deployment")
    if report.failed and call.when == "call" and isinstance(deployment, AirflowDeployment):
        report.sections.append(("airflow deployment logs", deployment.report()))
        site = item.funcargs.get("machines")
        if isinstance(site, CeleryMachines):
            report.sections.append(("celery workers", site.report()))
