"""Shared fixtures: an Engine DB profile on each dialect, written as a real craft-connector.yml."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.auth import cache
from airflow_provider_etl_craft.engine import reuse
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

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


@dataclass
class EngineSetup:
    """A craft-connector.yml on disk for one dialect, plus the environment its secret lives in."""

    dialect: str
    config_path: Path
    env: dict[str, str] = field(default_factory=dict)
    database: object | None = None  # PgDatabase on PostgreSQL

    def hook(self) -> EngineDBHook:
        return EngineDBHook.from_config(self.config_path)

    def subprocess_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}


def engine_rows(hook: EngineDBHook, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Rows of one statement (``?`` placeholders) on a fresh connection, as its own transaction.

    Through the dialect on the Engine's own connection (``?`` placeholders on both dialects), which sets
    the Engine schema for the statement.
    """
    with closing(hook.engine.connect()) as conn:
        return [tuple(r) for r in hook.engine.query(conn, sql, params)]


def write_config(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "craft-connector.yml"
    path.write_text(text, encoding="utf-8")
    return path


def pg_profile_yaml(db: object, schema: str | None = None, secret_var: str = "ENGINE_SECRET") -> str:
    cluster = db.cluster  # type: ignore[attr-defined]
    return (
        "Engine:\n  test:\n"
        f"    jdbc_url: jdbc:postgresql://{cluster.host}:{cluster.port}/{db.name}?sslmode=require\n"  # type: ignore[attr-defined]
        f"    schema: {schema or db.schema}\n"  # type: ignore[attr-defined]
        f"    user: {db.user}\n"  # type: ignore[attr-defined]
        "    auth_mode: password\n"
        f"    secret: {secret_var}\n"
    )


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


@pytest.fixture(params=DIALECTS)
def engine(request: pytest.FixtureRequest, make_engine: Callable[[str], EngineSetup]) -> EngineSetup:
    """An Engine profile on each dialect in turn (tests using it run twice)."""
    return make_engine(request.param)
