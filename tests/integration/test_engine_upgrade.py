"""Upgrading an Engine DB made by the first release (ENGINE 0001 only) in place, on both dialects.

The first release's Engine DB is its ``schema.sql`` with its ledger row, plus runs written the way that
release wrote them (no MAP_INDEX). ``migrate`` brings it to the latest schema keeping every row; until then
the run lifecycle refuses to start with an ENGINE_DB error naming the pending migration.
"""

from __future__ import annotations

import io
from contextlib import closing

import pytest

from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.engine.schema import SCHEMA_VERSION, checksum, latest_version, schema_text
from airflow_provider_etl_craft.errors import EngineDBError
from airflow_provider_etl_craft.runs.counts import TaskCounts
from airflow_provider_etl_craft.runs.identity import RunIdentity
from harness.engines import EngineSetup, engine_rows

PENDING = (
    "0002_map_index.sql",
    "0003_claim_finish_functions.sql",
    "0004_cfg_semantics.sql",
    "0005_purge.sql",
    "0006_history_indexes.sql",
    "0007_config_indexes.sql",
)
LATEST = PENDING[-1]

# Runs as the previous release wrote them: a finished run with a retried task and a gate decision on its
# second attempt (a foreign key into AUD_TASK_ATTEMPTS), and a run still IN-PROGRESS with a live attempt.
SEED = [
    "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) VALUES ('UP', 'u', 'FULL', 't')",
    "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) VALUES ('OTHER', 'o', 'FULL', 't')",
    "INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY) SELECT 'LOAD', 'ETL', PIPELINE_ID, "
    "'PYTHON', 't' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'UP'",
    "INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY) SELECT 'FILES', 'ETL', PIPELINE_ID, "
    "'PYTHON', 't' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'OTHER'",
    "INSERT INTO CFG_PIPELINE_DEPENDENCY (PIPELINE_ID, DEPENDS_ON_PIPELINE_ID, DEPENDENCY_TYPE, CREATED_BY) "
    "SELECT d.PIPELINE_ID, u.PIPELINE_ID, 'SUCCESS', 't' FROM CFG_PIPELINES d, CFG_PIPELINES u "
    "WHERE d.PIPELINE_CODE = 'OTHER' AND u.PIPELINE_CODE = 'UP'",
    "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, STATUS, RUN_KEY, TRIGGER_KIND) SELECT PIPELINE_ID, 'SUCCESS', "
    "'airflow:d:r1', 'ORCHESTRATOR' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'UP'",
    "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, STATUS, ATTEMPT_COUNT, ROWS_WRITTEN) "
    "SELECT TASK_ID, 1, 'SUCCESS', 2, 5 FROM CFG_TASKS WHERE TASK_CODE = 'LOAD'",
    "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, STATUS, OWNER_ID, HOST, PID, ERROR_MESSAGE) "
    "VALUES (1, 1, 'FAILED', 'h:1:a', 'h', 1, 'RuntimeError: boom')",
    "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, STATUS, OWNER_ID, HOST, PID, ROWS_WRITTEN) "
    "VALUES (1, 2, 'SUCCESS', 'h:2:b', 'h', 2, 5)",
    "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, STATUS, RUN_KEY, TRIGGER_KIND) SELECT PIPELINE_ID, 'IN-PROGRESS', "
    "'airflow:o:r1', 'ORCHESTRATOR' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'OTHER'",
    "INSERT INTO AUD_GATE_DECISIONS (PIPELINE_RUN_ID, ATTEMPT_ID, PIPELINE_DEPENDENCY_ID, SELECTED_PIPELINE_RUN_ID, "
    "RESULT, REASON) VALUES (2, 2, 1, 1, 'SATISFIED', 'upstream succeeded')",
    "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, STATUS, ATTEMPT_COUNT) "
    "SELECT TASK_ID, 2, 'IN-PROGRESS', 1 FROM CFG_TASKS WHERE TASK_CODE = 'FILES'",
    "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, STATUS, OWNER_ID) VALUES (2, 1, 'RUNNING', 'h:3:c')",
]
TABLES = ("CFG_PIPELINES", "CFG_TASKS", "CFG_PIPELINE_DEPENDENCY", "AUD_PIPELINES_RUN_LOG", "AUD_TASK_RUN_LOG",
          "AUD_TASK_ATTEMPTS", "AUD_GATE_DECISIONS")  # fmt: skip


def previous_release(engine: EngineSetup) -> None:
    """An Engine DB as the previous release's init-db left it, with its runs."""
    hook = engine.hook()
    dialect = hook.engine
    text = schema_text(dialect.name)
    with closing(dialect.connect(create=True)) as conn, dialect.transaction(conn) as cur:
        dialect.execute_script(cur, text)
        cur.execute(dialect.sql("INSERT INTO SCHEMA_MIGRATIONS (SOURCE, VERSION, CHECKSUM) VALUES ('ENGINE', ?, ?)"),
                    (SCHEMA_VERSION, checksum(text)))  # fmt: skip
        for statement in SEED:
            cur.execute(statement)


def dump(engine: EngineSetup, table: str, columns: str = "*") -> list[tuple]:
    hook = engine.hook()
    with closing(hook.get_conn()) as conn:
        key = {"AUD_TASK_ATTEMPTS": "ATTEMPT_ID", "AUD_GATE_DECISIONS": "DECISION_ID"}.get(table, "1")
        return [tuple(r) for r in hook.engine.query(conn, f"SELECT {columns} FROM {table} ORDER BY {key}")]


def columns(engine: EngineSetup, table: str) -> list[str]:
    hook = engine.hook()
    with closing(hook.get_conn()) as conn:
        cur = conn.cursor()
        cur.execute(f"SELECT * FROM {hook.engine_profile.schema}.{table} WHERE 1 = 0")
        return [d[0].upper() for d in cur.description]


def cli(engine: EngineSetup, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main([*args, "--config", str(engine.config_path)], out, err), out.getvalue(), err.getvalue()


def test_an_engine_db_of_the_previous_release_is_migrated_in_place(engine: EngineSetup) -> None:
    previous_release(engine)
    old_columns = {t: columns(engine, t) for t in TABLES}
    before = {t: dump(engine, t) for t in TABLES}
    assert "MAP_INDEX" not in old_columns["AUD_TASK_ATTEMPTS"]

    # Until migrate runs, the lifecycle stops with what to do, and init-db says what is pending.
    identity = RunIdentity("d", "r2")
    with engine.hook().lifecycle() as lifecycle, pytest.raises(EngineDBError) as refused:
        lifecycle.claim("UP", identity)
    assert f"needs ENGINE migration {', '.join(PENDING)}" in str(refused.value)
    assert "etl-craft-airflow migrate" in str(refused.value)
    result = engine.hook().init_db()
    assert not result.created and f"ENGINE migration {', '.join(PENDING)} is pending" in result.message

    status, out, err = cli(engine, "migrate")
    assert (status, err) == (0, ""), err
    assert all(f"applied ENGINE {version}" in out for version in PENDING)

    # Every row kept as it was; the new column is NULL (unmapped) for all of them.
    after = {t: dump(engine, t, ", ".join(old_columns[t])) for t in TABLES}
    assert after == before
    assert dump(engine, "AUD_TASK_ATTEMPTS", "MAP_INDEX") == [(None,)] * 3
    assert columns(engine, "AUD_TASK_ATTEMPTS") == [*old_columns["AUD_TASK_ATTEMPTS"], "MAP_INDEX"]
    ledger = dump(engine, "SCHEMA_MIGRATIONS", "SOURCE, VERSION")
    assert sorted(ledger) == [("ENGINE", SCHEMA_VERSION), *(("ENGINE", version) for version in PENDING)]
    assert latest_version(engine.hook().engine.name) == LATEST

    # Repeatable: a second migrate applies nothing and changes nothing.
    status, out, _ = cli(engine, "migrate")
    assert status == 0 and "applied ENGINE" not in out
    assert {t: dump(engine, t, ", ".join(old_columns[t])) for t in TABLES} == before

    # The new rules hold: one live attempt per task run and map index, and the migrated DB is used as is.
    with engine.hook().lifecycle() as lifecycle:
        assert lifecycle.claim("UP", identity).action == "CREATED"
        first = lifecycle.start_task("UP", "LOAD", identity, 1, map_index=0)
        second = lifecycle.start_task("UP", "LOAD", identity, 1, map_index=1)
        assert first.task_run_id == second.task_run_id
        lifecycle.finish_task(first, "SUCCESS", TaskCounts(rows_written=2), map_count=2)
        lifecycle.finish_task(second, "SUCCESS", TaskCounts(rows_written=3), map_count=2)
        outcome = lifecycle.finish_run("UP", identity, {}, {"LOAD": {0: "success", 1: "success"}})
    assert outcome.status == "SUCCESS"
    assert dump(engine, "AUD_TASK_RUN_LOG", "STATUS, ATTEMPT_COUNT, ROWS_WRITTEN")[-1] == ("SUCCESS", 2, 5)
    hook = engine.hook()
    with pytest.raises(hook.engine.integrity_error()):
        engine_rows(
            hook,
            "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, MAP_INDEX, STATUS) VALUES (2, 2, NULL, 'RUNNING')",
        )
    engine_rows(
        hook,
        "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, MAP_INDEX, STATUS) VALUES (2, 1, 0, 'RUNNING')",
    )


def test_a_fresh_init_db_creates_the_latest_schema_in_one_step(engine: EngineSetup) -> None:
    result = engine.hook().init_db()
    assert result.created and result.version == LATEST
    assert sorted(dump(engine, "SCHEMA_MIGRATIONS", "SOURCE, VERSION")) == [
        ("ENGINE", SCHEMA_VERSION),
        *(("ENGINE", version) for version in PENDING),
    ]
    assert "MAP_INDEX" in columns(engine, "AUD_TASK_ATTEMPTS")
    status, out, _ = cli(engine, "migrate")
    assert status == 0 and "applied ENGINE" not in out and f"already at {LATEST}" in out
