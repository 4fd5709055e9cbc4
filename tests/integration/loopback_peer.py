"""A loopback TCP peer in a process of its own, standing in for what sits in front of PostgreSQL in a failover.

Modes (``python -m tests.integration.loopback_peer MODE [HOST PORT]``; it prints the port it listens on):

* ``close``: accepts each connection, reads the client's first bytes and closes it without a byte of
  answer, as HAProxy does while no primary is up behind it;
* ``silent``: accepts each connection and never answers (nor closes), as a proxy whose backend hangs;
* ``cut``: relays to the server at HOST PORT and closes both sides when the client sends its first
  query (a ``Q`` message after the startup), so the session is lost after the login and before the
  first statement; it needs ``sslmode=disable`` to read the protocol.

:class:`Peer` starts one for a test and stops it (by its own process) afterwards.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType

_ROOT = Path(__file__).resolve().parents[2]


class Peer:
    """A running peer process: ``port`` to point a URL at; a context manager that stops it."""

    def __init__(self, mode: str, *upstream: str | int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.loopback_peer", mode, *map(str, upstream)],
            cwd=_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


def _recv_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _cut(client: socket.socket, upstream: tuple[str, int]) -> None:
    """Relay server answers as they come; relay client messages one by one until the first ``Q``, then close."""
    server = socket.create_connection(upstream)
    threading.Thread(target=_pump, args=(server, client), daemon=True).start()
    try:
        (length,) = struct.unpack("!I", _recv_exactly(client, 4))  # the startup message: no type byte
        server.sendall(struct.pack("!I", length) + _recv_exactly(client, length - 4))
        while True:
            kind = _recv_exactly(client, 1)
            (length,) = struct.unpack("!I", _recv_exactly(client, 4))
            body = _recv_exactly(client, length - 4)
            if kind == b"Q":
                break
            server.sendall(kind + struct.pack("!I", length) + body)
    except OSError:
        pass
    for sock in (client, server):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def _serve(mode: str, upstream: tuple[str, int] | None) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    print(listener.getsockname()[1], flush=True)
    held = []
    while True:
        client, _ = listener.accept()
        if mode == "close":
            client.settimeout(2)
            with contextlib.suppress(OSError):
                client.recv(1024)
            client.close()
        elif mode == "silent":
            held.append(client)  # never answered, never closed
        else:
            assert upstream is not None
            threading.Thread(target=_cut, args=(client, upstream), daemon=True).start()


if __name__ == "__main__":
    _mode, *_rest = sys.argv[1:]
    _serve(_mode, (_rest[0], int(_rest[1])) if _rest else None)
