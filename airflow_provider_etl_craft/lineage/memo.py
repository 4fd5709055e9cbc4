"""What an operator recorded in the Engine DB, kept in memory for its OpenLineage facets (docs/lineage.md).

Plain values, no OpenLineage import: operators fill them in as they record, whether or not lineage is on,
and :mod:`.facets` reads them when Airflow's OpenLineage listener asks (after the try, in the same process
or a fork of it), so a facet costs no Engine query of its own except the finish's task totals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class EngineDb:
    """Which Engine DB, as a lineage consumer may see it: dialect and schema, never a host or credential."""

    dialect: str
    schema: str

    @classmethod
    def of(cls, engine: Any) -> EngineDb:
        """From an ``EngineDialect`` (its resolved profile)."""
        return cls(dialect=engine.profile.dialect_name, schema=engine.profile.schema)


@dataclass(frozen=True, kw_only=True)
class Claimed:
    """A claim's look that got (or skipped) the run."""

    engine_db: EngineDb
    action: str
    pipeline_run_id: int | None
    run_key: str
    status: str


@dataclass(frozen=True, kw_only=True)
class Ended:
    """A recorded task's attempt as its end was written (``AUD_TASK_ATTEMPTS`` and, unmapped, its task run)."""

    engine_db: EngineDb
    pipeline_run_id: int
    task_run_id: int
    attempt_number: int
    map_index: int | None
    attempt_status: str
    #: The task run's STATUS this end wrote; None for a mapped instance (its task run settles over every index).
    task_run_status: str | None
    #: SOURCE, TARGET, INSERT, UPDATE, DELETE counts, ROWS_WRITTEN (``TaskCounts.values()``).
    counts: tuple[int | None, ...]


@dataclass(frozen=True, kw_only=True)
class Finished:
    """A finish's outcome, with the Engine it was written to (the facet reads the run's task totals there)."""

    engine: Any
    pipeline_run_id: int
    run_key: str
    status: str
    sla_status: str | None
