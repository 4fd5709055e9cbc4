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

from dataclasses import dataclass

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


def _state_sql(count: int) -> str:
    """The fingerprint of ``count`` pipelines (``count`` placeholders, repeated for each part)."""
    ids = ", ".join("?" * count)
    live = f"r.PIPELINE_ID IN ({ids}) AND r.STATUS = 'IN-PROGRESS'"
    return (
        f"SELECT (SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG r WHERE {live}), "  # noqa: S608 - placeholders only
        f"(SELECT COALESCE(SUM(r.PIPELINE_RUN_ID), 0) FROM AUD_PIPELINES_RUN_LOG r WHERE {live}), "
        "(SELECT COUNT(*) FROM AUD_TASK_RUN_LOG tr JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = "
        f"tr.PIPELINE_RUN_ID WHERE {live} AND tr.STATUS <> 'IN-PROGRESS'), "
        f"(SELECT COUNT(*) FROM AUD_PIPELINE_PAUSES pp WHERE pp.PIPELINE_ID IN ({ids}) AND pp.RESUMED_AT IS NULL), "
        f"(SELECT COALESCE(MAX(r.PIPELINE_RUN_ID), 0) FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_ID IN ({ids}))"
    )


@dataclass(frozen=True)
class Watch:
    """The pipelines one wait watches (their ids), read once per connection."""

    engine: EngineDialect
    pipeline_ids: frozenset[int]

    @classmethod
    def of(cls, engine: EngineDialect, conn: Connection, pipeline_code: str) -> Watch:
        rows = engine.execute(conn, _WATCHED, (pipeline_code,) * 3).rows
        return cls(engine, frozenset(int(r[0]) for r in rows))

    def state(self, conn: Connection) -> list[int]:
        """The fingerprint now (a JSON-friendly list; empty when the pipeline is not active)."""
        if not self.pipeline_ids:
            return []
        ids = tuple(sorted(self.pipeline_ids))
        (row,) = self.engine.execute(conn, _state_sql(len(ids)), ids * 5).rows
        return [int(v) for v in row]


def watch_state(engine: EngineDialect, conn: Connection, pipeline_code: str) -> list[int]:
    """The fingerprint of ``pipeline_code``'s wait, as a waiting task hands it to its trigger."""
    return Watch.of(engine, conn, pipeline_code).state(conn)
