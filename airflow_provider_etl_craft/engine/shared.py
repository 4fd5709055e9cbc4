"""An Engine DB that etl-craft made: how the provider recognises it and what adopting it adds.

The rules are in docs/etl-craft-parity.md, "Sharing an Engine DB": etl-craft's ``migrate`` refuses every
``SCHEMA_MIGRATIONS`` row it cannot match to one of its own files, so on such a database the provider keeps
its ENGINE ledger in a table of its own and leaves etl-craft's ledger rows (and everything else of
etl-craft's) as they are.
"""

from __future__ import annotations

from airflow_provider_etl_craft.engine.dbapi import Connection, Cursor
from airflow_provider_etl_craft.engine.dialects import EngineDialect

#: etl-craft's first packaged migration: its init-db records it (by file name) in every Engine DB it makes.
ETL_CRAFT_MARK = "0001_pipeline_pauses.sql"
#: The provider's own ENGINE ledger in an Engine DB etl-craft made (etl-craft never reads it).
PROVIDER_LEDGER = "ETL_CRAFT_AIRFLOW_MIGRATIONS"
#: PostgreSQL: the provider's schema check over :data:`PROVIDER_LEDGER`, re-created after adoption steps.
SCHEMA_CHECK = "schema_check.sql"


def adopt_text(dialect_name: str, name: str) -> str | None:
    """The text of ``sql/<dialect>/adopt/<name>``, or None when there is no such file."""
    from airflow_provider_etl_craft.engine.schema import sql_root

    item = sql_root() / dialect_name / "adopt" / name
    return item.read_text(encoding="utf-8") if item.is_file() else None


def adoption_steps(dialect_name: str, baseline: str) -> list[tuple[str, str]]:
    """What adopting an etl-craft Engine DB applies, as ``(version, text)`` in order, each recorded in
    :data:`PROVIDER_LEDGER` under the provider's ENGINE version it stands for.

    ``baseline`` first (``adopt/<baseline>``: the ledger table), then each packaged ENGINE migration: its
    ``adopt/<version>`` counterpart where the provider's own file would change something of etl-craft's,
    else the packaged file as it is.
    """
    from airflow_provider_etl_craft.engine.schema import packaged_migrations

    first = adopt_text(dialect_name, f"{baseline}.sql")
    assert first is not None, f"sql/{dialect_name}/adopt/{baseline}.sql is missing from the package"
    steps = [(baseline, first)]
    for version, text in packaged_migrations(dialect_name):
        counterpart = adopt_text(dialect_name, version)
        steps.append((version, text if counterpart is None else counterpart))
    return steps


def ledger_versions(
    dialect: EngineDialect, conn: Connection, cur: Cursor | None, tables: set[str]
) -> frozenset[str]:
    """The versions in :data:`PROVIDER_LEDGER` (empty when the table is not there yet)."""
    if PROVIDER_LEDGER not in tables:
        return frozenset()
    read = f"SELECT VERSION FROM {PROVIDER_LEDGER}"  # noqa: S608 - a constant
    rows = dialect.rows(cur, read) if cur is not None else dialect.query(conn, read)
    return frozenset(r[0] for r in rows)


def made_by_etl_craft(engine_versions: frozenset[str], baseline: str) -> bool:
    """Whether ``SCHEMA_MIGRATIONS``' ENGINE versions are those of an etl-craft init-db: its first migration's
    file name, and not the provider's own baseline row."""
    return ETL_CRAFT_MARK in engine_versions and baseline not in engine_versions
