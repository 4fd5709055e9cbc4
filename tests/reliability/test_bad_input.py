"""Hostile input is refused before it reaches the Engine DB, or stored as harmless text (codes: docs/schema.md,
errors: docs/errors.md).

- pipeline and task codes carrying quotes and SQL are refused by ``check_code`` and by every operator at DAG
  parse time (no connection is opened), and by the lifecycle and the schema's CHECKs if they get that far;
- run ids carrying SQL are stored verbatim (they are bound parameters, never SQL text);
- error texts of 10 MB, with lone surrogates or NUL bytes are stored cut and cleaned, and the tables stay intact;
- hostile craft-connector.yml files (schema names with quotes, YAML tags, alias bombs, bad bytes) are refused
  with a ConfigurationError.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from airflow_provider_etl_craft.config import load_engine_profile
from airflow_provider_etl_craft.engine.dialects.postgresql import PostgresDialect
from airflow_provider_etl_craft.engine.dialects.sqlite import SqliteDialect
from airflow_provider_etl_craft.errors import ConfigurationError, EtlCraftError, MetadataError
from airflow_provider_etl_craft.runs import RunIdentity, TaskCounts
from airflow_provider_etl_craft.runs.counts import MAX_ERROR_CHARS
from airflow_provider_etl_craft.runs.identity import check_code
from harness.engines import EngineSetup
from tests.reliability.conftest import rows, scalar, seed, table_counts

SQL_IN_A_CODE = "X'; DROP TABLE CFG_TASKS;--"
HOSTILE_CODES = [
    SQL_IN_A_CODE,
    'X"; DROP TABLE CFG_TASKS;--',
    "X; DELETE FROM AUD_TASK_ATTEMPTS",
    "A B",
    "ABC\n",
    "ABC\x00",
    "",
    "1ABC",
    "_ABC",
    "ÄBC",
    "ABC\u200b",
    "ＡＢＣ",
    "A" * 129,
    "../../etc/passwd",
    "pipeline:X",
    "A-B",
    "A.B",
    "BAD\udcff",
]
#: Characters a lock name cannot hold (docs/locks.md: lock names come from codes).
LOCK_NAME_CHARS = re.compile(r"[^A-Za-z0-9_:.\-]")
PARSE_TIME = datetime(2026, 1, 1)


# -- codes ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [*HOSTILE_CODES, None, 42], ids=repr)
def test_check_code_refuses_hostile_codes(code: object) -> None:
    with pytest.raises(ValueError, match="not a valid etl-craft code"):
        check_code("pipeline_code", code)  # type: ignore[arg-type]


@pytest.fixture
def no_engine_db(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Any attempt to open an Engine DB connection is recorded and refused."""
    opened: list[str] = []

    def refuse(self: object) -> None:
        opened.append(type(self).__name__)
        raise AssertionError("an Engine DB connection was opened at DAG parse time")

    monkeypatch.setattr(SqliteDialect, "connect", refuse)
    monkeypatch.setattr(PostgresDialect, "connect", refuse)
    yield opened
    assert opened == []


def build(kind: str, code: str) -> None:
    """Create, inside a DAG, the operator/decorator/task group ``kind`` naming the hostile ``code``."""
    from airflow.providers.standard.operators.python import PythonOperator

    from airflow_provider_etl_craft._compat import DAG
    from airflow_provider_etl_craft.decorators import etl_craft_task
    from airflow_provider_etl_craft.operators.pipeline_run import (
        ClaimPipelineRunOperator,
        FinishPipelineRunOperator,
    )
    from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator, recorded
    from airflow_provider_etl_craft.task_groups import etl_craft_pipeline

    with DAG(f"bad_input_{kind}", schedule=None, start_date=PARSE_TIME):
        if kind == "python_pipeline_code":
            EtlCraftPythonOperator(task_id="step", pipeline_code=code, python_callable=lambda: None)
        elif kind == "python_task_code":
            EtlCraftPythonOperator(
                task_id="step", pipeline_code="SAFE", task_code=code, python_callable=lambda: None
            )
        elif kind == "recorded_task_code":
            recorded(PythonOperator)(
                task_id="step", pipeline_code="SAFE", task_code=code, python_callable=lambda: None
            )
        elif kind == "decorator_task_code":

            def step() -> None:
                return None

            etl_craft_task(task_code=code, pipeline_code="SAFE")(step)()
        elif kind == "claim":
            ClaimPipelineRunOperator(task_id="claim", pipeline_code=code)
        elif kind == "finish":
            FinishPipelineRunOperator(task_id="finish", pipeline_code=code)
        elif kind == "task_group":
            with etl_craft_pipeline(code):
                pass
        else:
            raise AssertionError(kind)


KINDS = ["python_pipeline_code", "python_task_code", "recorded_task_code", "decorator_task_code", "claim", "finish",
         "task_group"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_operators_refuse_hostile_codes_at_parse_time_without_touching_the_db(kind: str,
                                                                              no_engine_db: list[str]) -> None:  # fmt: skip
    for code in HOSTILE_CODES:
        with pytest.raises((ValueError, ConfigurationError)) as info:
            build(kind, code)
        assert "not a valid etl-craft code" in str(info.value), (kind, code, info.value)


def test_a_task_id_airflow_accepts_but_no_code_matches_is_refused(no_engine_db: list[str]) -> None:
    from airflow_provider_etl_craft._compat import DAG
    from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator

    with (
        DAG("bad_input_task_id", schedule=None, start_date=PARSE_TIME),
        pytest.raises(ValueError, match="LOAD-ORDERS"),
    ):
        EtlCraftPythonOperator(task_id="load-orders", pipeline_code="SAFE", python_callable=lambda: None)


def test_the_lifecycle_refuses_hostile_codes_and_the_tables_stay_intact(engine: EngineSetup) -> None:
    """Past the parse-time checks (the lifecycle called directly), hostile codes are still only refused."""
    seed(engine, {"SAFE": ["STEP"]})
    hook = engine.hook()
    safe = RunIdentity("bad_input_dag", "safe")
    with hook.lifecycle(lock_timeout=10) as lc:
        assert lc.claim("SAFE", safe).action == "CREATED"
    before = table_counts(engine)
    folder = sorted(p.name for p in engine.config_path.parent.rglob("*"))
    with hook.lifecycle(lock_timeout=10) as lc:
        for code in HOSTILE_CODES:
            calls = {
                "claim": lambda c=code: lc.claim(c, safe),
                "start_task pipeline": lambda c=code: lc.start_task(c, "STEP", safe, 1),
                "start_task task": lambda c=code: lc.start_task("SAFE", c, safe, 1),
                "finish_run": lambda c=code: lc.finish_run(c, safe, {"STEP": "success"}),
            }
            if LOCK_NAME_CHARS.search(
                code
            ):  # a lock name it cannot be: refused before any file or connection
                calls["lock"] = lambda c=code: hook.lock(f"pipeline:{c}", timeout=1).__enter__()
            for what, call in calls.items():
                with pytest.raises((ValueError, EtlCraftError)) as info:
                    call()
                if what == "start_task task":
                    assert isinstance(info.value, MetadataError | ValueError), (code, info.value)
    assert table_counts(engine) == before
    new_files = sorted(set(p.name for p in engine.config_path.parent.rglob("*")) - set(folder))
    assert all(
        re.fullmatch(r"etl-craft\.db\.pipeline:[A-Za-z0-9_:.\-]*\.lock", name) for name in new_files
    ), new_files
    assert rows(engine, "SELECT TASK_CODE, ACTIVE_FLAG FROM CFG_TASKS") == [("STEP", "Y")]
    with hook.lifecycle(lock_timeout=10) as lc:  # and the Engine DB still works
        lc.finish_task(lc.start_task("SAFE", "STEP", safe, 1), "SUCCESS", TaskCounts(rows_written=1))
        assert lc.finish_run("SAFE", safe, {"STEP": "success"}).status == "SUCCESS"


def test_the_schema_refuses_hostile_codes_in_cfg_rows(engine: EngineSetup) -> None:
    """A project migration cannot store them either: the CHECK constraints refuse each one."""
    seed(engine, {"SAFE": ["STEP"]})
    hook = engine.hook()
    dialect = hook.engine
    refused, codes = [], [SQL_IN_A_CODE, "A B", "ABC\n", "1ABC", "_ABC", "A" * 129, "ÄBC", "A-B"]
    conn = hook.get_conn()
    try:
        for code in codes:
            try:
                with dialect.transaction(conn) as cur:
                    cur.execute(dialect.sql("INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, "
                                            "CREATED_BY) VALUES (?, 'hostile', 'FULL', 'test')"), (code,))  # fmt: skip
            except dialect.integrity_error():
                refused.append(code)
    finally:
        conn.close()
    assert refused == codes, f"stored although invalid: {[c for c in codes if c not in refused]}"
    assert scalar(engine, "SELECT COUNT(*) FROM CFG_PIPELINES") == 1


def test_run_ids_carrying_sql_are_stored_verbatim(engine: EngineSetup) -> None:
    seed(engine, {"SAFE": ["STEP"]})
    hook = engine.hook()
    identity = RunIdentity("dag'; DROP TABLE CFG_TASKS;--",
                           "manual__x\"'); DELETE FROM AUD_TASK_ATTEMPTS;-- %s %(x)s ?")  # fmt: skip
    with hook.lifecycle(lock_timeout=10) as lc:
        run_id = lc.claim("SAFE", identity).pipeline_run_id
        lc.finish_task(lc.start_task("SAFE", "STEP", identity, 1), "SUCCESS", TaskCounts(rows_written=3))
        assert lc.finish_run("SAFE", identity, {"STEP": "success"}).status == "SUCCESS"
    stored = rows(
        engine, "SELECT PIPELINE_RUN_ID, RUN_KEY, STARTED_BY, ENDED_BY, STATUS FROM AUD_PIPELINES_RUN_LOG"
    )
    key = identity.run_key
    assert stored == [(run_id, key, key, key, "SUCCESS")]
    assert rows(engine, "SELECT REQUESTED_BY, STATUS FROM AUD_TASK_ATTEMPTS") == [(key, "SUCCESS")]
    assert table_counts(engine)["CFG_TASKS"] == 1


# -- error texts ------------------------------------------------------------------------------------------

HOSTILE_ERRORS = {
    "ten_megabytes": "E" * 10_000_000,
    "ten_megabytes_multibyte": "é🙂" * 5_000_000,
    "surrogate": "bad \udcff text",
    "lone_high_surrogate": "bad \ud800 text",
    "nul_bytes": "nul \x00 byte\x00",
    "sql_and_everything": "quote ' \" ; DROP TABLE CFG_TASKS;-- %s %(x)s ? \x00 \udcff 🙂 \u2028 end",
}


def test_hostile_error_texts_are_stored_cut_and_cleaned(engine: EngineSetup) -> None:
    seed(engine, {"SAFE": ["STEP"]})
    hook = engine.hook()
    identity = RunIdentity("bad_input_dag", "errors")
    attempts = {}
    with hook.lifecycle(lock_timeout=10) as lc:
        lc.claim("SAFE", identity)
        for try_number, (name, text) in enumerate(HOSTILE_ERRORS.items(), start=1):
            handle = lc.start_task("SAFE", "STEP", identity, try_number)
            lc.finish_task(handle, "FAILED", error=text)
            attempts[handle.attempt_id] = name
        outcome = lc.finish_run("SAFE", identity, {"STEP": "failed"})
    assert outcome.status == "FAILED"

    stored = dict(rows(engine, "SELECT ATTEMPT_ID, ERROR_MESSAGE FROM AUD_TASK_ATTEMPTS"))
    assert set(stored) == set(attempts)
    marker_room = 100
    for attempt_id, name in attempts.items():
        message = stored[attempt_id]
        assert isinstance(message, str) and message, name
        assert "\x00" not in message, name
        message.encode("utf-8")  # no lone surrogates left: strict UTF-8 encodes it
        assert len(message) <= MAX_ERROR_CHARS + marker_room, (name, len(message))
    by_name = {name: stored[attempt_id] for attempt_id, name in attempts.items()}
    assert by_name["ten_megabytes"].startswith("E" * 1000) and "trimmed" in by_name["ten_megabytes"]
    assert by_name["ten_megabytes_multibyte"].startswith("é🙂" * 100)
    assert by_name["surrogate"].startswith("bad ") and by_name["surrogate"].endswith(" text")
    assert by_name["nul_bytes"].startswith("nul ") and "byte" in by_name["nul_bytes"]
    assert (
        "DROP TABLE CFG_TASKS;--" in by_name["sql_and_everything"] and "🙂" in by_name["sql_and_everything"]
    )
    last = by_name["sql_and_everything"]
    assert rows(engine, "SELECT STATUS, ATTEMPT_COUNT, ERROR_MESSAGE FROM AUD_TASK_RUN_LOG") == [
        ("FAILED", len(HOSTILE_ERRORS), last)
    ]
    counts = table_counts(engine)
    assert (counts["CFG_TASKS"], counts["AUD_TASK_ATTEMPTS"], counts["AUD_TASK_RUN_LOG"]) == (
        1,
        len(HOSTILE_ERRORS),
        1,
    )


# -- hostile craft-connector.yml --------------------------------------------------------------------------

SECRET = "TOPSECRET-reliability-value"


def pg_file(schema: str) -> str:
    return ("Engine:\n  prod:\n    jdbc_url: jdbc:postgresql://db.internal:5432/etl_craft\n"
            f"    schema: {schema}\n    user: etl_user\n    auth_mode: password\n    secret: ENGINE_SECRET\n")  # fmt: skip


BOMB = "".join(f"  b{i}: &b{i} [*b{i - 1}, *b{i - 1}, *b{i - 1}, *b{i - 1}, *b{i - 1}, *b{i - 1}, *b{i - 1}, *b{i - 1}]\n"
               for i in range(1, 10))  # fmt: skip
HOSTILE_CONFIGS = [
    pytest.param(
        pg_file("'etl\"; DROP SCHEMA public CASCADE; --'"),
        {},
        "plain identifier",
        id="schema-double-quote-sql",
    ),
    pytest.param(pg_file('"etl\'craft"'), {}, "plain identifier", id="schema-single-quote"),
    pytest.param(pg_file('"etl;craft"'), {}, "plain identifier", id="schema-semicolon"),
    pytest.param(
        pg_file("ENGINE_SCHEMA"),
        {"ENGINE_SCHEMA": 'etl"; DROP TABLE x; --'},
        "plain identifier",
        id="schema-from-a-variable-with-sql",
    ),  # fmt: skip
    pytest.param(pg_file('"etl\\ncraft"'), {}, "plain identifier", id="schema-inner-newline"),
    pytest.param(pg_file('"etl\\0craft"'), {}, "plain identifier", id="schema-nul"),
    pytest.param(pg_file('"etl\\u200bcraft"'), {}, "plain identifier", id="schema-zero-width-space"),
    pytest.param(pg_file('"etl_\u0441raft"'), {}, "plain identifier", id="schema-cyrillic-homoglyph"),
    pytest.param(pg_file("a" * 64), {}, "plain identifier", id="schema-64-characters"),
    pytest.param(
        "Engine:\n  dev:\n    jdbc_url: jdbc:sqlite:engine/e.db\n    schema: 'main\"; ATTACH DATABASE x'\n",
        {},
        "plain identifier",
        id="sqlite-schema-quote",
    ),  # fmt: skip
    pytest.param(
        pg_file('!!python/object/apply:os.system ["touch __MARKER__"]'),
        {},
        "not valid YAML",
        id="yaml-python-tag",
    ),  # fmt: skip
    pytest.param(
        "Orchestration:\n  b0: &b0 [lol]\n" + BOMB + pg_file("*b9"),
        {},
        "must be a single value",
        id="yaml-alias-bomb-as-schema",
    ),  # fmt: skip
    pytest.param(pg_file("etl_craft") + "# \x00\n", {}, "not valid YAML", id="nul-byte-in-file"),
]


@pytest.mark.parametrize(("text", "env", "fragment"), HOSTILE_CONFIGS)
def test_hostile_config_files_are_refused_with_a_configuration_error(text: str, env: dict[str, str], fragment: str,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    marker = tmp_path / "pwned"
    path = tmp_path / "craft-connector.yml"
    path.write_text(text.replace("__MARKER__", str(marker)), encoding="utf-8")
    monkeypatch.setenv("ENGINE_SECRET", SECRET)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    with pytest.raises(ConfigurationError) as info:
        load_engine_profile(path)
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert fragment in message and SECRET not in message, message
    assert not marker.exists()


def test_a_config_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "craft-connector.yml"
    path.write_bytes(b"Engine:\n  dev:\n    jdbc_url: jdbc:sqlite:\xff\xfe.db\n")
    with pytest.raises(ConfigurationError, match="UTF-8"):
        load_engine_profile(path)


NESTING = 1000


def nested_config(tmp_path: Path) -> Path:
    """A valid YAML document whose (ignored) Orchestration section is nested 1,000 lists deep, or as deep as
    this process's recursion limit (Airflow's operator ``__deepcopy__`` raises it to 5,000 for the process)."""
    path = tmp_path / "craft-connector.yml"
    nesting = max(NESTING, sys.getrecursionlimit())
    path.write_text("Orchestration: " + "[" * nesting + "]" * nesting + "\n"
                    "Engine:\n  dev:\n    jdbc_url: jdbc:sqlite:engine/e.db\n", encoding="utf-8")  # fmt: skip
    return path


def test_a_deeply_nested_config_is_refused_with_a_configuration_error(tmp_path: Path) -> None:
    path = nested_config(tmp_path)
    with pytest.raises(ConfigurationError, match="nested too deeply") as info:
        load_engine_profile(path)
    assert str(path) in str(info.value)


def test_the_cli_reports_a_deeply_nested_config_without_a_traceback(tmp_path: Path) -> None:
    path = nested_config(tmp_path)
    cli = Path(sys.executable).with_name("etl-craft-airflow")
    result = subprocess.run([str(cli), "--config", str(path), "check"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert result.stderr == ""
    first = result.stdout.splitlines()[0]
    assert first.startswith("[FAIL] Configuration: ") and "nested too deeply" in first, result.stdout
