"""What a deferred wait watches: the pipelines a waiting claim or gate depends on, and a fingerprint of
their state that changes whenever something it could be waiting for happens.

A claim waits for another run of its pipeline, or an upstream pipeline's run, to end; a gate waits for an
upstream task run or run to end, or for a pause to be lifted. So a wait watches its own pipeline and every
pipeline it depends on (pipeline dependencies, and the upstream pipelines of its tasks' dependencies), and
the fingerprint counts what ends there: IN-PROGRESS runs (how many, which), task runs that ended inside
them, open pauses, and the newest run id. Every transition that ends one of these changes it; one that
reopens a run changes it too.

The waiting task reads the fingerprint *before* it judges for the last time and hands it to its trigger,
which fires as soon as the fingerprint differs: a change between that read and the trigger's start is
never missed. Notices (:meth:`~airflow_provider_etl_craft.engine.dialects.base.EngineDialect.change_notice`)
only say when to read it again.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from airflow_provider_etl_craft.engine.dbapi import Connection
from airflow_provider_etl_craft.engine.dialects.base import EngineDialect

#: The pipeline and the pipelines it depends on; parameters: PIPELINE_CODE three times.
_WATCHED = (
    "SELECT p.PIPELINE_ID FROM CFG_PIPELINES p WHERE p.PIPELINE_CODE = ? AND p.ACTIVE_FLAG = 'Y' "
    "UNION SELECT d.DEPENDS_ON_PIPELINE_ID FROM CFG_PIPELINE_DEPENDENCY d JOIN CFG_PIPELINES p "
    "ON p.PIPELINE_ID = d.PIPELINE_ID WHERE p.PIPELINE_CODE = ? AND p.ACTIVE_FLAG = 'Y' AND d.ACTIVE_FLAG = 'Y' "
    "UNION SELECT d.DEPENDS_ON_PIPELINE_ID FROM CFG_TASK_DEPENDENCY d JOIN CFG_TASKS t ON t.TASK_ID = d.TASK_ID "
    "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = t.PIPELINE_ID WHERE p.PIPELINE_CODE = ? AND p.ACTIVE_FLAG = 'Y' "
    "AND d.ACTIVE_FLAG = 'Y'"
)


#: Where a fingerprint counts the task runs ended inside IN-PROGRESS runs: what gates wait for, and claims
#: do not (a claim waits for runs to end, pauses to lift and the newest run to move).
ENDED_TASK_RUNS = 2

#: Most pipeline ids one fingerprint read binds (far below SQLite's and PostgreSQL's parameter limits).
READ_CHUNK = 500


def _components_sql(count: int) -> str:
    """Each of ``count`` pipelines' share of a fingerprint, by PIPELINE_ID: IN-PROGRESS runs (how many, the
    sum of their ids), task runs ended inside them, open pauses, and the newest run id."""
    live = "r.PIPELINE_ID = p.PIPELINE_ID AND r.STATUS = 'IN-PROGRESS'"
    return (
        "SELECT p.PIPELINE_ID, "  # noqa: S608 - constant text and placeholders only
        f"(SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG r WHERE {live}), "
        f"(SELECT COALESCE(SUM(r.PIPELINE_RUN_ID), 0) FROM AUD_PIPELINES_RUN_LOG r WHERE {live}), "
        "(SELECT COUNT(*) FROM AUD_TASK_RUN_LOG tr JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = "
        f"tr.PIPELINE_RUN_ID WHERE {live} AND tr.STATUS <> 'IN-PROGRESS'), "
        "(SELECT COUNT(*) FROM AUD_PIPELINE_PAUSES pp WHERE pp.PIPELINE_ID = p.PIPELINE_ID AND pp.RESUMED_AT IS NULL), "
        "(SELECT COALESCE(MAX(r.PIPELINE_RUN_ID), 0) FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_ID = p.PIPELINE_ID) "
        f"FROM CFG_PIPELINES p WHERE p.PIPELINE_ID IN ({', '.join('?' * count)})"
    )


def fingerprints(
    engine: EngineDialect, conn: Connection, watches: Sequence[frozenset[int]]
) -> list[list[int]]:
    """The fingerprint of each set of pipeline ids (a JSON-friendly list; empty for an empty set), from one read
    of their union (one statement per :data:`READ_CHUNK` pipelines): so any number of waits cost one query.

    A set's fingerprint adds up its pipelines' shares (the newest run id is their maximum), so it is the same
    whether read alone or with others.
    """
    union = sorted(set().union(*watches)) if watches else []
    shares: dict[int, tuple[int, ...]] = {}
    for at in range(0, len(union), READ_CHUNK):
        chunk = tuple(union[at : at + READ_CHUNK])
        for row in engine.execute(conn, _components_sql(len(chunk)), chunk).rows:
            shares[int(row[0])] = tuple(int(v) for v in row[1:])
    found = []
    for ids in watches:
        parts = [shares.get(i, (0, 0, 0, 0, 0)) for i in sorted(ids)]
        found.append(
            [sum(p[k] for p in parts) for k in range(4)] + [max((p[4] for p in parts), default=0)]
            if ids
            else []
        )
    return found


class Watch(Struct, frozen=True):
    """The pipelines one wait watches (their ids), read once per connection."""

    engine: EngineDialect
    pipeline_ids: frozenset[int]

    @classmethod
    def of(cls, engine: EngineDialect, conn: Connection, pipeline_code: str) -> Watch:
        rows = engine.execute(conn, _WATCHED, (pipeline_code,) * 3).rows
        return cls(engine, frozenset(int(r[0]) for r in rows))

    def state(self, conn: Connection) -> list[int]:
        """The fingerprint now (a JSON-friendly list; empty when the pipeline is not active)."""
        return fingerprints(self.engine, conn, [self.pipeline_ids])[0]


def moved(state: list[int], seen: list[int], ignore_task_ends: bool = False) -> bool:
    """Whether ``state`` differs from ``seen`` in what the wait cares for (``ignore_task_ends``: a claim's)."""
    if ignore_task_ends and len(state) == len(seen) > ENDED_TASK_RUNS:
        return any(a != b for i, (a, b) in enumerate(zip(state, seen, strict=True)) if i != ENDED_TASK_RUNS)
    return state != seen


def watch_state(engine: EngineDialect, conn: Connection, pipeline_code: str) -> list[int]:
    """The fingerprint of ``pipeline_code``'s wait, as a waiting task hands it to its trigger."""
    return Watch.of(engine, conn, pipeline_code).state(conn)
