"""How a mapped task's one task run stands, given the latest attempt of each of its map indexes.

A mapped Airflow task (``.expand()``) is one etl-craft task: one ``AUD_TASK_RUN_LOG`` row whose attempts
carry ``MAP_INDEX``. The row is settled again whenever one of its instances ends, and for the last time
by the pipeline's finish with Airflow's own view of every map index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from msgspec import Struct

from airflow_provider_etl_craft.runs.vocabulary import LIVE_ATTEMPT, AttemptStatus, TaskRunStatus

#: Airflow map-index states that failed (the instance will not run again in this DAG run).
AIRFLOW_FAILED = frozenset({"failed"})


class IndexAttempt(Struct, frozen=True):
    """The latest attempt of one map index (or what Airflow says of an index that recorded none)."""

    status: AttemptStatus
    skipped: bool = False
    error: str | None = None
    counts: Sequence[int | None] = (None,) * 6


class Settled(Struct, frozen=True):
    status: TaskRunStatus
    counts: tuple[int | None, ...]
    error: str | None
    log: str


def settle(latest: Mapping[int, IndexAttempt], map_count: int | None) -> Settled:
    """The task run's status from the latest attempt of each map index.

    IN-PROGRESS while an index is live or (``map_count`` known) has not started; else FAILED when any index
    failed, SKIPPED when every index skipped (or there were none), else SUCCESS with the counts summed over
    the indexes that succeeded.
    """
    total = max(map_count or 0, len(latest))
    ok = sorted(i for i, a in latest.items() if a.status == AttemptStatus.SUCCESS)
    skipped = sorted(i for i, a in latest.items() if a.status == AttemptStatus.CANCELLED and a.skipped)
    live = sorted(i for i, a in latest.items() if a.status in LIVE_ATTEMPT)
    failed = sorted(set(latest) - set(ok) - set(skipped) - set(live))
    counts = tuple(_sum(latest[i].counts[k] for i in ok) for k in range(6))
    log = f"{total} map indexes: {len(ok)} SUCCESS, {len(skipped)} SKIPPED, {len(failed)} FAILED"
    if live or len(latest) < total:
        return Settled(
            TaskRunStatus.IN_PROGRESS,
            counts,
            None,
            log + f", {total - len(ok) - len(skipped) - len(failed)} open",
        )
    if failed:
        first = latest[failed[0]]
        error = f"map index {failed[0]} {first.status}: {first.error or 'no error recorded'}"
        if len(failed) > 1:
            error += f" (and {len(failed) - 1} more failed map index(es))"
        return Settled(TaskRunStatus.FAILED, counts, error, log)
    if len(skipped) == total:
        return Settled(
            TaskRunStatus.SKIPPED, counts, None, log if total else "no map index: the expansion was empty"
        )
    return Settled(TaskRunStatus.SUCCESS, counts, None, log)


def _sum(values: object) -> int | None:
    present = [v for v in values if v is not None]  # type: ignore[attr-defined]
    return sum(present) if present else None
