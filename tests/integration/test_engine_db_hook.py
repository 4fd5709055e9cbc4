"""EngineDBHook on real SQLite files and a real PostgreSQL server: session setup, checks, connections."""

from __future__ import annotations

import io
import json
import re
import sqlite3
from contextlib import closing

import pytest

from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.engine.dialects.sqlite import check_sqlite_version
from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from harness.engines import EngineSetup, pg_profile_yaml, write_config


def test_sqlite_connections_use_wal_foreign_keys_and_a_busy_timeout(make_engine) -> None:
    conn = make_engine("sqlite").hook().engine.connect(create=True)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 10_000


def test_sqlite_write_transactions_begin_immediate(make_engine) -> None:
    hook = make_engine("sqlite").hook()
    conn = hook.engine.connect(create=True)
    sent: list[str] = []
    conn.set_trace_callback(sent.append)
    with hook.engine.transaction(conn) as cur:
        cur.execute("CREATE TABLE T (X INTEGER)")
    assert sent[0] == "BEGIN IMMEDIATE"
    assert sent[-1] == "COMMIT"


def test_sqlite_older_than_3_35_is_refused_with_both_versions() -> None:
    with pytest.raises(ConfigurationError, match=r"SQLite 3\.35\.0 or newer.*links SQLite 3\.34\.1"):
        check_sqlite_version((3, 34, 1))
    check_sqlite_version((3, 35, 0))


@pytest.mark.postgres
def test_postgres_transactions_set_the_profile_schema_and_the_session_keeps_none(make_engine) -> None:
    """No ``options=-c search_path`` (poolers refuse it): each transaction sets the schema for itself only."""
    setup = make_engine("postgresql")
    hook = setup.hook()
    assert "options" not in hook.engine.connect_kwargs()
    schema = setup.database.schema
    with closing(hook.engine.connect()) as conn:  # the Engine's own connection (get_conn(): test_user_sql.py)
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('search_path'), current_setting('application_name')")
            assert cur.fetchone() == ('"$user", public', "etl-craft-airflow")
        with hook.engine.transaction(conn) as cur:
            cur.execute("SELECT current_schema(), current_setting('search_path')")
            assert cur.fetchone() == (schema, schema)  # SET LOCAL search_path TO "<schema>"
        assert hook.engine.query(conn, "SELECT current_schema()") == [(schema,)]
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('search_path')")
            assert cur.fetchone() == ('"$user", public',)  # nothing stayed on the session


@pytest.mark.postgres
def test_postgres_url_options_are_passed_untouched(pg_database, tmp_path, monkeypatch) -> None:
    text = pg_profile_yaml(pg_database).replace(
        "?sslmode=require", "?sslmode=require&options=-c%20work_mem%3D8MB"
    )
    monkeypatch.setenv("ENGINE_SECRET", pg_database.password)
    hook = EngineDBHook.from_config(write_config(tmp_path, text))
    with closing(hook.get_conn()) as conn:
        assert hook.engine.query(conn, "SELECT current_setting('work_mem'), current_schema()") == [
            ("8MB", pg_database.schema)
        ]


@pytest.mark.postgres
def test_postgres_schema_without_usage_stops_check_test_connection_and_init_db(
    pg_database, tmp_path, monkeypatch
) -> None:
    """The schema exists but the role may not use it: current_schema() is NULL in its transactions."""
    admin = pg_database.cluster.admin_connect(pg_database.name)
    with closing(admin), admin.cursor() as cur:
        cur.execute("CREATE SCHEMA no_usage")  # owned by the superuser; no GRANT to the profile's role
    monkeypatch.setenv("ENGINE_SECRET", pg_database.password)
    config = write_config(tmp_path, pg_profile_yaml(pg_database, schema="no_usage"))
    hook = EngineDBHook.from_config(config)
    naming = r"resolve names in schema no schema, not in the profile's schema \"no_usage\""
    ok, message = hook.test_connection()
    assert not ok and re.search(naming, message) and "GRANT USAGE" in message
    with pytest.raises(ConfigurationError, match=naming):
        hook.init_db()
    out, err = io.StringIO(), io.StringIO()
    assert main(["check", "--config", str(config)], out, err) == 1
    assert re.search(r"\[FAIL\] Engine DB schema: .*" + naming, out.getvalue())
    assert "[OK  ] Engine DB connection:" in out.getvalue()
    assert "[FAIL] Engine DB tables: not checked: needs Engine DB schema, which failed" in out.getvalue()
    admin = pg_database.cluster.admin_connect(pg_database.name)
    with closing(admin), admin.cursor() as cur:  # init-db created nothing anywhere
        cur.execute("SELECT count(*) FROM pg_tables WHERE schemaname IN ('public', 'no_usage')")
        assert cur.fetchone() == (0,)


@pytest.mark.postgres
def test_postgres_url_query_settings_reach_the_driver(pg_database, tmp_path, monkeypatch) -> None:
    text = pg_profile_yaml(pg_database).replace(
        "?sslmode=require", "?sslmode=disable&application_name=etl-query-test"
    )
    monkeypatch.setenv("ENGINE_SECRET", pg_database.password)
    hook = EngineDBHook.from_config(write_config(tmp_path, text))
    with hook.get_conn() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT ssl, current_setting('application_name') FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        )
        assert cur.fetchone() == (False, "etl-query-test")


@pytest.mark.postgres
def test_postgres_missing_schema_is_a_configuration_error_with_the_fix(make_engine, tmp_path) -> None:
    setup = make_engine("postgresql")
    write_config(tmp_path, pg_profile_yaml(setup.database, schema="engine_missing"))
    hook = EngineDBHook.from_config(tmp_path / "craft-connector.yml")
    with pytest.raises(ConfigurationError) as info:
        hook.get_conn()
    message = str(info.value)
    assert '"engine_missing"' in message and f'"{setup.database.name}"' in message
    assert "CREATE SCHEMA engine_missing;" in message
    out, err = io.StringIO(), io.StringIO()
    assert main(["init-db", "--config", str(tmp_path / "craft-connector.yml")], out, err) == 3
    assert err.getvalue().count("error:") == 1 and "CREATE SCHEMA engine_missing;" in err.getvalue()


@pytest.mark.postgres
def test_postgres_wrong_secret_is_a_permanent_error_without_the_secret(make_engine, monkeypatch) -> None:
    setup = make_engine("postgresql")
    monkeypatch.setenv("ENGINE_SECRET", "wrong-secret-value-123")
    with pytest.raises(ConfigurationError) as info:
        setup.hook().get_conn()
    assert not info.value.retryable
    assert "authentication failed" in str(info.value)
    assert "wrong-secret-value-123" not in str(info.value)


@pytest.mark.postgres
def test_unreachable_postgres_is_retryable(tmp_path, monkeypatch) -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    write_config(tmp_path, "Engine:\n  x:\n"
                 f"    jdbc_url: jdbc:postgresql://127.0.0.1:{port}/db?connect_timeout=2\n"
                 "    schema: s\n    user: u\n    auth_mode: password\n    secret: UNREACH_SECRET\n")  # fmt: skip
    monkeypatch.setenv("UNREACH_SECRET", "pw")
    with pytest.raises(ConfigurationError) as info:
        EngineDBHook.from_config(tmp_path / "craft-connector.yml").get_conn()
    assert info.value.retryable and info.value.exit_code == 3


def test_uri_and_descriptions_never_show_the_secret(engine: EngineSetup) -> None:
    hook = engine.hook()
    shown = " ".join(
        [hook.get_uri(), hook.engine.describe(), hook.engine_profile.describe(), repr(hook.engine_profile)]
    )
    for secret in engine.env.values():
        assert secret not in shown
    assert hook.dialect_name == engine.dialect


@pytest.mark.smoke
def test_test_connection_reports_whether_the_engine_tables_exist(engine: EngineSetup) -> None:
    hook = engine.hook()
    ok, message = hook.test_connection()
    if engine.dialect == "sqlite":  # only init-db creates the file: before it there is nothing to open
        assert not ok and "does not exist on this machine" in message and "init-db" in message
        assert not hook.engine.path.exists()
    else:  # as `check` says: the Engine DB is reachable, but not ready for runs
        assert not ok and "holds no Engine tables yet" in message and "init-db" in message
    hook.init_db()
    ok, message = hook.test_connection()
    assert ok and "the Engine tables exist" in message
    folder = engine.config_path.parent / "migrations"  # project migrations beside craft-connector.yml
    folder.mkdir()
    (folder / "0001_a.sql").write_text("CREATE TABLE A1 (X INTEGER);\n", encoding="utf-8")
    ok, message = engine.hook().test_connection()
    assert not ok and message.startswith(
        "1 pending: PROJECT 0001_a.sql; apply with `etl-craft-airflow migrate`"
    )
    status = main(["check", "--config", str(engine.config_path)], io.StringIO(), io.StringIO())
    assert status == 1


def test_dbapi_methods_work_on_the_engine_db(engine: EngineSetup) -> None:
    hook = engine.hook()
    hook.init_db()
    schema = hook.engine_profile.schema  # the hook's own SQL names the Engine schema (no session search_path)
    hook.run(
        f"INSERT INTO {schema}.CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE) VALUES ('P1', 'One', 'FULL')"
    )
    assert hook.get_records(f"SELECT PIPELINE_CODE, ACTIVE_FLAG FROM {schema}.CFG_PIPELINES") == [("P1", "Y")]


def test_file_backed_airflow_connection(engine: EngineSetup, monkeypatch) -> None:
    extra = {"config_path": str(engine.config_path), "profile": "test"}
    monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_FILE", json.dumps({"conn_type": "etl_craft", "extra": extra}))
    hook = EngineDBHook("etl_craft_file")
    assert hook.engine_profile.name == "test"
    hook.init_db()
    assert hook.test_connection()[0]


def test_inline_sqlite_airflow_connection(tmp_path, monkeypatch) -> None:
    db = tmp_path / "inline" / "engine.db"
    conn = {"conn_type": "etl_craft", "extra": {"jdbc_url": f"jdbc:sqlite:{db}"}}
    monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_INLINE", json.dumps(conn))
    hook = EngineDBHook(etl_craft_conn_id="etl_craft_inline")
    assert hook.init_db().created
    ledger = (
        sqlite3.connect(db)
        .execute("SELECT SOURCE, VERSION FROM SCHEMA_MIGRATIONS ORDER BY VERSION")
        .fetchall()
    )
    assert ledger == [
        ("ENGINE", "0001_schema"),
        ("ENGINE", "0002_map_index.sql"),
        ("ENGINE", "0003_claim_finish_functions.sql"),
        ("ENGINE", "0004_cfg_semantics.sql"),
        ("ENGINE", "0005_purge.sql"),
        ("ENGINE", "0006_history_indexes.sql"),
        ("ENGINE", "0007_config_indexes.sql"),
    ]


@pytest.mark.smoke
@pytest.mark.postgres
def test_inline_postgres_airflow_connection(pg_database, monkeypatch) -> None:
    cluster = pg_database.cluster
    conn = {
        "conn_type": "etl_craft", "host": cluster.host, "port": cluster.port, "schema": pg_database.name,
        "login": pg_database.user, "password": pg_database.password,
        "extra": {"engine_schema": pg_database.schema, "auth_mode": "password", "sslmode": "require"},
    }  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_INLINE_PG", json.dumps(conn))
    hook = EngineDBHook("etl_craft_inline_pg")
    assert hook.init_db().created
    assert pg_database.password not in hook.get_uri()
    with hook.get_conn() as c, c.cursor() as cur:
        cur.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        assert cur.fetchone() == (True,)
