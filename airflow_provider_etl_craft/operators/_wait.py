"""Deferred waits, shared by the claim and by recorded tasks' gates.

A deferred wait frees its worker slot and hands the wait to an
:class:`~airflow_provider_etl_craft.triggers.engine_change.EngineChangeTrigger`, which wakes the task
within a second of the change it waits for instead of one poke interval later. The protocol: after a
look that has to wait, read the wait's fingerprint, look once more (so a change between the two looks is
seen), then defer with that fingerprint; the trigger fires once it differs. The task's deadline (its
``timeout``) travels with the deferral, since Airflow starts each resumed look afresh.

Whatever the mode, a wait never hands the task back before Airflow's scheduler can have taken in the exit
of the process that deferred or rescheduled it (:func:`hand_back_delay`): a try resumed earlier can be
failed by that late executor event as a "state mismatch" (docs/deferred-waits.md).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_etl_craft.runs.changes import watch_state
from airflow_provider_etl_craft.settings import setting

if TYPE_CHECKING:
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

#: Airflow's own allowance past the trigger's deadline before it fails the deferral itself (the trigger
#: fires ``timeout`` first, so the task can say what it waited for).
DEFERRAL_GRACE = timedelta(minutes=5)


def default_deferrable() -> bool:
    """Airflow's ``[operators] default_deferrable`` (False when unset), as Airflow's own operators default."""
    from airflow_provider_etl_craft._compat import conf

    return bool(conf.getboolean("operators", "default_deferrable", fallback=False))


def hand_back_delay() -> float:
    """``[etl_craft] wait_hand_back_delay``: the least time between a deferral or reschedule and the next look."""
    return max(float(setting("wait_hand_back_delay")), 0.0)


def reschedule_interval(poke_interval: float) -> float:
    """A reschedule's interval: ``poke_interval``, but never less than :func:`hand_back_delay`."""
    return max(float(poke_interval), hand_back_delay())


def seen_state(hook: EngineDBHook, pipeline_code: str) -> list[int]:
    """The fingerprint of ``pipeline_code``'s wait, on a connection of its own."""
    with hook.lifecycle() as lifecycle:
        return watch_state(lifecycle.engine, lifecycle.conn, pipeline_code)


def deadline(timeout: float, carried: str | None) -> datetime:
    """The wait's deadline: the one carried over from an earlier deferral, else ``timeout`` from now."""
    if carried is not None:
        return datetime.fromisoformat(carried)
    return datetime.now(UTC) + timedelta(seconds=timeout)


def defer(
    task: Any,
    engine_db: tuple[str, str | None],
    pipeline_code: str,
    seen: list[int],
    recheck_after: float,
    until: datetime,
    method_name: str,
    claim: bool = False,
) -> None:
    """Defer ``task`` until the wait's fingerprint differs from ``seen`` (or ``recheck_after``, or ``until``);
    the trigger hands nothing back before :func:`hand_back_delay` from now.

    :param engine_db: the Airflow connection id of the Engine DB and its profile (None: the file's choice).
    :param method_name: receives ``event`` and ``deadline`` (the ISO deadline, to carry on).
    :param claim: a claim's wait, which task runs ending inside the run it waits for do not wake.
    """
    # Imported here: every recorded task's process imports this module, few of them ever defer.
    from airflow_provider_etl_craft.triggers.engine_change import EngineChangeTrigger

    trigger = EngineChangeTrigger(
        etl_craft_conn_id=engine_db[0],
        profile=engine_db[1],
        pipeline_code=pipeline_code,
        seen=seen,
        recheck_after=recheck_after,
        deadline=until.isoformat(),
        poll_interval=setting("wait_poll_interval"),
        listen=setting("wait_listen"),
        ignore_task_ends=claim,
        hold_until=(datetime.now(UTC) + timedelta(seconds=hand_back_delay())).isoformat(),
    )
    left = until - datetime.now(UTC)
    task.defer(
        trigger=trigger,
        method_name=method_name,
        kwargs={"deadline": until.isoformat()},
        timeout=max(left, timedelta(0)) + DEFERRAL_GRACE,
    )
