"""A server out of connection slots is a retryable ``server_full`` (issue 26, docs/failover-errors.md).

PostgreSQL refuses a login with SQLSTATE 53300 when the slots left are reserved for superusers, when the role's
or the database's ``CONNECTION LIMIT`` is reached (all three only after the login), and when no process slot
is left at all (before it). libpq gives no SQLSTATE for a failed connect, so the provider's probe finishes the
login with the same credential (SCRAM-SHA-256, MD5, cleartext, a client certificate) and reads the code. A
wrong password stays the permanent refused login, now by its SQLSTATE 28P01. Against a cluster of its own
with ``max_connections = 8``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path

import psycopg2
import pytest
from psycopg2 import sql

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.errors import ConfigurationError, EngineUnreachableError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.operators._outcome import airflow_outcome
from airflow_provider_etl_craft.runs import RunIdentity
from harness.engines import write_config
from harness.postgres import CERT_ROLE, PgCluster, PgDatabase, _server_os_user, _write, find_bindir
from tests.integration.loopback_peer import Peer

pytestmark = pytest.mark.postgres

SECRET_VAR = "FULL_ENGINE_SECRET"
LOGGER = "airflow_provider_etl_craft.engine.dialects.postgresql"
#: Roles of this module's cluster that log in with MD5 and with a cleartext password (pg_hba ``password``).
MD5_ROLE, CLEARTEXT_ROLE = "etl_md5", "etl_cleartext"
MAX_CONNECTIONS = 8


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    """A cluster with few connection slots, and roles that log in with MD5 and with a cleartext password."""
    cluster = PgCluster.create(find_bindir(), _server_os_user())
    try:
        hba = cluster.datadir / "pg_hba.conf"
        lines = f"host all {MD5_ROLE} 127.0.0.1/32 md5\nhost all {CLEARTEXT_ROLE} 127.0.0.1/32 password\n"
        _write(hba, lines + hba.read_text(), 0o600, cluster.server_user)
        with closing(cluster.admin_connect()) as admin, admin.cursor() as cur:
            cur.execute("SET password_encryption = 'md5'")
            for role in (MD5_ROLE, CLEARTEXT_ROLE):
                cluster.passwords[role] = (
                    f"{role}-secret-ü-{time.time_ns()}"  # not ASCII: SASLprep's path too
                )
                create = sql.SQL("CREATE ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(role))
                cur.execute(create, (cluster.passwords[role],))
            cur.execute(f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}")
        cluster.stop()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def db(cluster: PgCluster) -> Iterator[PgDatabase]:
    database = PgDatabase(cluster, cluster.create_database())
    try:
        yield database
    finally:
        with closing(cluster.admin_connect()) as admin, admin.cursor() as cur:
            for role in ("etl_password", MD5_ROLE, CLEARTEXT_ROLE, CERT_ROLE):
                cur.execute(sql.SQL("ALTER ROLE {} CONNECTION LIMIT -1").format(sql.Identifier(role)))
        cluster.drop_database(database.name)


def hook_for(
    folder: Path, db: PgDatabase, role: str = "etl_password", query: str = "sslmode=require"
) -> EngineDBHook:
    cluster = db.cluster
    url = f"jdbc:postgresql://{cluster.host}:{cluster.port}/{db.name}?{query}"
    if role == CERT_ROLE:
        url = f"jdbc:postgresql://{cluster.host}:{cluster.port}/{db.name}?sslmode=verify-full&sslrootcert={cluster.ca_cert}"
        auth = f"    auth_mode: key_file\n    key_file: {cluster.client_key}\n    cert_file: {cluster.client_cert}\n"
    else:
        auth = f"    auth_mode: password\n    secret: {SECRET_VAR}\n"
    text = f"Engine:\n  full:\n    jdbc_url: {url}\n    schema: {db.schema}\n    user: {role}\n{auth}"
    folder.mkdir(parents=True, exist_ok=True)
    return EngineDBHook.from_config(write_config(folder, text))


def server_full(caught: pytest.ExceptionInfo[EngineUnreachableError], secret: str | None) -> str:
    """The error is the retryable ``server_full`` one, says the server is full and shows no secret."""
    error = caught.value
    assert type(error) is EngineUnreachableError and error.retryable, error
    assert error.case == "server_full", (error.case, str(error))
    message = str(error)
    assert "is full" in message and "SQLSTATE 53300" in message and "refused the login" not in message, (
        message
    )
    assert secret is None or secret not in message
    return message


def admin_run(cluster: PgCluster, statement: sql.Composable | str) -> None:
    with closing(cluster.admin_connect()) as admin, admin.cursor() as cur:
        cur.execute(statement)


def sessions_of(cluster: PgCluster, role: str) -> int:
    deadline = time.monotonic() + 10
    while True:  # superusers' sessions just closed may hold their slots for a moment
        try:
            admin = cluster.admin_connect()
            break
        except psycopg2.OperationalError:
            assert time.monotonic() < deadline, "no superuser session could be opened"
            time.sleep(0.05)
    with closing(admin), admin.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (role,))
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


def free_one(held: list[psycopg2.extensions.connection], cluster: PgCluster, role: str) -> None:
    """Close one held session and wait until its server process is gone (a closed socket frees the slot only
    when the backend has exited)."""
    before = sessions_of(cluster, role)
    held.pop().close()
    deadline = time.monotonic() + 10
    while sessions_of(cluster, role) >= before:
        assert time.monotonic() < deadline, "the closed session's backend did not exit"
        time.sleep(0.05)


def hold(db: PgDatabase, role: str, count: int | None = None) -> list[psycopg2.extensions.connection]:
    """Sessions of ``role`` (``count``, or as many as the server takes)."""
    held: list[psycopg2.extensions.connection] = []
    while count is None or len(held) < count:
        try:
            held.append(db.connect(user=role, password=db.cluster.passwords[role], options=""))
        except psycopg2.OperationalError:
            if count is None:
                return held
            raise
    return held


def test_a_server_whose_free_slots_are_reserved_for_superusers_is_full_and_retries_then_works(
    db: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every slot but the superusers' reserved ones taken by another client: ``server_full`` (53300 after the
    login), in an operator Airflow's retry; once a slot is freed the same call works."""
    monkeypatch.setenv(SECRET_VAR, db.password)
    hook = hook_for(tmp_path, db)
    with ExitStack() as stack:
        held = hold(db, "etl_token")
        stack.callback(lambda: [c.close() for c in held])
        assert held, "the server took no session at all"
        with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(EngineUnreachableError) as caught:
            hook.get_conn()
        assert "after the login" in server_full(caught, db.password)
        assert [r.args[0] for r in caplog.records if r.name == LOGGER and "failover case" in r.msg] == [  # type: ignore[index]
            "server_full"
        ]
        with pytest.raises(_compat.retry_exception()) as retried, airflow_outcome(), hook.lifecycle() as lc:
            lc.claim("ANY", RunIdentity("full", "run-1"))
        assert not isinstance(retried.value, _compat.fail_exception())
        assert "is full" in str(retried.value)
        free_one(held, db.cluster, "etl_token")
        hook.get_conn().close()


def test_a_server_with_no_process_slot_left_is_full_before_the_login(
    db: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Superusers took the reserved slots too: PostgreSQL 15 answers 53300 before any login."""
    monkeypatch.setenv(SECRET_VAR, db.password)
    hook = hook_for(tmp_path, db)
    with ExitStack() as stack:
        held = hold(db, "etl_token")
        stack.callback(lambda: [c.close() for c in held])
        supers: list[psycopg2.extensions.connection] = []
        stack.callback(lambda: [c.close() for c in supers])
        while True:
            try:
                supers.append(db.cluster.admin_connect())
            except psycopg2.OperationalError:
                break
        with pytest.raises(EngineUnreachableError) as caught:
            hook.get_conn()
        assert "before the login" in server_full(caught, db.password)
        while supers:
            supers.pop().close()
        free_one(held, db.cluster, "etl_token")  # the superusers' slots are reserved: one more is needed
        hook.get_conn().close()


@pytest.mark.parametrize("limit_of", ["role", "database"])
def test_a_role_or_database_at_its_connection_limit_is_full_and_retries_then_works(
    db: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit_of: str
) -> None:
    """``CONNECTION LIMIT 1`` and one session held: ``server_full``, Airflow's retry; freed: it works."""
    monkeypatch.setenv(SECRET_VAR, db.password)
    hook = hook_for(tmp_path, db)
    kind, name = ("ROLE", db.user) if limit_of == "role" else ("DATABASE", db.name)
    admin_run(db.cluster, sql.SQL(f"ALTER {kind} {{}} CONNECTION LIMIT 1").format(sql.Identifier(name)))
    try:
        held = hold(db, db.user, 1)
        with pytest.raises(EngineUnreachableError) as caught:
            hook.get_conn()
        server_full(caught, db.password)
        with pytest.raises(_compat.retry_exception()), airflow_outcome(), hook.lifecycle() as lc:
            lc.claim("ANY", RunIdentity("full", "run-1"))
        free_one(held, db.cluster, db.user)
        hook.get_conn().close()
    finally:
        admin_run(db.cluster, sql.SQL(f"ALTER {kind} {{}} CONNECTION LIMIT -1").format(sql.Identifier(name)))


@pytest.mark.parametrize("role", ["etl_password", MD5_ROLE, CLEARTEXT_ROLE, CERT_ROLE])
def test_each_login_method_reads_the_limit_after_the_login(
    db: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    """SCRAM-SHA-256, MD5, a cleartext password and a client certificate: the probe logs in as libpq did."""
    secret = db.cluster.passwords.get(role)
    if secret is not None:
        monkeypatch.setenv(SECRET_VAR, secret)
    hook = hook_for(tmp_path, db, role, "sslmode=disable")
    hook.get_conn().close()  # the login works
    admin_run(db.cluster, sql.SQL("ALTER ROLE {} CONNECTION LIMIT 0").format(sql.Identifier(role)))
    with pytest.raises(EngineUnreachableError) as caught:
        hook.get_conn()
    server_full(caught, secret)


@pytest.mark.parametrize("role", ["etl_password", MD5_ROLE, CLEARTEXT_ROLE])
def test_a_wrong_password_stays_a_permanent_refused_login_by_its_sqlstate(
    db: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    """The probe's login with the wrong secret gets 28P01: the permanent refusal, never a retry."""
    wrong = f"wrong-secret-of-{role}"
    monkeypatch.setenv(SECRET_VAR, wrong)
    hook = hook_for(tmp_path, db, role)
    with pytest.raises(ConfigurationError) as caught:
        hook.get_conn()
    message = str(caught.value)
    assert not caught.value.retryable and "refused the login" in message and "SQLSTATE 28P01" in message, (
        message
    )
    assert wrong not in message
    with pytest.raises(_compat.fail_exception()), airflow_outcome(), hook.lifecycle() as lc:
        lc.claim("ANY", RunIdentity("full", "run-1"))


def test_a_refusal_that_has_passed_when_the_probe_logs_in_is_retryable(
    db: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq refused (a full server's answer), and the probe's own login a moment later opened a session:
    ``refusal_passed``, retryable; the next call works."""
    monkeypatch.setenv(SECRET_VAR, db.password)
    with Peer("full-once", db.cluster.host, db.cluster.port) as peer:
        cluster = db.cluster
        url = f"jdbc:postgresql://{cluster.host}:{peer.port}/{db.name}?sslmode=disable"
        text = (
            f"Engine:\n  full:\n    jdbc_url: {url}\n    schema: {db.schema}\n    user: {db.user}\n"
            f"    auth_mode: password\n    secret: {SECRET_VAR}\n"
        )
        hook = EngineDBHook.from_config(write_config(tmp_path, text))
        with pytest.raises(EngineUnreachableError) as caught:
            hook.get_conn()
        error = caught.value
        assert error.retryable and error.case == "refusal_passed", (error.case, str(error))
        assert "then took the same login a moment later" in str(error) and db.password not in str(error)
        hook.get_conn().close()
