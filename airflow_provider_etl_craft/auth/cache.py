"""A per-process, thread-safe cache of short-lived credentials (tokens, assumed-role keys), kept until shortly
before they expire.

Memory only: nothing is written to disk, and a forked child starts empty (it fetches its own). A key is
everything that determines the credential, never a secret itself (see :func:`secret_id`). Fetches of one key
are serialised: N threads that miss at once cause one fetch, the others take its result.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from msgspec import Struct

V = TypeVar("V")

#: Refresh when less than this many seconds of a credential's lifetime remain …
MIN_MARGIN = 60.0
#: … or less than this share of it, whichever is more (but at the latest halfway through the lifetime).
MARGIN_SHARE = 0.1

#: Key of :func:`secret_id`, new in every process: an id cannot be checked against a guessed secret elsewhere.
_ID_KEY = secrets.token_bytes(32)


def secret_id(secret: str) -> str:
    """A stand-in for ``secret`` in a cache key: equal for equal secrets, revealing nothing about them."""
    return hmac.new(_ID_KEY, secret.encode(), hashlib.sha256).hexdigest()


def usable_for(lifetime: float) -> float:
    """Seconds a credential valid for ``lifetime`` seconds is handed out before it is fetched anew."""
    if lifetime <= 0:
        return 0.0
    margin = min(max(MIN_MARGIN, MARGIN_SHARE * lifetime), lifetime / 2)
    return lifetime - margin


class _Entry(Struct, Generic[V]):
    value: V
    refresh_at: float  # time.monotonic()
    #: Handed out from the cache (not only to the caller whose fetch made it).
    served: bool = False


class ExpiringCache(Generic[V]):
    """Values by key, each until its refresh point; ``fetch`` returns ``(value, lifetime in seconds)``."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[Hashable, threading.Lock] = {}
        self._entries: dict[Hashable, _Entry[V]] = {}
        _CACHES.add(self)

    def _lock(self, key: Hashable) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _valid(self, key: Hashable) -> _Entry[V] | None:
        entry = self._entries.get(key)
        return entry if entry is not None and time.monotonic() < entry.refresh_at else None

    def _fetch(self, key: Hashable, fetch: Callable[[], tuple[V, float]]) -> V:
        started = time.monotonic()  # the lifetime counts from the request, not from its answer
        value, lifetime = fetch()
        self._entries[key] = _Entry(value, started + usable_for(lifetime))
        return value

    def get(self, key: Hashable, fetch: Callable[[], tuple[V, float]]) -> V:
        """The cached value of ``key``, or a fetched one (cached unless its lifetime is too short)."""
        entry = self._valid(key)
        if entry is None:
            with self._lock(key):
                entry = self._valid(key)  # another thread may have fetched it while this one waited
                if entry is None:
                    return self._fetch(key, fetch)
        entry.served = True
        return entry.value

    def renew(self, key: Hashable, refused: V, fetch: Callable[[], tuple[V, float]]) -> V | None:
        """After ``refused`` (from :meth:`get`) was turned down: a value to try once more, or ``None``.

        ``None`` when ``refused`` was fetched for the caller and never served from the cache: a fresh value
        was refused, so another one would be too (it is dropped). When another thread has renewed it already,
        its value is returned without a fetch.
        """
        with self._lock(key):
            entry = self._entries.get(key)
            if entry is not None and entry.value == refused and not entry.served:
                del self._entries[key]
                return None
            entry = self._valid(key)
            if entry is not None and entry.value != refused:
                entry.served = True
                return entry.value
            return self._fetch(key, fetch)

    def discard(self, key: Hashable) -> None:
        with self._lock(key):
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._guard:
            self._entries.clear()

    def _reset_after_fork(self) -> None:
        # The child must not use the parent's credentials, nor locks another parent thread may have held.
        self._guard = threading.Lock()
        self._locks = {}
        self._entries = {}


_CACHES: weakref.WeakSet[ExpiringCache[Any]] = weakref.WeakSet()


def clear_all() -> None:
    """Forget every cached credential of this process (tests; a rotated secret takes effect at once)."""
    for cache in list(_CACHES):
        cache.clear()


def _after_fork_in_child() -> None:
    for cache in list(_CACHES):
        cache._reset_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
