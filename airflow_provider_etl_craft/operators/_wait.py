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

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

from msgspec import Struct

from airflow_provider_etl_craft.runs.changes import watch_state
from airflow_provider_etl_craft.settings import setting

if TYPE_CHECKING:
    from airflow_provider_etl_craft.engine.dialects.base import EngineDialect

T = TypeVar("T")

#: Airflow's own allowance past the trigger's deadline before it fails the deferral itself (the trigger
#: fires ``timeout`` first, so the task can say what it waited for).
DEFERRAL_GRACE = timedelta(minutes=5)


class Wait(Struct, frozen=True, kw_only=True):
    """What a deferred wait watches, and where the task resumes.

    :param engine_db: the Airflow connection id of the Engine DB and its profile (None: the file's choice).
    :param pipeline_code: the pipeline whose fingerprint is watched (:func:`seen_state`).
    :param recheck_after: seconds after which the trigger fires anyway, for what only Airflow knows.
    :param method_name: receives ``event`` and ``deadline`` (the ISO deadline, to carry on).
    :param claim: a claim's wait, which task runs ending inside the run it waits for do not wake.
    """

    engine_db: tuple[str, str | None]
    pipeline_code: str
    recheck_after: float
    method_name: str
    claim: bool = False


class Look(Struct, Generic[T], frozen=True):
    """One look of a waiting task: done (with its value), or still waiting (for ``reason``, if it says)."""

    done: bool
    value: T | None = None
    reason: str | None = None


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


def seen_state(wait: Wait, engine: EngineDialect) -> list[int]:
    """The fingerprint of ``wait``'s pipeline, on the process's connection to ``engine`` (the try's Engine DB,
    which the look before it used too)."""
    from airflow_provider_etl_craft.runs.lifecycle import lent_lifecycle

    with lent_lifecycle(engine) as lifecycle:
        return watch_state(lifecycle.engine, lifecycle.conn, wait.pipeline_code)


def deadline(timeout: float, carried: str | None) -> datetime:
    """The wait's deadline: the one carried over from an earlier deferral, else ``timeout`` from now."""
    if carried is not None:
        return datetime.fromisoformat(carried)
    return datetime.now(UTC) + timedelta(seconds=timeout)


def look_or_defer(
    task: Any,
    look: Callable[[], Look[T]],
    wait: Wait,
    *,
    timeout: float,
    carried: str | None,
    expired: bool = False,
    timed_out: Callable[[Look[T]], Exception],
    engine: Callable[[], EngineDialect],
) -> T | None:
    """The one deferred-wait protocol of the claim and of recorded tasks' gates: look; while the look must
    wait, fail once the deadline has passed, read the wait's fingerprint, look again, and defer with it.

    :param timeout: the wait's length, from the first look (the deadline is :func:`deadline`).
    :param carried: the ISO deadline an earlier deferral of this wait carried back.
    :param expired: the trigger said the deadline passed: one more look, then the wait fails.
    :param timed_out: the error a wait that is still waiting at its deadline raises, given the last look.
    :param engine: the try's Engine DB, as the looks got it (its profile read once per try, not again here).
    :return: the value of the look that was done (a wait that must go on defers: :func:`defer` raises).
    """
    seen: list[int] | None = None
    until: datetime | None = None
    while True:
        looked = look()
        if looked.done:
            return looked.value
        until = until or deadline(timeout, carried)  # from the first look that has to wait
        if expired or datetime.now(UTC) >= until:
            raise timed_out(looked)
        if seen is not None:  # looked again after reading the fingerprint: still waiting
            if looked.reason:
                task.log.info("etl-craft: %s; deferred until it changes", looked.reason)
            defer(task, wait, seen, until=until)
        seen = seen_state(wait, engine())


def defer(task: Any, wait: Wait, seen: list[int], *, until: datetime) -> NoReturn:
    """Defer ``task`` until the wait's fingerprint differs from ``seen`` (or ``wait.recheck_after``, or
    ``until``); the trigger hands nothing back before :func:`hand_back_delay` from now.

    :raises TaskDeferred: always (Airflow's ``task.defer``).
    """
    # Imported here: every recorded task's process imports this module, few of them ever defer.
    from airflow_provider_etl_craft.triggers.engine_change import EngineChangeTrigger

    trigger = EngineChangeTrigger(
        etl_craft_conn_id=wait.engine_db[0],
        profile=wait.engine_db[1],
        pipeline_code=wait.pipeline_code,
        seen=seen,
        recheck_after=wait.recheck_after,
        deadline=until.isoformat(),
        poll_interval=setting("wait_poll_interval"),
        listen=setting("wait_listen"),
        ignore_task_ends=wait.claim,
        hold_until=(datetime.now(UTC) + timedelta(seconds=hand_back_delay())).isoformat(),
    )
    left = until - datetime.now(UTC)
    task.defer(
        trigger=trigger,
        method_name=wait.method_name,
        kwargs={"deadline": until.isoformat()},
        timeout=max(left, timedelta(0)) + DEFERRAL_GRACE,
    )
    raise AssertionError(f"{type(task).__name__}.defer returned instead of raising TaskDeferred")
