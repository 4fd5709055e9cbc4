"""What a PostgreSQL server (or a pooler in front of it) answers to a session request, asked after libpq failed.

libpq reports a failed connection as text only: no SQLSTATE, and the server's part translated by its
``lc_messages``. To classify the failure by code, the dialect asks the server the way libpq starts a session:
TCP; an ``SSLRequest`` unless ``sslmode=disable`` (verifying the certificate as ``verify-ca``/``verify-full``
ask, against the same ``sslrootcert``); then a ``StartupMessage`` with the same user, database and startup
parameters. The probe sends no password, key or token, and closes before authenticating. With several
hosts (a multi-host ``jdbc_url``) the dialect asks each of them in turn, as libpq tried them, and weighs the
answers. The first answer of a host tells what happened there:

* no TCP connection: the Engine DB is unreachable;
* the certificate does not verify: a TLS configuration error;
* an ``ErrorResponse``: its SQLSTATE (field ``C``): the server or pooler refused the session before any login;
* an authentication request: the server would take a session for this user and database, so the refusal
  was the login itself (or, with ``target_session_attrs``, the server took the login but was no primary);
* nothing: the peer accepted the TCP connection and closed it, or never answered within the timeout, as a
  proxy (HAProxy in front of Patroni) does while no primary is up behind it.
"""

from __future__ import annotations

import socket
import ssl
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

_SSL_REQUEST = 80877103
_PROTOCOL_3 = 196608
_VERIFYING = ("verify-ca", "verify-full")


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
    user: str | None,
    startup: dict[str, str],
    settings: dict[str, str],
    timeout: float,
) -> ServerAnswer:
    """Ask ``host:port`` for a session as libpq would (see the module docstring)."""
    try:
        sock: socket.socket = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return ServerAnswer(reachable=False)
    try:
        sslmode = settings.get("sslmode", "prefer")
        if sslmode != "disable":
            sock.sendall(struct.pack("!II", 8, _SSL_REQUEST))
            if _recv(sock, 1) == b"S":
                try:
                    context = _tls(sslmode, settings)
                except OSError as exc:
                    return ServerAnswer(reachable=True, tls_error=f"cannot read sslrootcert ({exc.strerror})")
                try:
                    sock = context.wrap_socket(sock, server_hostname=host)
                except ssl.SSLCertVerificationError as exc:
                    return ServerAnswer(reachable=True, tls_error=exc.verify_message or str(exc))
        params = {"user": user or "", "database": database, **startup}
        payload = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in params.items() if v) + b"\0"
        sock.sendall(struct.pack("!II", 8 + len(payload), _PROTOCOL_3) + payload)
        kind = _recv(sock, 1)
        (length,) = struct.unpack("!I", _recv(sock, 4))
        body = _recv(sock, min(length - 4, 65536))
    except TimeoutError:  # accepted, then no answer at all within the timeout
        return ServerAnswer(reachable=True, said_nothing="silent", waited=timeout)
    except (_Closed, ConnectionError, ssl.SSLEOFError):  # accepted, then closed (or reset) without answering
        return ServerAnswer(reachable=True, said_nothing="closed")
    except (OSError, struct.error):
        return ServerAnswer(reachable=True)  # it answered something this probe does not read (a TLS alert)
    finally:
        sock.close()
    if kind == b"R":  # an authentication request, not a refusal; one for a credential unless AuthenticationOk
        if body[:4] == b"\0\0\0\0":
            return ServerAnswer(reachable=True, let_in=True)
        return ServerAnswer(reachable=True, asked_login=True)
    if kind != b"E":
        return ServerAnswer(reachable=True)  # another message: not a refusal
    fields = {
        chunk[:1].decode("ascii", "replace"): chunk[1:].decode("utf-8", "replace")
        for chunk in body.split(b"\0")
        if chunk
    }
    return ServerAnswer(reachable=True, sqlstate=fields.get("C"), message=fields.get("M"))


def _tls(sslmode: str, settings: dict[str, str]) -> ssl.SSLContext:
    if sslmode not in _VERIFYING:  # libpq's require/prefer/allow encrypt without checking who answers
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    root = settings.get("sslrootcert") or str(Path.home() / ".postgresql" / "root.crt")
    context = ssl.create_default_context(cafile=None if root == "system" else root)
    context.check_hostname = sslmode == "verify-full"
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
