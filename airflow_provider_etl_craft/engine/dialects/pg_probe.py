"""What a PostgreSQL server (or a pooler in front of it) answers to a session request, asked after libpq failed.

libpq reports a failed connection as text only: no SQLSTATE (psycopg2's ``pgcode`` and psycopg 3's
``sqlstate`` are None for it), and the server's part translated by its ``lc_messages``. To classify the
failure by code, the dialect asks the server the way libpq starts a session: TCP; an ``SSLRequest`` unless
``sslmode=disable`` (verifying the certificate as ``verify-ca``/``verify-full`` ask, against the same
``sslrootcert``, and presenting the same client certificate); then a ``StartupMessage`` with the same user,
database and startup parameters. With several hosts (a multi-host ``jdbc_url``) the dialect asks each of
them in turn, as libpq tried them, and weighs the answers. What a host answers tells what happened there:

* no TCP connection: the Engine DB is unreachable;
* the certificate does not verify: a TLS configuration error;
* an ``ErrorResponse``: its SQLSTATE (field ``C``), before the login (a server starting up, or with no
  process slot left) or after it (see below);
* an authentication request the probe cannot answer (no password given; GSSAPI, OAuth): the server would
  take a session for this user and database, so the refusal was the login itself;
* nothing: the peer accepted the TCP connection and closed it, or never answered within the timeout, as a
  proxy (HAProxy in front of Patroni) does while no primary is up behind it.

PostgreSQL checks most limits only after the login: the connection slots kept for superusers, a role's or a
database's ``CONNECTION LIMIT`` (SQLSTATE 53300), a missing database (3D000). So, given the same credential
libpq had (:class:`Login`), the probe finishes the login as libpq would (cleartext, MD5 or SCRAM-SHA-256
without channel binding; a certificate login through TLS with the client certificate) and reads what follows
``AuthenticationOk``: an ``ErrorResponse`` and its SQLSTATE, or ``ReadyForQuery`` (the server takes the
session now), after which it ends the session with ``Terminate``. A wrong password is answered with its own
SQLSTATE (28P01). The credential goes to the server only; it is never logged nor kept in an answer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import socket
import ssl
import stringprep
import struct
import unicodedata
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

_SSL_REQUEST = 80877103
_PROTOCOL_3 = 196608
_VERIFYING = ("verify-ca", "verify-full")
#: Authentication request codes (``AuthenticationXXX``, message ``R``).
_AUTH_OK, _AUTH_CLEARTEXT, _AUTH_MD5, _AUTH_SASL, _AUTH_SASL_CONTINUE, _AUTH_SASL_FINAL = 0, 3, 5, 10, 11, 12
_SCRAM = "SCRAM-SHA-256"
_TERMINATE = b"X" + struct.pack("!I", 4)


class Login:
    """The credential libpq was given, for the probe to answer an authentication request with.

    Holds secrets: its ``repr`` shows none, and nothing of it is logged or kept in a :class:`ServerAnswer`.
    """

    __slots__ = ("cert", "key", "key_password", "password")

    def __init__(
        self,
        password: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        key_password: str | None = None,
    ) -> None:
        self.password = password
        #: The client certificate and key files (PEM) of a certificate login, and the key's passphrase.
        self.cert, self.key, self.key_password = cert, key, key_password

    def __repr__(self) -> str:
        return "Login(<hidden>)"


@dataclass(frozen=True)
class ServerAnswer:
    """The first thing the server said; ``message`` is the server's text, shown to users, never read."""

    reachable: bool
    sqlstate: str | None = None
    message: str | None = None
    tls_error: str | None = None
    #: It asked for authentication: it would take a session for this user and database, so a failed
    #: connect was refused at the login (the credential).
    asked_login: bool = False
    #: It took the session without asking for a credential (``AuthenticationOk``: trust, or a certificate).
    let_in: bool = False
    #: The login passed (``AuthenticationOk``, with or without a credential): a ``sqlstate`` came after it.
    logged_in: bool = False
    #: After the login it was ready for queries (``ReadyForQuery``): it takes this session now.
    took_session: bool = False
    #: It accepted the TCP connection, then said nothing: ``closed`` it without a byte of answer, or gave no
    #: answer within the probe's ``timeout`` (``silent``). None when it answered (or was not reachable).
    said_nothing: Literal["closed", "silent"] | None = None
    #: The seconds the probe waited for an answer.
    waited: float = 0.0

    @property
    def takes_sessions(self) -> bool:
        """It would take a session for this user and database (asked for a login, or let the probe in)."""
        return self.asked_login or self.let_in


def ask(
    host: str,
    port: int,
    database: str,
    *,
    user: str | None,
    startup: dict[str, str],
    settings: dict[str, str],
    timeout: float,
    login: Login | None = None,
) -> ServerAnswer:
    """Ask ``host:port`` for a session as libpq would (see the module docstring); with ``login``, log in.

    :param user: the role to ask for (None: libpq's default, the empty name).
    :param startup: startup parameters besides user and database (application_name, options, …).
    :param settings: the URL's driver settings (sslmode and the files it needs).
    :param timeout: seconds for the TCP connect and for each answer.
    """
    try:
        sock: socket.socket = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return ServerAnswer(reachable=False)
    try:
        sslmode = settings.get("sslmode", "prefer")
        if sslmode != "disable":
            sock.sendall(struct.pack("!II", 8, _SSL_REQUEST))
            tls = _recv(sock, 1) == b"S"
            if not tls and sslmode in ("require", *_VERIFYING):  # libpq gives up here: TLS is required
                return ServerAnswer(reachable=True, tls_error="the server takes no TLS connections")
            if tls:
                try:
                    context = _tls(sslmode, settings, login)
                except OSError as exc:
                    return ServerAnswer(reachable=True, tls_error=f"cannot read sslrootcert ({exc.strerror})")
                try:
                    sock = context.wrap_socket(sock, server_hostname=host)
                except ssl.SSLCertVerificationError as exc:
                    return ServerAnswer(reachable=True, tls_error=exc.verify_message or str(exc))
        params = {"user": user or "", "database": database, **startup}
        payload = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in params.items() if v) + b"\0"
        sock.sendall(struct.pack("!II", 8 + len(payload), _PROTOCOL_3) + payload)
        return _converse(sock, user or "", login)
    except TimeoutError:  # accepted, then no answer at all within the timeout
        return ServerAnswer(reachable=True, said_nothing="silent", waited=timeout)
    except (_Closed, ConnectionError, ssl.SSLEOFError):  # accepted, then closed (or reset) without answering
        return ServerAnswer(reachable=True, said_nothing="closed")
    except (OSError, struct.error):
        return ServerAnswer(reachable=True)  # it answered something this probe does not read (a TLS alert)
    finally:
        sock.close()


def _converse(sock: socket.socket, user: str, login: Login | None) -> ServerAnswer:
    """Read the server's answers to the startup message; answer what ``login`` can; stop at the first
    ``ErrorResponse``, an authentication request it cannot answer, or ``ReadyForQuery``.

    A message that ends the first reply early (the peer closed before any answer) raises :class:`_Closed`.
    """
    talk = _Conversation(sock, user, login)
    answered = False  # a message of the server was read: a close after it is not "said nothing"
    try:
        while True:
            kind, body = _message(sock)
            answered = True
            ended = talk.read(kind, body)
            if ended is not None:
                return ended
    except (_Closed, ConnectionError, ssl.SSLEOFError):
        if not answered:
            raise
        # It closed after answering part of the way (a login it gave up on): it asked for a login at least.
        return talk.answer()


class _Conversation:
    """One startup conversation of :func:`_converse`: what the server asked, and how far the login got."""

    def __init__(self, sock: socket.socket, user: str, login: Login | None) -> None:
        self.sock, self.user, self.login = sock, user, login
        self.asked = False  # the server asked for a login
        self.logged_in = False  # AuthenticationOk was read
        self.scram: _ScramClient | None = None

    def answer(self, sqlstate: str | None = None, message: str | None = None) -> ServerAnswer:
        """The server's answer so far, with the error its last message gave, if any."""
        return ServerAnswer(
            reachable=True,
            sqlstate=sqlstate,
            message=message,
            asked_login=self.asked,
            let_in=self.logged_in and not self.asked,
            logged_in=self.logged_in,
        )

    def read(self, kind: bytes, body: bytes) -> ServerAnswer | None:
        """Take one message of the server: the answer it ends the conversation with, else None."""
        if kind == b"E":
            fields = _fields(body)
            return self.answer(sqlstate=fields.get("C"), message=fields.get("M"))
        if kind == b"Z":
            self.sock.sendall(_TERMINATE)
            return ServerAnswer(
                reachable=True,
                asked_login=self.asked,
                let_in=not self.asked,
                logged_in=True,
                took_session=True,
            )
        if kind != b"R":
            # Once logged in: ParameterStatus, BackendKeyData, a notice, the session being set up. Before:
            # another message before the login, which is not a refusal.
            return None if self.logged_in else ServerAnswer(reachable=True)
        (code,) = struct.unpack("!I", body[:4])
        if code == _AUTH_OK:
            self.logged_in = True
            return None
        self.asked = True
        return self._authenticate(code, body[4:])

    def _authenticate(self, code: int, data: bytes) -> ServerAnswer | None:
        """Answer an authentication request when the login can (None); else the conversation ends here."""
        password = self.login.password if self.login is not None else None
        if code in (_AUTH_SASL_CONTINUE, _AUTH_SASL_FINAL) and self.scram is not None:
            reply = self.scram.step(code, data)
            if reply is None:  # the server's proof did not verify: nothing more to believe
                return ServerAnswer(reachable=True, asked_login=True)
            if reply:
                self.sock.sendall(b"p" + struct.pack("!I", 4 + len(reply)) + reply)
            return None
        if password is None:
            return ServerAnswer(reachable=True, asked_login=True)
        if code == _AUTH_CLEARTEXT:
            _send_password(self.sock, password.encode())
        elif code == _AUTH_MD5:
            inner = hashlib.md5(password.encode() + self.user.encode()).hexdigest()  # noqa: S324 - the protocol's
            outer = hashlib.md5(inner.encode() + data[:4]).hexdigest()  # noqa: S324
            _send_password(self.sock, b"md5" + outer.encode())
        elif code == _AUTH_SASL and _SCRAM.encode() in data.split(b"\0"):
            self.scram = _ScramClient(password)
            first = self.scram.first()
            sasl = _SCRAM.encode() + b"\0" + struct.pack("!I", len(first)) + first
            self.sock.sendall(b"p" + struct.pack("!I", 4 + len(sasl)) + sasl)
        else:  # GSSAPI, SSPI, OAuth, a SASL mechanism of its own: the probe cannot answer it
            return ServerAnswer(reachable=True, asked_login=True)
        return None


def _message(sock: socket.socket) -> tuple[bytes, bytes]:
    kind = _recv(sock, 1)
    (length,) = struct.unpack("!I", _recv(sock, 4))
    if not 4 <= length <= 1 << 20:
        raise struct.error(f"message length {length}")
    return kind, _recv(sock, length - 4)


def _fields(body: bytes) -> dict[str, str]:
    return {
        chunk[:1].decode("ascii", "replace"): chunk[1:].decode("utf-8", "replace")
        for chunk in body.split(b"\0")
        if chunk
    }


def _send_password(sock: socket.socket, secret: bytes) -> None:
    sock.sendall(b"p" + struct.pack("!I", 5 + len(secret)) + secret + b"\0")


class _ScramClient:
    """The client side of SCRAM-SHA-256 (RFC 5802, RFC 7677) without channel binding, as PostgreSQL takes it:
    the user name is the startup message's (sent empty here), the password prepared by SASLprep where it can be.
    """

    def __init__(self, password: str) -> None:
        self._password = _saslprep(password)
        self._nonce = base64.b64encode(secrets.token_bytes(18)).decode()
        self._bare = f"n=,r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._bare}".encode()

    def step(self, code: int, data: bytes) -> bytes | None:
        """The reply to the server's message (empty when none is due); None when the server is not believed."""
        if code == _AUTH_SASL_FINAL:
            said = dict(p.split("=", 1) for p in data.decode("ascii", "replace").split(",") if "=" in p)
            signature = base64.b64decode(said.get("v", ""))
            return b"" if hmac.compare_digest(signature, self._server_signature) else None
        server_first = data.decode("ascii", "replace")
        said = dict(p.split("=", 1) for p in server_first.split(",") if "=" in p)
        nonce, salt, rounds = said.get("r", ""), said.get("s", ""), int(said.get("i", "0") or 0)
        if not nonce.startswith(self._nonce) or rounds < 1:
            return None
        salted = hashlib.pbkdf2_hmac("sha256", self._password, base64.b64decode(salt), rounds)
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        without_proof = f"c=biws,r={nonce}"  # biws: "n,," in base64, no channel binding
        message = f"{self._bare},{server_first},{without_proof}".encode()
        signature = hmac.digest(hashlib.sha256(client_key).digest(), message, "sha256")
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = hmac.digest(hmac.digest(salted, b"Server Key", "sha256"), message, "sha256")
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def _saslprep(password: str) -> bytes:
    """SASLprep (RFC 4013) of a password, as PostgreSQL prepares it; a password it refuses is used as it is
    (PostgreSQL does the same), as is an ASCII one (which SASLprep leaves unchanged)."""
    if password.isascii():
        return password.encode()
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else c for c in password if not stringprep.in_table_b1(c)
    )
    prepared = unicodedata.normalize("NFKC", mapped)
    prohibited = (
        stringprep.in_table_c12, stringprep.in_table_c21, stringprep.in_table_c22, stringprep.in_table_c3,
        stringprep.in_table_c4, stringprep.in_table_c5, stringprep.in_table_c6, stringprep.in_table_c7,
        stringprep.in_table_c8, stringprep.in_table_c9, stringprep.in_table_a1,
    )  # fmt: skip
    if not prepared or any(check(c) for c in prepared for check in prohibited):
        return password.encode()
    rand_al = [stringprep.in_table_d1(c) for c in prepared]
    if any(rand_al) and (
        any(stringprep.in_table_d2(c) for c in prepared) or not (rand_al[0] and rand_al[-1])
    ):
        return password.encode()
    return prepared.encode()


def _tls(sslmode: str, settings: dict[str, str], login: Login | None) -> ssl.SSLContext:
    if sslmode not in _VERIFYING:  # libpq's require/prefer/allow encrypt without checking who answers
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        root = settings.get("sslrootcert") or str(Path.home() / ".postgresql" / "root.crt")
        context = ssl.create_default_context(cafile=None if root == "system" else root)
        context.check_hostname = sslmode == "verify-full"
    if login is not None and login.cert and login.key:
        # A client certificate libpq could use; one this cannot read is left out (libpq said why).
        with suppress(OSError, ssl.SSLError):
            context.load_cert_chain(login.cert, login.key, password=login.key_password)
    return context


class _Closed(Exception):
    """The peer closed the connection before the answer was complete."""


def _recv(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise _Closed
        data += chunk
    return data
