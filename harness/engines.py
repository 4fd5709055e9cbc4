"""Engine DB profiles on disk: a ``craft-connector.yml`` for a SQLite file or a database of the throwaway
PostgreSQL cluster (:mod:`harness.postgres`), and a hook's rows read on a fresh connection.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from harness.postgres import PgDatabase


@dataclass
class EngineSetup:
    """A craft-connector.yml on disk for one dialect, plus the environment its secret lives in."""

    dialect: str
    config_path: Path
    env: dict[str, str] = field(default_factory=dict)
    database: PgDatabase | None = None  # on PostgreSQL

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
    """Write ``craft-connector.yml`` into ``folder`` (made if missing) and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "craft-connector.yml"
    path.write_text(text, encoding="utf-8")
    return path


def pg_profile_yaml(db: PgDatabase, schema: str | None = None, secret_var: str = "ENGINE_SECRET") -> str:
    """The ``test`` Engine profile of ``db`` (password login as its user, the password in ``secret_var``)."""
    cluster = db.cluster
    return (
        "Engine:\n  test:\n"
        f"    jdbc_url: jdbc:postgresql://{cluster.host}:{cluster.port}/{db.name}?sslmode=require\n"
        f"    schema: {schema or db.schema}\n"
        f"    user: {db.user}\n"
        "    auth_mode: password\n"
        f"    secret: {secret_var}\n"
    )
