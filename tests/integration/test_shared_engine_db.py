"""An Engine DB that etl-craft made, shared with the provider (docs/etl-craft-parity.md, "Sharing an Engine
DB"), on both dialects: recognised and adopted without changing a row of etl-craft's, a second init-db or
migrate a no-op, etl-craft's ledger still acceptable to etl-craft's migrate, the provider's writes passing
etl-craft's guards (which still refuse a write without the actor marker), a pipeline run end to end, and
dependency gates across the two tools in both directions."""

from __future__ import annotations

import io
import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.engine.actor import acting_as
from airflow_provider_etl_craft.engine.schema import SCHEMA_VERSION, current_marks, packaged_versions
from airflow_provider_etl_craft.engine.shared import PROVIDER_LEDGER
from airflow_provider_etl_craft.errors import EngineDBError
from airflow_provider_etl_craft.runs import RunIdentity, TaskCounts
from harness.engines import EngineSetup, engine_rows
from tests.fixtures.etl_craft_made import (
    ADDED_INDEXES,
    ETL_CRAFT_VERSIONS,
    added_indexes,
    build,
    counts,
    etl_craft_connection,
    run,
    shape,
    without_added,
)


@pytest.fixture
def shared(engine: EngineSetup) -> EngineSetup:
    """The profile's Engine DB, made by etl-craft's init-db and holding etl-craft's history."""
    build(engine)
    return engine


def ledger(setup: EngineSetup) -> list[tuple[Any, ...]]:
    with etl_craft_connection(setup) as conn:
        return run(
            conn, setup.dialect, "SELECT SOURCE, VERSION, CHECKSUM FROM SCHEMA_MIGRATIONS ORDER BY 1, 2"
        )


def etl_craft_migrate_accepts(setup: EngineSetup, project: Path | None = None) -> None:
    """etl-craft's migrate checks every ledger row before it applies anything: an ENGINE row must be one of
    its packaged files, a PROJECT row a file of the project folder with the same SHA-256."""
    import hashlib

    files = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (project.glob("*.sql") if project else [])
    }
    for source, version, digest in ledger(setup):
        if source == "ENGINE":
            assert version in ETL_CRAFT_VERSIONS, f"etl-craft's migrate would refuse ENGINE row {version}"
        else:
            assert files.get(version) == digest, f"etl-craft's migrate would refuse PROJECT row {version}"


def cli(setup: EngineSetup, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main([*args, "--config", str(setup.config_path)], out, err)
    return status, out.getvalue(), err.getvalue()


def test_init_db_adopts_an_etl_craft_engine_db_and_keeps_every_row(shared: EngineSetup) -> None:
    before, etl_craft_ledger, tables = counts(shared), ledger(shared), shape(shared)
    status, out, err = cli(shared, "check")
    assert status != 0 and "was made by etl-craft and this provider has not adopted it yet" in out, (out, err)
    ok, message = shared.hook().test_connection()
    assert not ok and "has not adopted it yet" in message, message
    not_adopted = "was made by etl-craft and this provider has not adopted it yet"
    with pytest.raises(EngineDBError, match=not_adopted), shared.hook().lifecycle() as lc:
        lc.claim("DOWN", RunIdentity("down_dag", "r0"))

    result = shared.hook().init_db()
    assert result.created and result.shared and "was made by etl-craft: adopted" in result.message
    assert counts(shared) == before  # not one row of etl-craft's added, changed or removed
    assert ledger(shared) == etl_craft_ledger
    adopted = shape(shared)
    added = adopted["AUD_TASK_ATTEMPTS"]["columns"][len(tables["AUD_TASK_ATTEMPTS"]["columns"]) :]
    assert [c[0].upper() for c in added] == ["MAP_INDEX"]  # the one column adoption adds, at the end
    adopted["AUD_TASK_ATTEMPTS"]["columns"] = adopted["AUD_TASK_ATTEMPTS"]["columns"][: -len(added)]
    assert added_indexes(tables, adopted) == ADDED_INDEXES  # and the indexes of ENGINE 0006 and 0007
    adopted = without_added(adopted)
    assert adopted == tables  # every other column, type, default and index of etl-craft's as it was
    provider = engine_rows(shared.hook(), f"SELECT VERSION FROM {PROVIDER_LEDGER} ORDER BY VERSION")
    assert [v for (v,) in provider] == [SCHEMA_VERSION, *packaged_versions(shared.dialect)]
    etl_craft_migrate_accepts(shared)

    again = shared.hook().init_db()
    assert not again.created and "nothing changed" in again.message
    migrated = shared.hook().migrate(None)
    assert migrated.applied == [] and not migrated.init.created
    assert counts(shared) == before and ledger(shared) == etl_craft_ledger
    status, out, _ = cli(shared, "check")
    assert status == 0 and "migrations: none pending" in out, out


def test_migrate_adopts_too_and_shares_project_migrations(shared: EngineSetup, tmp_path: Path) -> None:
    """A project migration the provider applies is recorded as etl-craft records its own: a PROJECT row that
    etl-craft's migrate accepts, its CFG_ rows stamped by etl-craft's audit trigger with the file's name."""
    before = counts(shared)
    project = tmp_path / "project-migrations"
    project.mkdir()
    (project / "0001_more.sql").write_text(
        "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE) VALUES ('MORE', 'More', 'FULL');\n",
        encoding="utf-8",
    )
    result = shared.hook().migrate(project)
    assert result.init.created and result.applied == ["PROJECT 0001_more.sql"]
    after = counts(shared)
    assert after["CFG_PIPELINES"] == before["CFG_PIPELINES"] + 1
    assert after["AUD_METADATA_CHANGES"] == before["AUD_METADATA_CHANGES"] + 1
    assert after["SCHEMA_MIGRATIONS"] == before["SCHEMA_MIGRATIONS"] + 1
    assert {
        k: v
        for k, v in after.items()
        if k not in ("CFG_PIPELINES", "AUD_METADATA_CHANGES", "SCHEMA_MIGRATIONS")
    } == {
        k: v
        for k, v in before.items()
        if k not in ("CFG_PIPELINES", "AUD_METADATA_CHANGES", "SCHEMA_MIGRATIONS")
    }
    etl_craft_migrate_accepts(shared, project)
    [(created_by, actor, kind, migration)] = engine_rows(
        shared.hook(),
        "SELECT p.CREATED_BY, c.ACTOR, c.ACTOR_KIND, c.MIGRATION FROM CFG_PIPELINES p JOIN AUD_METADATA_CHANGES c "
        "ON c.TABLE_NAME = 'CFG_PIPELINES' AND c.ROW_KEY = CAST(p.PIPELINE_ID AS VARCHAR) WHERE p.PIPELINE_CODE = 'MORE'",
    )
    assert (created_by, actor, kind, migration) == (
        "etl-craft-airflow",
        "etl-craft-airflow",
        "SYSTEM",
        "0001_more.sql",
    )
    assert shared.hook().migrate(project).applied == []


def test_etl_craft_guards_refuse_a_write_without_the_actor_after_adoption(shared: EngineSetup) -> None:
    shared.hook().init_db()
    error: type[Exception]
    if shared.dialect == "sqlite":
        error = sqlite3.IntegrityError
    else:
        import psycopg2

        error = psycopg2.Error
    with pytest.raises(error), etl_craft_connection(shared, who=None) as conn:
        run(conn, shared.dialect, "UPDATE AUD_PIPELINES_RUN_LOG SET SLA_STATUS = 'MET'")
    with pytest.raises(error), etl_craft_connection(shared) as conn:  # append-only, even with the marker
        run(conn, shared.dialect, "DELETE FROM AUD_DEPENDENCY_CONSUMPTION")


def test_every_provider_transaction_carries_the_actor_and_nothing_outlives_it(engine: EngineSetup) -> None:
    hook = engine.hook()
    hook.init_db()
    dialect = hook.engine
    with closing(dialect.connect()) as conn:
        if engine.dialect == "sqlite":
            read = (
                "SELECT etl_craft_actor(), etl_craft_actor_kind(), etl_craft_migration(), etl_craft_purpose()"
            )
            assert dialect.query(conn, read) == [("etl-craft-airflow", "SYSTEM", "", "")]
            with acting_as("airflow:d:r", "ORCHESTRATOR", "0001_x.sql"):
                assert dialect.query(conn, read) == [("airflow:d:r", "ORCHESTRATOR", "0001_x.sql", "")]
            return
        read = (
            "SELECT current_setting('etl_craft.actor', true), current_setting('etl_craft.actor_kind', true), "
            "current_setting('etl_craft.migration', true)"
        )
        with acting_as("airflow:d:r", "ORCHESTRATOR"), dialect.transaction(conn) as cur:
            cur.execute(read)
            assert cur.fetchone() == ("airflow:d:r", "ORCHESTRATOR", "")
        with acting_as("alice", "HUMAN"):  # the one-statement form sets it for its own transaction
            assert dialect.execute(conn, read).rows == [("alice", "HUMAN", "")]
        with conn.cursor() as cur:  # the same server session afterwards: nothing is left
            cur.execute(read)
            assert cur.fetchone() in ((None, None, None), ("", "", ""))


def _etl_craft_gate(setup: EngineSetup, pipeline: str, ended_by: str) -> tuple[Any, ...] | None:
    """etl-craft's gate reads (latest_finished_pipeline_run.sql, last_consumed_pipeline_run.sql), as written
    there, on etl-craft's own connection."""
    with etl_craft_connection(setup) as conn:
        latest = run(
            conn,
            setup.dialect,
            "SELECT r.PIPELINE_RUN_ID, r.STATUS, CASE WHEN EXISTS (SELECT 1 FROM AUD_TASK_RUN_LOG t "
            "WHERE t.PIPELINE_RUN_ID = r.PIPELINE_RUN_ID AND t.TARGET_COUNT > 0) THEN 1 ELSE 0 END "
            "FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID "
            "WHERE p.PIPELINE_CODE = ? AND r.STATUS IN ('SUCCESS', 'FAILED', 'SKIPPED', 'CANCELLED') "
            "AND r.END_DATE <= ? AND r.BACKFILL = 'N' ORDER BY r.PIPELINE_RUN_ID DESC LIMIT 1",
            (pipeline, ended_by),
        )
    return latest[0] if latest else None


def _last_consumed(setup: EngineSetup) -> tuple[Any, ...]:
    with etl_craft_connection(setup) as conn:
        return run(
            conn,
            setup.dialect,
            "SELECT CONSUMED_PIPELINE_RUN_ID, CONSUMED_REVISION FROM AUD_DEPENDENCY_CONSUMPTION "
            "WHERE PIPELINE_DEPENDENCY_ID = (SELECT PIPELINE_DEPENDENCY_ID FROM CFG_PIPELINE_DEPENDENCY) "
            "ORDER BY CONSUMPTION_ID DESC LIMIT 1",
        )[0]


def _now_as_etl_craft_writes(setup: EngineSetup) -> Any:
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%d %H:%M:%S.%f") + "+00:00" if setup.dialect == "sqlite" else now


def test_a_pipeline_runs_after_adoption_and_gates_work_across_the_tools(
    shared: EngineSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared.hook().init_db()
    hook = shared.hook()
    answers: list[
        Any
    ] = []  # what the one-statement forms answered (PostgreSQL): they wrote through the guards
    if shared.dialect == "postgresql":
        from airflow_provider_etl_craft.engine.dialects.postgresql import PostgresDialect

        for name in ("call_at_once", "write_at_once"):
            real = getattr(PostgresDialect, name)

            def spy(self: Any, *args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
                answer = seen = _real(self, *args, **kwargs)
                if _name == "write_at_once" and answer is not None:  # an end (it notifies): its row count
                    _name, seen = (
                        ("end", answer.rowcount) if args[1].notifies else ("start", answer.rows or None)
                    )
                answers.append((_name, seen[0] if isinstance(seen, tuple) else seen))
                return answer

            monkeypatch.setattr(PostgresDialect, name, spy)
    if shared.dialect == "postgresql":  # the one-call claim and finish act here (their schema check passes)
        versions, tables = current_marks("postgresql")
        assert engine_rows(hook, "SELECT ETL_CRAFT_SCHEMA_IS_CURRENT(?, ?)", (versions, tables)) == [(True,)]
    (up_run_2,) = engine_rows(
        hook, "SELECT PIPELINE_RUN_ID FROM AUD_PIPELINES_RUN_LOG WHERE RUN_KEY = 'schedule:up:2'"
    )[0]
    with hook.lifecycle(lock_timeout=30) as lc:
        # The provider downstream of an etl-craft-recorded upstream run: SATISFIED once …
        who = RunIdentity("down_dag", "run_1", run_date=datetime(2026, 1, 4, tzinfo=UTC))
        outcome = lc.claim("DOWN", who)
        assert outcome.action == "CREATED", outcome
        handle = lc.start_task("DOWN", "X", who, 1)
        lc.finish_task(handle, "SUCCESS", TaskCounts(target_count=3, rows_written=3))
        lc.finish_run("DOWN", who, {"X": "success"})
        down_run = outcome.pipeline_run_id
        # … and not again for the same upstream run.
        second = lc.claim("DOWN", RunIdentity("down_dag", "run_2", run_date=datetime(2026, 1, 5, tzinfo=UTC)))
        assert second.action == "SKIPPED", second
        # Pause and resume by a person, then the provider records a run of UP (its one-call forms on PostgreSQL).
        lc.pause("UP", "maintenance", "bob")
        lc.resume("UP", "done", "bob")
        up_who = RunIdentity("up_dag", "run_1", run_date=datetime(2026, 1, 6, tzinfo=UTC))
        assert lc.claim("UP", up_who).action == "CREATED"
        up_handle = lc.start_task("UP", "U1", up_who, 1)
        lc.finish_task(up_handle, "SUCCESS", TaskCounts(target_count=7, rows_written=7))
        lc.finish_run("UP", up_who, {"U1": "success"})

    [decision] = engine_rows(
        hook,
        "SELECT SELECTED_PIPELINE_RUN_ID, SELECTED_REVISION, RESULT FROM AUD_GATE_DECISIONS WHERE PIPELINE_RUN_ID = ?",
        (down_run,),
    )
    assert decision == (up_run_2, 1, "SATISFIED")
    assert _last_consumed(shared) == (up_run_2, 1)  # what etl-craft's gate reads as consumed
    [run_row] = engine_rows(
        hook,
        "SELECT STATUS, STARTED_BY, STARTED_BY_KIND, ENDED_BY, ENDED_BY_KIND, TRIGGER_KIND, OUTPUT_REVISION, BACKFILL "
        "FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = ?",
        (down_run,),
    )
    actor = "airflow:down_dag:run_1"
    assert run_row == ("SUCCESS", actor, "ORCHESTRATOR", actor, "ORCHESTRATOR", "ORCHESTRATOR", 1, "N")
    attempts = engine_rows(
        hook,
        "SELECT a.STATUS, a.REQUESTED_BY, a.REQUESTED_BY_KIND FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG t "
        "ON t.TASK_RUN_ID = a.TASK_RUN_ID WHERE t.PIPELINE_RUN_ID = ?",
        (down_run,),
    )
    assert attempts == [("SUCCESS", actor, "ORCHESTRATOR")]
    [pause] = engine_rows(
        hook,
        "SELECT PAUSED_BY, PAUSED_BY_KIND, RESUMED_BY, RESUMED_BY_KIND FROM AUD_PIPELINE_PAUSES pp JOIN CFG_PIPELINES p "
        "ON p.PIPELINE_ID = pp.PIPELINE_ID WHERE p.PIPELINE_CODE = 'UP'",
    )
    assert pause == ("bob", "HUMAN", "bob", "HUMAN")

    # etl-craft's gate reading the run the provider recorded: the newest finished run of UP, with data.
    [(up_run_3,)] = engine_rows(hook, "SELECT PIPELINE_RUN_ID FROM AUD_PIPELINES_RUN_LOG WHERE RUN_KEY = ?",
                                ("airflow:up_dag:run_1",))  # fmt: skip
    assert _etl_craft_gate(shared, "UP", _now_as_etl_craft_writes(shared)) == (up_run_3, "SUCCESS", 1)
    # … and the provider's next DOWN run is SATISFIED by it.
    with hook.lifecycle(lock_timeout=30) as lc:
        third = lc.claim("DOWN", RunIdentity("down_dag", "run_3", run_date=datetime(2026, 1, 7, tzinfo=UTC)))
    assert third.action == "CREATED", third
    if shared.dialect == "postgresql":
        assert ("call_at_once", "CREATED") in answers and ("call_at_once", "FINISHED") in answers, answers
        assert any(n == "start" and a is not None for n, a in answers), answers
        assert ("end", 1) in answers, answers
