"""migrate: packaged ENGINE migrations, then the team's PROJECT migrations, each ledgered with its checksum."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_etl_craft.engine.actor import acting_as
from airflow_provider_etl_craft.engine.dbapi import Connection, Cursor
from airflow_provider_etl_craft.engine.dialects import EngineDialect
from airflow_provider_etl_craft.engine.locks import MIGRATE_LOCK
from airflow_provider_etl_craft.engine.migration_checks import check_rows
from airflow_provider_etl_craft.engine.schema import (
    MIGRATE_LOCK_TIMEOUT,
    SCHEMA_VERSION,
    InitResult,
    apply_adoption_step,
    checksum,
    finish_adoption_steps,
    init_db,
    packaged_migrations,
)
from airflow_provider_etl_craft.engine.shared import PROVIDER_LEDGER, adoption_steps
from airflow_provider_etl_craft.engine.url import resolve_beside
from airflow_provider_etl_craft.errors import LockTimeoutError, MigrationError, first_line
from airflow_provider_etl_craft.paths import checked_path, read_text

MIGRATIONS_ENV_VAR = "ETL_CRAFT_MIGRATIONS_DIR"


#: Statements that end or split the file's transaction, or cannot run inside one (first word, upper case).
TRANSACTION_CONTROL = frozenset(
    {
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        "END",
        "ABORT",
        "START",
        "SAVEPOINT",
        "RELEASE",
        "VACUUM",
        "ATTACH",
        "DETACH",
    }
)


def transaction_control(text: str) -> tuple[int, str] | None:
    """The first statement of a migration that a file's one transaction cannot hold: (line, statement).

    Tokenized by ``sqlparse`` (as common-sql does), so comments, string literals, dollar-quoted bodies and
    trigger bodies are never mistaken for statements: ``BEGIN``/``COMMIT``/``ROLLBACK``/``END``/``SAVEPOINT``/
    ``RELEASE``/``START TRANSACTION``/``ABORT``, ``PREPARE TRANSACTION``, ``VACUUM``, ``ATTACH``/``DETACH``,
    and ``… CONCURRENTLY`` (index builds PostgreSQL runs only outside a transaction).
    """
    import sqlparse  # here: only migrate reads migrations, and no DAG parse needs it

    offset = 0
    for statement in sqlparse.parse(text):
        source = str(statement)
        start = offset
        offset += len(source)
        tokens = [
            t for t in statement.flatten() if not t.is_whitespace and t.ttype not in sqlparse.tokens.Comment
        ]
        if not tokens:
            continue
        words = [t.value.upper() for t in tokens if t.is_keyword or t.ttype in sqlparse.tokens.Name]
        first = tokens[0].value.upper()
        refused = (
            first in TRANSACTION_CONTROL
            or (first == "PREPARE" and words[1:2] == ["TRANSACTION"])
            or (first in ("CREATE", "DROP", "REINDEX") and "CONCURRENTLY" in words)
        )
        if refused:
            at = start + source.index(tokens[0].value)
            line = text.count("\n", 0, at) + 1
            return line, " ".join(source.split())[:80]
    return None


@dataclass(frozen=True)
class MigrationFile:
    source: str
    version: str
    text: str = field(repr=False)

    @property
    def checksum(self) -> str:
        return checksum(self.text)

    @property
    def label(self) -> str:
        return f"{self.source} {self.version}"


@dataclass(frozen=True)
class MigrateResult:
    init: InitResult
    applied: list[str]


def find_migrations_dir(explicit: str | os.PathLike[str] | None, base_dir: Path | None) -> Path | None:
    """``--migrations-dir`` / operator argument, else ``$ETL_CRAFT_MIGRATIONS_DIR``, else ``migrations/``
    beside craft-connector.yml when it exists.

    :raises ConfigurationError: an explicitly named folder that does not exist.
    """
    for value, what in (
        (explicit, "the migrations directory"),
        (os.environ.get(MIGRATIONS_ENV_VAR), f"${MIGRATIONS_ENV_VAR}"),
    ):
        if value:
            return checked_path(resolve_beside(value, base_dir), what, kind="directory")
    if base_dir is not None and (base_dir / "migrations").is_dir():
        return (base_dir / "migrations").resolve()
    return None


def migration_files(dialect_name: str, project_dir: Path | None, shared: bool = False) -> list[MigrationFile]:
    """ENGINE files (packaged, for this dialect) first, then PROJECT files; each group in file-name order.

    :param shared: an Engine DB etl-craft made: the ENGINE files are the adoption steps that stand for them.
    """
    engine = adoption_steps(dialect_name, SCHEMA_VERSION)[1:] if shared else packaged_migrations(dialect_name)
    files = [MigrationFile("ENGINE", version, text) for version, text in engine]
    if project_dir is not None:
        for path in sorted(project_dir.glob("*.sql")):
            text = read_text(path, f"migration PROJECT {path.name}", error=MigrationError)
            files.append(MigrationFile("PROJECT", path.name, text))
    return files


def pending_migrations(
    dialect: EngineDialect,
    conn: Connection,
    files: list[MigrationFile],
    *,
    cur: Cursor | None = None,
    sources: frozenset[str] = frozenset({"ENGINE", "PROJECT"}),
    shared: bool = False,
) -> list[MigrationFile]:
    """Files not yet in the ledger, after checking the ledger against the files.

    :param cur: read the ledger inside this cursor's transaction instead of on ``conn``.
    :param sources: the ledger sources to judge; a reader that knows no PROJECT folder (an inline Airflow
        connection's Test button) judges ENGINE alone, since it cannot tell an applied file from a removed one.
    :param shared: an Engine DB etl-craft made: ENGINE versions come from the provider's own ledger, and
        etl-craft's ENGINE rows in ``SCHEMA_MIGRATIONS`` are etl-craft's to check, not the provider's.
    :raises MigrationError: a ledgered file was edited or removed, or a new file sorts before an applied one.
    """

    def read(text: str) -> list[tuple[str, str, str]]:
        found = dialect.rows(cur, text) if cur is not None else dialect.query(conn, text)
        return [(r[0], r[1], r[2]) for r in found]

    rows = read("SELECT SOURCE, VERSION, CHECKSUM FROM SCHEMA_MIGRATIONS")
    if shared:
        rows = [r for r in rows if r[0] != "ENGINE"]
        rows += read(f"SELECT 'ENGINE', VERSION, CHECKSUM FROM {PROVIDER_LEDGER}")  # noqa: S608 - a constant
    ledger = {
        (src, ver): digest
        for src, ver, digest in rows
        if src in sources and not (src == "ENGINE" and ver == SCHEMA_VERSION)
    }
    by_key = {(f.source, f.version): f for f in files}
    problems = []
    for (src, ver), digest in sorted(ledger.items()):
        found = by_key.get((src, ver))
        if found is None:
            problems.append(f"{src} {ver} was applied but its file is gone")
        elif found.checksum != digest:
            problems.append(
                f"{src} {ver} was edited after it was applied (checksum {digest[:12]}… → {found.checksum[:12]}…)"
            )
    pending = [f for f in files if (f.source, f.version) not in ledger]
    for new in pending:
        later = sorted(v for (s, v) in ledger if s == new.source and v > new.version)
        if later:
            problems.append(
                f"{new.label} is new but sorts before already applied {later[-1]}; rename it to sort last"
            )
    if problems:
        raise MigrationError(
            "migrations stopped before applying anything: "
            + "; ".join(problems)
            + ". Applied migrations are immutable: restore the original file and put changes in a new one"
        )
    return pending


def migrate(
    dialect: EngineDialect,
    conn: Connection,
    project_dir: Path | None,
    lock_timeout: float | None = MIGRATE_LOCK_TIMEOUT,
) -> MigrateResult:
    """Bring the Engine DB up to date: init-db if needed, then every pending file, one transaction each.

    Every one of those transactions takes the ``migrate`` lock itself and reads the ledger again inside
    it, so concurrent runs serialise file by file and a file another process applied meanwhile is skipped:
    each file is applied once.

    :raises MigrationError: ledger problems (nothing applied), or a file that fails (that file rolled back).
    :raises LockTimeoutError: another init-db or migrate held the lock too long.
    """
    project = migration_files(dialect.name, project_dir)  # read (and checked) before anything is changed
    init = init_db(dialect, conn, lock_timeout)
    files = migration_files(dialect.name, project_dir, init.shared) if init.shared else project
    pending = pending_migrations(dialect, conn, files, shared=init.shared)
    for item in pending:  # files applied already stay as they were (their ledger checksums hold)
        found = transaction_control(item.text)
        if found is not None:
            raise MigrationError(
                f"migrations stopped before applying anything: {item.label} line {found[0]} controls the "
                f"transaction ({found[1]!r}); each file runs in one transaction that migrate opens and commits "
                "with its ledger row, so a file may not BEGIN, COMMIT, ROLLBACK, SAVEPOINT, VACUUM or build an "
                "index CONCURRENTLY: remove that statement (split the file in two if it needs two transactions)"
            )
    applied: list[str] = []
    for item in pending:
        if _apply(
            dialect,
            conn,
            item,
            files=files,
            lock_timeout=lock_timeout,
            earlier=len(applied),
            shared=init.shared,
        ):
            applied.append(item.label)
    return MigrateResult(init, applied)


def _apply(
    dialect: EngineDialect,
    conn: Connection,
    item: MigrationFile,
    *,
    files: list[MigrationFile],
    lock_timeout: float | None,
    earlier: int,
    shared: bool = False,
) -> bool:
    """Apply ``item`` with its ledger row in one transaction holding the ``migrate`` lock, unless the ledger
    read inside it shows the file applied already. :return: whether this call applied it.

    :param files: every migration file (the ledger is checked against them).
    :param earlier: how many files this migrate applied before (for the message of a file that fails).

    The transaction names the file as the migration writing (etl-craft's change log records it); on an
    Engine DB etl-craft made, an ENGINE step is recorded in the provider's own ledger.
    """
    try:
        with (
            acting_as(None, migration=item.version),
            dialect.schema_transaction(conn, lock=MIGRATE_LOCK, lock_timeout=lock_timeout) as cur,
        ):
            if item not in pending_migrations(dialect, conn, files, cur=cur, shared=shared):
                return False
            if item.source == "ENGINE":
                check_rows(
                    dialect, cur, item.version
                )  # rows breaking a rule it adds: listed, nothing changed
            if shared and item.source == "ENGINE":
                apply_adoption_step(dialect, cur, item.version, item.text)
                finish_adoption_steps(dialect, cur)
            else:
                dialect.execute_script(cur, item.text)
                cur.execute(
                    dialect.sql("INSERT INTO SCHEMA_MIGRATIONS (SOURCE, VERSION, CHECKSUM) VALUES (?, ?, ?)"),
                    (item.source, item.version, item.checksum),
                )
    except (LockTimeoutError, MigrationError):
        raise
    except Exception as exc:
        if isinstance(exc, dialect.database_error()) and (transient := dialect.classify(exc)).retryable:
            raise transient from exc  # the server went away or a conflict: not the file's fault
        detail = first_line(exc)
        raise MigrationError(
            f"migration {item.label} failed and was rolled back ({detail}); fix the file and run migrate "
            f"again ({earlier} earlier file(s) stay applied)"
        ) from None
    return True
