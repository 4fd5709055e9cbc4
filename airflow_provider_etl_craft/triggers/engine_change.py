"""The trigger of deferred claims and gates: fires when what the wait watches changes in the Engine DB.

It holds one Engine DB connection and no lock. On PostgreSQL it LISTENs for the change notices that the
transactions ending runs, attempts and pauses send at COMMIT, and reads the wait's fingerprint
(:mod:`airflow_provider_etl_craft.runs.changes`) when a notice for a watched pipeline arrives, and every
``poll_interval`` in case one was lost. On SQLite (one machine) it reads ``PRAGMA data_version`` every
quarter second and the fingerprint only when that moved. Behind a transaction pooler (``listen=False``) it
reads the fingerprint every ``poll_interval``.

It fires ``changed`` as soon as the fingerprint differs from the one the task read before it judged,
``recheck`` after ``recheck_after`` seconds (the task then looks at what only Airflow knows, such as a
blocking run whose DAG run ended without finishing it), and ``timeout`` at ``deadline``. The task judges
again in every case: the trigger only decides when.

A lost connection (a PostgreSQL restart, a failover) is opened again with backoff, LISTEN included, and
the fingerprint compared again, so nothing that happened meanwhile is missed. A triggerer restart
re-creates the trigger from its serialized arguments, which is all its state.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from airflow_provider_etl_craft._compat import BaseTrigger, TriggerEvent
from airflow_provider_etl_craft.engine.dialects.base import SessionLost
from airflow_provider_etl_craft.errors import EtlCraftError
from airflow_provider_etl_craft.runs.changes import Watch

#: How often SQLite's ``data_version`` is read.
COUNTER_TICK = 0.25
#: Backoff between attempts to open the connection again (seconds, doubling up to the last).
RECONNECT_BACKOFF = (0.5, 1.0, 2.0, 4.0)


class EngineChangeTrigger(BaseTrigger):
    """Wait for a change of what ``pipeline_code``'s claim or gate waits for.

    :param etl_craft_conn_id: Airflow connection of the Engine DB.
    :param profile: Engine profile of a file-backed connection.
    :param pipeline_code: the waiting run's pipeline (its dependencies are watched too).
    :param seen: the fingerprint the task read before it last judged.
    :param recheck_after: seconds after which to fire ``recheck`` anyway.
    :param deadline: ISO time at which to fire ``timeout`` (None: never).
    :param poll_interval: seconds between two reads of the fingerprint without a notice.
    :param listen: LISTEN for notices (PostgreSQL without a transaction pooler).
    """

    def __init__(
        self,
        *,
        etl_craft_conn_id: str,
        profile: str | None,
        pipeline_code: str,
        seen: list[int],
        recheck_after: float,
        deadline: str | None,
        poll_interval: float,
        listen: bool = True,
    ) -> None:
        super().__init__()
        self.etl_craft_conn_id = etl_craft_conn_id
        self.profile = profile
        self.pipeline_code = pipeline_code
        self.seen = list(seen)
        self.recheck_after = float(recheck_after)
        self.deadline = deadline
        self.poll_interval = float(poll_interval)
        self.listen = listen

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "etl_craft_conn_id": self.etl_craft_conn_id,
                "profile": self.profile,
                "pipeline_code": self.pipeline_code,
                "seen": self.seen,
                "recheck_after": self.recheck_after,
                "deadline": self.deadline,
                "poll_interval": self.poll_interval,
                "listen": self.listen,
            },
        )

    async def run(self) -> AsyncIterator[Any]:
        started = time.monotonic()
        deadline = None if self.deadline is None else datetime.fromisoformat(self.deadline)
        failures = 0
        while True:
            recheck_in = self.recheck_after - (time.monotonic() - started)
            left = recheck_in if deadline is None else min(recheck_in, _seconds_until(deadline))
            if left <= 0:
                yield self._end(deadline)
                return
            try:
                if await asyncio.wait_for(self._changed(), timeout=left):
                    yield self._event("changed")
                    return
            except TimeoutError:
                continue  # the loop's top fires recheck or timeout
            except _lost() as exc:
                delay = RECONNECT_BACKOFF[min(failures, len(RECONNECT_BACKOFF) - 1)]
                failures += 1
                self.log.warning(
                    "etl-craft: lost the Engine DB while waiting for %s (%s); looking again in %.1fs",
                    self.pipeline_code,
                    _first_line(exc),
                    delay,
                )
                await asyncio.sleep(delay)

    def _end(self, deadline: datetime | None) -> Any:
        return self._event("timeout" if deadline is not None and _seconds_until(deadline) <= 0 else "recheck")

    def _event(self, status: str) -> Any:
        """The event; it carries the deadline too (``dag.test()`` hands a resumed task the event alone)."""
        return TriggerEvent(
            {"status": status, "pipeline_code": self.pipeline_code, "deadline": self.deadline}
        )

    async def _changed(self) -> bool:
        """Open a connection, then wait until the fingerprint differs from ``seen`` (True), on this connection.

        Returns only True; a lost connection raises (the caller opens a new one).
        """
        from asgiref.sync import sync_to_async

        # Resolving the Airflow connection goes through the triggerer's supervisor: not on the event loop.
        engine, conn, listening = await sync_to_async(self._open)()
        try:
            watch = await asyncio.to_thread(Watch.of, engine, conn, self.pipeline_code)
            # The counter is read before the fingerprint (as LISTEN comes before it in _open): a commit between
            # the two reads then moves the counter and is looked at, instead of falling between them.
            counter = await asyncio.to_thread(engine.change_counter, conn)
            if await asyncio.to_thread(watch.state, conn) != self.seen:
                return True
            while True:
                if listening:
                    await _readable(conn.fileno(), self.poll_interval)
                    notices = engine.received_notices(conn)
                    if notices and not notices & watch.pipeline_ids:
                        continue
                elif counter is not None:
                    await asyncio.sleep(COUNTER_TICK)
                    now = await asyncio.to_thread(engine.change_counter, conn)
                    if now == counter:
                        continue
                    counter = now
                else:
                    await asyncio.sleep(self.poll_interval)
                if await asyncio.to_thread(watch.state, conn) != self.seen:
                    return True
        finally:
            await asyncio.to_thread(_close_quietly, conn)

    def _open(self) -> tuple[Any, Any, bool]:
        from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

        hook = EngineDBHook(etl_craft_conn_id=self.etl_craft_conn_id, profile=self.profile)
        engine = hook.engine
        conn = hook.engine.connect()
        listening = self.listen and engine.delivers_notices
        try:
            with engine.classified(conn):
                if listening:
                    engine.listen(conn)
        except BaseException:
            _close_quietly(conn)
            raise
        return engine, conn, listening


async def _readable(fd: int, timeout: float) -> None:
    """Until ``fd`` has something to read, or ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await asyncio.wait_for(ready, timeout)
    except TimeoutError:
        pass
    finally:
        loop.remove_reader(fd)


def _seconds_until(moment: datetime) -> float:
    return (moment - datetime.now(UTC)).total_seconds()


def _lost() -> tuple[type[Exception], ...]:
    """What a lost or refused connection raises while waiting (the wait opens a new one, with backoff): the
    provider's errors, OS errors, and the base error classes of the drivers loaded (a driver error leaves
    the wait's own queries unclassified). Read when first needed, so importing this module loads no driver."""
    found: list[type[Exception]] = [EtlCraftError, SessionLost, OSError, sqlite3.Error]
    for module in ("psycopg2", "psycopg"):
        loaded = sys.modules.get(module)
        if loaded is not None:
            found.append(loaded.Error)
    return tuple(found)


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):  # the connection may be gone already
        conn.close()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
