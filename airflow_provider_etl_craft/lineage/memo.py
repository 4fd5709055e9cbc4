"""What an operator recorded in the Engine DB, kept in memory for its OpenLineage facets (docs/lineage.md).

Plain values, no OpenLineage import: operators fill them in as they record, whether or not lineage is on,
and :mod:`.facets` reads them when Airflow's OpenLineage listener asks (after the try, in the same process
or a fork of it), so a facet costs no Engine query of its own except the finish's task totals. A recorded task's declared
target (its ``TARGET_OBJECT`` parameter) is read with the attempt's end, on the try's own connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from msgspec import Struct

from airflow_provider_etl_craft.engine.url import PostgresTarget, SqliteTarget, host_port


class EngineDb(Struct, frozen=True, kw_only=True):
    """Which Engine DB, as a lineage consumer may see it: dialect and schema (the facet's ``engineDb``), and
    where it lives in OpenLineage's naming (the Engine job's namespace), never a user or a credential."""

    dialect: str
    schema: str
    #: ``postgres://{host}:{port}`` (the first server) or ``sqlite://{path}``: as the hook names the Engine DB.
    namespace: str | None = None
    #: The PostgreSQL database (None for SQLite).
    database: str | None = None

    @classmethod
    def of(cls, engine: Any) -> EngineDb:
        """From an ``EngineDialect`` (its resolved profile)."""
        profile = engine.profile
        target = getattr(profile, "target", None)
        if not isinstance(target, PostgresTarget | SqliteTarget):
            return cls(dialect=profile.dialect_name, schema=profile.schema)
        scheme, authority, database = place(target)
        return cls(
            dialect=profile.dialect_name,
            schema=profile.schema,
            namespace=f"{scheme}://{authority}",
            database=database,
        )


def place(target: PostgresTarget | SqliteTarget) -> tuple[str, str, str | None]:
    """Where an Engine DB lives in OpenLineage's naming: scheme, authority and database — ``postgres``, the
    first server's ``host:port`` and the database, or ``sqlite`` and the file's path (no database). Never a
    user or credential. The hook's ``get_openlineage_database_info`` and the Engine job's namespace both use it."""
    if isinstance(target, PostgresTarget):
        return "postgres", host_port(target.host, target.port), target.database
    return "sqlite", str(target.path), None


class DagRunRef(Struct, frozen=True, kw_only=True):
    """The Airflow DAG run a claim or a finish ran in, as OpenLineage names it: the Engine run's parent."""

    dag_id: str
    #: The logical date, else the run_after (as Airflow's OpenLineage integration dates a DAG run).
    run_date: datetime
    clear_number: int
    #: The DAG run's conf: an ``openlineage`` entry there names the root of the DAG run's own events.
    conf: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, context: Mapping[str, Any]) -> DagRunRef | None:
        """From an Airflow task context; None when it has no dated DAG run."""
        dag_run = context.get("dag_run")
        run_date = getattr(dag_run, "logical_date", None) or getattr(dag_run, "run_after", None)
        if dag_run is None or not isinstance(run_date, datetime):
            return None
        conf = getattr(dag_run, "conf", None)
        return cls(
            dag_id=dag_run.dag_id,
            run_date=run_date,
            clear_number=int(getattr(dag_run, "clear_number", 0) or 0),
            conf=conf if isinstance(conf, Mapping) else None,
        )


class Claimed(Struct, frozen=True, kw_only=True):
    """A claim's look that got (or skipped) the run."""

    engine_db: EngineDb
    action: str
    pipeline_run_id: int | None
    run_key: str
    status: str
    #: The DAG run that claimed: the parent of the Engine run's START event.
    dag_run: DagRunRef | None = None


class Ended(Struct, frozen=True, kw_only=True):
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
    #: The task's active ``CFG_TASK_PARAMETERS`` ``TARGET_OBJECT``, read with the end where Airflow's
    #: OpenLineage listener runs in the process; else None (no declared target, or no listener to tell).
    target_object: str | None = None


class Finished(Struct, frozen=True, kw_only=True):
    """A finish's outcome, with the Engine it was written to (the facet reads the run's task totals there)."""

    engine: Any
    pipeline_run_id: int
    run_key: str
    status: str
    sla_status: str | None
    #: The DAG run that finished: the parent of the Engine run's end event.
    dag_run: DagRunRef | None = None
