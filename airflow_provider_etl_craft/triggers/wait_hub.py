"""All deferred waits on one Engine DB in one triggerer event loop, served by one connection.

A triggerer runs every trigger of its process in one asyncio event loop. A wait of its own connection each
would take as many Engine DB connections as there are waits, and every LISTENing connection would receive
every notice. Instead, the waits of one Engine DB (an Airflow connection id and profile, with the same
listen/poll settings) share a hub per event loop: one connection, which LISTENs (PostgreSQL) and reads the
fingerprints (:mod:`airflow_provider_etl_craft.runs.changes`) of many waits in one query.

- A notice for a pipeline reads, in one query, the fingerprints of the waits that watch it; no other wait
  is looked at.
- A wait that registers is read at once (a change before it started fires it).
- On SQLite it reads ``PRAGMA data_version`` every quarter second and every wait's fingerprint when that
  moved; without LISTEN (a transaction pooler) it reads every wait's fingerprint every ``poll_interval``:
  one query per look, however many waits.
- A lost connection is opened again with backoff (LISTEN included), and every wait's fingerprint is read
  again, so nothing that ended during the gap is missed.
- The hub closes its connection a few seconds after its last wait ends.
- The number of waits the process holds goes to ``etl_craft.triggerer.deferred_waits`` (a gauge, sent when a
  wait starts or ends; docs/metrics.md).

The limit is per event loop, so per triggerer process: several triggerers (or ``[triggerer] capacity``
spread over several processes) each hold their own connection per Engine DB.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_etl_craft import metrics
from airflow_provider_etl_craft.engine.dialects.base import SessionLost
from airflow_provider_etl_craft.errors import EtlCraftError, first_line
from airflow_provider_etl_craft.runs.changes import Watch, fingerprints, moved

log = logging.getLogger(__name__)

#: How often SQLite's ``data_version`` is read.
COUNTER_TICK = 0.25
#: Backoff between attempts to open the connection again (seconds, doubling up to the last).
RECONNECT_BACKOFF = (0.5, 1.0, 2.0, 4.0)
#: Seconds a hub keeps its connection after its last wait ended, for the next one.
IDLE_CLOSE = 5.0

#: What opens the hub's connection: (dialect, connection, whether it LISTENs). Called in a worker thread.
Opener = Callable[[], tuple[Any, Any, bool]]


@dataclass(eq=False)
class _Waiter:
    pipeline_code: str
    seen: list[int]
    done: asyncio.Future[bool]
    #: The pipelines it watches, read on the hub's current connection (None: not read yet).
    ids: frozenset[int] | None = None
    #: A claim's wait: task runs ending inside the run it waits for do not wake it.
    ignore_task_ends: bool = False


@dataclass(eq=False)
class WaitHub:
    """The shared watcher of one Engine DB in one event loop (see the module docstring)."""

    key: tuple[Any, ...]
    opener: Opener
    poll_interval: float
    waiters: set[_Waiter] = field(default_factory=set)
    _fresh: list[_Waiter] = field(default_factory=list)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    #: How many connections the hub has opened (tests read it).
    opened: int = 0

    async def wait(self, pipeline_code: str, seen: list[int], ignore_task_ends: bool = False) -> bool:
        """Until the fingerprint of ``pipeline_code``'s wait differs from ``seen``: True (cancel to stop).

        ``ignore_task_ends``: a claim's wait, which ended task runs do not concern.
        """
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(pipeline_code, list(seen), future, ignore_task_ends=ignore_task_ends)
        self.waiters.add(waiter)
        metrics.deferred_waits(held())
        self._fresh.append(waiter)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._main(), name=f"etl-craft wait hub {self.key}"
            )
        try:
            return await waiter.done
        finally:
            self.waiters.discard(waiter)
            metrics.deferred_waits(held())

    async def _main(self) -> None:
        failures = 0
        try:
            while await self._has_waiters():
                try:
                    engine, conn, listening = await self._open()
                except _lost() as exc:
                    failures = await self._backoff(failures, exc)
                    continue
                try:
                    failures = 0
                    await self._serve(engine, conn, listening)
                except _lost() as exc:
                    failures = await self._backoff(failures, exc)
                finally:
                    await asyncio.to_thread(close_quietly, conn)
        except Exception as exc:  # noqa: BLE001 - a defect: each wait fails with it, none hangs
            for waiter in self.waiters:
                if not waiter.done.done():
                    waiter.done.set_exception(exc)
        finally:
            _HUBS.pop(self.key, None)

    async def _has_waiters(self) -> bool:
        """Whether any wait is registered, waiting up to :data:`IDLE_CLOSE` for a new one."""
        if self.waiters:
            return True
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), IDLE_CLOSE)
        return bool(self.waiters)

    async def _open(self) -> tuple[Any, Any, bool]:
        from asgiref.sync import sync_to_async

        # Resolving the Airflow connection goes through the triggerer's supervisor: not on the event loop.
        opened = await sync_to_async(self.opener)()
        self.opened += 1
        return opened

    async def _backoff(self, failures: int, exc: BaseException) -> int:
        delay = RECONNECT_BACKOFF[min(failures, len(RECONNECT_BACKOFF) - 1)]
        codes = sorted({w.pipeline_code for w in self.waiters})
        log.warning(
            "etl-craft: lost the Engine DB while waiting for %s (%s); looking again in %.1fs",
            ", ".join(codes) or "nothing",
            first_line(exc),
            delay,
        )
        await asyncio.sleep(delay)
        return failures + 1

    async def _serve(self, engine: Any, conn: Any, listening: bool) -> None:
        """Serve every wait on this connection until it is lost, or no wait is left for a while."""
        for waiter in self.waiters:  # pipelines are read again on each connection
            waiter.ids = None
        self._fresh.clear()
        # What signals a change (LISTEN in the opener, SQLite's counter here) is set up before the first read,
        # so a commit between the two is not missed.
        counter = await asyncio.to_thread(engine.change_counter, conn)
        await self._look(engine, conn, list(self.waiters))
        while await self._has_waiters():
            if self._fresh:
                fresh, self._fresh = self._fresh, []
                await self._look(engine, conn, [w for w in fresh if w in self.waiters])
                continue
            self._wake.clear()
            if listening:
                notified = await self._notices(engine, conn)
                if notified is None:  # woken by a new wait
                    continue
                await self._look(engine, conn, [w for w in self.waiters if w.ids is None or w.ids & notified])
            elif counter is not None:
                if not await self._sleep(COUNTER_TICK):
                    continue
                now = await asyncio.to_thread(engine.change_counter, conn)
                if now != counter:
                    counter = now
                    await self._look(engine, conn, list(self.waiters))
            elif await self._sleep(self.poll_interval):
                await self._look(engine, conn, list(self.waiters))

    async def _notices(self, engine: Any, conn: Any) -> set[int] | None:
        """The pipelines notified, waiting up to ``poll_interval`` (then every wait counts as notified: a lost
        notice costs one interval); None when a new wait came first."""
        loop = asyncio.get_running_loop()
        readable = loop.create_future()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(conn.fileno(), ready)
        woken = loop.create_task(self._wake.wait())
        try:
            done, _ = await asyncio.wait(
                {readable, woken}, timeout=self.poll_interval, return_when="FIRST_COMPLETED"
            )
        finally:
            loop.remove_reader(conn.fileno())
            woken.cancel()
        if readable in done:
            return engine.received_notices(conn)
        if woken in done:
            return None
        return {i for w in self.waiters for i in (w.ids or ())} | {-1}

    async def _sleep(self, seconds: float) -> bool:
        """Sleep ``seconds``; False when a new wait came first."""
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            return True
        return False

    async def _look(self, engine: Any, conn: Any, waiters: list[_Waiter]) -> None:
        """Read the fingerprints of ``waiters`` (one query) and wake those whose fingerprint moved."""
        waiters = [w for w in waiters if not w.done.done()]
        if not waiters:
            return
        unread = sorted({w.pipeline_code for w in waiters if w.ids is None})
        if unread:
            watched = await asyncio.to_thread(_watched, engine, conn, unread)
            for waiter in waiters:
                if waiter.ids is None:
                    waiter.ids = watched[waiter.pipeline_code]
        states = await asyncio.to_thread(
            read_fingerprints, engine, conn, [w.ids or frozenset() for w in waiters]
        )
        for waiter, state in zip(waiters, states, strict=True):
            if moved(state, waiter.seen, waiter.ignore_task_ends) and not waiter.done.done():
                waiter.done.set_result(True)


def read_fingerprints(engine: Any, conn: Any, watches: list[frozenset[int]]) -> list[list[int]]:
    """:func:`~airflow_provider_etl_craft.runs.changes.fingerprints`, the one read a look makes (tests wrap it)."""
    return fingerprints(engine, conn, watches)


def _watched(engine: Any, conn: Any, codes: list[str]) -> dict[str, frozenset[int]]:
    return {code: Watch.of(engine, conn, code).pipeline_ids for code in codes}


#: The hubs of this process, by (event loop, Engine DB, listen, poll interval).
_HUBS: dict[tuple[Any, ...], WaitHub] = {}


def held() -> int:
    """How many deferred waits this process holds, over all its hubs."""
    return sum(len(hub.waiters) for hub in tuple(_HUBS.values()))


def hub_for(key: tuple[Any, ...], opener: Opener, poll_interval: float) -> WaitHub:
    """The hub of ``key`` in the running event loop (created on first use)."""
    full = (id(asyncio.get_running_loop()), *key)
    hub = _HUBS.get(full)
    if hub is None:
        hub = _HUBS[full] = WaitHub(full, opener, poll_interval)
    return hub


def _lost() -> tuple[type[BaseException], ...]:
    """What a lost or refused connection raises (the hub opens a new one, with backoff): the provider's
    errors, OS errors, and the base error classes of the drivers loaded (the hub's reads are not classified).
    Read when first needed, so importing this module loads no driver."""
    found: list[type[BaseException]] = [EtlCraftError, SessionLost, OSError, sqlite3.Error]
    for module in ("psycopg2", "psycopg"):
        loaded = sys.modules.get(module)
        if loaded is not None:
            found.append(loaded.Error)
    return tuple(found)


def close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):  # the connection may be gone already
        conn.close()
