"""Failover errors are typed and retryable (issue 25, docs/failover-errors.md), each decided by what the
servers answer, never by libpq's text, against real servers and loopback peers:

* a session lost after the login, before its first statement (a relay that cuts at the first query), on
  every public path that opens a connection;
* a peer that accepts and closes, or accepts and never answers (a proxy with no primary behind it);
* a write answered read-only (25006), and no primary among the hosts of ``targetServerType=primary``;
* a server stopped, starting up in recovery (57P03), a standby, then promoted; a crash mid-session;
* TCP keepalives on every session by default.

Each error carries its ``case`` and logs it in one warning line.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from psycopg2 import sql

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.errors import EngineUnreachableError, EtlCraftError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.operators._outcome import airflow_outcome
from airflow_provider_etl_craft.runs import RunIdentity
from airflow_provider_etl_craft.triggers.engine_change import EngineChangeTrigger
from harness.engines import write_config
from harness.postgres import PgCluster, PgDatabase, _server_os_user, _write, find_bindir
from tests.integration.loopback_peer import Peer
from tests.integration.test_multihost import closed_port
from tests.reliability.conftest import pipeline_sql

pytestmark = pytest.mark.postgres

SECRET_VAR = "FAILOVER_ENGINE_SECRET"
LOGGER = "airflow_provider_etl_craft.engine.dialects.postgresql"


def config(folder: Path, db: PgDatabase, servers: str, query: str = "sslmode=require") -> Path:
    return write_config(
        folder,
        "Engine:\n  failover:\n"
        f"    jdbc_url: jdbc:postgresql://{servers}/{db.name}?{query}\n"
        f"    schema: {db.schema}\n    user: {db.user}\n    auth_mode: password\n    secret: {SECRET_VAR}\n",
    )


def failover(caught: pytest.ExceptionInfo[EngineUnreachableError], case: str) -> str:
    """The error is the retryable one of ``case``; its message."""
    assert type(caught.value) is EngineUnreachableError, caught.value
    assert caught.value.retryable and caught.value.case == case, (caught.value.case, str(caught.value))
    return str(caught.value)


def logged_cases(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.args[0]  # type: ignore[index]
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.WARNING and "failover case" in r.msg
    ]


@pytest.fixture
def db(pg_database: PgDatabase, monkeypatch: pytest.MonkeyPatch) -> PgDatabase:
    monkeypatch.setenv(SECRET_VAR, pg_database.password)
    return pg_database


# -- lost before the first statement -----------------------------------------------------------------------


def check_connection_line(config_path: Path) -> str:
    out, err = io.StringIO(), io.StringIO()
    status = main(["check", "--config", str(config_path)], out, err)
    text = out.getvalue() + err.getvalue()
    assert status != 0 and "Traceback" not in text, text
    (line,) = [ln for ln in text.splitlines() if "] Engine DB connection: " in ln]
    return line


def test_a_session_lost_before_its_first_statement_is_retryable_on_every_path_that_opens_one(
    db: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The relay lets the login through and closes both sides at the first query: lifecycle, get_conn,
    init_db, migrate, check and the trigger's open each raise the typed, retryable error (none a driver
    error), and an operator's outcome is Airflow's retry."""
    cluster = db.cluster
    caplog.set_level(logging.WARNING, LOGGER)
    with Peer("cut", cluster.host, cluster.port) as relay:
        path = config(tmp_path, db, f"127.0.0.1:{relay.port}", "sslmode=disable")
        hook = EngineDBHook.from_config(path)
        opens = {
            "lifecycle": lambda: hook.lifecycle().__enter__(),
            "get_conn": hook.get_conn,
            "init_db": hook.init_db,
            "migrate": hook.migrate,
        }
        for name, open_one in opens.items():
            with pytest.raises(EtlCraftError) as caught:
                open_one()
            message = failover(caught, "lost_before_first_statement")  # type: ignore[arg-type]
            assert "before its first statement" in message and "nothing was written" in message, name
        line = check_connection_line(path)
        assert line.startswith("[FAIL]") and "before its first statement" in line, line

        conn = {"conn_type": "etl_craft", "extra": {"config_path": str(path)}}
        monkeypatch.setenv("AIRFLOW_CONN_FAILOVER_ENGINE", json.dumps(conn))
        trigger = EngineChangeTrigger(
            etl_craft_conn_id="failover_engine", profile=None, pipeline_code="P", seen=[], recheck_after=60,
            deadline=None, poll_interval=60,
        )  # fmt: skip
        with pytest.raises(EtlCraftError) as caught:
            trigger._open()
        failover(caught, "lost_before_first_statement")  # type: ignore[arg-type]

        with (
            pytest.raises(_compat.retry_exception()) as retried,
            airflow_outcome(),
            hook.lifecycle() as lifecycle,
        ):
            lifecycle.claim("ANY", RunIdentity("failover_dag", "manual__1"))
        assert not isinstance(retried.value, _compat.fail_exception())
    assert logged_cases(caplog).count("lost_before_first_statement") >= 7
    assert db.password not in caplog.text


# -- a peer that accepts, then closes or says nothing --------------------------------------------------------


def test_a_peer_that_accepts_and_closes_is_retryable_and_says_so(
    db: PgDatabase, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    with Peer("close") as proxy:
        hook = EngineDBHook.from_config(config(tmp_path, db, f"127.0.0.1:{proxy.port}"))
        with pytest.raises(EngineUnreachableError) as caught:
            hook.get_conn()
    message = failover(caught, "peer_closed")
    assert "accepted the connection, then closed it without answering" in message, message
    assert "refused the login" not in message and db.password not in message
    assert logged_cases(caplog) == ["peer_closed"]


def test_a_peer_that_accepts_and_never_answers_is_retryable_and_says_how_long(
    db: PgDatabase, tmp_path: Path
) -> None:
    with Peer("silent") as proxy:
        path = config(tmp_path, db, f"127.0.0.1:{proxy.port}", "sslmode=require&connect_timeout=2")
        with pytest.raises(EngineUnreachableError) as caught:
            EngineDBHook.from_config(path).get_conn()
    message = failover(caught, "peer_silent")
    assert "never answered within 2 s" in message, message


def test_of_several_hosts_a_closed_port_and_a_closing_proxy_are_a_closing_proxy(
    db: PgDatabase, tmp_path: Path
) -> None:
    closed = closed_port()
    with Peer("close") as proxy:
        servers = f"127.0.0.1:{closed},127.0.0.1:{proxy.port}"
        path = config(tmp_path, db, servers, "sslmode=require&targetServerType=primary")
        with pytest.raises(EngineUnreachableError) as caught:
            EngineDBHook.from_config(path).get_conn()
    message = failover(caught, "peer_closed")
    assert f"(answer of 127.0.0.1:{proxy.port}; not reachable: 127.0.0.1:{closed})" in message, message


# -- read-only answers and no primary ------------------------------------------------------------------------


def migrate_with_pipeline(hook: EngineDBHook, tmp_path: Path, code: str) -> None:
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "0001_pipeline.sql").write_text(pipeline_sql(code, ["WORK"]), encoding="utf-8")
    hook.migrate(folder)


def read_only(db: PgDatabase) -> None:
    admin = db.cluster.admin_connect()
    try:
        admin.cursor().execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(
                sql.Identifier(db.name)
            )
        )
    finally:
        admin.close()


def test_a_write_answered_read_only_is_retryable_and_names_the_fix(
    db: PgDatabase, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """25006 (a standby or a demoted primary answered): retryable, a failover may be under way; if it persists,
    the fix. In an operator: Airflow's retry."""
    hook = EngineDBHook.from_config(config(tmp_path, db, f"{db.cluster.host}:{db.cluster.port}"))
    migrate_with_pipeline(hook, tmp_path, "RO")
    read_only(db)
    caplog.set_level(logging.WARNING, LOGGER)
    identity = RunIdentity("ro_dag", "manual__1")
    with pytest.raises(EngineUnreachableError) as caught, hook.lifecycle() as lifecycle:
        lifecycle.claim("RO", identity)
    message = failover(caught, "read_only_answer")
    assert "SQLSTATE 25006" in message and "a failover may be under way" in message, message
    assert "targetServerType=primary" in message and "target_session_attrs=read-write" in message, message
    assert logged_cases(caplog) == ["read_only_answer"]
    with pytest.raises(_compat.retry_exception()), airflow_outcome(), hook.lifecycle() as lifecycle:
        lifecycle.claim("RO", identity)


def test_no_writable_host_for_target_server_type_primary_is_retryable_and_names_each_host(
    db: PgDatabase, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """libpq finds no read-write host; the provider logs in to each for real, without target_session_attrs,
    and reports what each answered: not a refused login."""
    cluster = db.cluster
    read_only(db)
    closed = closed_port()
    caplog.set_level(logging.WARNING, LOGGER)
    for folder, servers, query in (
        ("one", f"{cluster.host}:{cluster.port}", "sslmode=require&target_session_attrs=read-write"),
        (
            "two",
            f"127.0.0.1:{closed},{cluster.host}:{cluster.port}",
            "sslmode=require&targetServerType=primary",
        ),
    ):
        hook = EngineDBHook.from_config(config(tmp_path / folder, db, servers, query))
        with pytest.raises(EngineUnreachableError) as caught:
            hook.get_conn()
        message = failover(caught, "no_primary")
        said = f"127.0.0.1:{cluster.port} takes no writes (transaction_read_only is on, not in recovery)"
        assert said in message and "refused the login" not in message, message
        assert db.password not in message
    assert f"127.0.0.1:{closed} not reachable" in message, message
    assert logged_cases(caplog) == ["no_primary", "no_primary"]


def test_a_wrong_secret_with_target_server_type_primary_stays_a_refused_login(
    db: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No real login works, so it is no failover: the permanent refusal as before."""
    monkeypatch.setenv(SECRET_VAR, "wrong-failover-secret")
    servers = f"{db.cluster.host}:{db.cluster.port}"
    hook = EngineDBHook.from_config(config(tmp_path, db, servers, "sslmode=require&targetServerType=primary"))
    with pytest.raises(EtlCraftError) as caught:
        hook.get_conn()
    assert not caught.value.retryable and "refused the login" in str(caught.value), caught.value
    assert "wrong-failover-secret" not in str(caught.value)


# -- a server of its own: stopped, starting up, a standby, promoted; a crash mid-session ----------------------


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[PgCluster]:
    """A cluster these tests stop, turn into a standby (no upstream: ``standby.signal``) and promote."""
    cluster = PgCluster.create(find_bindir(), _server_os_user())
    try:
        yield cluster
    finally:
        cluster.destroy()


def restart_as_standby(cluster: PgCluster, hot_standby: bool) -> None:
    if (cluster.datadir / "postmaster.pid").exists():
        cluster.stop()
    _write(cluster.datadir / "standby.signal", "", 0o600, cluster.server_user)
    settings = (cluster.datadir / "etl_craft.conf").read_text().split("hot_standby")[0]
    settings += f"hot_standby = {'on' if hot_standby else 'off'}\n"
    _write(cluster.datadir / "etl_craft.conf", settings, 0o600, cluster.server_user)
    cluster.start()


def test_a_primary_stopped_then_starting_as_a_standby_then_promoted(
    own_cluster: PgCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each phase of a promotion as the client sees it: nothing listening (``unreachable``), a server in
    recovery that takes no sessions (57P03, ``not_accepting``), a hot standby (``no_primary`` for
    targetServerType=primary; a write answered read-only on a plain URL), then the promoted primary."""
    db = PgDatabase(own_cluster, own_cluster.create_database())
    monkeypatch.setenv(SECRET_VAR, db.password)
    server = f"{own_cluster.host}:{own_cluster.port}"
    plain = EngineDBHook.from_config(config(tmp_path / "plain", db, server))
    primary = EngineDBHook.from_config(
        config(tmp_path / "primary", db, server, "sslmode=require&targetServerType=primary")
    )
    migrate_with_pipeline(plain, tmp_path, "PROMOTED")
    own_cluster.stop()
    with pytest.raises(EngineUnreachableError) as caught:
        plain.get_conn()
    failover(caught, "unreachable")

    restart_as_standby(own_cluster, hot_standby=False)
    with pytest.raises(EngineUnreachableError) as caught:
        plain.get_conn()
    assert "SQLSTATE 57P03" in failover(caught, "not_accepting")

    restart_as_standby(own_cluster, hot_standby=True)
    with pytest.raises(EngineUnreachableError) as caught:
        primary.get_conn()
    assert f"{server} is a standby (in recovery)" in failover(caught, "no_primary")
    with pytest.raises(EngineUnreachableError) as caught, plain.lifecycle() as lifecycle:
        lifecycle.claim("PROMOTED", RunIdentity("promoted_dag", "manual__1"))
    failover(caught, "read_only_answer")

    own_cluster._run_checked("pg_ctl", "-D", own_cluster.datadir, "-w", "promote")
    with closing(primary.get_conn()) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_is_in_recovery()")
        assert cur.fetchone() == (False,)
    with primary.lifecycle() as lifecycle:
        assert lifecycle.claim("PROMOTED", RunIdentity("promoted_dag", "manual__1")).action == "CREATED"


def test_a_crash_of_another_backend_mid_session_is_retryable(
    own_cluster: PgCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend killed with SIGKILL makes the server end every session (crash shutdown, 57P02) and restart:
    the session in the middle of a command gets the retryable error."""
    db = PgDatabase(own_cluster, own_cluster.create_database())
    monkeypatch.setenv(SECRET_VAR, db.password)
    hook = EngineDBHook.from_config(config(tmp_path, db, f"{own_cluster.host}:{own_cluster.port}"))
    hook.migrate()
    victim = own_cluster.admin_connect()
    victim_pid = victim.get_backend_pid()
    with pytest.raises(EngineUnreachableError) as caught, hook.lifecycle() as lifecycle:
        os.kill(victim_pid, signal.SIGKILL)
        victim.close()
        lifecycle.engine.query(lifecycle.conn, "SELECT pg_sleep(30)")
    assert caught.value.retryable
    # The server comes back by itself; the next connect works.
    for _ in range(100):
        try:
            hook.get_conn().close()
            break
        except EngineUnreachableError:
            time.sleep(0.1)


# -- TCP keepalives --------------------------------------------------------------------------------------------


def test_sessions_have_tcp_keepalives_by_default_and_the_url_overrides_them(
    db: PgDatabase, tmp_path: Path
) -> None:
    server = f"{db.cluster.host}:{db.cluster.port}"
    cases = (
        ("sslmode=require", (1, 30, 10, 3, 60000)),
        ("sslmode=require&keepalives_idle=7&tcp_user_timeout=9000", (1, 7, 10, 3, 9000)),
    )
    for number, (query, expected) in enumerate(cases):
        hook = EngineDBHook.from_config(config(tmp_path / str(number), db, server, query))
        with closing(hook.get_conn()) as conn:
            sock = socket.socket(fileno=os.dup(conn.fileno()))  # type: ignore[attr-defined]
            try:
                found = (
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
                )
            finally:
                sock.close()
        assert found == expected, (query, found)
