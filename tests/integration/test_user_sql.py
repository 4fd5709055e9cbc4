"""SQL of the user's own through EngineDBHook finds the Engine tables, on SQLite and on PostgreSQL.

The "Using the hook" examples of docs/hook.md run as written (read from that page). On PostgreSQL the Engine
schema is first on the search path of each transaction the hook's cursors open, and nothing stays on the
server session afterwards (docs/etl-craft-parity.md, "Your own SQL").
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.testing import run_dag_test
from harness.engines import EngineSetup, write_config
from harness.postgres import SSO_ROLE, PgCluster
from tests.reliability.conftest import seed

HOOK_PAGE = Path(__file__).resolve().parents[2] / "docs" / "hook.md"
ACTIVE = [("DAILY_SALES",), ("WEEKLY_STOCK",)]
#: The session's search path as a fresh role's session has it (nothing set by anybody).
DEFAULT_PATH = '"$user", public'
#: The search path inside a transaction of the user's SQL: the Engine schema first, then the session's.
SCHEMA_FIRST = f'"etl_craft", {DEFAULT_PATH}'


def doc_block(marker: str) -> str:
    """The one ```python block of docs/hook.md that contains ``marker``."""
    text = HOOK_PAGE.read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if marker in b]
    assert len(blocks) == 1, f"expected one docs/hook.md block with {marker!r}, found {len(blocks)}"
    return blocks[0]


HOOK_EXAMPLE = doc_block("EngineDBHook(etl_craft_conn_id=")
OPERATOR_EXAMPLE = doc_block("SQLExecuteQueryOperator(")


def run_example(code: str, namespace: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[Any]]:
    """Run ``code`` statement by statement as written; its namespace and the values of its bare expressions."""
    namespace = {} if namespace is None else namespace
    values: list[Any] = []
    for node in ast.parse(code).body:
        if isinstance(node, ast.Expr):
            values.append(eval(compile(ast.Expression(node.value), "docs/hook.md", "eval"), namespace))  # noqa: S307
        else:
            exec(compile(ast.Module([node], []), "docs/hook.md", "exec"), namespace)  # noqa: S102
    return namespace, values


def seeded(setup: EngineSetup) -> EngineSetup:
    """init-db plus two active pipelines and an inactive one."""
    seed(setup, {"DAILY_SALES": ["EXTRACT"], "WEEKLY_STOCK": ["LOAD"], "OLD_FEED": ["X"]})
    with closing(setup.hook().engine.connect()) as conn:
        setup.hook().engine.execute(conn, "UPDATE CFG_PIPELINES SET ACTIVE_FLAG = 'N' WHERE PIPELINE_CODE = ?",
                                    ("OLD_FEED",))  # fmt: skip
    return setup


def as_default_connection(monkeypatch: pytest.MonkeyPatch, setup: EngineSetup) -> None:
    """``etl_craft_default``: a file-backed Airflow connection on the setup's craft-connector.yml."""
    conn = {"conn_type": "etl_craft", "extra": {"config_path": str(setup.config_path), "profile": "test"}}
    monkeypatch.setenv("AIRFLOW_CONN_ETL_CRAFT_DEFAULT", json.dumps(conn))


def hook_example(monkeypatch: pytest.MonkeyPatch, setup: EngineSetup) -> list[Any]:
    """The docs' hook example on ``etl_craft_default``: the value of its ``get_records`` line."""
    as_default_connection(monkeypatch, setup)
    _, values = run_example(HOOK_EXAMPLE)
    assert len(values) == 1, values  # the get_records line is the example's only bare expression
    return sorted(values[0])


DAG_FILE = """
import textwrap
from airflow_provider_etl_craft._compat import DAG

with DAG("etl_craft_user_sql", schedule=None, catchup=False) as dag:
    exec(EXAMPLE)  # the docs/hook.md block, as written
"""


def operator_example(monkeypatch: pytest.MonkeyPatch, setup: EngineSetup, dags_folder: Path) -> Any:
    """The docs' SQLExecuteQueryOperator example in a DAG file, under dag.test(): the task's XCom."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    as_default_connection(monkeypatch, setup)
    path = dags_folder / "etl_craft_user_sql.py"
    path.write_text(f"EXAMPLE = {OPERATOR_EXAMPLE!r}\n{DAG_FILE}", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("etl_craft_user_sql", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = run_dag_test(module.dag)
    with create_session() as session:
        ti = run.get_task_instance("active_pipelines", session=session)
        assert ti is not None and str(ti.state) == "success", ti
        value = session.scalars(
            XComModel.get_many(
                run_id=run.run_id, dag_ids=run.dag_id, task_ids="active_pipelines", key="return_value"
            ).with_only_columns(XComModel.value)
        ).first()
    from airflow.serialization.serde import deserialize

    return deserialize(json.loads(value) if isinstance(value, (str, bytes)) else value)


# -- docs/hook.md, as written --------------------------------------------------------------------------------


def test_docs_examples_are_the_ones_run_here() -> None:
    """The tests below run these very lines: the blocks are found, and say what the tests expect of them."""
    assert (
        "hook.get_records(\"SELECT PIPELINE_CODE FROM CFG_PIPELINES WHERE ACTIVE_FLAG = 'Y'\")"
        in HOOK_EXAMPLE
    )
    assert 'conn_id="etl_craft_default"' in OPERATOR_EXAMPLE and "FROM CFG_PIPELINES" in OPERATOR_EXAMPLE


def test_docs_hook_example_reads_the_engine_tables(engine: EngineSetup, monkeypatch) -> None:
    assert hook_example(monkeypatch, seeded(engine)) == ACTIVE


@pytest.mark.e2e
def test_docs_sql_execute_query_operator_example_reads_the_engine_tables(
    engine: EngineSetup, airflow_db: Path, monkeypatch
) -> None:
    rows = operator_example(monkeypatch, seeded(engine), airflow_db / "dags")
    assert sorted(tuple(r) for r in rows) == ACTIVE


# -- the common-sql surface ----------------------------------------------------------------------------------


@pytest.mark.parametrize("autocommit", [False, True])
def test_run_get_first_insert_rows_and_a_cursor_find_the_engine_tables(
    engine: EngineSetup, autocommit: bool
) -> None:
    hook = seeded(engine).hook()
    count = "SELECT COUNT(*) FROM CFG_PIPELINES WHERE ACTIVE_FLAG = 'Y'"
    assert hook.run(count, autocommit=autocommit, handler=lambda cur: cur.fetchone()) == (2,)
    assert hook.get_first(count) == (2,)
    hook.run(f"UPDATE CFG_PIPELINES SET PIPELINE_NAME = {hook.placeholder} WHERE PIPELINE_CODE = "
             f"{hook.placeholder}", autocommit=autocommit, parameters=("Daily", "DAILY_SALES"))  # fmt: skip
    hook.insert_rows(
        "CFG_PIPELINES",
        [("NEW_ONE", "New one", 24, "FULL", "me")],
        ["PIPELINE_CODE", "PIPELINE_NAME", "SLA_IN_HOURS", "REFRESH_TYPE", "CREATED_BY"],
        autocommit=autocommit,
    )
    with closing(hook.get_conn()) as conn:
        hook.set_autocommit(conn, autocommit)
        cur = conn.cursor()
        cur.execute("SELECT PIPELINE_NAME FROM CFG_PIPELINES WHERE PIPELINE_CODE IN ('DAILY_SALES', 'NEW_ONE') "
                    "ORDER BY PIPELINE_CODE")  # fmt: skip
        assert cur.fetchall() == [("Daily",), ("New one",)]
        cur.close()
        if not autocommit:
            conn.commit()


@pytest.mark.parametrize("autocommit", [False, True])
def test_get_sqlalchemy_engine_finds_the_engine_tables(engine: EngineSetup, autocommit: bool) -> None:
    from sqlalchemy import text

    kwargs = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
    sa_engine = seeded(engine).hook().get_sqlalchemy_engine(kwargs)
    try:
        with sa_engine.connect() as conn:
            rows = conn.execute(text("SELECT PIPELINE_CODE FROM CFG_PIPELINES WHERE ACTIVE_FLAG = 'Y'")).all()
        assert sorted(tuple(r) for r in rows) == ACTIVE
    finally:
        sa_engine.dispose()


# -- PostgreSQL: per transaction, nothing on the session -----------------------------------------------------


def session_search_path(conn: Any) -> str:
    """The session's search_path, asked with the driver's plain cursor (outside any transaction of ours)."""
    cur = conn.cursor(cursor_factory=psycopg2.extensions.cursor)
    try:
        cur.execute("SHOW search_path")
        return str(cur.fetchone()[0])
    finally:
        cur.close()


@pytest.mark.postgres
@pytest.mark.parametrize("autocommit", [False, True])
def test_postgres_schema_first_inside_the_transaction_and_nothing_on_the_session(
    make_engine: Callable[[str], EngineSetup], autocommit: bool
) -> None:
    hook = make_engine("postgresql").hook()
    assert "options" not in hook.engine.connect_kwargs()
    assert hook.get_first("SHOW search_path") == (SCHEMA_FIRST,)
    with closing(hook.get_conn()) as conn:
        hook.set_autocommit(conn, autocommit)
        cur = conn.cursor()
        cur.execute("SELECT current_schema(), current_setting('search_path')")
        assert cur.fetchone() == ("etl_craft", SCHEMA_FIRST)
        cur.close()
        if not autocommit:
            conn.commit()
        assert session_search_path(conn) == DEFAULT_PATH


@pytest.mark.postgres
def test_postgres_autocommit_keeps_the_users_own_transaction_block(
    make_engine: Callable[[str], EngineSetup],
) -> None:
    """An explicit BEGIN … ROLLBACK sent on an autocommit connection stays one transaction, and is rolled back."""
    hook = seeded(make_engine("postgresql")).hook()
    with closing(hook.get_conn()) as conn:
        cur = conn.cursor()
        cur.execute("BEGIN")
        cur.execute("DELETE FROM CFG_TASKS")
        cur.execute("DELETE FROM CFG_PIPELINES")
        cur.execute("SELECT COUNT(*) FROM CFG_PIPELINES")
        assert cur.fetchone() == (0,)
        cur.execute("ROLLBACK")
        cur.execute("SELECT COUNT(*) FROM CFG_PIPELINES")
        assert cur.fetchone() == (3,)
        cur.close()
        assert session_search_path(conn) == DEFAULT_PATH


@pytest.mark.postgres
def test_postgres_statements_refused_in_a_transaction_still_run_with_autocommit(
    make_engine: Callable[[str], EngineSetup],
) -> None:
    """VACUUM cannot take a transaction-scoped schema: it runs as written (qualified), as on any connection."""
    hook = seeded(make_engine("postgresql")).hook()
    hook.run("VACUUM etl_craft.CFG_PIPELINES", autocommit=True)
    hook.run("CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_user ON etl_craft.CFG_PIPELINES (PIPELINE_NAME)",
             autocommit=True)  # fmt: skip
    with pytest.raises(psycopg2.errors.ActiveSqlTransaction):  # several statements: refused, as always
        hook.run("SELECT 1; VACUUM etl_craft.CFG_PIPELINES", autocommit=True)


@pytest.mark.postgres
def test_postgres_executemany_callproc_and_copy_find_the_engine_tables(
    make_engine: Callable[[str], EngineSetup],
) -> None:
    import io

    hook = seeded(make_engine("postgresql")).hook()
    with closing(hook.get_conn()) as conn:  # autocommit: each call its own transaction
        cur = conn.cursor()
        cur.executemany("UPDATE CFG_PIPELINES SET PIPELINE_NAME = %s WHERE PIPELINE_CODE = %s",
                        [("D", "DAILY_SALES"), ("W", "WEEKLY_STOCK")])  # fmt: skip
        out = io.StringIO()
        cur.copy_expert("COPY (SELECT PIPELINE_NAME FROM CFG_PIPELINES ORDER BY 1) TO STDOUT", out)
        assert out.getvalue().splitlines() == ["D", "Reliability OLD_FEED", "W"]
        cur.callproc("current_schemas", (False,))
        assert cur.fetchone()[0][0] == "etl_craft"
        cur.close()
        assert session_search_path(conn) == DEFAULT_PATH


# -- psycopg 3 (auth_mode sso) --------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("autocommit", [False, True])
def test_postgres_psycopg3_connections_put_the_schema_first_too(
    pg_cluster: PgCluster, tmp_path: Path, autocommit: bool
) -> None:
    psycopg = pytest.importorskip("psycopg", reason="auth_mode sso needs psycopg 3 (the [sso] extra)")
    if psycopg.pq.version() < 180000:
        pytest.skip(f"psycopg 3 here uses libpq {psycopg.pq.version()}; sso needs libpq >= 18")
    database = pg_cluster.create_database(owner=SSO_ROLE)
    try:
        url = (f"jdbc:postgresql://{pg_cluster.host}:{pg_cluster.port}/{database}?sslmode=verify-full"
               f"&sslrootcert={pg_cluster.ca_cert}")  # fmt: skip
        config = write_config(tmp_path, (
            f"Engine:\n  test:\n    jdbc_url: {url}\n    schema: etl_craft\n    auth_mode: sso\n    user: {SSO_ROLE}\n"
            "    issuer: https://issuer.example.com\n    client_id: etl-craft-airflow-cli\n"
        ))  # fmt: skip
        hook = EngineDBHook.from_config(config)
        hook.init_db()
        hook.run("INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY) "
                 "VALUES (%s, %s, 24, 'FULL', 'me')", autocommit=autocommit, parameters=("DAILY_SALES", "D"))  # fmt: skip
        assert hook.run("SELECT PIPELINE_CODE FROM CFG_PIPELINES WHERE PIPELINE_NAME = %s", autocommit=autocommit,
                        parameters=("D",), handler=lambda cur: cur.fetchall()) == [("DAILY_SALES",)]  # fmt: skip
        with closing(hook.get_conn()) as conn:
            hook.set_autocommit(conn, autocommit)
            assert type(conn).__module__.split(".")[0] == "psycopg"
            cur = conn.cursor()
            cur.execute("SELECT current_setting('search_path')")
            assert cur.fetchone() == (SCHEMA_FIRST,)
            cur.executemany("UPDATE CFG_PIPELINES SET PIPELINE_NAME = %s WHERE PIPELINE_CODE = %s",
                            [("E", "DAILY_SALES")])  # fmt: skip
            cur.close()
            if not autocommit:
                conn.commit()
            plain = psycopg.Cursor(conn)
            plain.execute("SHOW search_path")
            assert plain.fetchone() == (DEFAULT_PATH,)
            plain.close()
        assert hook.get_first("SELECT PIPELINE_NAME FROM CFG_PIPELINES") == ("E",)
    finally:
        pg_cluster.drop_database(database)


@pytest.mark.postgres
def test_postgres_a_named_cursor_finds_the_engine_tables(make_engine: Callable[[str], EngineSetup]) -> None:
    """A server-side cursor (DECLARE … FOR <query>) gets the schema from a statement of its own first."""
    hook = seeded(make_engine("postgresql")).hook()
    with closing(hook.get_conn()) as conn:
        hook.set_autocommit(conn, False)
        cur = conn.cursor(name="user_cursor")
        cur.execute("SELECT PIPELINE_CODE FROM CFG_PIPELINES WHERE ACTIVE_FLAG = 'Y' ORDER BY 1")
        assert cur.fetchall() == ACTIVE
        cur.close()
        conn.rollback()
        assert session_search_path(conn) == DEFAULT_PATH
