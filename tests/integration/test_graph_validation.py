"""Dependency-graph validation on real Engine DBs, both dialects: ``validate``, the claim's refusal, and the
DAG check (docs/graph-validation.md).

Each broken pipeline below has exactly one thing wrong. SELF and UNKNOWN hold rows the Engine's own
constraints refuse; they are written with the constraints off (a SQLite shell without foreign keys, or an
Engine DB another tool filled), because the gates would read such rows all the same.
"""

from __future__ import annotations

import io
import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft._compat import DAG
from airflow_provider_etl_craft.cli.main import main as cli_main
from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.errors import (
    DependencyCycleError,
    EtlCraftError,
    GraphError,
    MetadataError,
    SelfDependencyError,
    UnknownTaskError,
)
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.operators._outcome import airflow_outcome
from airflow_provider_etl_craft.runs import RunIdentity
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline
from airflow_provider_etl_craft.testing import assert_dag_matches_engine, check_dag_against_engine
from harness.engines import EngineSetup, engine_rows


def _pipeline(code: str, active: str = "Y") -> str:
    return (f"INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, ACTIVE_FLAG, CREATED_BY) "
            f"VALUES ('{code}', '{code}', 'FULL', '{active}', 'test');\n")  # fmt: skip


def _task(pipeline: str, code: str, condition: str | None = None, count: int | None = None,
          active: str = "Y") -> str:  # fmt: skip
    cond = "NULL" if condition is None else f"'{condition}'"
    n = "NULL" if count is None else str(count)
    return (f"INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, RUN_CONDITION, RUN_CONDITION_COUNT, "
            f"ACTIVE_FLAG, CREATED_BY) SELECT '{code}', 'ETL', PIPELINE_ID, 'PYTHON', {cond}, {n}, '{active}', 'test' "
            f"FROM CFG_PIPELINES WHERE PIPELINE_CODE = '{pipeline}';\n")  # fmt: skip


def _task_dep(down: str, task: str, up: str, up_task: str, named: str | None = None) -> str:
    """``down.task`` depends on ``up.up_task``; the row names pipeline ``named`` (default: ``up``)."""
    return (f"INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_PIPELINE_ID, DEPENDS_ON_TASK_ID, "
            f"DEPENDENCY_TYPE, CREATED_BY) SELECT t.PIPELINE_ID, t.TASK_ID, np.PIPELINE_ID, u.TASK_ID, 'SUCCESS', "
            f"'test' FROM CFG_TASKS t JOIN CFG_PIPELINES dp ON dp.PIPELINE_ID = t.PIPELINE_ID, CFG_TASKS u "
            f"JOIN CFG_PIPELINES up ON up.PIPELINE_ID = u.PIPELINE_ID, CFG_PIPELINES np WHERE dp.PIPELINE_CODE = "
            f"'{down}' AND t.TASK_CODE = '{task}' AND up.PIPELINE_CODE = '{up}' AND u.TASK_CODE = '{up_task}' "
            f"AND np.PIPELINE_CODE = '{named or up}';\n")  # fmt: skip


def _pipeline_dep(down: str, up: str) -> str:
    return (f"INSERT INTO CFG_PIPELINE_DEPENDENCY (PIPELINE_ID, DEPENDS_ON_PIPELINE_ID, DEPENDENCY_TYPE, CREATED_BY) "
            f"SELECT d.PIPELINE_ID, u.PIPELINE_ID, 'SUCCESS', 'test' FROM CFG_PIPELINES d, CFG_PIPELINES u "
            f"WHERE d.PIPELINE_CODE = '{down}' AND u.PIPELINE_CODE = '{up}';\n")  # fmt: skip


def migration() -> str:
    """OK: EXTRACT <- LOAD <- REPORT, and CHECK (N=1 over EXTRACT and LOAD). The others each break one rule."""
    sql = _pipeline("OK") + "".join(_task("OK", c) for c in ("EXTRACT", "LOAD", "REPORT"))
    sql += _task("OK", "CHECK", "N", 1)
    sql += _task_dep("OK", "LOAD", "OK", "EXTRACT") + _task_dep("OK", "REPORT", "OK", "LOAD")
    sql += _task_dep("OK", "CHECK", "OK", "EXTRACT") + _task_dep("OK", "CHECK", "OK", "LOAD")
    # CYCLE: A depends on B, B on C, C on A; D stands apart.
    sql += _pipeline("CYCLE") + "".join(_task("CYCLE", c) for c in ("A", "B", "C", "D"))
    sql += _task_dep("CYCLE", "A", "CYCLE", "B") + _task_dep("CYCLE", "B", "CYCLE", "C")
    sql += _task_dep("CYCLE", "C", "CYCLE", "A")
    # RETIRED: A depends on OLD, a task retired from the pipeline.
    sql += _pipeline("RETIRED") + _task("RETIRED", "A") + _task("RETIRED", "OLD", active="N")
    sql += _task_dep("RETIRED", "A", "RETIRED", "OLD")
    # COUNT: Z needs 3 of its 2 dependencies.
    sql += _pipeline("COUNT") + _task("COUNT", "X") + _task("COUNT", "Y") + _task("COUNT", "Z", "N", 3)
    sql += _task_dep("COUNT", "Z", "COUNT", "X") + _task_dep("COUNT", "Z", "COUNT", "Y")
    # PING and PONG depend on each other; LATE depends on GONE, a retired pipeline; FAR's task T on GONE's task.
    sql += _pipeline("PING") + _task("PING", "X") + _pipeline("PONG") + _task("PONG", "X")
    sql += _pipeline_dep("PING", "PONG") + _pipeline_dep("PONG", "PING")
    sql += _pipeline("GONE", active="N") + _task("GONE", "ONLY")
    sql += _pipeline("LATE") + _task("LATE", "X") + _pipeline_dep("LATE", "GONE")
    sql += _pipeline("FAR") + _task("FAR", "T") + _task_dep("FAR", "T", "GONE", "ONLY")
    # Filled in with the constraints off (see without_constraints).
    sql += _pipeline("SELF") + _task("SELF", "A") + _pipeline("UNKNOWN") + _task("UNKNOWN", "A")
    return sql


#: Rows the Engine's constraints refuse: a task on itself, and a "same-pipeline" dependency on OK's task.
UNCONSTRAINED = (
    "INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_PIPELINE_ID, DEPENDS_ON_TASK_ID, DEPENDENCY_TYPE, "
    "CREATED_BY) SELECT t.PIPELINE_ID, t.TASK_ID, t.PIPELINE_ID, t.TASK_ID, 'SUCCESS', 'test' FROM CFG_TASKS t JOIN "
    "CFG_PIPELINES p ON p.PIPELINE_ID = t.PIPELINE_ID WHERE p.PIPELINE_CODE = 'SELF' AND t.TASK_CODE = 'A'",
    _task_dep("UNKNOWN", "A", "OK", "EXTRACT", named="UNKNOWN").rstrip(";\n"),
)
#: On PostgreSQL: the constraints that refuse them.
PG_CONSTRAINTS = ("CK_CFG_TASK_DEPENDENCY_NOT_SELF", "FK_CFG_TASK_DEPENDENCY_UPSTREAM_PIPELINE")

#: Each broken pipeline: the error its claim is refused with, and the start of its one problem.
BROKEN = {
    "CYCLE": (DependencyCycleError, 7, "task dependencies form a cycle (A -> B -> C -> A, each depending on the next)"),
    "RETIRED": (MetadataError, 4, "task A depends on task OLD, which is retired (ACTIVE_FLAG='N')"),
    "COUNT": (GraphError, 5, "task Z has RUN_CONDITION='N' with RUN_CONDITION_COUNT=3 but only 2 active dependencies"),
    "SELF": (SelfDependencyError, 6, "task A depends on itself"),
    "UNKNOWN": (UnknownTaskError, 8, "task A depends on task EXTRACT, which is not a task of pipeline UNKNOWN but of OK"),
    "PING": (DependencyCycleError, 7, "pipeline dependencies form a cycle (PING -> PONG -> PING"),
    "PONG": (DependencyCycleError, 7, "pipeline dependencies form a cycle (PONG -> PING -> PONG"),
    "LATE": (MetadataError, 4, "depends on pipeline GONE, which is retired (ACTIVE_FLAG='N')"),
    "FAR": (MetadataError, 4, "task T depends on task GONE.ONLY, whose pipeline GONE is retired"),
}  # fmt: skip


def without_constraints(engine: EngineSetup, hook: EngineDBHook) -> None:
    if engine.dialect == "sqlite":
        with closing(sqlite3.connect(hook.engine.path)) as conn:  # type: ignore[attr-defined]
            conn.execute("PRAGMA foreign_keys = OFF")
            conn.execute("PRAGMA ignore_check_constraints = ON")
            for statement in UNCONSTRAINED:
                conn.execute(statement)
            conn.commit()
        return
    with closing(hook.get_conn()) as conn:
        for name in PG_CONSTRAINTS:
            hook.engine.execute(conn, f"ALTER TABLE CFG_TASK_DEPENDENCY DROP CONSTRAINT {name}")
        for statement in UNCONSTRAINED:
            hook.engine.execute(conn, statement)


@dataclass
class Db:
    engine: EngineSetup
    hook: EngineDBHook
    serial: int = 0

    def cli(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        status = cli_main([*args, "--config", str(self.engine.config_path)], out, err)
        return status, out.getvalue(), err.getvalue()

    def ident(self) -> RunIdentity:
        self.serial += 1
        return RunIdentity("graph_dag", f"run_{self.serial}", datetime(2026, 1, 2, tzinfo=UTC))

    def runs(self) -> int:
        return int(engine_rows(self.hook, "SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG")[0][0])


@pytest.fixture
def db(engine: EngineSetup, tmp_path: Path) -> Iterator[Db]:
    folder = tmp_path / "project-migrations"
    folder.mkdir()
    (folder / "0001_graphs.sql").write_text(migration(), encoding="utf-8")
    hook = engine.hook()
    hook.migrate(folder)
    without_constraints(engine, hook)
    yield Db(engine, hook)


# -- validate --------------------------------------------------------------------------------------------


def test_validate_reports_each_kind_of_graph_problem_and_exits_1(db: Db) -> None:
    status, out, err = db.cli("validate")
    assert (status, err) == (1, "")
    lines = out.splitlines()
    fails = [line for line in lines if line.startswith("[FAIL] ")]
    for code, (_, _, message) in BROKEN.items():
        assert [line for line in fails if line.startswith(f"[FAIL] {code}: {message}")], (code, out)
    assert len(fails) == len(BROKEN), out  # one problem each; OK and GONE (retired) have none
    assert not [line for line in lines if line.startswith("[FAIL] OK:")]
    # Active pipelines: OK, CYCLE, RETIRED, COUNT, PING, PONG, LATE, FAR, SELF, UNKNOWN; their active tasks.
    assert lines[-1] == f"checked 10 pipeline(s) and 18 task(s): {len(BROKEN)} failed"
    # Messages speak in codes, and say how to mend the rows.
    assert "through a project migration" in out and "TASK_ID=" not in out


def test_validate_of_one_pipeline_and_as_json(db: Db) -> None:
    assert db.cli("validate", "--pipeline", "OK") == (
        0,
        "checked 1 pipeline(s) and 4 task(s): 0 failed\n",
        "",
    )
    status, out, _ = db.cli("validate", "--pipeline", "CYCLE", "--format", "json")
    doc = json.loads(out)
    assert status == 1
    assert (doc["pipelines"], doc["tasks"], doc["failed"]) == (1, 4, 1)
    (problem,) = doc["problems"]
    assert (problem["pipeline_code"], problem["status_name"], problem["exit_code"]) == (
        "CYCLE",
        "DEPENDENCY_CYCLE",
        7,
    )
    status, out, _ = db.cli("validate", "--pipeline", "OK", "--format", "json")
    assert (status, json.loads(out)["problems"]) == (0, [])


def test_validate_of_a_retired_or_unknown_pipeline_is_a_metadata_error(db: Db) -> None:
    status, out, err = db.cli("validate", "--pipeline", "GONE")
    assert (status, out) == (4, "") and "pipeline GONE is retired (ACTIVE_FLAG='N')" in err
    status, _, err = db.cli("validate", "--pipeline", "NOPE")
    assert status == 4 and "pipeline NOPE does not exist" in err


# -- the claim -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", list(BROKEN))
def test_a_claim_of_an_invalid_graph_is_refused_at_once_with_its_status(db: Db, code: str) -> None:
    error, exit_code, message = BROKEN[code]
    with db.hook.lifecycle(lock_timeout=30) as lc, pytest.raises(EtlCraftError) as refused:
        lc.claim(code, db.ident())
    assert type(refused.value) is error
    assert (refused.value.exit_code, refused.value.retryable) == (exit_code, False)
    assert str(refused.value).startswith(f"pipeline {code}: {message}")
    assert f"etl-craft-airflow validate --pipeline {code}" in str(refused.value)
    assert db.runs() == 0  # nothing written, nothing to wait for

    # In an operator the refusal is Airflow's permanent failure: no retry, no reschedule.
    with pytest.raises(_compat.fail_exception()) as failed, airflow_outcome(), db.hook.lifecycle() as lc:
        lc.claim(code, db.ident())
    assert str(failed.value).startswith(f"[{error.status_name}] pipeline {code}: ")


def test_a_claim_of_a_valid_graph_is_still_created(db: Db) -> None:
    with db.hook.lifecycle(lock_timeout=30) as lc:
        outcome = lc.claim("OK", db.ident(), ["EXTRACT", "LOAD", "REPORT", "CHECK"])
    assert outcome.action == "CREATED"
    assert outcome.lenient_tasks == ("CHECK",)
    assert db.runs() == 1


def test_the_claim_refuses_a_graph_broken_after_a_run_and_accepts_it_once_mended(db: Db) -> None:
    with db.hook.lifecycle(lock_timeout=30) as lc:
        who = db.ident()
        assert lc.claim("OK", who).action == "CREATED"
        lc.finish_run("OK", who, dict.fromkeys(("EXTRACT", "LOAD", "REPORT", "CHECK"), "skipped"))
        with closing(db.hook.get_conn()) as conn:
            db.hook.engine.execute(conn, _task_dep("OK", "EXTRACT", "OK", "REPORT").rstrip(";\n"))
        with pytest.raises(DependencyCycleError, match=r"EXTRACT -> REPORT -> LOAD -> EXTRACT"):
            lc.claim("OK", db.ident())
        with closing(db.hook.get_conn()) as conn:
            db.hook.engine.execute(
                conn,
                "UPDATE CFG_TASK_DEPENDENCY SET ACTIVE_FLAG = 'N' WHERE TASK_ID = (SELECT TASK_ID FROM CFG_TASKS "
                "WHERE TASK_CODE = 'EXTRACT' AND PIPELINE_ID = (SELECT PIPELINE_ID FROM CFG_PIPELINES "
                "WHERE PIPELINE_CODE = 'OK'))",
            )
        assert lc.claim("OK", db.ident()).action == "CREATED"


def test_a_claim_on_an_engine_db_without_tables_still_names_the_command_to_run(
    engine: EngineSetup,
) -> None:
    """The graph read is the claim's first statement: on an empty Engine DB it fails, and the schema check
    still explains, as it did before the read."""
    hook = engine.hook()
    if engine.dialect == "sqlite":
        hook.init_db()
        with closing(sqlite3.connect(hook.engine.path)) as conn:  # type: ignore[attr-defined]
            conn.execute("DROP TABLE CFG_TASK_DEPENDENCY")
    else:
        hook.init_db()
        with closing(hook.get_conn()) as conn:
            hook.engine.execute(conn, "DROP TABLE CFG_TASK_DEPENDENCY CASCADE")
    with hook.lifecycle() as lc, pytest.raises(EtlCraftError) as refused:
        lc.claim("OK", RunIdentity("d", "r"))
    assert refused.value.status_name == "ENGINE_DB"
    assert "CFG_TASK_DEPENDENCY" in str(refused.value)


# -- the DAG check ---------------------------------------------------------------------------------------


def _ok_dag(hook_conn: str, *, drift: bool) -> Any:
    """The OK pipeline as a DAG: as CFG_ has it, or (``drift``) with REPORT missing, ARCHIVE (no CFG_ row)
    recorded instead, and LOAD no longer after EXTRACT."""
    dag_id = f"ok_{'drift' if drift else 'same'}"
    with (
        DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1)) as dag,
        etl_craft_pipeline("OK", etl_craft_conn_id=hook_conn),
    ):

        @etl_craft_task
        def extract() -> int:
            return 1

        @etl_craft_task
        def load() -> int:
            return 1

        @etl_craft_task
        def report() -> int:
            return 1

        @etl_craft_task
        def check() -> int:
            return 1

        @etl_craft_task
        def archive() -> int:
            return 1

        e, lo, c = extract(), load(), check()
        if drift:
            e >> archive()
        else:
            e >> lo >> report()
        e >> c
        lo >> c
    return dag


def test_the_dag_check_finds_no_difference_where_dag_and_engine_agree(db: Db) -> None:
    dag = _ok_dag("etl_craft_default", drift=False)
    assert check_dag_against_engine(dag, db.hook) == []
    assert_dag_matches_engine(dag, db.hook)


def test_the_dag_check_reports_each_kind_of_drift(db: Db) -> None:
    dag = _ok_dag("etl_craft_default", drift=True)
    found = check_dag_against_engine(dag, db.hook)
    assert found == [
        "pipeline OK: DAG ok_drift task ok.archive records task code ARCHIVE, which has no active row in CFG_TASKS",
        "pipeline OK: active task REPORT of CFG_TASKS has no recorded task in DAG ok_drift",
        "pipeline OK: CFG_TASK_DEPENDENCY says LOAD depends on EXTRACT, but in DAG ok_drift ok.extract is not "
        "directly upstream of ok.load",
    ]
    with pytest.raises(AssertionError, match=r"DAG ok_drift and the Engine DB disagree:\n- pipeline OK: "):
        assert_dag_matches_engine(dag, db.hook)


def test_the_dag_check_reports_an_edge_the_engine_lacks_and_the_graphs_problems(db: Db) -> None:
    with DAG("cycle_dag", schedule=None, start_date=datetime(2026, 1, 1)) as dag, etl_craft_pipeline("CYCLE"):

        @etl_craft_task
        def a() -> int:
            return 1

        @etl_craft_task
        def b() -> int:
            return 1

        @etl_craft_task
        def c() -> int:
            return 1

        @etl_craft_task
        def d() -> int:
            return 1

        ta, tb, tc, td = a(), b(), c(), d()
        tc >> tb >> ta
        td >> ta  # CFG_ has no dependency of A on D
    found = check_dag_against_engine(dag, db.hook)
    assert found[0] == (
        "pipeline CYCLE: CFG_TASK_DEPENDENCY says C depends on A, but in DAG cycle_dag cycle.a is not directly "
        "upstream of cycle.c"
    )
    assert found[1] == (
        "pipeline CYCLE: in DAG cycle_dag cycle.d runs before cycle.a, but CFG_TASK_DEPENDENCY has no active "
        "dependency of A on D"
    )
    assert found[2].startswith(
        "pipeline CYCLE: [DEPENDENCY_CYCLE] task dependencies form a cycle (A -> B -> C -> A"
    )
    assert len(found) == 3
    assert check_dag_against_engine(dag, db.hook, graph_problems=False) == found[:2]
