"""One address that follows the primary, as an RDS or Cloud SQL endpoint, a Patroni VIP or a CloudNativePG
``-rw`` service does: a loopback TCP relay whose target the test moves to the new primary after a failover.

Bytes are relayed unchanged (TLS included). :meth:`FloatingAddress.move` points new sessions at another
port and cuts the sessions relayed so far, as the old primary's end of them is gone. While the target is
down a session is accepted and closed at once (what a proxy with no primary behind it does).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading


class FloatingAddress:
    """Relays 127.0.0.1:``port`` to 127.0.0.1:``target``."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sessions: set[socket.socket] = set()
        self._closing = False
        threading.Thread(target=self._accept, name="floating-address", daemon=True).start()

    def move(self, target: int) -> None:
        """New sessions go to ``target``; the sessions relayed so far are cut."""
        with self._lock:
            self.target = target
            sessions, self._sessions = self._sessions, set()
        for sock in sessions:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closing = True
        self._listener.close()
        self.move(self.target)

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with self._lock:
            target = self.target
        try:
            server = socket.create_connection(("127.0.0.1", target), timeout=5)
        except OSError:
            client.close()  # nothing listens there: accepted and closed
            return
        server.settimeout(None)
        with self._lock:
            self._sessions.update((client, server))
        try:
            while True:
                readable, _, _ = select.select([client, server], [], [])
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (server if sock is client else client).sendall(data)
        except OSError:
            return
        finally:
            with self._lock:
                self._sessions.difference_update((client, server))
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
