"""Dependencies, run conditions and pauses (docs/gates.md) on real Engine DBs, both dialects.

The truth table runs every dependency type against every upstream state, for the three kinds of edge:
pipeline → pipeline (judged at claim), cross-pipeline task edges and same-pipeline task edges (judged
when the task starts). The scenarios after it cover consumption: yesterday's success, repairs, failed
downstreams, backfills, and pauses.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.cli.main import main as cli_main
from airflow_provider_etl_craft.errors import RunStateError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import RunIdentity, RunLifecycle, TaskCounts
from airflow_provider_etl_craft.runs.gates import GateSkipped, GateWaiting
from harness.engines import EngineSetup, engine_rows

TYPES = ("SUCCESS", "FAILURE", "ALWAYS", "HAS_DATA")
STATES = ("NONE", "IN-PROGRESS", "SUCCESS_ROWS", "SUCCESS_NO_ROWS", "FAILED", "SKIPPED", "CANCELLED")

#: The documented result of each dependency type per upstream state (docs/gates.md, "Truth
#: table"): run = the gate is satisfied, skip = unsatisfied (recorded SKIPPED), wait = reschedule.
TRUTH = {
    "NONE":            {"SUCCESS": "skip", "FAILURE": "skip", "ALWAYS": "skip", "HAS_DATA": "skip"},
    "IN-PROGRESS":     {"SUCCESS": "wait", "FAILURE": "wait", "ALWAYS": "wait", "HAS_DATA": "wait"},
    "SUCCESS_ROWS":    {"SUCCESS": "run",  "FAILURE": "skip", "ALWAYS": "run",  "HAS_DATA": "run"},
    "SUCCESS_NO_ROWS": {"SUCCESS": "run",  "FAILURE": "skip", "ALWAYS": "run",  "HAS_DATA": "skip"},
    "FAILED":          {"SUCCESS": "skip", "FAILURE": "run",  "ALWAYS": "run",  "HAS_DATA": "skip"},
    "SKIPPED":         {"SUCCESS": "skip", "FAILURE": "skip", "ALWAYS": "run",  "HAS_DATA": "skip"},
    "CANCELLED":       {"SUCCESS": "skip", "FAILURE": "skip", "ALWAYS": "run",  "HAS_DATA": "skip"},
}  # fmt: skip
#: Same-pipeline edges read the current run: an upstream task that has not started yet is waited for.
TRUTH_SAME_RUN = {**TRUTH, "NONE": dict.fromkeys(TYPES, "wait")}


def _pipeline(code: str) -> str:
    return (f"INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) "
            f"VALUES ('{code}', '{code}', 'FULL', 'test');\n")  # fmt: skip


def _task(pipeline: str, code: str, condition: str | None = None, count: int | None = None) -> str:
    cond = "NULL" if condition is None else f"'{condition}'"
    n = "NULL" if count is None else str(count)
    return (f"INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, RUN_CONDITION, RUN_CONDITION_COUNT, "
            f"CREATED_BY) SELECT '{code}', 'ETL', PIPELINE_ID, 'PYTHON', {cond}, {n}, 'test' FROM CFG_PIPELINES "
            f"WHERE PIPELINE_CODE = '{pipeline}';\n")  # fmt: skip


def _pipeline_dep(down: str, up: str, kind: str, repairs: str | None = "N") -> str:
    """``repairs`` None leaves CONSUME_REPAIRS to its column default."""
    column, value = ("", "") if repairs is None else (" CONSUME_REPAIRS,", f" '{repairs}',")
    return (f"INSERT INTO CFG_PIPELINE_DEPENDENCY (PIPELINE_ID, DEPENDS_ON_PIPELINE_ID, DEPENDENCY_TYPE,{column} "
            f"CREATED_BY) SELECT d.PIPELINE_ID, u.PIPELINE_ID, '{kind}',{value} 'test' "
            f"FROM CFG_PIPELINES d, CFG_PIPELINES u WHERE d.PIPELINE_CODE = '{down}' AND u.PIPELINE_CODE = '{up}';\n")  # fmt: skip


def _task_dep(down: str, task: str, up: str, up_task: str, kind: str, repairs: str | None = "N") -> str:
    column, value = ("", "") if repairs is None else (" CONSUME_REPAIRS,", f" '{repairs}',")
    return (f"INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_PIPELINE_ID, DEPENDS_ON_TASK_ID, "
            f"DEPENDENCY_TYPE,{column} CREATED_BY) SELECT t.PIPELINE_ID, t.TASK_ID, u.PIPELINE_ID, u.TASK_ID, "
            f"'{kind}',{value} 'test' FROM CFG_TASKS t JOIN CFG_PIPELINES dp ON dp.PIPELINE_ID = t.PIPELINE_ID, "
            f"CFG_TASKS u JOIN CFG_PIPELINES up ON up.PIPELINE_ID = u.PIPELINE_ID WHERE dp.PIPELINE_CODE = '{down}' "
            f"AND t.TASK_CODE = '{task}' AND up.PIPELINE_CODE = '{up}' AND u.TASK_CODE = '{up_task}';\n")  # fmt: skip


def migration() -> str:
    """UP (task U1); P_<type> depend on UP; DOWN's tasks D_<type> depend on UP.U1; SAME's B_<type> on SAME.A;
    REPAIRS depends on UP with CONSUME_REPAIRS='Y'; DEFAULTS (and TASK_DEFAULTS.X) on UP (.U1) with the default
    CONSUME_REPAIRS; COND holds run conditions ANY / N=2 / ALL over X, Y, Z."""
    sql = _pipeline("UP") + _task("UP", "U1") + _pipeline("DOWN") + _pipeline("SAME") + _task("SAME", "A")
    for kind in TYPES:
        sql += _pipeline(f"P_{kind}") + _task(f"P_{kind}", "X") + _pipeline_dep(f"P_{kind}", "UP", kind)
        sql += _task("DOWN", f"D_{kind}") + _task_dep("DOWN", f"D_{kind}", "UP", "U1", kind)
        sql += _task("SAME", f"B_{kind}") + _task_dep("SAME", f"B_{kind}", "SAME", "A", kind)
    sql += _pipeline("REPAIRS") + _task("REPAIRS", "X") + _pipeline_dep("REPAIRS", "UP", "SUCCESS", "Y")
    sql += _task("DOWN", "D_REPAIRS") + _task_dep("DOWN", "D_REPAIRS", "UP", "U1", "SUCCESS", "Y")
    # Edges that leave CONSUME_REPAIRS to its default ('Y', as in etl-craft): a pipeline edge and a task edge.
    sql += _pipeline("DEFAULTS") + _task("DEFAULTS", "X") + _pipeline_dep("DEFAULTS", "UP", "SUCCESS", None)
    sql += _pipeline("TASK_DEFAULTS") + _task("TASK_DEFAULTS", "X")
    sql += _task_dep("TASK_DEFAULTS", "X", "UP", "U1", "SUCCESS", None)
    sql += _pipeline("COND") + "".join(_task("COND", c) for c in ("X", "Y", "Z"))
    for code, condition, count in (("ANY_OF", "ANY", None), ("TWO_OF", "N", 2), ("ALL_OF", "ALL", None),
                                   ("DATA_OF", None, None)):  # fmt: skip
        sql += _task("COND", code, condition, count)
    for code in ("ANY_OF", "TWO_OF", "ALL_OF"):
        sql += "".join(_task_dep("COND", code, "COND", up, "SUCCESS") for up in ("X", "Y", "Z"))
    sql += _task_dep("COND", "DATA_OF", "COND", "X", "HAS_DATA")
    return sql


@dataclass
class Db:
    hook: EngineDBHook
    lc: RunLifecycle
    serial: int = 0

    def records(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return engine_rows(self.hook, sql, params)

    def ident(self, dag: str, backfill: bool = False) -> RunIdentity:
        self.serial += 1
        return RunIdentity(dag_id=dag, run_id=f"run_{self.serial}", run_date=datetime(2026, 1, 2, tzinfo=UTC),
                           backfill=backfill)  # fmt: skip

    def upstream(self, state: str, backfill: bool = False) -> int | None:
        """Make a run of UP end in ``state`` (or leave it IN-PROGRESS); returns its id."""
        if state == "NONE":
            return None
        who = self.ident("up_dag", backfill)
        run_id = self.lc.claim("UP", who).pipeline_run_id
        if state == "CANCELLED":
            assert self.lc.close_abandoned("UP", run_id, who, "test")
        elif state == "SKIPPED":
            self.lc.finish_run("UP", who, {"U1": "skipped"})
        elif state != "IN-PROGRESS":
            handle = self.lc.start_task("UP", "U1", who, 1)
            if state == "FAILED":
                self.lc.finish_task(handle, "FAILED", error="upstream broke")
            else:
                self.lc.finish_task(
                    handle, "SUCCESS", TaskCounts(rows_written=5 if state == "SUCCESS_ROWS" else 0)
                )
            self.lc.finish_run("UP", who, {"U1": "failed" if state == "FAILED" else "success"})
        assert self.status(run_id) == ("IN-PROGRESS" if state == "IN-PROGRESS" else state.split("_")[0])
        return run_id

    def status(self, run_id: int) -> str:
        return self.records("SELECT STATUS FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = ?", run_id)[0][
            0
        ]

    def decisions(self, run_id: int) -> list[tuple[Any, ...]]:
        return self.records(
            "SELECT ATTEMPT_ID, SELECTED_PIPELINE_RUN_ID, SELECTED_REVISION, RESULT, REASON FROM AUD_GATE_DECISIONS "
            "WHERE PIPELINE_RUN_ID = ? ORDER BY DECISION_ID", run_id)  # fmt: skip

    def consumed(self, pipeline: str) -> list[tuple[Any, ...]]:
        return self.records(
            "SELECT c.PIPELINE_RUN_ID, c.CONSUMED_PIPELINE_RUN_ID, c.CONSUMED_REVISION, c.CONSUMED_TASK_RUN_ID, "
            "c.TASK_ID FROM AUD_DEPENDENCY_CONSUMPTION c JOIN CFG_PIPELINES p ON p.PIPELINE_ID = c.PIPELINE_ID "
            "WHERE p.PIPELINE_CODE = ? ORDER BY c.CONSUMPTION_ID", pipeline)  # fmt: skip

    def task_run(self, run_id: int, code: str) -> tuple[Any, ...]:
        return self.records(
            "SELECT tr.STATUS, tr.TASK_LOG, a.STATUS, a.ERROR_MESSAGE FROM AUD_TASK_RUN_LOG tr JOIN CFG_TASKS t ON "
            "t.TASK_ID = tr.TASK_ID LEFT JOIN AUD_TASK_ATTEMPTS a ON a.TASK_RUN_ID = tr.TASK_RUN_ID WHERE "
            "tr.PIPELINE_RUN_ID = ? AND t.TASK_CODE = ? ORDER BY a.ATTEMPT_NUMBER DESC", run_id, code)[0]  # fmt: skip

    def run_downstream_pipeline(self, code: str, identity: RunIdentity, task_status: str = "SUCCESS") -> int:
        """Claim ``code`` (must be CREATED), run its task X with ``task_status``, finish; returns the run id."""
        outcome = self.lc.claim(code, identity)
        assert outcome.action == "CREATED", outcome
        handle = self.lc.start_task(code, "X", identity, 1)
        self.lc.finish_task(handle, task_status, TaskCounts(rows_written=1))
        self.lc.finish_run(code, identity, {"X": "success" if task_status == "SUCCESS" else "failed"})
        return outcome.pipeline_run_id


@pytest.fixture
def db(engine: EngineSetup, tmp_path: Path) -> Iterator[Db]:
    folder = tmp_path / "project-migrations"
    folder.mkdir()
    (folder / "0001_gates.sql").write_text(migration(), encoding="utf-8")
    hook = engine.hook()
    hook.migrate(folder)
    with hook.lifecycle(lock_timeout=30) as lc:
        yield Db(hook, lc)


def _task_outcome(db: Db, pipeline: str, task: str, who: RunIdentity, try_number: int = 1,
                  states: dict[str, str | None] | None = None) -> str:  # fmt: skip
    try:
        handle = db.lc.start_task(pipeline, task, who, try_number,
                                  upstream_states=(lambda codes: {c: (states or {}).get(c) for c in codes}))  # fmt: skip
    except GateWaiting:
        return "wait"
    except GateSkipped:
        return "skip"
    db.lc.finish_task(handle, "SUCCESS")
    return "run"


# -- the truth table -----------------------------------------------------------------------------------


@pytest.mark.parametrize("state", STATES)
def test_truth_table_for_pipeline_edges(db: Db, state: str) -> None:
    up_run = db.upstream(state)
    for kind in TYPES:
        outcome = db.lc.claim(f"P_{kind}", db.ident(f"p_{kind}"))
        got = {"CREATED": "run", "SKIPPED": "skip", "WAITING": "wait"}[outcome.action]
        assert got == TRUTH[state][kind], (kind, outcome)
        if got == "wait":
            assert outcome.pipeline_run_id is None and f"run {up_run} of UP" in outcome.reason
            continue
        assert db.status(outcome.pipeline_run_id) == ("IN-PROGRESS" if got == "run" else "SKIPPED")
        [(attempt, selected, _, result, reason)] = db.decisions(outcome.pipeline_run_id)
        assert attempt is None and result == ("SATISFIED" if got == "run" else "UNSATISFIED")
        assert selected == up_run and f"{kind} on UP" in reason


@pytest.mark.parametrize("state", STATES)
def test_truth_table_for_cross_pipeline_task_edges(db: Db, state: str) -> None:
    up_run = db.upstream(state)
    who = db.ident("down")
    run_id = db.lc.claim("DOWN", who).pipeline_run_id
    for kind in TYPES:
        got = _task_outcome(db, "DOWN", f"D_{kind}", who)
        assert got == TRUTH[state][kind], kind
        if got == "wait":
            assert db.records("SELECT COUNT(*) FROM AUD_TASK_RUN_LOG tr JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
                              "WHERE t.TASK_CODE = ?", f"D_{kind}") == [(0,)]  # fmt: skip
            continue
        task_status, log, attempt_status, _ = db.task_run(run_id, f"D_{kind}")
        if got == "run":
            assert (task_status, attempt_status) == ("SUCCESS", "SUCCESS")
        else:
            assert (task_status, attempt_status) == ("SKIPPED", "CANCELLED") and f"{kind} on UP.U1" in log
    decided = [d for d in db.decisions(run_id)]
    assert len(decided) == sum(1 for k in TYPES if TRUTH[state][k] != "wait")
    assert all(d[0] is not None and d[1] == up_run for d in decided)  # an attempt's decisions, naming the run


@pytest.mark.parametrize("state", STATES)
def test_truth_table_for_same_pipeline_task_edges(db: Db, state: str) -> None:
    who = db.ident("same")
    db.lc.claim("SAME", who)
    if state == "SKIPPED":  # A never ran: Airflow reports it skipped, and it has no row
        airflow = {"A": "skipped"}
    else:
        airflow = {}
        if state != "NONE":
            handle = db.lc.start_task("SAME", "A", who, 1)
            if state in ("SUCCESS_ROWS", "SUCCESS_NO_ROWS"):
                db.lc.finish_task(
                    handle, "SUCCESS", TaskCounts(rows_written=5 if state == "SUCCESS_ROWS" else 0)
                )
            elif state in ("FAILED", "CANCELLED"):
                db.lc.finish_task(handle, state)
    for kind in TYPES:
        assert _task_outcome(db, "SAME", f"B_{kind}", who, states=airflow) == TRUTH_SAME_RUN[state][kind], (
            kind
        )


def test_same_pipeline_upstream_without_a_row_is_read_from_airflow(db: Db) -> None:
    who = db.ident("same")
    db.lc.claim("SAME", who)
    assert _task_outcome(db, "SAME", "B_SUCCESS", who, states={"A": "running"}) == "wait"
    assert (
        _task_outcome(db, "SAME", "B_FAILURE", who, states={"A": "failed"}) == "run"
    )  # failed before recording
    assert _task_outcome(db, "SAME", "B_ALWAYS", who, states={"A": "upstream_failed"}) == "run"
    assert _task_outcome(db, "SAME", "B_SUCCESS", who, states={"A": "upstream_failed"}) == "skip"


# -- run conditions --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("x", "y", "z", "expected"), [
    # X, Y, Z end like this; ANY_OF / TWO_OF / ALL_OF need 1 / 2 / 3 of them SUCCESS.
    ("SUCCESS", "FAILED", "FAILED", {"ANY_OF": "run", "TWO_OF": "skip", "ALL_OF": "skip"}),
    ("SUCCESS", "SUCCESS", "FAILED", {"ANY_OF": "run", "TWO_OF": "run", "ALL_OF": "skip"}),
    ("SUCCESS", "SUCCESS", "SUCCESS", {"ANY_OF": "run", "TWO_OF": "run", "ALL_OF": "run"}),
    ("FAILED", "FAILED", "FAILED", {"ANY_OF": "skip", "TWO_OF": "skip", "ALL_OF": "skip"}),
    # Z still running: decided early where the others already decide it, else wait.
    ("SUCCESS", "SUCCESS", None, {"ANY_OF": "run", "TWO_OF": "run", "ALL_OF": "wait"}),
    ("FAILED", "FAILED", None, {"ANY_OF": "wait", "TWO_OF": "skip", "ALL_OF": "skip"}),
    ("SUCCESS", "FAILED", None, {"ANY_OF": "run", "TWO_OF": "wait", "ALL_OF": "skip"}),
])  # fmt: skip
def test_run_conditions_any_n_and_all(
    db: Db, x: str, y: str, z: str | None, expected: dict[str, str]
) -> None:
    who = db.ident("cond")
    run_id = db.lc.claim("COND", who).pipeline_run_id
    for code, end in (("X", x), ("Y", y), ("Z", z)):
        handle = db.lc.start_task("COND", code, who, 1)
        if end is not None:
            db.lc.finish_task(handle, end)
    got = {code: _task_outcome(db, "COND", code, who) for code in expected}
    assert got == expected
    for code, result in expected.items():
        if result == "skip":
            assert "dependencies satisfied" in db.task_run(run_id, code)[1]


def test_the_claim_names_tasks_that_need_a_lenient_trigger_rule(db: Db) -> None:
    codes = ["X", "Y", "Z", "ANY_OF", "TWO_OF", "ALL_OF", "DATA_OF"]
    assert db.lc.claim("COND", db.ident("cond"), codes).lenient_tasks == ("ANY_OF", "TWO_OF")
    assert db.lc.claim("SAME", db.ident("same"), ["A", *(f"B_{k}" for k in TYPES)]).lenient_tasks == (
        "B_ALWAYS",
        "B_FAILURE",
    )


def test_has_data_reads_the_rows_the_upstream_task_wrote(db: Db) -> None:
    for rows, expected in ((0, "skip"), (3, "run")):
        who = db.ident("cond")
        db.lc.claim("COND", who)
        db.lc.finish_task(
            db.lc.start_task("COND", "X", who, 1), "SUCCESS", TaskCounts.from_result({"insert_count": rows})
        )  # rows_written = inserts
        assert _task_outcome(db, "COND", "DATA_OF", who) == expected
        db.lc.finish_run("COND", who, {})


# -- consumption ------------------------------------------------------------------------------------------


def test_yesterdays_success_does_not_count_until_a_newer_upstream_run_ends(db: Db) -> None:
    first = db.upstream("SUCCESS_ROWS")
    today = db.run_downstream_pipeline("P_SUCCESS", db.ident("p"))
    assert db.consumed("P_SUCCESS") == [(today, first, 1, None, None)]
    again = db.lc.claim("P_SUCCESS", db.ident("p"))
    assert again.action == "SKIPPED" and f"run {first}" in again.reason and "consumed already" in again.reason
    second = db.upstream("SUCCESS_ROWS")
    tomorrow = db.run_downstream_pipeline("P_SUCCESS", db.ident("p"))
    assert db.consumed("P_SUCCESS") == [(today, first, 1, None, None), (tomorrow, second, 1, None, None)]


def test_a_repaired_upstream_run_satisfies_only_edges_that_consume_repairs(db: Db) -> None:
    who = db.ident("up_dag")
    db.lc.claim("UP", who)
    db.lc.finish_task(db.lc.start_task("UP", "U1", who, 1), "SUCCESS", TaskCounts(rows_written=2))
    db.lc.finish_run("UP", who, {"U1": "success"})
    db.run_downstream_pipeline("P_SUCCESS", db.ident("p"))
    up_run = db.consumed("P_SUCCESS")[0][1]
    db.run_downstream_pipeline("REPAIRS", db.ident("r"))
    # The same upstream run, repaired (cleared in Airflow): its OUTPUT_REVISION goes from 1 up to 2.
    assert db.lc.claim("UP", who).action == "REOPENED"
    db.lc.finish_task(db.lc.start_task("UP", "U1", who, 2), "SUCCESS", TaskCounts(rows_written=2))
    db.lc.finish_run("UP", who, {"U1": "success"})
    assert db.records(
        "SELECT OUTPUT_REVISION FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = ?", up_run
    ) == [(2,)]
    skipped = db.lc.claim("P_SUCCESS", db.ident("p"))
    assert skipped.action == "SKIPPED" and "CONSUME_REPAIRS='N'" in skipped.reason
    repaired = db.run_downstream_pipeline("REPAIRS", db.ident("r"))
    assert db.consumed("REPAIRS")[-1][:3] == (repaired, up_run, 2)


def test_edges_inserted_without_consume_repairs_take_etl_crafts_default_and_consume_a_repair(db: Db) -> None:
    assert db.records(
        "SELECT d.CONSUME_REPAIRS FROM CFG_PIPELINE_DEPENDENCY d JOIN CFG_PIPELINES p ON p.PIPELINE_ID = d.PIPELINE_ID "
        "WHERE p.PIPELINE_CODE = 'DEFAULTS' UNION ALL SELECT d.CONSUME_REPAIRS FROM CFG_TASK_DEPENDENCY d JOIN "
        "CFG_PIPELINES p ON p.PIPELINE_ID = d.PIPELINE_ID WHERE p.PIPELINE_CODE = 'TASK_DEFAULTS'"
    ) == [("Y",), ("Y",)]
    who = db.ident("up_dag")
    up_run = db.lc.claim("UP", who).pipeline_run_id
    db.lc.finish_task(db.lc.start_task("UP", "U1", who, 1), "SUCCESS", TaskCounts(rows_written=2))
    db.lc.finish_run("UP", who, {"U1": "success"})
    first = db.run_downstream_pipeline("DEFAULTS", db.ident("d"))
    task_run = db.run_downstream_pipeline("TASK_DEFAULTS", db.ident("t"))
    assert db.consumed("DEFAULTS") == [(first, up_run, 1, None, None)]
    assert [c[:3] for c in db.consumed("TASK_DEFAULTS")] == [(task_run, up_run, 1)]
    # Nothing new upstream: both edges have consumed it already.
    assert db.lc.claim("DEFAULTS", db.ident("d")).action == "SKIPPED"
    # The upstream run is repaired (revision 2): both downstreams are triggered again by the same run.
    assert db.lc.claim("UP", who).action == "REOPENED"
    db.lc.finish_task(db.lc.start_task("UP", "U1", who, 2), "SUCCESS", TaskCounts(rows_written=2))
    db.lc.finish_run("UP", who, {"U1": "success"})
    again = db.run_downstream_pipeline("DEFAULTS", db.ident("d"))
    task_again = db.run_downstream_pipeline("TASK_DEFAULTS", db.ident("t"))
    assert db.consumed("DEFAULTS")[-1][:3] == (again, up_run, 2)
    assert db.consumed("TASK_DEFAULTS")[-1][:3] == (task_again, up_run, 2)


def test_a_failed_downstream_consumes_nothing_and_is_judged_again_against_the_same_run(db: Db) -> None:
    up_run = db.upstream("SUCCESS_ROWS")
    failed = db.run_downstream_pipeline("P_SUCCESS", db.ident("p"), task_status="FAILED")
    assert db.status(failed) == "FAILED" and db.consumed("P_SUCCESS") == []
    retried = db.run_downstream_pipeline("P_SUCCESS", db.ident("p"))
    assert db.decisions(retried)[0][1] == up_run and db.consumed("P_SUCCESS") == [
        (retried, up_run, 1, None, None)
    ]


def test_a_task_edge_consumes_on_attempt_success_only(db: Db) -> None:
    up_run = db.upstream("SUCCESS_ROWS")
    up_task_run = db.records("SELECT TASK_RUN_ID FROM AUD_TASK_RUN_LOG WHERE PIPELINE_RUN_ID = ?", up_run)[0][
        0
    ]
    who = db.ident("down")
    run_id = db.lc.claim("DOWN", who).pipeline_run_id
    db.lc.finish_task(db.lc.start_task("DOWN", "D_SUCCESS", who, 1), "FAILED", error="boom")
    assert db.consumed("DOWN") == []
    db.lc.finish_task(db.lc.start_task("DOWN", "D_SUCCESS", who, 2), "SUCCESS")  # judged again: the same run
    task_id = db.records("SELECT TASK_ID FROM CFG_TASKS WHERE TASK_CODE = 'D_SUCCESS'")[0][0]
    assert db.consumed("DOWN") == [(run_id, up_run, 1, up_task_run, task_id)]
    assert [d[3] for d in db.decisions(run_id)] == ["SATISFIED", "SATISFIED"]  # one decision per attempt
    # Consumed: the next run's task is not satisfied by the same upstream run.
    who2 = db.ident("down")
    db.lc.finish_run("DOWN", who, {})
    db.lc.claim("DOWN", who2)
    assert _task_outcome(db, "DOWN", "D_SUCCESS", who2) == "skip"


def test_backfill_runs_of_the_upstream_are_invisible(db: Db) -> None:
    db.upstream("SUCCESS_ROWS", backfill=True)
    skipped = db.lc.claim("P_SUCCESS", db.ident("p"))
    assert skipped.action == "SKIPPED" and "no finished run of UP" in skipped.reason
    db.upstream("IN-PROGRESS", backfill=True)  # a running backfill is not waited for either
    assert db.lc.claim("P_ALWAYS", db.ident("p")).action == "SKIPPED"


# -- pauses ---------------------------------------------------------------------------------------------


def test_a_paused_pipeline_skips_its_claims_and_holds_its_tasks_until_resumed(
    db: Db, engine: EngineSetup
) -> None:
    running = db.ident("same")
    db.lc.claim("SAME", running)
    out = io.StringIO()
    args = ["--config", str(engine.config_path)]
    assert cli_main(["pause", *args, "--pipeline", "SAME", "--reason", "warehouse upgrade", "--by", "jane"],
                    out=out) == 0  # fmt: skip
    assert "paused by jane" in out.getvalue()
    with pytest.raises(RunStateError, match="already|paused by jane"):
        db.lc.pause("SAME", "again", "bob")
    # A running run starts no new task while paused (nothing written); a new DAG run's claim is skipped.
    with pytest.raises(GateWaiting, match="paused by jane.*warehouse upgrade"):
        db.lc.start_task("SAME", "A", running, 1)
    db.lc.finish_run("SAME", running, {})
    nxt = db.ident("same")
    skipped = db.lc.claim("SAME", nxt)
    assert skipped.action == "SKIPPED" and "warehouse upgrade" in skipped.reason
    assert db.records("SELECT STATUS, ENDED_BY, ENDED_BY_KIND FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = ?",
                      skipped.pipeline_run_id) == [("SKIPPED", "jane", "HUMAN")]  # fmt: skip
    assert db.lc.finish_run("SAME", nxt, {}).status == "SKIPPED"
    err = io.StringIO()
    assert cli_main(["resume", *args, "--pipeline", "SAME", "--reason", "done", "--by", "jane"], out=out) == 0
    assert cli_main(["resume", *args, "--pipeline", "SAME", "--reason", "done"], out=out, err=err) == 9
    assert "not paused" in err.getvalue()
    assert db.lc.claim("SAME", db.ident("same")).action == "CREATED"
    assert db.records("SELECT PAUSED_BY, PAUSED_BY_KIND, REASON, RESUMED_BY, RESUMED_BY_KIND, RESUME_REASON FROM "
                      "AUD_PIPELINE_PAUSES") == [("jane", "HUMAN", "warehouse upgrade", "jane", "HUMAN", "done")]  # fmt: skip
