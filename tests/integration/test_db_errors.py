"""Database errors after a successful login become typed provider errors, decided by SQLSTATE / SQLite result
code (issue 14): a read-only or damaged SQLite file, privileges a PostgreSQL role lacks, a session the server
ends in the middle of a command. The CLI prints one ``error:`` line with the documented exit status (never a
traceback); operators get the same typed error through ``hook.lifecycle()``.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from contextlib import closing, suppress
from pathlib import Path

import psycopg2
import pytest
from psycopg2 import sql

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.errors import ConfigurationError, EngineDBError, EngineUnreachableError
from airflow_provider_etl_craft.operators._outcome import airflow_outcome
from airflow_provider_etl_craft.runs import RunIdentity
from airflow_provider_etl_craft.runs.lifecycle import RunLifecycle
from harness.engines import EngineSetup, pg_profile_yaml, write_config
from harness.postgres import PgCluster, PgDatabase

CLI = str(Path(sys.executable).with_name("etl-craft-airflow"))


def cli(setup: EngineSetup, *args: str) -> tuple[int, str]:
    """The CLI in-process on the setup's craft-connector.yml: (exit status, stdout + stderr)."""
    out, err = io.StringIO(), io.StringIO()
    status = main([*args, "--config", str(setup.config_path)], out, err)
    return status, out.getvalue() + err.getvalue()


def one_error_line(text: str) -> str:
    """The output holds exactly one ``error:`` line and no traceback; that line."""
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, text
    return lines[0]


# -- SQLite --------------------------------------------------------------------------------------------------


def test_a_sqlite_file_the_user_may_read_but_not_write_is_a_configuration_error(
    make_engine, tmp_path: Path
) -> None:
    """``pause`` writes; the file is readable only. As root (CI) the CLI runs without the capabilities that
    let root write anyone's file (``setpriv``), on a file owned by ``nobody``; otherwise the file is 0444."""
    folder = Path(tmp_path / "shared")
    setup = make_engine("sqlite", folder)
    setup.hook().migrate()
    with closing(setup.hook().get_conn()) as conn:
        conn.execute(
            "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE) VALUES ('P', 'P', 'FULL')"
        )
    db = next(folder.rglob("*.db"))
    args = ["pause", "--pipeline", "P", "--reason", "test", "--by", "me", "--config", str(setup.config_path)]
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("setpriv (util-linux) is needed to drop root's file capabilities")
        os.chown(db, 65534, 65534)
        db.chmod(0o644)
        for path in [db.parent, *db.parent.parents]:
            if path == tmp_path.parent.parent:
                break
            path.chmod(0o777)
        done = subprocess.run(
            ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", CLI, *args],
            capture_output=True, text=True, timeout=120, env={**os.environ, **setup.env}, check=False,
        )  # fmt: skip
        status, text = done.returncode, done.stdout + done.stderr
    else:
        db.chmod(0o444)
        status, text = cli(setup, *args[:-2])
    line = one_error_line(text)
    assert status == 3, text
    assert "is read-only for this user (SQLITE_READONLY" in line and str(db) in line


def test_a_damaged_sqlite_file_is_an_engine_db_error(make_engine, tmp_path: Path) -> None:
    setup = make_engine("sqlite")
    setup.hook().migrate()
    db = next(tmp_path.rglob("*.db"))
    with closing(setup.hook().get_conn()) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    page = 4096
    # Every page after the first (the tables' b-trees, wherever the schema's migrations placed them).
    data[page:] = b"\xa5" * (len(data) - page)
    db.write_bytes(bytes(data))
    status, text = cli(setup, "status", "--pipeline", "ANY")
    line = one_error_line(text)
    assert status == 12, text
    assert "is damaged or not a SQLite database (SQLITE_CORRUPT" in line


def test_a_file_that_is_not_a_sqlite_database_is_an_engine_db_error(make_engine, tmp_path: Path) -> None:
    setup = make_engine("sqlite")
    setup.hook().migrate()
    db = next(tmp_path.rglob("*.db"))
    for extra in db.parent.glob(db.name + "-*"):
        extra.unlink()
    db.write_bytes(os.urandom(8192))
    status, text = cli(setup, "status", "--pipeline", "ANY")
    line = one_error_line(text)
    assert status == 12, text
    assert "(SQLITE_NOTADB" in line
    with pytest.raises(EngineDBError):
        setup.hook().get_conn()


# -- PostgreSQL: privileges with real roles ------------------------------------------------------------------


@pytest.fixture
def foreign_schema(pg_cluster: PgCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A database whose etl_craft schema belongs to etl_token; etl_password may only USE the schema.

    Returns (owner's setup, etl_password's setup).
    """
    name = pg_cluster.create_database(owner="etl_token")
    conn = pg_cluster.admin_connect(name)
    try:
        conn.autocommit = True
        conn.cursor().execute(sql.SQL("GRANT USAGE ON SCHEMA etl_craft TO etl_password"))
    finally:
        conn.close()
    setups = []
    for user, var in (("etl_token", "OWNER_SECRET"), ("etl_password", "USER_SECRET")):
        db = PgDatabase(pg_cluster, name, user=user)
        monkeypatch.setenv(var, db.password)
        config = write_config(tmp_path / user, pg_profile_yaml(db, secret_var=var))
        setups.append(EngineSetup("postgresql", config, {var: db.password}, db))
    yield tuple(setups)
    with suppress(psycopg2.Error):
        pg_cluster.drop_database(name)


GRANT = "GRANT USAGE, CREATE ON SCHEMA etl_craft TO etl_password"


@pytest.mark.postgres
def test_init_db_without_create_on_the_schema_names_the_grant(foreign_schema) -> None:
    _, user = foreign_schema
    status, text = cli(user, "init-db")
    line = one_error_line(text)
    assert status == 3, text
    assert "role etl_password lacks a privilege" in line and "SQLSTATE 42501" in line and GRANT in line


@pytest.mark.postgres
def test_reading_engine_tables_the_role_may_not_read_names_the_grant(foreign_schema) -> None:
    owner, user = foreign_schema
    assert cli(owner, "migrate")[0] == 0
    status, text = cli(user, "status", "--pipeline", "ANY")
    line = one_error_line(text)
    assert status == 3, text
    assert (
        "SQLSTATE 42501" in line
        and "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA etl_craft" in line
    )


# -- PostgreSQL: the server ends the session mid-command ------------------------------------------------------


@pytest.mark.postgres
def test_a_session_terminated_by_the_server_is_a_retryable_unreachable_error(
    make_engine, pg_cluster: PgCluster
) -> None:
    setup = make_engine("postgresql")
    hook = setup.hook()
    hook.migrate()
    with pytest.raises(EngineUnreachableError) as caught, hook.lifecycle() as lifecycle:
        pid = lifecycle.conn.get_backend_pid()
        admin = pg_cluster.admin_connect()
        try:
            admin.autocommit = True
            admin.cursor().execute("SELECT pg_terminate_backend(%s)", (pid,))
        finally:
            admin.close()
        hook.engine.query(lifecycle.conn, "SELECT COUNT(*) FROM CFG_PIPELINES")
    assert caught.value.retryable and caught.value.exit_code == 3
    assert "lost the Engine DB" in str(caught.value)


# -- command-line arguments the OS hands over --------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "status", "expected"),
    [
        ([b"pause", b"--pipeline", b"P\xff\xfe", b"--reason", b"r"], 2, "argument --pipeline: is not valid UTF-8"),
        ([b"status", b"--pipeline", b"P", b"--profile", b"\xc3("], 2, "argument --profile: is not valid UTF-8"),
        ([b"init-db", b"--lock-timeout", b"nan"], 2, "must be a finite number of seconds, 0 or more, got 'nan'"),
        ([b"migrate", b"--lock-timeout", b"-1"], 2, "must be a finite number of seconds"),
        ([b"status", b"--pipeline", b"P", b"--config", b"/nonexistent/\xff/craft-connector.yml"], 3,
         "error: "),
    ],
)  # fmt: skip
def test_arguments_that_are_not_text_or_not_numbers_are_usage_errors(
    argv: list[bytes], status: int, expected: str, tmp_path: Path
) -> None:
    """Real argv bytes (a subprocess): no UnicodeEncodeError or ValueError traceback, a documented status."""
    done = subprocess.run([CLI.encode(), *argv], capture_output=True, timeout=120, cwd=tmp_path, check=False)
    text = done.stdout.decode("utf-8", "replace") + done.stderr.decode("utf-8", "replace")
    assert done.returncode == status, text
    assert expected in text and "Traceback" not in text, text


@pytest.mark.postgres
def test_a_schema_the_role_may_not_use_is_reported_as_a_missing_grant_not_a_missing_schema(
    foreign_schema, pg_cluster: PgCluster
) -> None:
    owner, user = foreign_schema
    assert cli(owner, "migrate")[0] == 0
    conn = pg_cluster.admin_connect(user.database.name)
    try:
        conn.autocommit = True
        conn.cursor().execute("REVOKE USAGE ON SCHEMA etl_craft FROM etl_password")
    finally:
        conn.close()
    for command in (
        ["init-db"],
        ["status", "--pipeline", "X"],
        ["pause", "--pipeline", "X", "--reason", "r"],
    ):
        status, text = cli(user, *command)
        line = one_error_line(text)
        assert status == 3, (command, text)
        assert "GRANT USAGE, CREATE ON SCHEMA etl_craft" in line, (command, text)
        assert "does not exist" not in line and "init-db" not in line, (command, text)


# -- PostgreSQL: a refused session, classified by what the server answers (no libpq text read) -------------


def pg_config(tmp_path: Path, db: PgDatabase, url: str) -> EngineSetup:
    text = pg_profile_yaml(db).replace(pg_profile_yaml(db).split("jdbc_url: ")[1].split("\n")[0], url)
    return EngineSetup("postgresql", write_config(tmp_path / "refused", text), {}, db)


@pytest.mark.postgres
def test_a_database_that_does_not_exist_is_a_permanent_login_refusal(make_engine, tmp_path: Path) -> None:
    """PostgreSQL checks the database after the login (SQLSTATE 3D000, which the provider's probe reads by
    finishing the login): a CONFIGURATION error that names the database and the fix, with no retry."""
    db = make_engine("postgresql").database
    cluster = db.cluster
    setup = pg_config(
        tmp_path, db, f"jdbc:postgresql://{cluster.host}:{cluster.port}/no_such_db?sslmode=require"
    )
    with pytest.raises(ConfigurationError) as caught:
        setup.hook().get_conn()
    assert type(caught.value) is ConfigurationError and not caught.value.retryable
    message = str(caught.value)
    assert "SQLSTATE 3D000" in message and "database 'no_such_db' does not exist there" in message, message
    assert db.password not in message


@pytest.mark.postgres
def test_a_server_certificate_that_does_not_verify_is_a_tls_configuration_error(
    make_engine, tmp_path: Path
) -> None:
    db = make_engine("postgresql").database
    cluster = db.cluster
    other_ca = tmp_path / "other-ca.crt"
    other_ca.write_bytes(
        (cluster.certs_dir / "client.crt").read_bytes()
    )  # a certificate, but not the server's CA
    url = f"jdbc:postgresql://{cluster.host}:{cluster.port}/{db.name}?sslmode=verify-full&sslrootcert={other_ca}"
    with pytest.raises(ConfigurationError) as caught:
        pg_config(tmp_path, db, url).hook().get_conn()
    message = str(caught.value)
    assert "presented a certificate that does not verify" in message and "sslrootcert" in message
    assert "refused the login" not in message


# -- the same errors in an operator: the Airflow outcome --------------------------------------------------


@pytest.mark.postgres
def test_in_an_operator_a_missing_privilege_fails_without_retry_and_a_lost_session_retries(
    foreign_schema, pg_cluster: PgCluster
) -> None:
    """Operators run the lifecycle as ``with airflow_outcome(), hook.lifecycle() as lc`` (claim, attempts,
    finish): a driver error becomes the typed error inside, and that the Airflow outcome outside."""
    owner, user = foreign_schema
    owner.hook().migrate()
    identity = RunIdentity("errors_dag", "manual__1")
    with pytest.raises(_compat.fail_exception()) as denied, airflow_outcome(), user.hook().lifecycle() as lc:
        lc.claim("ANY", identity)
    assert str(denied.value).startswith("[CONFIGURATION] role etl_password lacks a privilege")
    assert GRANT in str(denied.value)

    def terminate(lc: RunLifecycle) -> None:
        admin = pg_cluster.admin_connect()
        try:
            admin.autocommit = True
            admin.cursor().execute("SELECT pg_terminate_backend(%s)", (lc.conn.get_backend_pid(),))
        finally:
            admin.close()

    # A step whose session is lost is sent again on a new connection (docs/high-availability.md) …
    with airflow_outcome(), owner.hook().lifecycle() as lc:
        terminate(lc)
        lost_pid = lc.conn.get_backend_pid()
        metadata = r"^\[METADATA\] pipeline ANY does not exist"
        with pytest.raises(_compat.fail_exception(), match=metadata), airflow_outcome():
            lc.claim("ANY", identity)
        assert lc.conn.get_backend_pid() != lost_pid
    # … and without a new connection, the lost session is Airflow's retry.
    with pytest.raises(_compat.retry_exception()) as lost, airflow_outcome(), owner.hook().lifecycle() as lc:
        lc.reconnect_with = None
        terminate(lc)
        lc.claim("ANY", identity)
    assert not isinstance(lost.value, _compat.fail_exception())
    assert str(lost.value).startswith("[CONFIGURATION] lost the Engine DB")
