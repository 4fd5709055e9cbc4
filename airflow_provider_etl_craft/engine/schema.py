"""init-db: create the Engine tables from the packaged ``schema.sql`` once, safely, in a transaction holding the migrate lock."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from airflow_provider_etl_craft.engine.dbapi import Connection, Cursor
from airflow_provider_etl_craft.engine.dialects import EngineDialect
from airflow_provider_etl_craft.engine.locks import MIGRATE_LOCK
from airflow_provider_etl_craft.engine.shared import (
    PROVIDER_LEDGER,
    SCHEMA_CHECK,
    adopt_text,
    adoption_steps,
    ledger_versions,
    made_by_etl_craft,
)
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
#: Seconds init-db and migrate wait for the ``migrate`` lock by default (the CLI's and EngineInitDbOperator's
#: too): long, since another process may be migrating. The pipeline lock's default is ``[etl_craft] lock_timeout``.
MIGRATE_LOCK_TIMEOUT = 300.0


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
    #: An Engine DB that etl-craft made (the provider's ENGINE ledger is its own table there).
    shared: bool = False


def packaged_migrations(dialect_name: str) -> list[tuple[str, str]]:
    """The packaged ENGINE migrations of a dialect as ``(version, text)``, in file-name order.

    They change the baseline ``schema.sql`` (which stays as released, so existing Engine DBs keep their
    ledger checksum); a fresh init-db applies them too, so it always creates the latest schema.
    """
    folder = sql_root() / dialect_name / "migrations"
    if not folder.is_dir():
        return []
    items = sorted((item for item in folder.iterdir() if item.name.endswith(".sql")), key=lambda i: i.name)
    return [(item.name, item.read_text(encoding="utf-8")) for item in items]


def packaged_versions(dialect_name: str) -> tuple[str, ...]:
    """The versions (file names) of the packaged ENGINE migrations of a dialect, in order; no file is read."""
    folder = sql_root() / dialect_name / "migrations"
    if not folder.is_dir():
        return ()
    return tuple(sorted(item.name for item in folder.iterdir() if item.name.endswith(".sql")))


def latest_version(dialect_name: str) -> str:
    """The ENGINE version a fully migrated Engine DB of this dialect is at."""
    versions = packaged_versions(dialect_name)
    return versions[-1] if versions else SCHEMA_VERSION


def current_marks(dialect_name: str) -> tuple[list[str], list[str]]:
    """What a CURRENT Engine schema holds, as :func:`require_current` decides it: every packaged ENGINE version
    and every Engine table (upper case). The one-call forms of claim and finish check these in the database
    (``ETL_CRAFT_SCHEMA_IS_CURRENT``, ENGINE migration 0003 on PostgreSQL) instead of two schema queries."""
    return list(packaged_versions(dialect_name)), sorted(ENGINE_TABLES)


class Verdict(enum.Enum):
    """What an Engine schema is fit for; every reader (init-db, check, test_connection, the run lifecycle,
    status and history) decides on this one verdict."""

    EMPTY = "empty"  #: no Engine tables: init-db creates them
    PARTIAL = "partial"  #: some Engine tables are missing: nothing may use or change it
    PENDING = "pending"  #: every table, but packaged ENGINE migrations are not applied: migrate applies them
    CURRENT = "current"  #: ready for run bookkeeping


@dataclass(frozen=True)
class SchemaState:
    """What the Engine schema of a database holds: its Engine tables and applied ENGINE versions."""

    present: frozenset[str]
    applied: frozenset[str]
    pending: tuple[str, ...]
    #: ``<engine> schema <name>``, for messages.
    where: str
    #: Made by etl-craft: ``applied`` is then the provider's own ledger (docs/etl-craft-parity.md).
    shared: bool = False

    @property
    def verdict(self) -> Verdict:
        if not self.present:
            return Verdict.EMPTY
        if self.present != ENGINE_TABLES:
            return Verdict.PARTIAL
        return Verdict.PENDING if self.pending else Verdict.CURRENT

    @property
    def missing(self) -> list[str]:
        return sorted(ENGINE_TABLES - self.present)

    def problem(self) -> EngineDBError | None:
        """Why run bookkeeping cannot use this schema (None: it can), naming the command that fixes it."""
        verdict = self.verdict
        if verdict is Verdict.EMPTY:
            return EngineDBError(
                f"the Engine DB {self.where} has no Engine tables; create them with `etl-craft-airflow init-db` "
                "(or an EngineInitDbOperator task) before running pipelines"
            )
        if verdict is Verdict.PARTIAL:
            return EngineDBError(
                f"the Engine DB {self.where} holds only some Engine tables (found {', '.join(sorted(self.present))}; "
                f"missing {', '.join(self.missing)}); nothing will use or change a partial schema: restore it, or "
                "point the profile at another schema"
            )
        if verdict is Verdict.PENDING and self.shared and SCHEMA_VERSION not in self.applied:
            return EngineDBError(
                f"the Engine DB {self.where} was made by etl-craft and this provider has not adopted it yet; "
                "adopt it with `etl-craft-airflow init-db` or `etl-craft-airflow migrate` (it adds the provider's "
                "ledger, column and functions and changes nothing of etl-craft's) before running pipelines"
            )
        if verdict is Verdict.PENDING:
            return EngineDBError(
                f"the Engine DB {self.where} needs ENGINE migration {', '.join(self.pending)} of this provider "
                "release; apply it with `etl-craft-airflow migrate` (or EngineInitDbOperator(apply_migrations=True)) "
                "before running pipelines"
            )
        return None

    def require(self, *fit: Verdict) -> None:
        """:raises EngineDBError: the verdict is not one of ``fit`` (the message says how to fix it)."""
        problem = None if self.verdict in fit else self.problem()
        if problem is not None:
            raise problem


def schema_state(dialect: EngineDialect, conn: Connection, cur: Cursor | None = None) -> SchemaState:
    """Read which Engine tables exist and which packaged ENGINE migrations are not applied yet (two queries).

    :param cur: read inside this cursor's transaction (under the ``migrate`` lock) instead of on ``conn``.
    """
    tables = dialect.table_names(conn, cur)
    present = frozenset(tables & ENGINE_TABLES)
    applied: frozenset[str] = frozenset()
    shared = False
    if "SCHEMA_MIGRATIONS" in present:
        ledger = "SELECT VERSION FROM SCHEMA_MIGRATIONS WHERE SOURCE = 'ENGINE'"
        rows = dialect.rows(cur, ledger) if cur is not None else dialect.query(conn, ledger)
        applied = frozenset(r[0] for r in rows)
        shared = made_by_etl_craft(applied, SCHEMA_VERSION)
        if shared:  # etl-craft's own versions say nothing about the provider's
            applied = ledger_versions(dialect, conn, cur, tables)
    pending = tuple(v for v in packaged_versions(dialect.name) if v not in applied)
    if shared and SCHEMA_VERSION not in applied:
        pending = (SCHEMA_VERSION, *pending)
    where = f"{dialect.describe()} schema {dialect.profile.schema}"
    return SchemaState(present=present, applied=applied, pending=pending, where=where, shared=shared)


def check_schema(dialect: EngineDialect, conn: Connection) -> SchemaState:
    """The schema's state, after checking the role may use it: a role without USAGE sees no tables, which
    is said as the missing GRANT, not as an empty schema.

    :raises ConfigurationError: the schema is missing or the role may not use it.
    """
    dialect.verify_schema(conn)
    return schema_state(dialect, conn)


def require_current(dialect: EngineDialect, conn: Connection) -> None:
    """Stop before run bookkeeping, or reading runs, on an Engine DB whose verdict is not CURRENT.

    :raises EngineDBError: naming what is missing and the command that fixes it.
    :raises ConfigurationError: the role may not use the Engine schema.
    """
    try:
        current = schema_state(dialect, conn).verdict is Verdict.CURRENT
    except dialect.database_error():  # e.g. no USAGE on the schema: the ledger is not found
        current = False
    if not current:
        check_schema(dialect, conn).require(Verdict.CURRENT)


def init_db(
    dialect: EngineDialect, conn: Connection, lock_timeout: float | None = MIGRATE_LOCK_TIMEOUT
) -> InitResult:
    """Create the Engine tables unless they are already there.

    On an empty schema, ``schema.sql`` and every packaged ENGINE migration run in one transaction with
    their ledger rows, and that transaction takes the ``migrate`` lock itself and reads the schema again
    inside it, so a crash leaves nothing half-made, concurrent runs (every Airflow retry, every deployment)
    serialise, one that waited finds the schema made and reports it existing, and the result is the latest
    schema. An existing Engine DB is never changed here: pending ENGINE migrations are reported for
    ``migrate`` to apply.

    :raises ConfigurationError: transactions do not resolve names in the profile's schema (no USAGE on it).
    :raises EngineDBError: some but not all Engine tables exist, or the ledger shows another schema.
    :raises LockTimeoutError: another init-db or migrate held the lock too long.
    """
    dialect.verify_schema(conn)
    with dialect.schema_transaction(conn, lock=MIGRATE_LOCK, lock_timeout=lock_timeout) as cur:
        return init_db_in(dialect, conn, cur)


def init_db_in(dialect: EngineDialect, conn: Connection, cur: Cursor) -> InitResult:
    """init-db inside the caller's schema transaction ``cur``, which holds the ``migrate`` lock."""
    text = schema_text(dialect.name)
    digest = checksum(text)
    state = schema_state(dialect, conn, cur)
    where = state.where
    state.require(Verdict.EMPTY, Verdict.PENDING, Verdict.CURRENT)
    if state.shared:
        return adopt_in(dialect, cur, state)
    if state.present:
        recorded = dialect.rows(
            cur,
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
        if state.pending:
            at = max(state.applied)
            return InitResult(
                False,
                at,
                f"Engine DB {where} is at {at}; ENGINE migration {', '.join(state.pending)} is "
                "pending (`etl-craft-airflow migrate` applies it)",
            )
        at = latest_version(dialect.name)
        return InitResult(False, at, f"Engine DB {where} is already at {at}; nothing changed")
    ledger = dialect.sql("INSERT INTO SCHEMA_MIGRATIONS (SOURCE, VERSION, CHECKSUM) VALUES ('ENGINE', ?, ?)")
    dialect.execute_script(cur, text)
    cur.execute(ledger, (SCHEMA_VERSION, digest))
    for version, migration in packaged_migrations(dialect.name):
        dialect.execute_script(cur, migration)
        cur.execute(ledger, (version, checksum(migration)))
    at = latest_version(dialect.name)
    return InitResult(True, at, f"Engine DB {where} initialised at {at}")


def adopt_in(dialect: EngineDialect, cur: Cursor, state: SchemaState) -> InitResult:
    """init-db on an Engine DB etl-craft made, inside the caller's schema transaction: adopt it (every step
    of :func:`~.shared.adoption_steps`, each recorded in the provider's own ledger) unless it was adopted
    already, in which case nothing is changed and pending provider versions are reported for ``migrate``."""
    where = state.where
    if SCHEMA_VERSION in state.applied:
        baseline = adopt_text(dialect.name, f"{SCHEMA_VERSION}.sql") or ""
        read = f"SELECT CHECKSUM FROM {PROVIDER_LEDGER} WHERE VERSION = ?"  # noqa: S608 - a constant
        recorded = dialect.rows(cur, read, (SCHEMA_VERSION,))
        if recorded and recorded[0][0] != checksum(baseline):
            raise EngineDBError(
                f"{where} was adopted from etl-craft with baseline checksum {recorded[0][0][:12]}…, but this "
                f"release packages {checksum(baseline)[:12]}…; use the matching provider release"
            )
        if state.pending:
            at = max(state.applied)
            return InitResult(
                False,
                at,
                f"Engine DB {where} (made by etl-craft, adopted) is at {at}; ENGINE migration "
                f"{', '.join(state.pending)} is pending (`etl-craft-airflow migrate` applies it)",
                shared=True,
            )
        at = latest_version(dialect.name)
        return InitResult(
            False,
            at,
            f"Engine DB {where} (made by etl-craft, adopted) is already at {at}; nothing changed",
            True,
        )
    for version, text in adoption_steps(dialect.name, SCHEMA_VERSION):
        apply_adoption_step(dialect, cur, version, text)
    finish_adoption_steps(dialect, cur)
    at = latest_version(dialect.name)
    return InitResult(
        True,
        at,
        f"Engine DB {where} was made by etl-craft: adopted at {at} (added the provider's own ledger "
        f"{PROVIDER_LEDGER} and what its ENGINE versions need; none of etl-craft's tables, rows or ledger rows "
        "changed)",
        shared=True,
    )


def apply_adoption_step(dialect: EngineDialect, cur: Cursor, version: str, text: str) -> None:
    """Run one adoption step and record it in the provider's own ledger, in the caller's transaction."""
    dialect.execute_script(cur, text)
    cur.execute(
        dialect.sql(f"INSERT INTO {PROVIDER_LEDGER} (VERSION, CHECKSUM) VALUES (?, ?)"),  # noqa: S608
        (version, checksum(text)),
    )


def finish_adoption_steps(dialect: EngineDialect, cur: Cursor) -> None:
    """After ENGINE steps on an adopted Engine DB: the dialect's schema check over the provider's ledger."""
    check = adopt_text(dialect.name, SCHEMA_CHECK)
    if check is not None:
        dialect.execute_script(cur, check)
