"""Multi-host jdbc_url against the real throwaway PostgreSQL: the first host a closed port, the second the
server. libpq skips the closed one; ``check`` names the server it reached and that it is the primary; a failed
connect is classified by probing every host, not only the first."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest

from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.errors import ConfigurationError, EngineUnreachableError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import RunIdentity
from harness.engines import EngineSetup, write_config
from harness.postgres import PgDatabase
from tests.reliability.conftest import pipeline_sql

SECRET_VAR = "MULTI_ENGINE_SECRET"


def closed_port(family: int = socket.AF_INET, address: str = "127.0.0.1") -> int:
    """A port nothing listens on (bound, read, released: connecting is refused at once)."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def has_ipv6_loopback() -> bool:
    try:
        closed_port(socket.AF_INET6, "::1")
    except OSError:
        return False
    return True


def multihost_config(folder: Path, db: PgDatabase, servers: str, query: str) -> Path:
    return write_config(
        folder,
        "Engine:\n  multi:\n"
        f"    jdbc_url: jdbc:postgresql://{servers}/{db.name}?sslmode=require&connect_timeout=3&{query}\n"
        f"    schema: {db.schema}\n    user: {db.user}\n    auth_mode: password\n    secret: {SECRET_VAR}\n",
    )


def check(config: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(["check", "--config", str(config)], out, err)
    return status, out.getvalue() + err.getvalue()


def connection_line(text: str) -> str:
    lines = [line for line in text.splitlines() if "] Engine DB connection: " in line]
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.postgres
@pytest.mark.parametrize(
    "query", ["targetServerType=primary", "target_session_attrs=read-write&load_balance_hosts=random"]
)
def test_a_closed_first_host_is_skipped_and_the_server_behind_it_claims(
    pg_database: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, query: str
) -> None:
    cluster = pg_database.cluster
    monkeypatch.setenv(SECRET_VAR, pg_database.password)
    closed = closed_port()
    config = multihost_config(
        tmp_path, pg_database, f"127.0.0.1:{closed},{cluster.host}:{cluster.port}", query
    )
    hook = EngineDBHook.from_config(config)
    assert hook.get_first("SELECT inet_server_port()") == (cluster.port,)
    assert not hook.test_connection()[0]  # reached, but no Engine tables yet
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "0001_pipeline.sql").write_text(pipeline_sql("MULTI", ["WORK"]), encoding="utf-8")
    hook.migrate(folder)
    with hook.lifecycle() as lifecycle:
        outcome = lifecycle.claim("MULTI", RunIdentity(dag_id="multi_dag", run_id="manual__1", run_date=None))
    assert outcome.action == "CREATED", outcome
    ok, said = hook.test_connection()  # Airflow's Test button
    assert ok and f"127.0.0.1:{closed},127.0.0.1:{cluster.port}" in said, said
    assert (
        hook.get_uri()
        == f"postgresql://{pg_database.user}@127.0.0.1:{closed},127.0.0.1:{cluster.port}/{pg_database.name}"
    )

    status, text = check(config)
    line = connection_line(text)
    assert line.startswith("[OK  ]"), text
    assert f"127.0.0.1:{closed},127.0.0.1:{cluster.port}" in line  # every host named
    assert f"reached 127.0.0.1:{cluster.port}, the primary" in line
    assert status == 0, text
    assert pg_database.password not in text


def test_check_names_the_server_reached_on_postgresql_only(
    engine: EngineSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")  # SQLite's kind check stays OK
    engine.hook().init_db()
    status, text = check(engine.config_path)
    line = connection_line(text)
    assert status == 0 and line.startswith("[OK  ]"), text
    if engine.dialect == "postgresql":
        cluster = engine.database.cluster  # type: ignore[attr-defined]
        assert line.endswith(f"; reached {cluster.host}:{cluster.port}, the primary"), line
    else:
        assert "reached" not in line, line


@pytest.mark.postgres
def test_no_host_reachable_is_retryable_and_names_every_host(
    pg_database: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_VAR, pg_database.password)
    one, two = closed_port(), closed_port()
    config = multihost_config(
        tmp_path, pg_database, f"127.0.0.1:{one},127.0.0.1:{two}", "targetServerType=primary"
    )
    with pytest.raises(EngineUnreachableError) as info:
        EngineDBHook.from_config(config).get_conn()
    message = str(info.value)
    assert info.value.retryable and f"127.0.0.1:{one},127.0.0.1:{two}" in message
    assert "(no host reachable)" in message, message


@pytest.mark.postgres
def test_a_refused_login_behind_a_closed_first_host_is_a_login_refusal_not_unreachable(
    pg_database: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe asks every host: the first is closed, the second asks for a login the server then refuses."""
    cluster = pg_database.cluster
    monkeypatch.setenv(SECRET_VAR, "wrong-multihost-secret")
    closed = closed_port()
    servers = f"127.0.0.1:{closed},{cluster.host}:{cluster.port}"
    config = multihost_config(tmp_path, pg_database, servers, "targetServerType=primary")
    with pytest.raises(ConfigurationError) as info:
        EngineDBHook.from_config(config).get_conn()
    message = str(info.value)
    assert not isinstance(info.value, EngineUnreachableError) and not info.value.retryable, message
    assert "refused the login" in message, message
    assert f"(answer of 127.0.0.1:{cluster.port}; not reachable: 127.0.0.1:{closed})" in message, message
    assert "wrong-multihost-secret" not in message


@pytest.mark.postgres
@pytest.mark.skipif(not has_ipv6_loopback(), reason="::1 is not configured on this machine")
def test_an_ipv6_literal_is_parsed_tried_and_classified(
    pg_database: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test server listens on 127.0.0.1 only: [::1] is a closed port, skipped for the second host, and alone
    an unreachable Engine DB named in brackets."""
    cluster = pg_database.cluster
    monkeypatch.setenv(SECRET_VAR, pg_database.password)
    closed = closed_port(socket.AF_INET6, "::1")
    both = multihost_config(
        tmp_path / "both",
        pg_database,
        f"[::1]:{closed},{cluster.host}:{cluster.port}",
        "targetServerType=primary",
    )
    assert EngineDBHook.from_config(both).get_first("SELECT inet_server_port()") == (cluster.port,)
    alone = multihost_config(tmp_path / "alone", pg_database, f"[::1]:{closed}", "targetServerType=primary")
    with pytest.raises(EngineUnreachableError) as info:
        EngineDBHook.from_config(alone).get_conn()
    assert f"postgresql://[::1]:{closed}/{pg_database.name}" in str(info.value)
