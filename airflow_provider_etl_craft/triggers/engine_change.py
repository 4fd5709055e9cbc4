"""The trigger of deferred claims and gates: fires when what the wait watches changes in the Engine DB.

It hands its wait to the shared hub of its Engine DB in the triggerer's event loop
(:mod:`~airflow_provider_etl_craft.triggers.wait_hub`): one connection for any number of waits. On PostgreSQL
the hub LISTENs for the change notices that the transactions ending runs, attempts and pauses send at
COMMIT, and reads the fingerprints (:mod:`airflow_provider_etl_craft.runs.changes`) of the waits that watch a
notified pipeline, and every ``poll_interval`` in case a notice was lost. On SQLite (one machine) it reads
``PRAGMA data_version`` every quarter second and the fingerprints only when that moved. Behind a
transaction pooler (``listen=False``) it reads them every ``poll_interval``.

It fires ``changed`` as soon as the fingerprint differs from the one the task read before it judged,
``recheck`` after ``recheck_after`` seconds (the task then looks at what only Airflow knows, such as a
blocking run whose DAG run ended without finishing it), and ``timeout`` at ``deadline``. The task judges
again in every case: the trigger only decides when. No event is handed back before ``hold_until``: a task
resumed before Airflow's scheduler took in the exit of the process that deferred it can lose its try to a
"state mismatch" (docs/deferred-waits.md), so a change seen right after the deferral waits out that moment.

A lost connection (a PostgreSQL restart, a failover) is opened again with backoff, LISTEN included, and
every fingerprint compared again, so nothing that happened meanwhile is missed. A triggerer restart
re-creates the trigger from its serialized arguments, which is all its state.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from airflow_provider_etl_craft._compat import BaseTrigger, TriggerEvent
from airflow_provider_etl_craft.triggers.wait_hub import close_quietly, hub_for


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
    :param ignore_task_ends: a claim's wait: task runs ending inside the run it waits for do not fire it.
    :param hold_until: ISO time before which no event is handed back (None: none; a trigger serialized by an
        earlier version has none).
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
        ignore_task_ends: bool = False,
        hold_until: str | None = None,
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
        self.ignore_task_ends = ignore_task_ends
        self.hold_until = hold_until

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
                "ignore_task_ends": self.ignore_task_ends,
                "hold_until": self.hold_until,
            },
        )

    async def run(self) -> AsyncIterator[Any]:
        until = None if self.deadline is None else datetime.fromisoformat(self.deadline)
        left = self.recheck_after if until is None else min(self.recheck_after, _seconds_until(until))
        hub = hub_for(
            (self.etl_craft_conn_id, self.profile, self.listen, self.poll_interval),
            self._open,
            self.poll_interval,
        )
        if left > 0:
            try:
                await asyncio.wait_for(
                    hub.wait(self.pipeline_code, self.seen, self.ignore_task_ends), timeout=left
                )
            except TimeoutError:
                pass
            else:
                await self._hold()
                yield self._event("changed")
                return
        await self._hold()
        yield self._end(until)

    async def _hold(self) -> None:
        """Wait out ``hold_until``: Airflow must have taken in the deferral before the task resumes."""
        if self.hold_until is not None:
            left = _seconds_until(datetime.fromisoformat(self.hold_until))
            if left > 0:
                await asyncio.sleep(left)

    def _end(self, deadline: datetime | None) -> Any:
        return self._event("timeout" if deadline is not None and _seconds_until(deadline) <= 0 else "recheck")

    def _event(self, status: str) -> Any:
        """The event; it carries the deadline too (``dag.test()`` hands a resumed task the event alone)."""
        return TriggerEvent(
            {"status": status, "pipeline_code": self.pipeline_code, "deadline": self.deadline}
        )

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
            close_quietly(conn)
            raise
        return engine, conn, listening


def _seconds_until(moment: datetime) -> float:
    return (moment - datetime.now(UTC)).total_seconds()
