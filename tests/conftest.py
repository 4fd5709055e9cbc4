"""Shared fixtures: an Engine DB profile on each dialect, written as a real craft-connector.yml."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.auth import cache
from airflow_provider_etl_craft.config import connection
from airflow_provider_etl_craft.engine import reuse
from harness.engines import EngineSetup, pg_profile_yaml, write_config

# A wait's hand-back delay guards against the executor-event race of a real scheduler (docs/deferred-waits.md).
# dag.test() runs every task in its own process with no executor, so there is no event to race: the tests that
# use it (here and in the subprocesses they start) wait without it. The deployment tier starts Airflow with
# none of this process's AIRFLOW__ variables, so it runs with the default; tests of the delay set it themselves.
os.environ.setdefault("AIRFLOW__ETL_CRAFT__WAIT_HAND_BACK_DELAY", "0")

DIALECTS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
#: For a test of the ``engine`` fixture whose point on each Airflow line does not depend on the engine: both
#: engines in the full suite, SQLite alone in the smoke set (which CI runs once per older line).
SMOKE_ON_SQLITE = pytest.mark.parametrize(
    "engine",
    [pytest.param("sqlite", marks=pytest.mark.smoke), pytest.param("postgresql", marks=pytest.mark.postgres)],
    indirect=True,
)


@pytest.fixture(autouse=True)
def _no_cached_credentials() -> Iterator[None]:
    """Every test starts without the tokens and assumed-role keys an earlier one left in this process."""
    cache.clear_all()
    yield
    cache.clear_all()


@pytest.fixture(autouse=True)
def _no_kept_engine_connection() -> Iterator[None]:
    """Every test starts without the Engine DB connection an earlier recorded task kept in this process."""
    reuse.close_all()
    yield
    reuse.close_all()


@pytest.fixture
def make_engine(request: pytest.FixtureRequest, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> Callable[[str], EngineSetup]:  # fmt: skip
    """Factory: an Engine profile on the given dialect (a fresh SQLite file, or a fresh PostgreSQL database)."""

    def make(dialect: str, folder: Path | None = None) -> EngineSetup:
        folder = folder or tmp_path
        folder.mkdir(parents=True, exist_ok=True)
        if dialect == "sqlite":
            text = "Engine:\n  test:\n    jdbc_url: jdbc:sqlite:engine/etl-craft.db\n    schema: main\n"
            return EngineSetup("sqlite", write_config(folder, text))
        db = request.getfixturevalue("pg_database")
        env = {"ENGINE_SECRET": db.password}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return EngineSetup("postgresql", write_config(folder, pg_profile_yaml(db)), env, db)

    return make


@pytest.fixture
def profile_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The Engine profile reads of the test (each asks Airflow for the connection), by connection id."""
    seen: list[str] = []
    read = connection.profile_for_conn_id

    def counted(conn_id: str, profile: str | None = None) -> Any:
        seen.append(conn_id)
        return read(conn_id, profile)

    monkeypatch.setattr(connection, "profile_for_conn_id", counted)
    return seen


@pytest.fixture(params=DIALECTS)
def engine(request: pytest.FixtureRequest, make_engine: Callable[[str], EngineSetup]) -> EngineSetup:
    """An Engine profile on each dialect in turn (tests using it run twice)."""
    return make_engine(request.param)
