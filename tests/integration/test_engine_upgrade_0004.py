"""ENGINE 0004 upgrades an Engine DB at 0003 in place, on both dialects (docs/etl-craft-parity.md, "Engine DB
schema"): the shared CFG_ tables take etl-craft's rules, OUTPUT_REVISION starts at 1 and RUN_DATE is a date.

Every table holds rows before the upgrade and keeps them; rows that break a new rule stop it with the list
and leave the DB as it was; and the upgraded schema is the one a fresh init-db creates.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.engine.schema import (
    SCHEMA_VERSION,
    apply_adoption_step,
    checksum,
    finish_adoption_steps,
    packaged_migrations,
    packaged_versions,
    schema_text,
)
from airflow_provider_etl_craft.engine.shared import adoption_steps
from airflow_provider_etl_craft.errors import MigrationError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs.identity import RunIdentity
from harness.engines import EngineSetup, engine_rows, pg_profile_yaml, write_config

PREVIOUS = ("0002_map_index.sql", "0003_claim_finish_functions.sql")
NEW = "0004_cfg_semantics.sql"
#: ENGINE migrations after 0004, which ``migrate`` applies after it.
LATER = tuple(v for v in packaged_versions("sqlite") if v > NEW)

#: Every Engine table but the ledger, with its key.
TABLES = {
    "CFG_PIPELINES": "PIPELINE_ID", "CFG_PIPELINE_DEPENDENCY": "PIPELINE_DEPENDENCY_ID", "CFG_TASKS": "TASK_ID",
    "CFG_TASK_DEPENDENCY": "TASK_DEPENDENCY_ID", "CFG_TASK_PARAMETERS": "TASK_PARAMETER_ID",
    "AUD_PIPELINES_RUN_LOG": "PIPELINE_RUN_ID", "AUD_TASK_RUN_LOG": "TASK_RUN_ID", "AUD_TASK_ATTEMPTS": "ATTEMPT_ID",
    "AUD_GATE_DECISIONS": "DECISION_ID", "AUD_DEPENDENCY_CONSUMPTION": "CONSUMPTION_ID",
    "AUD_PIPELINE_PAUSES": "PIPELINE_PAUSE_ID", "AUD_RUN_INTERVENTIONS": "INTERVENTION_ID",
}  # fmt: skip


def _pipeline(code: str, name: str, refresh: str, active: str = "Y") -> str:
    return (f"INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, ACTIVE_FLAG, CREATED_BY) "
            f"VALUES ('{code}', {name}, {refresh}, '{active}', 't')")  # fmt: skip


def _task(pipeline: str, code: str, kind: str, handler: str, extra: str = "NULL") -> str:
    return (f"INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, RUN_CONDITION) SELECT '{code}', "
            f"{kind}, PIPELINE_ID, {handler}, {extra} FROM CFG_PIPELINES WHERE PIPELINE_CODE = '{pipeline}'")  # fmt: skip


def _edge(down: str, up: str, kind: str, more: str = "", values: str = "") -> str:
    """A pipeline edge; ``more``/``values`` add columns (CONSUME_REPAIRS, ACTIVE_FLAG)."""
    return (f"INSERT INTO CFG_PIPELINE_DEPENDENCY (PIPELINE_ID, DEPENDS_ON_PIPELINE_ID, DEPENDENCY_TYPE{more}) "
            f"SELECT d.PIPELINE_ID, u.PIPELINE_ID, '{kind}'{values} FROM CFG_PIPELINES d, CFG_PIPELINES u "
            f"WHERE d.PIPELINE_CODE = '{down}' AND u.PIPELINE_CODE = '{up}'")  # fmt: skip


CROSS_TASK_EDGE = (
    "INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_PIPELINE_ID, DEPENDS_ON_TASK_ID, "
    "DEPENDENCY_TYPE) SELECT t.PIPELINE_ID, t.TASK_ID, u.PIPELINE_ID, u.TASK_ID, 'HAS_DATA' FROM CFG_TASKS t, "
    "CFG_TASKS u WHERE t.TASK_CODE = 'USE' AND u.TASK_CODE = 'LOAD'"
)

# Rows in every table, as the release at ENGINE 0003 wrote them (or a team's PROJECT migrations did): edges that
# took the old CONSUME_REPAIRS default 'N' and DEPENDENCY_TYPE default 'SUCCESS', a retired twin of an active
# edge, runs whose RUN_DATE is a timestamp (one given with a +05:00 offset: its UTC date is the day before its
# local one), and a deleted newest run (its id is never handed out again).
SEED = [
    _pipeline("UP", "'Upstream'", "'FULL'"),
    _pipeline("DOWN", "'Downstream'", "'INCREMENTAL'"),
    _pipeline("OLD", "'Old'", "'FULL'", active="N"),
    _task("UP", "LOAD", "'ETL'", "'SQL'"),
    _task("DOWN", "USE", "'ETL'", "'PYTHON'"),
    _task("DOWN", "MORE", "'INGESTION'", "'PYTHON'", "'ANY'"),
    _edge("DOWN", "UP", "SUCCESS"),
    _edge("DOWN", "UP", "SUCCESS", ", ACTIVE_FLAG", ", 'N'"),
    _edge("DOWN", "UP", "FAILURE", ", CONSUME_REPAIRS", ", 'Y'"),
    "INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_TASK_ID) SELECT t.PIPELINE_ID, t.TASK_ID, "
    "u.TASK_ID FROM CFG_TASKS t, CFG_TASKS u WHERE t.TASK_CODE = 'MORE' AND u.TASK_CODE = 'USE'",
    CROSS_TASK_EDGE,
    "INSERT INTO CFG_TASK_PARAMETERS (TASK_ID, PARAMETER_NAME, PARAMETER_VALUE) SELECT TASK_ID, 'source_table', "
    "'raw_orders' FROM CFG_TASKS WHERE TASK_CODE = 'LOAD'",
    "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, START_DATE, END_DATE, STATUS, RUN_DATE, RUN_KEY, TRIGGER_KIND) "
    "SELECT PIPELINE_ID, '2026-01-02T23:40:00.000Z', '2026-01-02T23:50:00.000Z', 'SUCCESS', "
    "'2026-01-02T23:30:00.000Z', 'airflow:up:r1', 'ORCHESTRATOR' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'UP'",
    "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, START_DATE, STATUS, RUN_DATE, RUN_KEY, TRIGGER_KIND) "
    "SELECT PIPELINE_ID, '2026-01-03T00:10:00.000Z', 'SUCCESS', '2026-01-03T01:00:00+05:00', 'airflow:down:r1', "
    "'ORCHESTRATOR' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'DOWN'",
    "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, STATUS, RUN_KEY) SELECT PIPELINE_ID, 'FAILED', 'airflow:up:r2' "
    "FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'UP'",
    "DELETE FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = 3",
    "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, STATUS, ATTEMPT_COUNT, ROWS_WRITTEN) "
    "SELECT TASK_ID, 1, 'SUCCESS', 1, 5 FROM CFG_TASKS WHERE TASK_CODE = 'LOAD'",
    "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, STATUS, ATTEMPT_COUNT) "
    "SELECT TASK_ID, 2, 'SUCCESS', 1 FROM CFG_TASKS WHERE TASK_CODE = 'USE'",
    "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, STATUS, OWNER_ID, ROWS_WRITTEN) "
    "VALUES (1, 1, 'SUCCESS', 'h:1:a', 5)",
    "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, MAP_INDEX, STATUS) VALUES (2, 1, 0, 'SUCCESS')",
    "INSERT INTO AUD_GATE_DECISIONS (PIPELINE_RUN_ID, PIPELINE_DEPENDENCY_ID, SELECTED_PIPELINE_RUN_ID, "
    "SELECTED_REVISION, RESULT, REASON) VALUES (2, 1, 1, 0, 'SATISFIED', 'upstream succeeded')",
    "INSERT INTO AUD_DEPENDENCY_CONSUMPTION (PIPELINE_DEPENDENCY_ID, PIPELINE_ID, PIPELINE_RUN_ID, "
    "DEPENDS_ON_PIPELINE_ID, CONSUMED_PIPELINE_RUN_ID, CONSUMED_REVISION) SELECT 1, d.PIPELINE_ID, 2, u.PIPELINE_ID, "
    "1, 0 FROM CFG_PIPELINES d, CFG_PIPELINES u WHERE d.PIPELINE_CODE = 'DOWN' AND u.PIPELINE_CODE = 'UP'",
    "INSERT INTO AUD_PIPELINE_PAUSES (PIPELINE_ID, PAUSED_BY, PAUSED_BY_KIND, REASON, RESUMED_AT, RESUMED_BY) "
    "SELECT PIPELINE_ID, 'ops', 'HUMAN', 'maintenance', '2026-01-01T10:00:00.000Z', 'ops' FROM CFG_PIPELINES "
    "WHERE PIPELINE_CODE = 'OLD'",
    "INSERT INTO AUD_RUN_INTERVENTIONS (PIPELINE_ID, PIPELINE_RUN_ID, ACTION, FROM_STATUS, TO_STATUS, REASON, "
    "REQUESTED_BY, REQUESTED_BY_KIND) SELECT PIPELINE_ID, 1, 'MARK', 'FAILED', 'SUCCESS', 'fixed by hand', 'ops', "
    "'HUMAN' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'UP'",
]
#: The UTC dates of the seeded RUN_DATE timestamps, by run id.
RUN_DATES = {1: date(2026, 1, 2), 2: date(2026, 1, 2)}

# Rows a team may have written at 0003 that etl-craft's rules refuse: each is listed by the stopped migrate.
OFFENDING = [
    (_pipeline("NO_NAME", "NULL", "'FULL'"), "PIPELINE_NAME is required", "PIPELINE_ID=4 PIPELINE_CODE=NO_NAME"),
    (_pipeline("NO_REFRESH", "'n'", "NULL"), "REFRESH_TYPE is required", "PIPELINE_ID=5 PIPELINE_CODE=NO_REFRESH"),
    (_task("UP", "NO_KIND", "NULL", "'SQL'"), "TASK_TYPE is required", "TASK_ID=4 PIPELINE_ID=1 TASK_CODE=NO_KIND"),
    (_task("UP", "NO_HANDLER", "'ETL'", "NULL"), "HANDLER is required", "TASK_ID=5 PIPELINE_ID=1 TASK_CODE=NO_HANDLER"),
    (_edge("DOWN", "UP", "SUCCESS"), "CFG_PIPELINE_DEPENDENCY: one ACTIVE row per edge",
     "PIPELINE_DEPENDENCY_ID=1 PIPELINE_ID=2 DEPENDS_ON_PIPELINE_ID=1 DEPENDENCY_TYPE=SUCCESS; "
     "PIPELINE_DEPENDENCY_ID=4 PIPELINE_ID=2 DEPENDS_ON_PIPELINE_ID=1 DEPENDENCY_TYPE=SUCCESS"),
    (CROSS_TASK_EDGE, "CFG_TASK_DEPENDENCY: one ACTIVE row per edge",
     "TASK_DEPENDENCY_ID=2 TASK_ID=2 DEPENDS_ON_PIPELINE_ID=1 DEPENDS_ON_TASK_ID=1 DEPENDENCY_TYPE=HAS_DATA; "
     "TASK_DEPENDENCY_ID=3 TASK_ID=2"),
]  # fmt: skip


def apply_packaged(engine: EngineSetup, version: str) -> None:
    """Apply one packaged ENGINE migration to ``engine`` and ledger it, as ``migrate`` of its release did."""
    dialect = engine.hook().engine
    (text,) = [t for v, t in packaged_migrations(dialect.name) if v == version]
    with closing(dialect.connect()) as conn, dialect.schema_transaction(conn) as cur:
        dialect.execute_script(cur, text)
        cur.execute(
            dialect.sql("INSERT INTO SCHEMA_MIGRATIONS (SOURCE, VERSION, CHECKSUM) VALUES ('ENGINE', ?, ?)"),
            (version, checksum(text)),
        )


def adopt_before(engine: EngineSetup, version: str) -> None:
    """Adopt the etl-craft Engine DB ``engine`` holds with the adoption steps before ``version``, as the release
    that shipped the one before it did."""
    dialect = engine.hook().engine
    with closing(dialect.connect()) as conn, dialect.schema_transaction(conn) as cur:
        for step, text in adoption_steps(dialect.name, SCHEMA_VERSION):
            if step < version:
                apply_adoption_step(dialect, cur, step, text)
        finish_adoption_steps(dialect, cur)


def index_names(engine: EngineSetup) -> set[str]:
    """The Engine DB's index names, upper-cased."""
    if engine.dialect == "sqlite":
        found = engine_rows(engine.hook(), "SELECT name FROM sqlite_master WHERE type = 'index'")
    else:
        found = engine_rows(
            engine.hook(), "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
        )
    return {str(name).upper() for (name,) in found}


def analysed_plan(engine: EngineSetup, sql: str, params: Any = ()) -> str:
    """The plan of ``sql`` on the Engine DB once it is analysed (SQLite's ``EXPLAIN QUERY PLAN`` details or
    PostgreSQL's ``EXPLAIN`` lines), one line each."""
    hook = engine.hook()
    explain = "EXPLAIN QUERY PLAN " if engine.dialect == "sqlite" else "EXPLAIN "
    with closing(hook.engine.connect()) as conn:
        hook.engine.execute(conn, "ANALYZE")
        rows = hook.engine.query(conn, explain + sql, params)
    return "\n".join(str(row[-1] if engine.dialect == "sqlite" else row[0]) for row in rows)


def at_0003(engine: EngineSetup, *more: str) -> None:
    """An Engine DB as the release at ENGINE 0003 left it: the baseline, 0002 and 0003 ledgered, with rows."""
    dialect = engine.hook().engine
    ledger = dialect.sql("INSERT INTO SCHEMA_MIGRATIONS (SOURCE, VERSION, CHECKSUM) VALUES ('ENGINE', ?, ?)")
    earlier = [(v, text) for v, text in packaged_migrations(dialect.name) if v < NEW]
    assert [v for v, _ in earlier] == list(PREVIOUS)
    with closing(dialect.connect(create=True)) as conn, dialect.schema_transaction(conn) as cur:
        for version, text in [(SCHEMA_VERSION, schema_text(dialect.name)), *earlier]:
            dialect.execute_script(cur, text)
            cur.execute(ledger, (version, checksum(text)))
        for statement in [*SEED, *more]:
            cur.execute(statement)


def dump(hook: EngineDBHook, table: str) -> list[dict[str, Any]]:
    with closing(hook.get_conn()) as conn, hook.engine.transaction(conn) as cur:
        cur.execute(f"SELECT * FROM {table} ORDER BY {TABLES.get(table, 'VERSION')}")
        names = [d[0].upper() for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def everything(hook: EngineDBHook) -> dict[str, list[dict[str, Any]]]:
    return {table: dump(hook, table) for table in [*TABLES, "SCHEMA_MIGRATIONS"]}


def cli(engine: EngineSetup, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main([*args, "--config", str(engine.config_path)], out, err), out.getvalue(), err.getvalue()


def engine_versions(hook: EngineDBHook) -> list[str]:
    found = engine_rows(
        hook, "SELECT VERSION FROM SCHEMA_MIGRATIONS WHERE SOURCE = 'ENGINE' ORDER BY VERSION"
    )
    return [v for (v,) in found]


def refused(hook: EngineDBHook, sql: str) -> None:
    with pytest.raises(hook.engine.integrity_error()):
        engine_rows(hook, sql)


# -- what the schema declares, for comparing two Engine DBs ------------------------------------------------------

PG_CATALOG = {
    "columns": "SELECT table_name, column_name, ordinal_position, data_type, is_nullable, column_default "
    "FROM information_schema.columns WHERE table_schema = %s",
    "constraints": "SELECT t.relname, k.conname, pg_get_constraintdef(k.oid) FROM pg_constraint k "
    "JOIN pg_class t ON t.oid = k.conrelid JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = %s",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %s",
    "triggers": "SELECT c.relname, g.tgname, pg_get_triggerdef(g.oid) FROM pg_trigger g JOIN pg_class c "
    "ON c.oid = g.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT g.tgisinternal",
    "functions": "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n "
    "ON n.oid = p.pronamespace WHERE n.nspname = %s",
}


def catalog(setup: EngineSetup) -> dict[str, list[tuple[Any, ...]]]:
    """Every table, column, default, NULL rule, constraint, index, trigger and function of the Engine schema, with
    the schema's own name taken out (two PostgreSQL Engine DBs here are two schemas of one database)."""
    hook = setup.hook()
    schema = hook.engine_profile.schema
    with closing(hook.get_conn()) as conn:
        cur = conn.cursor()
        if setup.dialect == "sqlite":
            cur.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")
            return {"sqlite_master": sorted(tuple(r) for r in cur.fetchall())}
        found = {}
        for what, sql in PG_CATALOG.items():
            cur.execute(sql, (schema,))
            found[what] = sorted(
                tuple(
                    re.sub(rf"\b{re.escape(schema)}\b", "<schema>", v) if isinstance(v, str) else v for v in r
                )
                for r in cur.fetchall()
            )
        return found


@pytest.fixture
def fresh(engine: EngineSetup, make_engine: Callable[..., EngineSetup], tmp_path: Path) -> EngineSetup:
    """A second, empty Engine DB of the same dialect (PostgreSQL: another schema of the same database)."""
    if engine.dialect == "sqlite":
        return make_engine("sqlite", tmp_path / "fresh")
    database: Any = engine.database
    with closing(database.connect()) as conn, conn.cursor() as cur:
        cur.execute("CREATE SCHEMA fresh_engine")
    return EngineSetup(
        "postgresql",
        write_config(tmp_path / "fresh", pg_profile_yaml(database, schema="fresh_engine")),
        engine.env,
        database,
    )


# -- the upgrade ----------------------------------------------------------------------------------------------------


def test_an_engine_db_at_0003_is_upgraded_in_place_keeping_every_row(engine: EngineSetup) -> None:
    at_0003(engine)
    hook = engine.hook()
    before = everything(hook)
    assert all(before[table] for table in TABLES), "every table holds rows before the upgrade"

    status, out, err = cli(engine, "migrate")
    assert (status, err) == (0, ""), err
    assert f"applied ENGINE {NEW}" in out
    after = everything(hook)
    assert engine_versions(hook) == [SCHEMA_VERSION, *PREVIOUS, NEW, *LATER]

    # Every row kept, every value as it was, but RUN_DATE: the UTC date of the timestamp it held.
    assert after["SCHEMA_MIGRATIONS"][: len(before["SCHEMA_MIGRATIONS"])] == before["SCHEMA_MIGRATIONS"]
    for table in TABLES:
        if table != "AUD_PIPELINES_RUN_LOG":
            assert after[table] == before[table], table
    runs = {r["PIPELINE_RUN_ID"]: r for r in after["AUD_PIPELINES_RUN_LOG"]}
    assert {k: {**r, "RUN_DATE": None} for k, r in runs.items()} == {
        r["PIPELINE_RUN_ID"]: {**r, "RUN_DATE": None} for r in before["AUD_PIPELINES_RUN_LOG"]
    }
    assert {k: hook.engine.from_db_date(r["RUN_DATE"]) for k, r in runs.items()} == RUN_DATES
    # Existing edges keep what they hold (the old defaults included); existing runs keep their revisions.
    edges = [
        (e["DEPENDENCY_TYPE"], e["CONSUME_REPAIRS"], e["ACTIVE_FLAG"])
        for e in after["CFG_PIPELINE_DEPENDENCY"]
    ]
    assert edges == [("SUCCESS", "N", "Y"), ("SUCCESS", "N", "N"), ("FAILURE", "Y", "Y")]
    assert [r["OUTPUT_REVISION"] for r in after["AUD_PIPELINES_RUN_LOG"]] == [0, 0]

    # etl-craft's rules hold from now on.
    refused(hook, _pipeline("NAMELESS", "NULL", "'FULL'"))
    refused(hook, "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME) VALUES ('NO_REFRESH', 'n')")
    refused(hook, _task("UP", "UNTYPED", "NULL", "'SQL'"))
    refused(hook, _task("UP", "UNHANDLED", "'ETL'", "NULL"))
    refused(hook, _edge("DOWN", "UP", "SUCCESS"))  # the same active edge again
    refused(hook, CROSS_TASK_EDGE)
    refused(hook, "INSERT INTO CFG_PIPELINE_DEPENDENCY (PIPELINE_ID, DEPENDS_ON_PIPELINE_ID) VALUES (2, 1)")
    engine_rows(hook, _edge("DOWN", "UP", "ALWAYS"))
    assert engine_rows(
        hook, "SELECT CONSUME_REPAIRS FROM CFG_PIPELINE_DEPENDENCY WHERE DEPENDENCY_TYPE = 'ALWAYS'"
    ) == [("Y",)]

    # A new run: the next id (the deleted run 3's is never reused), revision 1, RUN_DATE a date.
    identity = RunIdentity("up", "r3", run_date=datetime(2026, 1, 4, 23, 30, tzinfo=UTC))
    with hook.lifecycle() as lifecycle:
        outcome = lifecycle.claim("UP", identity)
    assert (outcome.action, outcome.pipeline_run_id) == ("CREATED", 4)
    [(revision, run_date)] = engine_rows(
        hook, "SELECT OUTPUT_REVISION, RUN_DATE FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = 4"
    )
    assert (revision, hook.engine.from_db_date(run_date)) == (1, date(2026, 1, 4))
    assert run_date == (date(2026, 1, 4) if engine.dialect == "postgresql" else "2026-01-04")

    # Repeatable: a second migrate applies nothing.
    status, out, _ = cli(engine, "migrate")
    assert status == 0 and "applied ENGINE" not in out


def test_rows_that_break_a_new_rule_stop_the_upgrade_listed_and_nothing_changes(engine: EngineSetup) -> None:
    bad_run_date = engine.dialect == "sqlite"  # PostgreSQL's TIMESTAMPTZ held nothing but timestamps
    more = [statement for statement, _, _ in OFFENDING]
    if bad_run_date:
        more.append("UPDATE AUD_PIPELINES_RUN_LOG SET RUN_DATE = 'last tuesday' WHERE PIPELINE_RUN_ID = 2")
    at_0003(engine, *more)
    hook = engine.hook()
    before, schema_before = everything(hook), catalog(engine)

    status, out, err = cli(engine, "migrate")
    assert status == MigrationError.exit_code, (out, err)
    assert f"ENGINE {NEW} stopped before changing anything" in err
    for _, rule, rows in OFFENDING:
        assert rule in err and rows in err, (rule, rows, err)
    assert ("PIPELINE_RUN_ID=2 RUN_DATE=last tuesday" in err) == bad_run_date
    assert "ACTIVE_FLAG = 'N'" in err and "etl-craft-airflow migrate" in err
    assert "Traceback" not in err
    # Nothing changed: still at 0003, the same rows and the same schema.
    assert engine_versions(hook) == [SCHEMA_VERSION, *PREVIOUS]
    assert everything(hook) == before
    assert catalog(engine) == schema_before

    # Once the rows are fixed (values filled in, duplicates retired), the upgrade goes through.
    for fix in (
        "UPDATE CFG_PIPELINES SET PIPELINE_NAME = 'No name' WHERE PIPELINE_NAME IS NULL",
        "UPDATE CFG_PIPELINES SET REFRESH_TYPE = 'FULL' WHERE REFRESH_TYPE IS NULL",
        "UPDATE CFG_TASKS SET TASK_TYPE = 'ETL' WHERE TASK_TYPE IS NULL",
        "UPDATE CFG_TASKS SET HANDLER = 'SQL' WHERE HANDLER IS NULL",
        "UPDATE CFG_PIPELINE_DEPENDENCY SET ACTIVE_FLAG = 'N' WHERE PIPELINE_DEPENDENCY_ID = 4",
        "UPDATE CFG_TASK_DEPENDENCY SET ACTIVE_FLAG = 'N' WHERE TASK_DEPENDENCY_ID = 3",
        "UPDATE AUD_PIPELINES_RUN_LOG SET RUN_DATE = NULL WHERE PIPELINE_RUN_ID = 2",
    ):
        engine_rows(hook, fix)
    status, out, err = cli(engine, "migrate")
    assert (status, err) == (0, "") and f"applied ENGINE {NEW}" in out


def test_a_fresh_init_db_and_an_upgraded_engine_db_have_the_same_schema(
    engine: EngineSetup, fresh: EngineSetup
) -> None:
    at_0003(engine)
    assert cli(engine, "migrate")[0] == 0
    created = fresh.hook().init_db()
    assert created.created and created.version == ([NEW, *LATER])[-1]
    upgraded, made = catalog(engine), catalog(fresh)
    assert upgraded == made
    if engine.dialect == "sqlite":
        tables = {r[1] for r in made["sqlite_master"] if r[0] == "table"}
    else:
        tables = {r[0] for r in made["columns"]}
    assert {t.upper() for t in tables} >= set(TABLES)
