"""The Engine DB through an Airflow connection of type ``postgres`` (apache-airflow-providers-postgres),
against the real throwaway PostgreSQL cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import RunIdentity
from harness.postgres import PgDatabase
from tests.reliability.conftest import pipeline_sql

pytestmark = pytest.mark.postgres

CONN_ID = "engine_pg"


def postgres_connection(monkeypatch: pytest.MonkeyPatch, database: PgDatabase, **extra: Any) -> EngineDBHook:
    """``AIRFLOW_CONN_ENGINE_PG``: a ``postgres`` connection on ``database`` (TLS required), and a hook on it."""
    conn = {
        "conn_type": "postgres",
        "host": database.cluster.host,
        "port": database.cluster.port,
        "schema": database.name,
        "login": database.user,
        "password": database.password,
        "extra": {"sslmode": "verify-full", "sslrootcert": str(database.cluster.ca_cert), **extra},
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
    return EngineDBHook(etl_craft_conn_id=CONN_ID)


def test_a_postgres_connection_connects_tests_and_claims(
    pg_database: PgDatabase, tmp_path: Path, monkeypatch
) -> None:
    hook = postgres_connection(monkeypatch, pg_database, engine_schema="etl_craft", cursor="dictcursor")
    assert hook.get_first("SELECT current_user, current_schema(), ssl FROM pg_stat_ssl WHERE pid = "
                          "pg_backend_pid()") == (pg_database.user, "etl_craft", True)  # fmt: skip
    ok, message = hook.test_connection()
    # The Test button judges what `check` judges: connected, but an empty Engine DB fails, naming init-db.
    assert not ok and "holds no Engine tables yet" in message and "init-db" in message, message
    assert pg_database.password not in message
    assert pg_database.password not in str(_compat.redact(f"line with {pg_database.password}"))  # masked

    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "0001_pipeline.sql").write_text(pipeline_sql("PG_CONN", ["WORK"]), encoding="utf-8")
    assert hook.migrate(folder).applied[-1] == "PROJECT 0001_pipeline.sql"
    ok, message = hook.test_connection()
    assert ok and "the Engine tables exist" in message, message
    with hook.lifecycle() as lifecycle:
        outcome = lifecycle.claim("PG_CONN", RunIdentity(dag_id="pg_dag", run_id="manual__1", run_date=None))
    assert outcome.action == "CREATED", outcome
    assert hook.get_records("SELECT STATUS, RUN_KEY FROM AUD_PIPELINES_RUN_LOG") == [
        ("IN-PROGRESS", "airflow:pg_dag:manual__1")
    ]


def test_a_postgres_connection_without_engine_schema_names_the_connection_and_the_extra(
    pg_database: PgDatabase, monkeypatch
) -> None:
    hook = postgres_connection(monkeypatch, pg_database)
    with pytest.raises(ConfigurationError, match=rf"Airflow connection '{CONN_ID}' \(type postgres\): set the extra "
                       "engine_schema"):  # fmt: skip
        hook.get_conn()
    ok, message = hook.test_connection()
    assert not ok and "engine_schema" in message and CONN_ID in message


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"iam": True}, "extra(s) iam ask for an IAM token"),
        ({"search_path": "x"}, "extra(s) search_path are not libpq settings"),
    ],
)
def test_a_postgres_connection_refuses_extras_it_cannot_honour(
    pg_database: PgDatabase, monkeypatch, extra: dict[str, Any], said: str
) -> None:
    hook = postgres_connection(monkeypatch, pg_database, engine_schema="etl_craft", **extra)
    with pytest.raises(ConfigurationError) as info:
        hook.get_conn()
    assert (
        said in str(info.value) and CONN_ID in str(info.value) and pg_database.password not in str(info.value)
    )
