"""The lifecycle's vocabulary (runs/vocabulary.py) and the Engine schema's CHECK constraints list the same values.

The packaged SQL of each dialect is read as it builds a fresh Engine DB: ``schema.sql``, then its ENGINE migrations
in order, the last ``CREATE TABLE`` of a table winning (SQLite migrations rebuild tables). Members also bind as their
text through sqlite3 (psycopg2 and psycopg 3 are exercised by every PostgreSQL lifecycle test).
"""

from __future__ import annotations

import re
import sqlite3
from enum import StrEnum
from pathlib import Path

import pytest

from airflow_provider_etl_craft.engine.actor import ActorKind
from airflow_provider_etl_craft.runs.vocabulary import (
    ATTEMPT_ENDS,
    ENDED_RUN,
    LIVE_ATTEMPT,
    LIVE_SQL,
    AttemptStatus,
    DependencyType,
    GateResult,
    InterventionAction,
    PurgeStatus,
    RunCondition,
    RunStatus,
    SlaStatus,
    TaskRunStatus,
    sql_list,
)

#: Every column that stores an actor's kind.
ACTOR_KIND_COLUMNS = [
    ("AUD_PIPELINES_RUN_LOG", "STARTED_BY_KIND"),
    ("AUD_PIPELINES_RUN_LOG", "ENDED_BY_KIND"),
    ("AUD_PIPELINE_PAUSES", "PAUSED_BY_KIND"),
    ("AUD_PIPELINE_PAUSES", "RESUMED_BY_KIND"),
    ("AUD_RUN_INTERVENTIONS", "REQUESTED_BY_KIND"),
    ("AUD_TASK_ATTEMPTS", "REQUESTED_BY_KIND"),
    ("AUD_ENGINE_PURGES", "REQUESTED_BY_KIND"),
]
SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
_CREATE = re.compile(r"CREATE TABLE (\w+) \((.*?)\n\);", re.DOTALL)
_VALUES = re.compile(r"^\s*(\w+)\s[^\n]*?(?:\n\s+)?CHECK \(\1 IN \(([^)]*)\)\)", re.MULTILINE)


def check_values(dialect: str) -> dict[tuple[str, str], set[str]]:
    """``(table, column) -> values`` of every ``CHECK (COLUMN IN (...))`` of the dialect's latest schema."""
    files = [SQL_DIR / dialect / "schema.sql", *sorted((SQL_DIR / dialect / "migrations").glob("*.sql"))]
    tables: dict[str, str] = {}
    for path in files:
        for table, body in _CREATE.findall(path.read_text()):
            tables[table.upper()] = body
    found = {}
    for table, body in tables.items():
        for column, values in _VALUES.findall(body):
            found[(table, column.upper())] = {v.strip().strip("'") for v in values.split(",")}
    return found


#: Each enum, the schema column whose CHECK lists its members, and members the schema does not store.
DECLARED: list[tuple[type[StrEnum], tuple[str, str], set[str]]] = [
    (RunStatus, ("AUD_PIPELINES_RUN_LOG", "STATUS"), set()),
    (TaskRunStatus, ("AUD_TASK_RUN_LOG", "STATUS"), set()),
    (AttemptStatus, ("AUD_TASK_ATTEMPTS", "STATUS"), set()),
    (InterventionAction, ("AUD_RUN_INTERVENTIONS", "ACTION"), set()),
    (GateResult, ("AUD_GATE_DECISIONS", "RESULT"), {"WAIT"}),
    (DependencyType, ("CFG_TASK_DEPENDENCY", "DEPENDENCY_TYPE"), set()),
    (DependencyType, ("CFG_PIPELINE_DEPENDENCY", "DEPENDENCY_TYPE"), set()),
    (RunCondition, ("CFG_TASKS", "RUN_CONDITION"), set()),
    (PurgeStatus, ("AUD_ENGINE_PURGES", "STATUS"), {"DRY_RUN"}),
    (SlaStatus, ("AUD_PIPELINES_RUN_LOG", "SLA_STATUS"), set()),
    *[(ActorKind, column, set()) for column in ACTOR_KIND_COLUMNS],
]


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
@pytest.mark.parametrize(
    ("enum", "column", "unstored"), DECLARED, ids=[f"{e.__name__}-{c[0]}.{c[1]}" for e, c, _ in DECLARED]
)
def test_each_status_enum_has_exactly_the_values_of_its_check_constraint(
    dialect: str, enum: type[StrEnum], column: tuple[str, str], unstored: set[str]
) -> None:
    found = check_values(dialect)
    assert column in found, sorted(found)
    assert {m.value for m in enum} - unstored == found[column]


def test_derived_sets_are_members_of_their_enums() -> None:
    assert set(LIVE_ATTEMPT) == {"QUEUED", "CLAIMED", "RUNNING"}
    assert LIVE_SQL == "('QUEUED', 'CLAIMED', 'RUNNING')"
    assert sql_list(ENDED_RUN) == "('SUCCESS', 'FAILED', 'SKIPPED', 'CANCELLED')"
    assert {a for a, _ in ATTEMPT_ENDS.values()} <= set(AttemptStatus)
    assert {t for _, t in ATTEMPT_ENDS.values()} <= set(TaskRunStatus)


def test_a_member_is_its_text_in_comparisons_formatting_and_sqlite3_bindings() -> None:
    member = RunStatus.IN_PROGRESS
    assert member == "IN-PROGRESS" and f"{member}" == "IN-PROGRESS" and hash(member) == hash("IN-PROGRESS")
    with sqlite3.connect(":memory:") as conn:
        assert conn.execute("SELECT ?, typeof(?)", (member, member)).fetchone() == ("IN-PROGRESS", "text")
