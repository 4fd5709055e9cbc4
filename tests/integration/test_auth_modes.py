"""Auth modes password, token, key_file and sso against the real throwaway PostgreSQL cluster.

Each mode is proven twice where it allows it: with a profile in a real craft-connector.yml and with an
inline Airflow connection (``AIRFLOW_CONN_…`` holding JSON). Every login runs over TLS with
``sslmode=verify-full`` against the test CA. The oauth and sts modes live in their own test files.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg2
import pytest

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.auth.sso import check_libpq
from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.errors import ConfigurationError, EngineUnreachableError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from harness.engines import write_config
from harness.postgres import CERT_ROLE, SSO_ROLE, PgCluster

pytestmark = pytest.mark.postgres

SHAPES = ["profile", "inline"]
SECRET_MODES = [("password", "etl_password"), ("token", "etl_token")]
ENGINE_SCHEMA = "etl_craft"
ISSUER = "https://issuer.example.com"
CLIENT_ID = "etl-craft-airflow-cli"
WRONG_SECRET = "wrong-secret-Zq8xV4mT2pLk"
WRONG_PASSPHRASE = "wrong-passphrase-Hc7Ry3Nd"
#: Profile name used in every craft-connector.yml here (settings read ``Engine.authtest.<key>``).
PROFILE = "authtest"


# --------------------------------------------------------------------------- helpers


def _tls_settings(cluster: PgCluster, rootcert: str | Path | None = None) -> dict[str, str]:
    """libpq TLS settings for a verified login against the test CA."""
    return {"sslmode": "verify-full", "sslrootcert": str(rootcert or cluster.ca_cert)}


def _jdbc_url(cluster: PgCluster, database: str, rootcert: str | Path | None = None) -> str:
    """jdbc:postgresql://host:port/db?sslmode=verify-full&sslrootcert=<CA> (a relative CA path is kept as written)."""
    query = urlencode(_tls_settings(cluster, rootcert), safe="/")
    return f"jdbc:postgresql://{cluster.host}:{cluster.port}/{database}?{query}"


def _profile_hook(folder: Path, jdbc_url: str, auth_mode: str, **fields: str) -> EngineDBHook:
    """Write a one-profile craft-connector.yml (environment secrets source) and return a hook on it."""
    lines = [f"    {key}: {value}" for key, value in fields.items()]
    text = (
        "Secrets:\n  Source_type: environment\n"
        f"Engine:\n  Profile: {PROFILE}\n  {PROFILE}:\n"
        f"    jdbc_url: {jdbc_url}\n    schema: {ENGINE_SCHEMA}\n    auth_mode: {auth_mode}\n"
        + "".join(f"{line}\n" for line in lines)
    )
    return EngineDBHook.from_config(write_config(folder, text))


def _inline_hook(monkeypatch: pytest.MonkeyPatch, conn_id: str, cluster: PgCluster, database: str,
                 login: str, password: str | None, auth_mode: str, **extras: str) -> EngineDBHook:  # fmt: skip
    """Define an inline ``etl_craft`` Airflow connection through ``AIRFLOW_CONN_<ID>`` and return a hook on it."""
    conn: dict[str, Any] = {
        "conn_type": "etl_craft",
        "host": cluster.host,
        "port": cluster.port,
        "schema": database,
        "login": login,
        "extra": {"engine_schema": ENGINE_SCHEMA, "auth_mode": auth_mode, **_tls_settings(cluster), **extras},
    }
    if password is not None:
        conn["password"] = password
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return EngineDBHook(etl_craft_conn_id=conn_id)


def _session_facts(hook: EngineDBHook) -> tuple[str, str, bool]:
    """(current_user, current_schema, ssl) of a fresh hook connection."""
    with closing(hook.get_conn()) as conn:
        cur = conn.cursor()
        try:
            row = hook.engine.query(  # the Engine schema is set per transaction, never on the session
                conn,
                "SELECT current_user, current_schema(), ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            )[0]
        finally:
            cur.close()
    assert row is not None
    return str(row[0]), str(row[1]), bool(row[2])


def _assert_logs_in(hook: EngineDBHook, role: str) -> None:
    """The hook logs in as ``role`` over TLS on the Engine schema, and init-db works there."""
    assert _session_facts(hook) == (role, ENGINE_SCHEMA, True)
    result = hook.init_db()
    assert result.created, result.message
    assert not hook.init_db().created  # idempotent on the second run
    with closing(hook.get_conn()) as conn:
        assert "CFG_PIPELINES" in hook.engine.table_names(conn)


def _reset_masker() -> None:
    """A fresh Airflow secret masker (the one ``_compat.redact`` uses), so masks from earlier tests don't count."""
    importlib.import_module(_compat.resolve("redact").__module__).reset_secrets_masker()


def _redacted(secret: str) -> str:
    return str(_compat.redact(f"log line with {secret} inside"))


def _free_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _copy_private(source: Path, target: Path) -> None:
    """Copy a key or certificate, keeping it 0600 (libpq refuses group/world-readable keys)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    os.chmod(target, 0o600)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def make_db(pg_cluster: PgCluster) -> Iterator[Callable[[str], str]]:
    """Factory: a fresh database owned by a role, with the etl_craft schema; dropped afterwards."""
    made: list[str] = []

    def make(owner: str) -> str:
        name = pg_cluster.create_database(owner=owner, schema=ENGINE_SCHEMA)
        made.append(name)
        return name

    yield make
    for name in made:
        pg_cluster.drop_database(name)


@pytest.fixture
def fresh_masker() -> Iterator[None]:
    _reset_masker()
    yield
    _reset_masker()


# --------------------------------------------------------------------------- password and token


def _secret_hook(shape: str, mode: str, role: str, secret: str, cluster: PgCluster, database: str,
                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EngineDBHook:  # fmt: skip
    if shape == "profile":
        variable = f"ETL_AUTH_TEST_{mode.upper()}_SECRET"
        monkeypatch.setenv(variable, secret)
        return _profile_hook(tmp_path, _jdbc_url(cluster, database), mode, user=role, secret=variable)
    return _inline_hook(monkeypatch, f"etl_auth_{mode}", cluster, database, role, secret, mode)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("mode", "role"), SECRET_MODES)
def test_secret_modes_log_in_init_db_and_mask_the_secret(
    mode: str, role: str, shape: str, pg_cluster: PgCluster, make_db, tmp_path, monkeypatch, fresh_masker
) -> None:
    secret = pg_cluster.passwords[role]
    assert secret in _redacted(secret)  # nothing masks it before the hook resolves it
    hook = _secret_hook(shape, mode, role, secret, pg_cluster, make_db(role), tmp_path, monkeypatch)
    assert hook.engine_profile.auth.name == mode
    _assert_logs_in(hook, role)
    assert secret not in _redacted(secret)
    assert "***" in _redacted(secret)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("mode", "role"), SECRET_MODES)
def test_secret_modes_wrong_secret_is_a_refused_login_without_secrets(
    mode: str, role: str, shape: str, pg_cluster: PgCluster, make_db, tmp_path, monkeypatch
) -> None:
    hook = _secret_hook(shape, mode, role, WRONG_SECRET, pg_cluster, make_db(role), tmp_path, monkeypatch)
    with pytest.raises(ConfigurationError) as info:
        hook.get_conn()
    message = str(info.value)
    assert type(info.value) is ConfigurationError and not info.value.retryable
    assert "refused the login" in message and "authentication failed" in message and role in message
    assert WRONG_SECRET not in message
    assert pg_cluster.passwords[role] not in message


# --------------------------------------------------------------------------- key_file


def test_key_file_unencrypted_key_logs_in(pg_cluster: PgCluster, make_db, tmp_path) -> None:
    hook = _profile_hook(
        tmp_path, _jdbc_url(pg_cluster, make_db(CERT_ROLE)), "key_file",
        user=CERT_ROLE, key_file=str(pg_cluster.client_key), cert_file=str(pg_cluster.client_cert),
    )  # fmt: skip
    assert "sslpassword" not in hook.engine.connect_kwargs()
    _assert_logs_in(hook, CERT_ROLE)


def test_key_file_encrypted_key_with_passphrase_logs_in_and_masks_it(
    pg_cluster: PgCluster, make_db, tmp_path, monkeypatch, fresh_masker
) -> None:
    passphrase = pg_cluster.client_key_passphrase
    monkeypatch.setenv("ETL_AUTH_TEST_KEY_PASSPHRASE", passphrase)
    assert passphrase in _redacted(passphrase)
    hook = _profile_hook(
        tmp_path, _jdbc_url(pg_cluster, make_db(CERT_ROLE)), "key_file", user=CERT_ROLE,
        key_file=str(pg_cluster.client_key_encrypted), cert_file=str(pg_cluster.client_cert),
        secret="ETL_AUTH_TEST_KEY_PASSPHRASE",
    )  # fmt: skip
    _assert_logs_in(hook, CERT_ROLE)
    assert passphrase not in _redacted(passphrase)


def test_key_file_wrong_passphrase_fails_clearly_without_the_passphrase(
    pg_cluster: PgCluster, make_db, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("ETL_AUTH_TEST_KEY_PASSPHRASE", WRONG_PASSPHRASE)
    hook = _profile_hook(
        tmp_path, _jdbc_url(pg_cluster, make_db(CERT_ROLE)), "key_file", user=CERT_ROLE,
        key_file=str(pg_cluster.client_key_encrypted), cert_file=str(pg_cluster.client_cert),
        secret="ETL_AUTH_TEST_KEY_PASSPHRASE",
    )  # fmt: skip
    with pytest.raises(ConfigurationError) as info:
        hook.get_conn()
    message = str(info.value)
    assert type(info.value) is ConfigurationError and not info.value.retryable
    assert "could not load private key file" in message and str(pg_cluster.client_key_encrypted) in message
    assert "client key or certificate" in message and f"Engine.{PROFILE}.secret" in message
    assert "refused the login" not in message  # the server never saw a login: the client's own key failed
    assert WRONG_PASSPHRASE not in message and pg_cluster.client_key_passphrase not in message


def test_key_file_paths_relative_to_craft_connector_yml(
    pg_cluster: PgCluster, make_db, tmp_path, monkeypatch
) -> None:
    config_dir = tmp_path / "deploy"
    tls = config_dir / "tls"
    _copy_private(pg_cluster.client_key_encrypted, tls / "client.key")
    _copy_private(pg_cluster.client_cert, tls / "client.crt")
    _copy_private(pg_cluster.ca_cert, tls / "ca.crt")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative paths must not depend on the working directory
    monkeypatch.setenv("ETL_AUTH_TEST_KEY_PASSPHRASE", pg_cluster.client_key_passphrase)
    hook = _profile_hook(
        config_dir, _jdbc_url(pg_cluster, make_db(CERT_ROLE), rootcert="tls/ca.crt"), "key_file",
        user=CERT_ROLE, key_file="tls/client.key", cert_file="tls/client.crt", secret="ETL_AUTH_TEST_KEY_PASSPHRASE",
    )  # fmt: skip
    kwargs = hook.engine.connect_kwargs()
    assert kwargs["sslkey"] == str(tls / "client.key")
    assert kwargs["sslcert"] == str(tls / "client.crt")
    assert kwargs["sslrootcert"] == str(tls / "ca.crt")
    _assert_logs_in(hook, CERT_ROLE)


def test_key_file_missing_key_names_the_setting(pg_cluster: PgCluster, make_db, tmp_path) -> None:
    hook = _profile_hook(
        tmp_path, _jdbc_url(pg_cluster, make_db(CERT_ROLE)), "key_file",
        user=CERT_ROLE, key_file="tls/missing.key", cert_file=str(pg_cluster.client_cert),
    )  # fmt: skip
    with pytest.raises(ConfigurationError) as info:
        hook.get_conn()
    message = str(info.value)
    assert f"Engine.{PROFILE}.key_file" in message
    assert str(tmp_path / "tls" / "missing.key") in message
    assert not info.value.retryable


def test_key_file_world_readable_key_is_refused_as_configuration(
    pg_cluster: PgCluster, make_db, tmp_path
) -> None:
    key = tmp_path / "tls" / "client.key"
    _copy_private(pg_cluster.client_key, key)
    os.chmod(key, 0o644)
    hook = _profile_hook(
        tmp_path, _jdbc_url(pg_cluster, make_db(CERT_ROLE)), "key_file",
        user=CERT_ROLE, key_file="tls/client.key", cert_file=str(pg_cluster.client_cert),
    )  # fmt: skip
    with pytest.raises(ConfigurationError) as info:
        hook.get_conn()
    assert type(info.value) is ConfigurationError and not info.value.retryable
    assert "group or world access" in str(info.value) and str(key) in str(info.value)
    assert "chmod 600" in str(info.value) and f"Engine.{PROFILE}.key_file" in str(info.value)


def test_key_file_inline_connection_with_passphrase_in_the_password_field(
    pg_cluster: PgCluster, make_db, monkeypatch, fresh_masker
) -> None:
    passphrase = pg_cluster.client_key_passphrase
    assert passphrase in _redacted(passphrase)
    hook = _inline_hook(
        monkeypatch, "etl_auth_key_file", pg_cluster, make_db(CERT_ROLE), CERT_ROLE, passphrase, "key_file",
        key_file=str(pg_cluster.client_key_encrypted), cert_file=str(pg_cluster.client_cert),
    )  # fmt: skip
    kwargs = hook.engine.connect_kwargs()
    assert kwargs["sslkey"] == str(pg_cluster.client_key_encrypted) and kwargs["sslpassword"] == passphrase
    _assert_logs_in(hook, CERT_ROLE)
    assert passphrase not in _redacted(passphrase)
    assert passphrase not in hook.get_uri()


def test_cli_check_passes_for_a_key_file_profile_without_printing_the_secret(
    pg_cluster: PgCluster, make_db, tmp_path, monkeypatch
) -> None:
    passphrase = pg_cluster.client_key_passphrase
    monkeypatch.setenv("ETL_AUTH_TEST_KEY_PASSPHRASE", passphrase)
    hook = _profile_hook(
        tmp_path, _jdbc_url(pg_cluster, make_db(CERT_ROLE)), "key_file", user=CERT_ROLE,
        key_file=str(pg_cluster.client_key_encrypted), cert_file=str(pg_cluster.client_cert),
        secret="ETL_AUTH_TEST_KEY_PASSPHRASE",
    )  # fmt: skip
    hook.init_db()
    out, err = io.StringIO(), io.StringIO()
    status = main(["check", "--config", str(tmp_path / "craft-connector.yml")], out=out, err=err)
    printed = out.getvalue() + err.getvalue()
    assert status == 0, printed
    assert err.getvalue() == ""
    assert "[FAIL]" not in printed
    assert (
        f"[OK  ] Engine DB secret: Engine.{PROFILE}.secret resolved from ETL_AUTH_TEST_KEY_PASSPHRASE "
        "(value not shown)\n" in printed
    )
    assert "[OK  ] Engine DB auth: auth_mode key_file, verified" in printed
    assert "[OK  ] Engine DB connection:" in printed and "[OK  ] Engine DB tables: all" in printed
    assert printed.endswith(" 0 warning(s), 0 failed\n")
    assert passphrase not in printed


# --------------------------------------------------------------------------- sso (libpq >= 18 via psycopg 3)


def _sso_hook(shape: str, cluster: PgCluster, database: str, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> EngineDBHook:  # fmt: skip
    if shape == "profile":
        return _profile_hook(tmp_path, _jdbc_url(cluster, database), "sso", user=SSO_ROLE, issuer=ISSUER,
                             client_id=CLIENT_ID)  # fmt: skip
    return _inline_hook(monkeypatch, "etl_auth_sso", cluster, database, SSO_ROLE, None, "sso",
                        issuer=ISSUER, client_id=CLIENT_ID)  # fmt: skip


def test_inline_connection_with_a_password_for_a_mode_without_a_secret_is_refused(
    pg_cluster: PgCluster, monkeypatch
) -> None:
    """sts takes no stored secret (sso takes an optional client secret, as etl-craft passes it)."""
    hook = _inline_hook(monkeypatch, "etl_auth_sts_pw", pg_cluster, "postgres", SSO_ROLE, "stray-Pw-9Tq", "sts",
                        region="eu-west-1")  # fmt: skip
    with pytest.raises(ConfigurationError) as info:
        hook.get_conn()
    message = str(info.value)
    assert (
        "takes no stored secret" in message and "etl_auth_sts_pw" in message and "stray-Pw-9Tq" not in message
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_sso_parameters_reach_libpq_18_and_are_accepted(
    shape: str, pg_cluster: PgCluster, make_db, tmp_path, monkeypatch
) -> None:
    psycopg = pytest.importorskip("psycopg", reason="auth_mode sso needs psycopg 3 (the [sso] extra)")
    if psycopg.pq.version() < 180000:
        pytest.skip(f"psycopg 3 here uses libpq {psycopg.pq.version()}; sso needs libpq >= 18")
    hook = _sso_hook(shape, pg_cluster, make_db(SSO_ROLE), tmp_path, monkeypatch)
    with closing(hook.get_conn()) as conn:
        assert type(conn).__module__.split(".")[0] == "psycopg"  # psycopg 3, not psycopg2
        params = conn.info.get_parameters()
        assert params["oauth_issuer"] == ISSUER and params["oauth_client_id"] == CLIENT_ID
        assert f"oauth_issuer={ISSUER}" in conn.info.dsn
        assert params["sslmode"] == "verify-full"
    _assert_logs_in(hook, SSO_ROLE)


def test_sso_libpq_17_does_not_know_oauth_issuer(pg_cluster: PgCluster) -> None:
    version = psycopg2.__libpq_version__
    if version >= 180000:
        pytest.skip(f"psycopg2 here bundles libpq {version}, which knows oauth_issuer")
    with pytest.raises(psycopg2.ProgrammingError, match='invalid connection option "oauth_issuer"'):
        psycopg2.connect(
            host=pg_cluster.host, port=pg_cluster.port, dbname="postgres", user=SSO_ROLE, connect_timeout=5,
            oauth_issuer=ISSUER, oauth_client_id=CLIENT_ID, **_tls_settings(pg_cluster),
        )  # fmt: skip
    with pytest.raises(ConfigurationError) as info:
        check_libpq(version, f"Engine.{PROFILE}.auth_mode", f"psycopg2 {psycopg2.__version__.split()[0]}")
    message = str(info.value)
    expected = f"{version // 10000}.{version % 10000}"
    assert expected.startswith("17.") and f"libpq {expected}" in message
    assert "[sso]" in message and f"Engine.{PROFILE}.auth_mode" in message
    assert re.search(r"libpq 18 or newer", message)


# --------------------------------------------------------------------------- error classification


def test_closed_port_is_retryable_engine_unreachable(tmp_path, monkeypatch) -> None:
    port = _free_port()
    monkeypatch.setenv("ETL_AUTH_TEST_UNREACHABLE", "not-used-secret-value")
    hook = _profile_hook(
        tmp_path, f"jdbc:postgresql://127.0.0.1:{port}/etl_craft?connect_timeout=3", "password",
        user="etl_password", secret="ETL_AUTH_TEST_UNREACHABLE",
    )  # fmt: skip
    with pytest.raises(EngineUnreachableError) as info:
        hook.get_conn()
    assert info.value.retryable and info.value.exit_code == 3
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "not-used-secret-value" not in str(info.value)


def test_role_rejected_by_pg_hba_is_a_permanent_configuration_error(
    pg_cluster: PgCluster, make_db, tmp_path, monkeypatch
) -> None:
    # etl_sso may only log in over hostssl; without TLS the last pg_hba line rejects it.
    database = make_db(SSO_ROLE)
    monkeypatch.setenv("ETL_AUTH_TEST_REJECTED", "rejected-role-secret-value")
    url = f"jdbc:postgresql://{pg_cluster.host}:{pg_cluster.port}/{database}?sslmode=disable"
    hook = _profile_hook(tmp_path, url, "password", user=SSO_ROLE, secret="ETL_AUTH_TEST_REJECTED")
    with pytest.raises(ConfigurationError) as info:
        hook.get_conn()
    assert type(info.value) is ConfigurationError
    assert not info.value.retryable and info.value.exit_code == 3
    assert "pg_hba.conf rejects connection" in str(info.value)
    assert "rejected-role-secret-value" not in str(info.value)
