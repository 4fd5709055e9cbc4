"""What a packaged ENGINE migration requires of the rows already in the Engine DB, checked before it runs.

A migration that adds a rule (a NOT NULL, a unique index) would fail on the first row that breaks it, with
the database's message about one row. ``migrate`` reads every rule's offending rows first, in the migration's
own transaction and before any of its statements, and stops with all of them listed, so the team can fix
them in one pass; nothing is changed. Rules and their reasons: docs/etl-craft-parity.md, "Engine DB schema".
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_etl_craft.engine.dbapi import Cursor
from airflow_provider_etl_craft.engine.dialects import EngineDialect
from airflow_provider_etl_craft.errors import MigrationError

#: Offending rows listed per rule; the count of the rest is given.
SHOWN_ROWS = 20


@dataclass(frozen=True)
class RowRule:
    """A rule a migration adds, and the query selecting the rows that break it (each column ``NAME=value``)."""

    table: str
    rule: str
    query: str
    #: Only this dialect (None: both); a rule about how a dialect stored a value.
    dialect: str | None = None


def _duplicate_edges(table: str, key: str, edge: tuple[str, ...]) -> str:
    same = " AND ".join(f"o.{column} = d.{column}" for column in edge)
    return (
        f"SELECT d.{key}, {', '.join(f'd.{c}' for c in edge)} FROM {table} d WHERE d.ACTIVE_FLAG = 'Y' "  # noqa: S608
        f"AND EXISTS (SELECT 1 FROM {table} o WHERE o.ACTIVE_FLAG = 'Y' AND {same} AND o.{key} <> d.{key}) "
        f"ORDER BY {', '.join(f'd.{c}' for c in edge)}, d.{key}"
    )


def _missing(table: str, column: str, key: tuple[str, ...]) -> str:
    return f"SELECT {', '.join(key)} FROM {table} WHERE {column} IS NULL ORDER BY {key[0]}"  # noqa: S608


_PIPELINE_EDGE = ("PIPELINE_ID", "DEPENDS_ON_PIPELINE_ID", "DEPENDENCY_TYPE")
_TASK_EDGE = ("TASK_ID", "DEPENDS_ON_PIPELINE_ID", "DEPENDS_ON_TASK_ID", "DEPENDENCY_TYPE")

#: By ENGINE version (file name).
RULES: dict[str, tuple[RowRule, ...]] = {
    "0004_cfg_semantics.sql": (
        RowRule("CFG_PIPELINES", "PIPELINE_NAME is required",
                _missing("CFG_PIPELINES", "PIPELINE_NAME", ("PIPELINE_ID", "PIPELINE_CODE"))),
        RowRule("CFG_PIPELINES", "REFRESH_TYPE is required",
                _missing("CFG_PIPELINES", "REFRESH_TYPE", ("PIPELINE_ID", "PIPELINE_CODE"))),
        RowRule("CFG_TASKS", "TASK_TYPE is required",
                _missing("CFG_TASKS", "TASK_TYPE", ("TASK_ID", "PIPELINE_ID", "TASK_CODE"))),
        RowRule("CFG_TASKS", "HANDLER is required",
                _missing("CFG_TASKS", "HANDLER", ("TASK_ID", "PIPELINE_ID", "TASK_CODE"))),
        RowRule("CFG_PIPELINE_DEPENDENCY", f"one ACTIVE row per edge ({', '.join(_PIPELINE_EDGE)})",
                _duplicate_edges("CFG_PIPELINE_DEPENDENCY", "PIPELINE_DEPENDENCY_ID", _PIPELINE_EDGE)),
        RowRule("CFG_TASK_DEPENDENCY", f"one ACTIVE row per edge ({', '.join(_TASK_EDGE)})",
                _duplicate_edges("CFG_TASK_DEPENDENCY", "TASK_DEPENDENCY_ID", _TASK_EDGE)),
        RowRule("AUD_PIPELINES_RUN_LOG", "RUN_DATE becomes a date: it must hold a timestamp SQLite can read",
                "SELECT PIPELINE_RUN_ID, RUN_DATE FROM AUD_PIPELINES_RUN_LOG WHERE RUN_DATE IS NOT NULL "
                "AND date(RUN_DATE, '+0 days') IS NULL ORDER BY PIPELINE_RUN_ID", dialect="sqlite"),
    ),
}  # fmt: skip


def _describe(names: list[str], row: tuple[object, ...]) -> str:
    return " ".join(f"{name}={value}" for name, value in zip(names, row, strict=True))


def check_rows(dialect: EngineDialect, cur: Cursor, version: str) -> None:
    """Stop before ENGINE migration ``version`` when rows in the Engine DB break a rule it adds.

    :param cur: the migration's transaction (nothing has been changed in it yet).
    :raises MigrationError: listing, per rule, the offending rows (table and key columns) and how to fix them.
    """
    problems = []
    for rule in RULES.get(version, ()):
        if rule.dialect not in (None, dialect.name):
            continue
        cur.execute(dialect.sql(rule.query))
        names = [d[0].upper() for d in cur.description or ()]
        rows = cur.fetchall()
        if not rows:
            continue
        shown = "; ".join(_describe(names, tuple(r)) for r in rows[:SHOWN_ROWS])
        more = f"; and {len(rows) - SHOWN_ROWS} more" if len(rows) > SHOWN_ROWS else ""
        problems.append(f"{rule.table}: {rule.rule}, {len(rows)} row(s) do not comply: {shown}{more}")
    if problems:
        raise MigrationError(
            f"migration ENGINE {version} stopped before changing anything: "
            + " | ".join(problems)
            + ". Fix these rows on the Engine DB (fill the missing values; retire a duplicate edge with "
            "ACTIVE_FLAG = 'N'), then run `etl-craft-airflow migrate` again"
        )
