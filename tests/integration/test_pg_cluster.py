"""Integration tests for the throwaway PostgreSQL cluster provided by tests.fixtures.fix_pg."""

from __future__ import annotations

import re
import stat
from typing import Any

import psycopg2
import pytest

from harness.postgres import PASSWORD_ROLES, PgCluster, PgDatabase

pytestmark = pytest.mark.postgres


def _scalar(conn: psycopg2.extensions.connection, query: str) -> Any:
    with conn.cursor() as cur:
        cur.execute(query)
        row = cur.fetchone()
    assert row is not None
    return row[0]


def _connect(cluster: PgCluster, user: str, **kwargs: Any) -> psycopg2.extensions.connection:
    return psycopg2.connect(
        host=cluster.host, port=cluster.port, dbname="postgres", user=user, connect_timeout=10, **kwargs
    )


def test_cluster_metadata(pg_cluster: PgCluster) -> None:
    assert pg_cluster.host == "127.0.0.1"
    assert re.fullmatch(r"\d+(\.\d+)*", pg_cluster.version)
    assert set(pg_cluster.passwords) == {*PASSWORD_ROLES, "etl_sts"}
    assert pg_cluster.ca_cert == pg_cluster.certs_dir / "ca.crt"
    for key in (pg_cluster.client_key, pg_cluster.client_key_encrypted):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert b"ENCRYPTED PRIVATE KEY" in pg_cluster.client_key_encrypted.read_bytes()
    conn = pg_cluster.admin_connect()
    try:
        assert _scalar(conn, "SHOW max_connections") == "200"
        assert _scalar(conn, "SHOW fsync") == "off"
        assert _scalar(conn, "SHOW listen_addresses") == "127.0.0.1"
    finally:
        conn.close()


@pytest.mark.parametrize("role", PASSWORD_ROLES)
def test_password_role_logs_in_with_scram(pg_cluster: PgCluster, role: str) -> None:
    conn = _connect(pg_cluster, role, password=pg_cluster.passwords[role])
    try:
        assert _scalar(conn, "SELECT current_user") == role
        assert _scalar(conn, "SHOW password_encryption") == "scram-sha-256"
    finally:
        conn.close()
    admin = pg_cluster.admin_connect()
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,))
            row = cur.fetchone()
        assert row is not None and row[0].startswith("SCRAM-SHA-256$")
    finally:
        admin.close()


def test_wrong_password_fails(pg_cluster: PgCluster) -> None:
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        _connect(pg_cluster, "etl_password", password="not-the-password")


def test_unlisted_role_is_rejected(pg_cluster: PgCluster) -> None:
    admin = pg_cluster.admin_connect()
    try:
        admin.cursor().execute("CREATE ROLE etl_unlisted LOGIN PASSWORD 'unlisted-secret'")
    finally:
        admin.close()
    with pytest.raises(psycopg2.OperationalError, match="rejects connection"):
        _connect(pg_cluster, "etl_unlisted", password="unlisted-secret")


def test_cert_role_logs_in_over_verified_tls(pg_cluster: PgCluster) -> None:
    conn = _connect(
        pg_cluster,
        "etl_cert",
        sslmode="verify-full",
        sslrootcert=str(pg_cluster.ca_cert),
        sslcert=str(pg_cluster.client_cert),
        sslkey=str(pg_cluster.client_key),
    )
    try:
        assert _scalar(conn, "SELECT current_user") == "etl_cert"
        assert _scalar(conn, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") is True
        assert (
            _scalar(conn, "SELECT client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()") == "/CN=etl_cert"
        )
    finally:
        conn.close()


def test_cert_role_with_encrypted_key(pg_cluster: PgCluster) -> None:
    conn = _connect(pg_cluster, "etl_cert", **pg_cluster.cert_params(encrypted=True))
    try:
        assert _scalar(conn, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") is True
    finally:
        conn.close()


def test_encrypted_key_with_wrong_passphrase_fails(pg_cluster: PgCluster) -> None:
    params = pg_cluster.cert_params(encrypted=True) | {"sslpassword": "wrong-passphrase"}
    with pytest.raises(psycopg2.OperationalError, match="could not load private key file"):
        _connect(pg_cluster, "etl_cert", **params)


@pytest.mark.parametrize(
    ("sslmode", "error"),
    [("verify-full", "requires a valid client certificate"), ("disable", "rejects connection")],
)
def test_cert_role_without_client_certificate_is_refused(
    pg_cluster: PgCluster, sslmode: str, error: str
) -> None:
    with pytest.raises(psycopg2.OperationalError, match=error):
        _connect(pg_cluster, "etl_cert", sslmode=sslmode, sslrootcert=str(pg_cluster.ca_cert))


def test_pg_database_connect(pg_database: PgDatabase) -> None:
    conn = pg_database.connect()
    try:
        assert _scalar(conn, "SELECT current_schema()") == pg_database.schema
        assert _scalar(conn, "SELECT current_database()") == pg_database.name
        assert _scalar(conn, "SELECT current_user") == "etl_password"
        conn.cursor().execute("CREATE TABLE probe (id int)")
        assert _scalar(conn, "SELECT to_regclass('etl_craft.probe') IS NOT NULL") is True
    finally:
        conn.close()


def test_create_database_for_other_owner_without_schema(pg_cluster: PgCluster) -> None:
    name = pg_cluster.create_database(owner="etl_token", schema=None)
    database = PgDatabase(pg_cluster, name, schema="", user="etl_token")
    conn = database.connect()
    try:
        assert _scalar(conn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'etl_craft'") == 0
        conn.cursor().execute("CREATE SCHEMA owned_by_token")
        assert (
            _scalar(conn, "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'owned_by_token'")
            == "etl_token"
        )
    finally:
        conn.close()
        pg_cluster.drop_database(name)


def test_stop_then_start(pg_cluster: PgCluster) -> None:
    pg_cluster.stop()
    try:
        with pytest.raises(psycopg2.OperationalError):
            pg_cluster.admin_connect()
    finally:
        pg_cluster.start()
    conn = _connect(pg_cluster, "etl_password", password=pg_cluster.passwords["etl_password"])
    try:
        assert _scalar(conn, "SELECT 1") == 1
    finally:
        conn.close()
