"""init-db: create the Engine tables from the packaged ``schema.sql`` once, safely, under the migrate lock."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from airflow_provider_etl_craft.engine.dialects import EngineDialect
from airflow_provider_etl_craft.engine.locks import MIGRATE_LOCK
from airflow_provider_etl_craft.errors import EngineDBError

#: Ledger version of the packaged schema (SOURCE='ENGINE').
SCHEMA_VERSION = "0001_schema"
ENGINE_TABLES = frozenset(
    {
        "CFG_PIPELINES", "CFG_PIPELINE_DEPENDENCY", "CFG_TASKS", "CFG_TASK_DEPENDENCY", "CFG_TASK_PARAMETERS",
        "AUD_PIPELINES_RUN_LOG", "AUD_TASK_RUN_LOG", "AUD_TASK_ATTEMPTS", "AUD_GATE_DECISIONS",
        "AUD_DEPENDENCY_CONSUMPTION", "AUD_PIPELINE_PAUSES", "AUD_RUN_INTERVENTIONS", "SCHEMA_MIGRATIONS",
    }
)  # fmt: skip
DEFAULT_LOCK_TIMEOUT = 300.0


def sql_root() -> Traversable:
    """The packaged ``sql/`` folder (inside the wheel; the repository's ``sql/`` in an editable install)."""
    packaged = resources.files("airflow_provider_etl_craft") / "sql"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "sql"


def schema_text(dialect_name: str) -> str:
    return (sql_root() / dialect_name / "schema.sql").read_text(encoding="utf-8")


def checksum(text: str) -> str:
    """SHA-256 of a SQL file's UTF-8 text, as stored in ``SCHEMA_MIGRATIONS.CHECKSUM``."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class InitResult:
    created: bool
    version: str
    message: str


def init_db(
    dialect: EngineDialect, conn: Any, lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT
) -> InitResult:
    """Create the Engine tables unless they are already there at the packaged version.

    The whole ``schema.sql`` and its ledger row run in one transaction under the ``migrate`` lock, so a
    crash leaves nothing half-made and concurrent runs (every Airflow retry, every deployment) serialise.

    :raises EngineDBError: some but not all Engine tables exist, or the ledger shows another schema.
    :raises LockTimeoutError: another init-db or migrate held the lock too long.
    """
    with dialect.lock(MIGRATE_LOCK, lock_timeout, conn):
        return init_db_locked(dialect, conn)


def init_db_locked(dialect: EngineDialect, conn: Any) -> InitResult:
    """init-db for a caller that already holds the ``migrate`` lock (migrate runs it first)."""
    text = schema_text(dialect.name)
    digest = checksum(text)
    where = f"{dialect.describe()} schema {dialect.profile.schema}"
    present = dialect.table_names(conn) & ENGINE_TABLES
    if present == ENGINE_TABLES:
        recorded = dialect.query(
            conn,
            "SELECT CHECKSUM FROM SCHEMA_MIGRATIONS WHERE SOURCE = 'ENGINE' AND VERSION = ?",
            (SCHEMA_VERSION,),
        )
        if not recorded:
            raise EngineDBError(
                f"{where} has every Engine table but SCHEMA_MIGRATIONS has no ENGINE row for {SCHEMA_VERSION}: "
                "it was not made by this provider's init-db; point the profile at an empty schema"
            )
        if recorded[0][0] != digest:
            raise EngineDBError(
                f"{where} holds Engine schema {SCHEMA_VERSION} with checksum {recorded[0][0][:12]}…, but this "
                f"release packages {digest[:12]}…; it was made by a different etl-craft version — use the "
                "matching provider release (init-db never rewrites existing tables)"
            )
        return InitResult(
            False, SCHEMA_VERSION, f"Engine DB {where} is already at {SCHEMA_VERSION}; nothing changed"
        )
    if present:
        missing = sorted(ENGINE_TABLES - present)
        raise EngineDBError(
            f"{where} holds only some Engine tables (found {', '.join(sorted(present))}; missing "
            f"{', '.join(missing)}); init-db will not touch a partial schema: restore it, or use an empty schema"
        )
    with dialect.transaction(conn) as cur:
        dialect.execute_script(cur, text)
        cur.execute(
            dialect.sql("INSERT INTO SCHEMA_MIGRATIONS (SOURCE, VERSION, CHECKSUM) VALUES ('ENGINE', ?, ?)"),
            (SCHEMA_VERSION, digest),
        )
    return InitResult(True, SCHEMA_VERSION, f"Engine DB {where} initialised at {SCHEMA_VERSION}")
