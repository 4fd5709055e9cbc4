"""A throwaway, TLS-enabled PostgreSQL cluster (initdb and pg_ctl from the machine's server binaries).

Never the machine's own server: a fresh data directory under ``/tmp``, on 127.0.0.1 and a free port, with
fsync and synchronous_commit off, a test CA, scram-sha-256 password roles, a certificate role and roles for
the token, sts and sso auth modes. The test suite runs one per session (``tests/fixtures/fix_pg.py``), the
benchmark its own (``bench/engines.py``, ``bench/scheduler.py``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import psycopg2
import psycopg2.extensions
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from psycopg2 import sql

BINDIR_ENV = "ETL_CRAFT_PG_BINDIR"
SERVER_ROOT = Path("/usr/lib/postgresql")
SERVER_OS_USER = "postgres"
PASSWORD_ROLES = ("etl_password", "etl_token", "etl_oauth")
CERT_ROLE = "etl_cert"
#: Logs in with an RDS-style IAM token as its password; TLS only (tests set the password to the token).
STS_ROLE = "etl_sts"
#: Stands for an sso login: the server trusts it over TLS, so a libpq-18 OAuth connection can complete.
SSO_ROLE = "etl_sso"
_START_ATTEMPTS = 3
_LOG_TAIL_LINES = 40


class PostgresUnavailable(Exception):
    """No usable PostgreSQL server installation was found."""


# --------------------------------------------------------------------------- discovery


def _has_server(bindir: Path) -> bool:
    return all(
        (bindir / tool).is_file() and os.access(bindir / tool, os.X_OK) for tool in ("initdb", "pg_ctl")
    )


def _version_key(bindir: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", bindir.parent.name))


def find_bindir() -> Path:
    """Return the PostgreSQL server bindir to use, or raise PostgresUnavailable with the reason."""
    override = os.environ.get(BINDIR_ENV)
    if override:
        bindir = Path(override)
        if not _has_server(bindir):
            raise PostgresUnavailable(f"{BINDIR_ENV}={override} has no executable initdb and pg_ctl")
        return bindir
    candidates = sorted((d for d in SERVER_ROOT.glob("*/bin") if _has_server(d)), key=_version_key)
    if candidates:
        return candidates[-1]
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            pass
        else:
            bindir = Path(out.stdout.strip())
            if _has_server(bindir):
                return bindir
    raise PostgresUnavailable(
        f"no PostgreSQL server found: set {BINDIR_ENV}, or install initdb/pg_ctl under "
        f"{SERVER_ROOT}/<version>/bin or in `pg_config --bindir`"
    )


def _server_os_user() -> str | None:
    """OS user that must run the server binaries, or None to run them as ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_OS_USER)
    except KeyError:
        raise PostgresUnavailable(f"running as root but there is no {SERVER_OS_USER!r} OS user") from None
    if not _runuser():
        raise PostgresUnavailable("running as root but `runuser` is not available")
    return SERVER_OS_USER


def _runuser() -> str | None:
    return shutil.which("runuser") or next(
        (p for p in ("/usr/sbin/runuser", "/sbin/runuser") if os.access(p, os.X_OK)), None
    )


def _server_env() -> dict[str, str]:
    """Our environment without PG* variables that could redirect the server tools."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- TLS material


def _key_usage(**enabled: bool) -> x509.KeyUsage:
    names = (
        "digital_signature",
        "content_commitment",
        "key_encipherment",
        "data_encipherment",
        "key_agreement",
        "key_cert_sign",
        "crl_sign",
        "encipher_only",
        "decipher_only",
    )
    return x509.KeyUsage(**{name: enabled.get(name, False) for name in names})


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _builder(subject: str, issuer: x509.Name, public_key: Any) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _issue(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    usage: x509.ObjectIdentifier,
    sans: Sequence[x509.GeneralName] = (),
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    builder = (
        _builder(common_name, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True, key_agreement=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _pem_key(key: ec.EllipticCurvePrivateKey, passphrase: str | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase.encode())
        if passphrase
        else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes | str, mode: int, owner: str | None = None) -> None:
    """Write `data` to `path` with `mode`, chowned to `owner` (an OS user) when given."""
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    if owner:
        entry = pwd.getpwnam(owner)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    os.chmod(path, mode)


def generate_certs(certs_dir: Path, passphrase: str, server_user: str | None) -> None:
    """Create a test CA, a server certificate for 127.0.0.1/localhost and etl_cert client certificates."""
    ca_key = _new_key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "etl-craft test CA")])
    ca_cert = (
        _builder("etl-craft test CA", ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_key, server_cert = _issue(
        ca_cert,
        ca_key,
        "127.0.0.1",
        ExtendedKeyUsageOID.SERVER_AUTH,
        sans=[
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.DNSName("localhost"),
            x509.DNSName("127.0.0.1"),  # for clients that only match DNS names
        ],
    )
    client_key, client_cert = _issue(ca_cert, ca_key, CERT_ROLE, ExtendedKeyUsageOID.CLIENT_AUTH)

    _write(certs_dir / "ca.crt", _pem_cert(ca_cert), 0o644, server_user)
    _write(certs_dir / "server.crt", _pem_cert(server_cert), 0o644, server_user)
    _write(certs_dir / "server.key", _pem_key(server_key), 0o600, server_user)
    # Client files stay owned by the test process: libpq insists on owning a 0600 key.
    _write(certs_dir / "client.crt", _pem_cert(client_cert), 0o644)
    _write(certs_dir / "client.key", _pem_key(client_key), 0o600)
    _write(certs_dir / "client-encrypted.key", _pem_key(client_key, passphrase), 0o600)


# --------------------------------------------------------------------------- cluster


def _quote_conf(value: str | Path) -> str:
    return "'" + str(value).replace("\\", "\\\\").replace("'", "''") + "'"


def _log_tail(logfile: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(logfile.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"<cannot read {logfile}: {exc}>"


@dataclass
class PgCluster:
    """A running throwaway PostgreSQL cluster with password, token, oauth and certificate roles."""

    CLIENT_KEY_PASSPHRASE: ClassVar[str] = "etl-craft-test-key-passphrase"

    host: str
    port: int
    bindir: Path
    datadir: Path
    certs_dir: Path
    ca_cert: Path
    client_cert: Path
    client_key: Path
    client_key_encrypted: Path
    client_key_passphrase: str
    superuser: str = "postgres"
    passwords: dict[str, str] = field(default_factory=dict, repr=False)
    version: str = ""
    server_user: str | None = None  # OS user running the server binaries; None = the test process

    @property
    def workdir(self) -> Path:
        """Temporary directory holding the data dir, certificates and server log."""
        return self.datadir.parent

    @property
    def logfile(self) -> Path:
        """The server log written by pg_ctl."""
        return self.workdir / "server.log"

    @classmethod
    def create(cls, bindir: Path, server_user: str | None) -> PgCluster:
        """Initialise, configure and start a new cluster in a fresh directory under /tmp."""
        workdir = Path(tempfile.mkdtemp(prefix="etl-craft-pg-", dir="/tmp"))
        certs_dir = workdir / "certs"
        cluster = cls(
            host="127.0.0.1",
            port=_free_port(),
            bindir=bindir,
            datadir=workdir / "data",
            certs_dir=certs_dir,
            ca_cert=certs_dir / "ca.crt",
            client_cert=certs_dir / "client.crt",
            client_key=certs_dir / "client.key",
            client_key_encrypted=certs_dir / "client-encrypted.key",
            client_key_passphrase=cls.CLIENT_KEY_PASSPHRASE,
            server_user=server_user,
        )
        try:
            cluster._bootstrap()
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    def _bootstrap(self) -> None:
        self.certs_dir.mkdir(mode=0o700)
        if self.server_user:
            entry = pwd.getpwnam(self.server_user)
            for path in (self.workdir, self.certs_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        generate_certs(self.certs_dir, self.client_key_passphrase, self.server_user)
        self._run_checked(
            "initdb",
            "-D",
            self.datadir,
            "-U",
            self.superuser,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        hba = (
            "# etl-craft test cluster\n"
            "local   all  all                                  trust\n"
            f"host    all  {self.superuser}  127.0.0.1/32  trust\n"
            f"hostssl all  {CERT_ROLE}  127.0.0.1/32  cert\n"
            f"hostssl all  {STS_ROLE}  127.0.0.1/32  scram-sha-256\n"
            f"hostssl all  {SSO_ROLE}  127.0.0.1/32  trust\n"
            f"host    all  {','.join(PASSWORD_ROLES)}  127.0.0.1/32  scram-sha-256\n"
            "host    all  all  127.0.0.1/32  reject\n"
        )
        _write(self.datadir / "pg_hba.conf", hba, 0o600, self.server_user)
        with (self.datadir / "postgresql.conf").open("a") as conf:
            conf.write("\ninclude 'etl_craft.conf'\n")
        for attempt in range(1, _START_ATTEMPTS + 1):
            self._write_settings()
            try:
                self.start()
                break
            except RuntimeError as exc:
                if attempt == _START_ATTEMPTS or "could not bind" not in str(exc):
                    raise
                self.port = _free_port()  # lost the race for the port; pick another
        self._create_roles()

    def _write_settings(self) -> None:
        settings = {
            "listen_addresses": _quote_conf(self.host),
            "port": str(self.port),
            "unix_socket_directories": _quote_conf(self.datadir),
            "max_connections": "200",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "password_encryption": "'scram-sha-256'",
            "ssl": "on",
            "ssl_cert_file": _quote_conf(self.certs_dir / "server.crt"),
            "ssl_key_file": _quote_conf(self.certs_dir / "server.key"),
            "ssl_ca_file": _quote_conf(self.ca_cert),
        }
        text = "".join(f"{key} = {value}\n" for key, value in settings.items())
        _write(self.datadir / "etl_craft.conf", text, 0o600, self.server_user)

    def _create_roles(self) -> None:
        """Create the login roles (random scram passwords per session) and record the server version."""
        self.passwords = {role: secrets.token_urlsafe(32) for role in (*PASSWORD_ROLES, STS_ROLE)}
        conn = self.admin_connect()
        try:
            with conn.cursor() as cur:
                for role, password in self.passwords.items():
                    query = sql.SQL("CREATE ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(role))
                    cur.execute(query, (password,))
                for role in (CERT_ROLE, SSO_ROLE):
                    cur.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
                cur.execute("SHOW server_version")
                row = cur.fetchone()
        finally:
            conn.close()
        assert row is not None
        self.version = str(row[0]).split()[0]

    def _run(self, tool: str, *args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a server tool from bindir, as the server OS user when we are root."""
        cmd = [str(self.bindir / tool), *(str(arg) for arg in args)]
        if self.server_user:
            cmd = [_runuser() or "runuser", "-u", self.server_user, "--", *cmd]
        return subprocess.run(
            cmd,
            cwd=self.workdir,
            env=_server_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _run_checked(self, tool: str, *args: str | Path) -> None:
        result = self._run(tool, *args)
        if result.returncode != 0:
            raise RuntimeError(
                f"{tool} failed with exit code {result.returncode}\n{result.stdout}{result.stderr}\n"
                f"--- last lines of {self.logfile} ---\n{_log_tail(self.logfile)}"
            )

    def start(self) -> None:
        """Start the server on the configured port and wait until it accepts connections."""
        self._run_checked("pg_ctl", "-D", self.datadir, "-l", self.logfile, "-w", "-t", "60", "start")

    def stop(self) -> None:
        """Stop the server with a fast shutdown (it can be started again with start())."""
        self._run_checked("pg_ctl", "-D", self.datadir, "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        """Stop the server immediately if it runs and delete all of its files."""
        if (self.datadir / "postmaster.pid").exists():
            result = self._run("pg_ctl", "-D", self.datadir, "-m", "immediate", "-w", "stop", timeout=60)
            if result.returncode != 0:
                self._kill_postmaster()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _kill_postmaster(self) -> None:
        try:
            pid = int((self.datadir / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGQUIT)
        except (OSError, ValueError, IndexError):
            pass

    def admin_connect(self, dbname: str = "postgres") -> psycopg2.extensions.connection:
        """Connect as the superuser over TCP (autocommit)."""
        conn = psycopg2.connect(
            host=self.host, port=self.port, user=self.superuser, dbname=dbname, connect_timeout=10
        )
        conn.autocommit = True
        return conn

    def create_database(self, owner: str = "etl_password", schema: str | None = "etl_craft") -> str:
        """Create a uniquely named fresh database owned by `owner`; create `schema` in it owned by owner
        (None = no schema). Return the database name."""
        name = f"etl_craft_{uuid.uuid4().hex[:16]}"
        conn = self.admin_connect()
        try:
            conn.cursor().execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(owner))
            )
        finally:
            conn.close()
        if schema is not None:
            conn = self.admin_connect(name)
            try:
                conn.cursor().execute(
                    sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                        sql.Identifier(schema), sql.Identifier(owner)
                    )
                )
            finally:
                conn.close()
        return name

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting any sessions still using it."""
        conn = self.admin_connect()
        force = sql.SQL(" WITH (FORCE)" if conn.server_version >= 130000 else "")
        try:
            conn.cursor().execute(sql.SQL("DROP DATABASE IF EXISTS {}{}").format(sql.Identifier(name), force))
        finally:
            conn.close()

    def cert_params(self, *, encrypted: bool = False) -> dict[str, str]:
        """libpq parameters for a verify-full TLS login as etl_cert with the client certificate."""
        params = {
            "sslmode": "verify-full",
            "sslrootcert": str(self.ca_cert),
            "sslcert": str(self.client_cert),
            "sslkey": str(self.client_key_encrypted if encrypted else self.client_key),
        }
        if encrypted:
            params["sslpassword"] = self.client_key_passphrase
        return params


@dataclass
class PgDatabase:
    """A fresh database in the test cluster, with a schema owned by `user`."""

    cluster: PgCluster
    name: str
    schema: str = "etl_craft"
    user: str = "etl_password"

    @property
    def password(self) -> str:
        """The session password of `user`."""
        try:
            return self.cluster.passwords[self.user]
        except KeyError:
            raise KeyError(f"role {self.user!r} has no password in the test cluster") from None

    def connect(self, **kwargs: Any) -> psycopg2.extensions.connection:
        """Connect as `user` with search_path set to `schema` (autocommit); kwargs override libpq params."""
        params: dict[str, Any] = {
            "host": self.cluster.host,
            "port": self.cluster.port,
            "dbname": self.name,
            "user": self.user,
            "connect_timeout": 10,
        }
        if self.user == CERT_ROLE:
            params.update(self.cluster.cert_params())
        else:
            params["password"] = self.password
        if self.schema:
            escaped = self.schema.replace("\\", "\\\\").replace(" ", "\\ ")
            params["options"] = f"-c search_path={escaped}"
        params.update(kwargs)
        conn = psycopg2.connect(**params)
        conn.autocommit = True
        return conn
