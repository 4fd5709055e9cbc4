"""init-db and migrate on both dialects: idempotence, partial schemas, ordering, checksums, rollback."""

from __future__ import annotations

import hashlib
import io
import re
from contextlib import closing
from pathlib import Path

import pytest

from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.engine.schema import ENGINE_TABLES, SCHEMA_VERSION
from airflow_provider_etl_craft.errors import EngineDBError, MigrationError
from harness.engines import EngineSetup, engine_rows


def rows(setup: EngineSetup, sql: str) -> list[tuple]:
    hook = setup.hook()
    with closing(hook.get_conn()) as conn:
        return hook.engine.query(conn, sql)


def cli(setup: EngineSetup, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main([*args, "--config", str(setup.config_path)], out, err)
    return status, out.getvalue(), err.getvalue()


def write_migrations(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


@pytest.mark.smoke
def test_init_db_twice_changes_nothing_the_second_time(engine: EngineSetup) -> None:
    first = engine.hook().init_db()
    before = rows(engine, "SELECT SOURCE, VERSION, CHECKSUM, APPLIED_AT FROM SCHEMA_MIGRATIONS")
    second = engine.hook().init_db()
    assert first.created and not second.created and "nothing changed" in second.message
    assert rows(engine, "SELECT SOURCE, VERSION, CHECKSUM, APPLIED_AT FROM SCHEMA_MIGRATIONS") == before
    assert before[0][:2] == ("ENGINE", SCHEMA_VERSION)
    assert engine.hook().engine.table_names(engine.hook().get_conn()) >= ENGINE_TABLES
    status, out, _ = cli(engine, "init-db")
    assert status == 0 and "already at" in out


def test_init_db_refuses_a_partial_engine_schema(engine: EngineSetup) -> None:
    hook = engine.hook()
    schema = hook.engine_profile.schema
    hook.engine.connect(create=True).close()  # a SQLite file someone made by hand
    hook.run(f"CREATE TABLE {schema}.CFG_PIPELINES (PIPELINE_ID INTEGER)")
    hook.run(f"CREATE TABLE {schema}.AUD_TASK_RUN_LOG (TASK_RUN_ID INTEGER)")
    with pytest.raises(EngineDBError, match="found AUD_TASK_RUN_LOG, CFG_PIPELINES; missing"):
        hook.init_db()
    status, _, err = cli(engine, "init-db")
    assert status == 12 and err.startswith("error: ") and "CFG_PIPELINES" in err
    assert rows(engine, "SELECT COUNT(*) FROM CFG_PIPELINES") == [(0,)]  # untouched


def test_a_partial_schema_gets_one_verdict_everywhere(engine: EngineSetup) -> None:
    """init-db, check, test_connection, status and a claim all refuse a partial schema with one message."""
    from airflow_provider_etl_craft.runs.identity import RunIdentity

    hook = engine.hook()
    hook.init_db()
    hook.run(f"DROP TABLE {hook.engine_profile.schema}.AUD_RUN_INTERVENTIONS")
    said = "holds only some Engine tables (found AUD_DEPENDENCY_CONSUMPTION"
    with pytest.raises(EngineDBError, match=r"missing AUD_RUN_INTERVENTIONS\); nothing will use") as init:
        engine.hook().init_db()
    ok, message = engine.hook().test_connection()
    assert not ok and message == str(init.value)
    status, out, _ = cli(engine, "check")
    assert status == 1 and f"[FAIL] Engine DB tables: {init.value}\n" in out, out
    status, _, err = cli(engine, "status", "--pipeline", "P")
    assert status == 12 and said in err, err
    identity = RunIdentity("d", "r")
    with engine.hook().lifecycle() as lc, pytest.raises(EngineDBError, match=re.escape(said)):
        lc.claim("P", identity)


def test_init_db_refuses_a_schema_made_by_another_version(engine: EngineSetup) -> None:
    engine.hook().init_db()
    hook = engine.hook()
    engine_rows(hook, "UPDATE SCHEMA_MIGRATIONS SET CHECKSUM = ? WHERE SOURCE = 'ENGINE'", ("0" * 64,))
    with pytest.raises(EngineDBError, match="different etl-craft version"):
        engine.hook().init_db()


@pytest.mark.smoke
def test_migrate_applies_project_files_in_order_with_checksums(engine: EngineSetup, tmp_path: Path) -> None:
    files = {
        "0002_rows.sql": "INSERT INTO T_ORDER (N) VALUES (2);\nINSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE) VALUES ('SALES', 'Sales', 'FULL');\n",
        "0001_table.sql": "-- first\nCREATE TABLE T_ORDER (N INTEGER NOT NULL);\nINSERT INTO T_ORDER (N) VALUES (1);\n",
        "notes.txt": "not a migration",
    }  # fmt: skip
    folder = write_migrations(tmp_path / "migs", files)
    result = engine.hook().migrate(folder)
    assert result.init.created
    assert result.applied == ["PROJECT 0001_table.sql", "PROJECT 0002_rows.sql"]
    assert rows(engine, "SELECT N FROM T_ORDER ORDER BY N") == [(1,), (2,)]
    ledger = rows(
        engine, "SELECT VERSION, CHECKSUM FROM SCHEMA_MIGRATIONS WHERE SOURCE = 'PROJECT' ORDER BY VERSION"
    )
    assert ledger == [
        (name, hashlib.sha256(files[name].encode()).hexdigest())
        for name in ("0001_table.sql", "0002_rows.sql")
    ]
    assert engine.hook().migrate(folder).applied == []  # nothing pending the second time
    status, out, _ = cli(engine, "migrate", "--migrations-dir", str(folder))
    assert status == 0 and "0 migration(s) applied" in out


def test_migrate_finds_migrations_beside_the_config_file(engine: EngineSetup) -> None:
    write_migrations(
        engine.config_path.parent / "migrations", {"0001_t.sql": "CREATE TABLE BESIDE (X INTEGER);\n"}
    )
    status, out, _ = cli(engine, "migrate")
    assert status == 0 and "applied PROJECT 0001_t.sql" in out


def test_migrate_refuses_before_applying_anything_when_an_applied_file_was_edited(
    engine: EngineSetup, tmp_path: Path
) -> None:
    folder = write_migrations(tmp_path / "migs", {"0001_a.sql": "CREATE TABLE A1 (X INTEGER);\n"})
    engine.hook().migrate(folder)
    write_migrations(folder, {"0001_a.sql": "CREATE TABLE A1 (X INTEGER, Y INTEGER);\n",
                              "0002_b.sql": "CREATE TABLE B2 (X INTEGER);\n"})  # fmt: skip
    with pytest.raises(MigrationError, match=r"PROJECT 0001_a\.sql was edited after it was applied"):
        engine.hook().migrate(folder)
    assert "B2" not in engine.hook().engine.table_names(engine.hook().get_conn())
    status, _, err = cli(engine, "migrate", "--migrations-dir", str(folder))
    assert status == 13 and err.count("error:") == 1


def test_migrate_refuses_when_an_applied_file_was_removed(engine: EngineSetup, tmp_path: Path) -> None:
    folder = write_migrations(tmp_path / "migs", {"0001_a.sql": "CREATE TABLE A1 (X INTEGER);\n"})
    engine.hook().migrate(folder)
    (folder / "0001_a.sql").unlink()
    with pytest.raises(MigrationError, match="its file is gone"):
        engine.hook().migrate(folder)


def test_migrate_refuses_a_new_file_that_sorts_before_an_applied_one(
    engine: EngineSetup, tmp_path: Path
) -> None:
    folder = write_migrations(tmp_path / "migs", {"0002_b.sql": "CREATE TABLE B2 (X INTEGER);\n"})
    engine.hook().migrate(folder)
    write_migrations(folder, {"0001_a.sql": "CREATE TABLE A1 (X INTEGER);\n"})
    with pytest.raises(MigrationError, match="sorts before already applied 0002_b.sql"):
        engine.hook().migrate(folder)


def test_a_failing_migration_rolls_back_with_its_ledger_row(engine: EngineSetup, tmp_path: Path) -> None:
    folder = write_migrations(tmp_path / "migs", {
        "0001_ok.sql": "CREATE TABLE OK1 (X INTEGER);\n",
        "0002_bad.sql": "CREATE TABLE HALF (X INTEGER);\nINSERT INTO NO_SUCH_TABLE VALUES (1);\n",
    })  # fmt: skip
    with pytest.raises(MigrationError, match=r"0002_bad\.sql failed and was rolled back"):
        engine.hook().migrate(folder)
    tables = engine.hook().engine.table_names(engine.hook().get_conn())
    assert "OK1" in tables and "HALF" not in tables
    assert rows(engine, "SELECT VERSION FROM SCHEMA_MIGRATIONS WHERE SOURCE = 'PROJECT'") == [
        ("0001_ok.sql",)
    ]
    (folder / "0002_bad.sql").write_text("CREATE TABLE HALF (X INTEGER);\n")
    assert engine.hook().migrate(folder).applied == ["PROJECT 0002_bad.sql"]


def test_a_migration_that_controls_its_own_transaction_is_refused_before_anything_runs(
    engine: EngineSetup, tmp_path: Path
) -> None:
    """Regression: ``INSERT …; COMMIT; INSERT <violates a CHECK>`` used to keep the first row, unledgered, while
    the error said the file was rolled back. Transaction control is found by tokenizing, so the same words in
    comments, string literals or a trigger body are fine."""
    folder = write_migrations(tmp_path / "migs", {
        "0001_ok.sql": (
            "-- COMMIT; in a comment\nCREATE TABLE NOTE (TXT TEXT);\nINSERT INTO NOTE VALUES ('BEGIN; COMMIT;');\n"
            "CREATE TRIGGER NOTE_T AFTER INSERT ON NOTE BEGIN SELECT 1; END;\n"
            if engine.dialect == "sqlite" else
            "-- COMMIT; in a comment\nCREATE TABLE NOTE (TXT TEXT);\nINSERT INTO NOTE VALUES ('BEGIN; COMMIT;');\n"
            "DO $$ BEGIN PERFORM 1; END $$;\n"
        ),
        "0002_commit.sql": (
            "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE) VALUES ('KEPT', 'K', 'FULL');\n"
            "  COMMIT;\nINSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE) VALUES ('X', 'X', 'NOPE');\n"
        ),
    })  # fmt: skip
    with pytest.raises(
        MigrationError, match=r"PROJECT 0002_commit\.sql line 2 controls the transaction \('COMMIT;'\)"
    ):
        engine.hook().migrate(folder)
    assert rows(engine, "SELECT PIPELINE_CODE FROM CFG_PIPELINES") == []
    assert rows(engine, "SELECT VERSION FROM SCHEMA_MIGRATIONS WHERE SOURCE = 'PROJECT'") == []
    (folder / "0002_commit.sql").unlink()
    assert engine.hook().migrate(folder).applied == ["PROJECT 0001_ok.sql"]
    assert rows(engine, "SELECT TXT FROM NOTE") == [("BEGIN; COMMIT;",)]
    status, out, err = cli(engine, "migrate", "--migrations-dir", str(write_migrations(folder, {
        "0003_vacuum.sql": "VACUUM;\n", "0004_index.sql": "CREATE INDEX CONCURRENTLY NOTE_I ON NOTE (TXT);\n"})))  # fmt: skip
    assert status == 13 and "PROJECT 0003_vacuum.sql line 1 controls the transaction" in err, (out, err)


def test_check_reports_pending_migrations(engine: EngineSetup, tmp_path: Path) -> None:
    folder = write_migrations(tmp_path / "migs", {"0001_a.sql": "CREATE TABLE A1 (X INTEGER);\n"})
    status, out, err = cli(engine, "check", "--migrations-dir", str(folder))
    if engine.dialect == "sqlite":  # check never creates the file; init-db does
        assert (
            status == 1 and "[FAIL] Engine DB connection: " in out and "does not exist on this machine" in out
        )
        assert not Path(engine.hook().engine_profile.target.path).exists()  # type: ignore[union-attr]
    else:
        assert status == 1 and "[FAIL] Engine DB tables: " in out and "holds no Engine tables yet" in out
    assert "[FAIL] Engine DB migrations: not checked: needs Engine DB " in out, out
    engine.hook().init_db()
    status, out, _ = cli(engine, "check", "--migrations-dir", str(folder))
    assert status == 1 and "[FAIL] Engine DB migrations: 1 pending: PROJECT 0001_a.sql; apply" in out, out
    assert out.endswith(" 1 failed\n")
    engine.hook().migrate(folder)
    status, out, _ = cli(engine, "check", "--migrations-dir", str(folder))
    assert status == 0 and "[OK  ] Engine DB migrations: none pending" in out and out.endswith(" 0 failed\n")


PIPELINE_SQL = (
    "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) "
    "VALUES ('REL', 'r', 'FULL', 't');"
)


def test_a_migrations_dir_typed_on_the_command_line_is_relative_to_the_working_directory(
    make_engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "proj"
    setup = make_engine("sqlite", project)
    write_migrations(project / "migrations", {"0001_a.sql": PIPELINE_SQL})
    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    status = main(
        ["--config", "proj/craft-connector.yml", "migrate", "--migrations-dir", "proj/migrations"], out, err
    )
    assert (status, err.getvalue()) == (0, "")
    assert "applied PROJECT 0001_a.sql" in out.getvalue()
    assert rows(setup, "SELECT PIPELINE_CODE FROM CFG_PIPELINES") == [("REL",)]
    # A path that does not exist from here is named as resolved against the working directory.
    status = main(
        ["--config", "proj/craft-connector.yml", "migrate", "--migrations-dir", "migrations"], out, err
    )
    assert status == 3 and f"{tmp_path / 'migrations'} does not exist" in err.getvalue()


@pytest.mark.postgres
def test_two_processes_migrating_at_once_apply_each_file_once(make_engine, tmp_path: Path) -> None:
    """Real processes started together on an empty schema: each file is applied by exactly one of them (a
    second CREATE TABLE would fail), and the other finds it in the ledger inside its own locked transaction."""
    import subprocess
    import sys

    setup = make_engine("postgresql")
    files = {f"{n:04d}_t{n}.sql": f"CREATE TABLE T{n} (X INTEGER);\n" for n in range(1, 7)}
    folder = write_migrations(tmp_path / "migs", files)
    command = [
        sys.executable,
        "-m",
        "airflow_provider_etl_craft.cli.main",
        "migrate",
        "--migrations-dir",
        str(folder),
        "--config",
        str(setup.config_path),
    ]
    procs = [
        subprocess.Popen(
            command, env=setup.subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    applied = [line for out, _ in outputs for line in out.splitlines() if line.startswith("applied ")]
    assert sorted(applied) == sorted(f"applied PROJECT {name}" for name in files)
    assert sum("initialised" in out for out, _ in outputs) == 1  # the other found the schema made meanwhile
    ledger = rows(setup, "SELECT VERSION FROM SCHEMA_MIGRATIONS WHERE SOURCE = 'PROJECT' ORDER BY VERSION")
    assert [r[0] for r in ledger] == sorted(files)
