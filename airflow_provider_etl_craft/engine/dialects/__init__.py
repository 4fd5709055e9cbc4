"""Dialects own every SQLite/PostgreSQL difference: connecting, transactions, locks, catalog queries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_etl_craft.engine.dialects.base import EngineDialect

if TYPE_CHECKING:
    from airflow_provider_etl_craft.config.profile import EngineProfile


def dialect_for(profile: EngineProfile) -> EngineDialect:
    """The dialect object bound to ``profile``'s database."""
    if profile.dialect_name == "sqlite":
        from airflow_provider_etl_craft.engine.dialects.sqlite import SqliteDialect

        return SqliteDialect(profile)
    from airflow_provider_etl_craft.engine.dialects.postgresql import PostgresDialect

    return PostgresDialect(profile)


__all__ = ["EngineDialect", "dialect_for"]
