"""``status`` and ``history`` on both dialects: real runs written through RunLifecycle, read back by the CLI."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.runs.counts import TaskCounts
from harness.engines import EngineSetup
from tests.fixtures.run_history import (
    HOST,
    LONG_ERROR,
    PID,
    Runs,
    add_gate_and_intervention,
    day,
    ident,
    write_runs,
)

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
#: Timestamps the lifecycle takes from the clock: checked for their form, then replaced by "T".
CLOCK_KEYS = {"start_date", "end_date", "started_at", "ended_at", "paused_at"}


@pytest.fixture
def runs(engine: EngineSetup, tmp_path: Path) -> Runs:
    return write_runs(engine, tmp_path)


def cli(setup: EngineSetup, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main([*args, "--config", str(setup.config_path)], out, err)
    return status, out.getvalue(), err.getvalue()


def cli_json(setup: EngineSetup, *args: str) -> dict[str, Any]:
    status, out, err = cli(setup, *args, "--format", "json")
    assert (status, err) == (0, "")
    return json.loads(out)


def normalized(value: Any) -> Any:
    """The document with clock timestamps checked (ISO-8601 UTC, milliseconds) and replaced by ``"T"``."""
    if isinstance(value, list):
        return [normalized(v) for v in value]
    if not isinstance(value, dict):
        return value
    for key in CLOCK_KEYS & value.keys():
        assert value[key] is None or ISO_MS.match(value[key]), (key, value[key])
    return {k: ("T" if k in CLOCK_KEYS and v is not None else normalized(v)) for k, v in value.items()}


def stripped_ids(value: Any) -> Any:
    """Drop TASK_RUN_ID/ATTEMPT_ID (surrogate keys) after checking they are integers."""
    if isinstance(value, list):
        return [stripped_ids(v) for v in value]
    if not isinstance(value, dict):
        return value
    for key in ("task_run_id", "attempt_id"):
        if key in value:
            assert isinstance(value[key], int)
    return {k: stripped_ids(v) for k, v in value.items() if k not in ("task_run_id", "attempt_id")}


def table(text: str, title: str, first_header: str = "PIPELINE_RUN_ID") -> list[dict[str, str]]:
    """The rows of the table that follows the line ``title``, as dicts (cells are split on 2+ spaces)."""
    lines = text.splitlines()
    start = lines.index(title) + 1
    assert lines[start].startswith(first_header)
    headers = lines[start].split()
    body = []
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line)
        assert len(cells) == len(headers), line
        body.append(dict(zip(headers, cells, strict=True)))
    return body


def counts(
    source=None, target=None, insert=None, update=None, delete=None, rows=None
) -> dict[str, int | None]:  # noqa: ANN001
    return {"source_count": source, "target_count": target, "insert_count": insert, "update_count": update,
            "delete_count": delete, "rows_written": rows}  # fmt: skip


def attempt(number: int, status: str, error: str | None = None, ended: bool = True,
            map_index: int | None = None) -> dict[str, Any]:  # fmt: skip
    return {"map_index": map_index, "attempt_number": number, "status": status, "host": HOST, "pid": PID, "started_at": "T",
            "ended_at": "T" if ended else None, "error_message": error, "queued_at": None}  # fmt: skip


def task_run(code: str, status: str, attempts: list[dict[str, Any]], error: str | None = None,
             log: str | None = None, ended: bool = True, **counted: int) -> dict[str, Any]:  # fmt: skip
    return {"task_code": code, "status": status, "attempt_count": len(attempts), **counts(**counted),
            "start_date": "T", "end_date": "T" if ended else None, "error_message": error, "task_log": log,
            "attempts": attempts}  # fmt: skip


def expected_runs(runs: Runs) -> list[dict[str, Any]]:
    """The three SALES runs as ``history --format json`` shows them, newest first."""

    def run(run_id: int, n: int, status: str, sla: str | None, summary: dict[str, int],
            tasks: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
        return {"pipeline_run_id": run_id, "status": status, "run_key": f"airflow:sales_dag:r{n}",
                "run_date": f"2026-07-0{n}", "start_date": "T",
                "end_date": None if status == "IN-PROGRESS" else "T", "sla_status": sla, "output_revision": 1,
                "trigger_kind": "ORCHESTRATOR", "backfill": "N", "task_status_counts": summary, "task_runs": tasks,
                "gate_decisions": [], "interventions": []}  # fmt: skip

    skipped_log = "not run by Airflow (Airflow state: {})"
    return [
        run(runs.running, 3, "IN-PROGRESS", None, {"IN-PROGRESS": 1}, [
            task_run("EXTRACT", "IN-PROGRESS", [attempt(1, "RUNNING", ended=False)], ended=False),
        ]),
        run(runs.failed, 2, "FAILED", "MET", {"SUCCESS": 2, "FAILED": 1, "SKIPPED": 1}, [
            task_run("EXTRACT", "SUCCESS", [attempt(1, "SUCCESS")], source=4, insert=4, rows=4),
            task_run("LOAD", "FAILED", [attempt(1, "FAILED", "OperationalError: connection reset"),
                                        attempt(2, "FAILED", LONG_ERROR)], error=LONG_ERROR),
            task_run("ALERT", "SUCCESS", [attempt(1, "SUCCESS")]),
            task_run("MART", "SKIPPED", [], log=skipped_log.format("upstream_failed")),
        ]),
        run(runs.ok, 1, "SUCCESS", "MET", {"SUCCESS": 3, "SKIPPED": 1}, [
            task_run("EXTRACT", "SUCCESS", [attempt(1, "SUCCESS")], source=10, target=10, insert=7, update=2,
                     delete=1, rows=10),
            task_run("LOAD", "SUCCESS", [attempt(1, "SUCCESS")], rows=5),
            task_run("MART", "SUCCESS", [attempt(1, "SUCCESS")], insert=3, rows=3),
            task_run("ALERT", "SKIPPED", [], log=skipped_log.format("skipped")),
        ]),
    ]  # fmt: skip


SALES = {"pipeline_code": "SALES", "pipeline_name": "Sales", "active_flag": "Y", "sla_in_hours": 2.0}


def pipeline_doc(doc: dict[str, Any]) -> dict[str, Any]:
    assert isinstance(doc["pipeline"].pop("pipeline_id"), int)
    return doc["pipeline"]


def test_history_json_has_every_run_task_run_and_attempt_newest_first(
    engine: EngineSetup, runs: Runs
) -> None:
    doc = cli_json(engine, "history", "--pipeline", "SALES")

    assert list(doc) == ["pipeline", "runs", "next_before"]
    assert pipeline_doc(doc) == SALES
    assert stripped_ids(normalized(doc["runs"])) == expected_runs(runs)


def test_history_limit_keeps_the_newest_runs_and_only_their_task_runs(
    engine: EngineSetup, runs: Runs
) -> None:
    doc = cli_json(engine, "history", "--pipeline", "SALES", "--limit", "2")

    assert stripped_ids(normalized(doc["runs"])) == expected_runs(runs)[:2]
    assert [r["pipeline_run_id"] for r in cli_json(engine, "history", "--pipeline", "OTHER")["runs"]] == [
        runs.other
    ]
    everything = cli_json(
        engine, "history", "--pipeline", "SALES", "--limit", str(10**30)
    )  # beyond any SQL LIMIT
    assert [r["pipeline_run_id"] for r in everything["runs"]] == [runs.running, runs.failed, runs.ok]


def test_history_timestamps_are_the_stored_ones_in_utc(engine: EngineSetup, runs: Runs) -> None:
    hook = engine.hook()
    with closing(hook.get_conn()) as conn:
        stored = hook.engine.query(conn, "SELECT START_DATE, END_DATE FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = ?",
                                   (runs.ok,))[0]  # fmt: skip
    start, end = (hook.engine.from_db_time(v) for v in stored)
    run = cli_json(engine, "history", "--pipeline", "SALES")["runs"][-1]

    assert run["pipeline_run_id"] == runs.ok
    assert datetime.fromisoformat(run["start_date"]) == start.replace(
        microsecond=start.microsecond // 1000 * 1000
    )
    assert datetime.fromisoformat(run["end_date"]) == end.replace(microsecond=end.microsecond // 1000 * 1000)


def test_history_table_lists_runs_task_runs_and_attempts(engine: EngineSetup, runs: Runs) -> None:
    status, out, err = cli(engine, "history", "--pipeline", "SALES")

    assert (status, err) == (0, "")
    assert out.startswith("pipeline SALES (Sales): active (ACTIVE_FLAG=Y), SLA 2 hours\n")
    assert "3 most recent run(s), newest first (--limit 20)" in out
    run_rows = table(out, "3 most recent run(s), newest first (--limit 20)")
    assert [(r["PIPELINE_RUN_ID"], r["STATUS"], r["SLA_STATUS"], r["TASKS"]) for r in run_rows] == [
        (str(runs.running), "IN-PROGRESS", "-", "1 IN-PROGRESS"),
        (str(runs.failed), "FAILED", "MET", "2 SUCCESS, 1 FAILED, 1 SKIPPED"),
        (str(runs.ok), "SUCCESS", "MET", "3 SUCCESS, 1 SKIPPED"),
    ]
    assert run_rows[2]["RUN_KEY"] == "airflow:sales_dag:r1" and run_rows[2]["RUN_DATE"] == "2026-07-01"
    assert all(ISO_MS.match(r["START_DATE"]) for r in run_rows)
    tasks = {(r["PIPELINE_RUN_ID"], r["TASK_CODE"]): r for r in table(out, "task runs")}
    assert len(tasks) == 9
    extract = tasks[(str(runs.ok), "EXTRACT")]
    assert [extract[h] for h in ("STATUS", "ATTEMPT_COUNT", "SOURCE", "TARGET", "INSERT", "UPDATE", "DELETE",
                                 "ROWS_WRITTEN", "ERROR_MESSAGE")] == ["SUCCESS", "1", "10", "10", "7", "2", "1", "10", "-"]  # fmt: skip
    load = tasks[(str(runs.failed), "LOAD")]
    assert (load["STATUS"], load["ATTEMPT_COUNT"], load["ROWS_WRITTEN"]) == ("FAILED", "2", "-")
    assert load["ERROR_MESSAGE"] == LONG_ERROR[:59] + "…"  # shortened in the table, whole in JSON
    attempts = table(out, "attempts")
    load_attempts = [
        a for a in attempts if (a["PIPELINE_RUN_ID"], a["TASK_CODE"]) == (str(runs.failed), "LOAD")
    ]
    assert [(a["ATTEMPT_NUMBER"], a["STATUS"], a["HOST"], a["PID"]) for a in load_attempts] == [
        ("1", "FAILED", HOST, str(PID)), ("2", "FAILED", HOST, str(PID))]  # fmt: skip
    assert load_attempts[0]["ERROR_MESSAGE"] == "OperationalError: connection reset"
    assert len(attempts) == 8  # 3 + 4 + 1; SKIPPED task runs have none


def test_status_shows_the_running_run_and_an_open_pause(engine: EngineSetup, runs: Runs) -> None:
    hook = engine.hook()
    sql = ("INSERT INTO AUD_PIPELINE_PAUSES (PIPELINE_ID, PAUSED_AT, PAUSED_BY, PAUSED_BY_KIND, REASON, RESUMED_AT) "
           "SELECT PIPELINE_ID, ?, ?, 'HUMAN', ?, ? FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'SALES'")  # fmt: skip
    with closing(hook.get_conn()) as conn:
        at = hook.engine.to_db_time
        hook.engine.query(conn, sql, (at(day(1)), "ann", "old, resumed", at(day(2))))
        hook.engine.query(conn, sql, (at(day(4)), "bob", "warehouse upgrade", None))

    status, out, err = cli(engine, "status", "--pipeline", "SALES")

    assert (status, err) == (0, "")
    assert out.splitlines()[:2] == [
        "pipeline SALES (Sales): active (ACTIVE_FLAG=Y), SLA 2 hours",
        "paused since 2026-07-04T06:00:00.000Z by bob (HUMAN): warehouse upgrade",
    ]
    assert [(r["PIPELINE_RUN_ID"], r["STATUS"], r["RUN_KEY"]) for r in table(out, "current run")] == [
        (str(runs.running), "IN-PROGRESS", "airflow:sales_dag:r3")]  # fmt: skip
    assert [(r["TASK_CODE"], r["STATUS"], r["END_DATE"]) for r in table(out, "task runs")] == [
        ("EXTRACT", "IN-PROGRESS", "-")
    ]
    assert [(a["ATTEMPT_NUMBER"], a["STATUS"], a["PID"]) for a in table(out, "attempts")] == [
        ("1", "RUNNING", str(PID))
    ]

    doc = cli_json(engine, "status", "--pipeline", "SALES")
    assert list(doc) == ["pipeline", "pause", "run"]
    assert pipeline_doc(doc) == SALES
    assert doc["pause"] == {"pause_id": doc["pause"]["pause_id"], "paused_at": "2026-07-04T06:00:00.000Z", "paused_by": "bob", "paused_by_kind": "HUMAN",
                            "reason": "warehouse upgrade"}  # fmt: skip
    assert stripped_ids(normalized(doc["run"])) == expected_runs(runs)[0]


def test_status_without_a_running_run_shows_the_latest(engine: EngineSetup, runs: Runs) -> None:
    status, out, _ = cli(engine, "status", "--pipeline", "OTHER")

    assert status == 0 and "paused" not in out
    assert [(r["PIPELINE_RUN_ID"], r["STATUS"], r["TASKS"]) for r in table(out, "latest run")] == [
        (str(runs.other), "SUCCESS", "1 SUCCESS")]  # fmt: skip
    assert [(r["TASK_CODE"], r["ROWS_WRITTEN"]) for r in table(out, "task runs")] == [("COPY", "1")]
    doc = cli_json(engine, "status", "--pipeline", "OTHER")
    assert (doc["pause"], doc["run"]["pipeline_run_id"], doc["pipeline"]["sla_in_hours"]) == (
        None,
        runs.other,
        None,
    )


def test_a_pipeline_without_runs_says_so(engine: EngineSetup, runs: Runs) -> None:
    for command in ("status", "history"):
        status, out, err = cli(engine, command, "--pipeline", "IDLE")
        assert (status, err) == (0, "")
        assert out.splitlines() == ["pipeline IDLE (Idle): active (ACTIVE_FLAG=Y), SLA none",
                                    "no runs of pipeline IDLE yet"]  # fmt: skip
    assert cli_json(engine, "status", "--pipeline", "IDLE")["run"] is None
    assert cli_json(engine, "history", "--pipeline", "IDLE")["runs"] == []


@pytest.mark.parametrize("command", ["status", "history"])
def test_an_unknown_pipeline_exits_4_with_one_error_line(
    engine: EngineSetup, runs: Runs, command: str
) -> None:
    for fmt in ("table", "json"):
        status, out, err = cli(engine, command, "--pipeline", "SALE", "--format", fmt)

        assert (status, out) == (4, "")
        assert len(err.splitlines()) == 1
        assert err.startswith("error: pipeline SALE does not exist in CFG_PIPELINES of the Engine DB ")
        assert err.rstrip().endswith("did you mean SALES?")


def test_an_engine_db_without_tables_exits_12(engine: EngineSetup) -> None:
    status, out, err = cli(engine, "status", "--pipeline", "SALES")

    assert (status, out) == (12, "")
    # PostgreSQL: the database has no Engine tables; SQLite: no file (only init-db creates one).
    assert err.startswith(("error: the Engine DB ", "error: the SQLite Engine DB "))
    assert "`etl-craft-airflow init-db`" in err


@pytest.mark.parametrize(("limit", "message"), [("0", "must be 1 or more, got 0"), ("-3", "must be 1 or more"),
                                                ("two", "must be a whole number")])  # fmt: skip
def test_history_limit_below_one_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], limit: str,
                                                  message: str) -> None:  # fmt: skip
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exited:
        main(
            ["history", "--pipeline", "SALES", "--limit", limit, "--config", str(tmp_path / "none.yml")],
            out,
            err,
        )

    assert exited.value.code == 2
    usage = capsys.readouterr().err
    assert "usage: etl-craft-airflow history" in usage and f"argument --limit: {message}" in usage
    assert (out.getvalue(), err.getvalue()) == ("", "")


def test_console_script_prints_only_the_json_document(engine: EngineSetup, runs: Runs) -> None:
    script = Path(sys.executable).with_name("etl-craft-airflow")
    result = subprocess.run(
        [str(script), "--profile", "test", "history", "--pipeline", "SALES", "--format", "json", "--config",
         str(engine.config_path)],
        capture_output=True, text=True, env=engine.subprocess_env(), cwd=engine.config_path.parent, timeout=120,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert json.loads(result.stdout) == cli_json(engine, "history", "--pipeline", "SALES")


@pytest.mark.postgres
def test_a_secret_echoed_into_an_error_message_is_masked(make_engine: Callable[[str], EngineSetup],
                                                         tmp_path: Path) -> None:  # fmt: skip
    engine = make_engine("postgresql")
    runs = write_runs(engine, tmp_path)
    secret = engine.env["ENGINE_SECRET"]
    who = ident("r3", 3)
    with engine.hook().lifecycle() as lc:
        handle = lc.start_task("SALES", "LOAD", who, 1)
        lc.finish_task(handle, "FAILED", error=f"could not connect with password={secret} to the warehouse")

    status, out, _ = cli(engine, "status", "--pipeline", "SALES")
    doc = cli_json(engine, "history", "--pipeline", "SALES")
    script = Path(sys.executable).with_name("etl-craft-airflow")
    result = subprocess.run(
        [str(script), "status", "--pipeline", "SALES", "--format", "json", "--config", str(engine.config_path)],
        capture_output=True, text=True, env=engine.subprocess_env(), timeout=120,
    )  # fmt: skip

    assert status == 0 and result.returncode == 0, result.stderr
    for text in (out, json.dumps(doc), result.stdout, result.stderr):
        assert secret not in text
    load = next(t for t in json.loads(result.stdout)["run"]["task_runs"] if t["task_code"] == "LOAD")
    assert load["error_message"] == "could not connect with password=*** to the warehouse"
    assert doc["runs"][0]["pipeline_run_id"] == runs.running


def test_status_and_history_show_the_map_index_of_a_mapped_tasks_attempts(
    engine: EngineSetup, runs: Runs
) -> None:
    running = ident("r3", 3)
    with engine.hook().lifecycle() as lc:
        for index in (1, 0):
            lc.finish_task(lc.start_task("SALES", "MART", running, 1, map_index=index), "SUCCESS",
                           TaskCounts(rows_written=index + 1), map_count=2)  # fmt: skip
    doc = cli_json(engine, "status", "--pipeline", "SALES")
    mart = next(t for t in doc["run"]["task_runs"] if t["task_code"] == "MART")
    assert [(a["map_index"], a["attempt_number"], a["status"]) for a in mart["attempts"]] == [
        (0, 1, "SUCCESS"), (1, 1, "SUCCESS"),
    ]  # fmt: skip
    assert (mart["status"], mart["attempt_count"], mart["rows_written"]) == ("SUCCESS", 2, 3)
    status, out, _ = cli(engine, "history", "--pipeline", "SALES", "--limit", "1")
    assert status == 0
    rows = [(a["TASK_CODE"], a["MAP_INDEX"], a["ATTEMPT_NUMBER"]) for a in table(out, "attempts")]
    assert ("MART", "0", "1") in rows and ("MART", "1", "1") in rows
    assert next(r for r in rows if r[0] == "EXTRACT")[1] in ("", "-")  # unmapped: no map index


def test_gate_decisions_and_interventions_come_with_their_run(engine: EngineSetup, runs: Runs) -> None:
    add_gate_and_intervention(engine, runs.failed)

    doc = cli_json(engine, "history", "--pipeline", "SALES")
    by_id = {r["pipeline_run_id"]: r for r in doc["runs"]}
    decision = by_id[runs.failed]["gate_decisions"]
    assert [{k: v for k, v in d.items() if k != "decision_id"} for d in decision] == [{
        "attempt_id": None, "task_code": "MART", "depends_on_pipeline_code": "SALES", "depends_on_task_code": "LOAD",
        "result": "UNSATISFIED", "reason": "upstream LOAD ended FAILED", "selected_pipeline_run_id": None,
        "selected_task_run_id": None, "selected_revision": None, "decided_at": "2026-07-02T06:00:00.000Z"}]  # fmt: skip
    assert [{k: v for k, v in i.items() if k != "intervention_id"} for i in by_id[runs.failed]["interventions"]] == [{
        "task_code": "LOAD", "action": "MARK", "from_status": "FAILED", "to_status": "SUCCESS",
        "reason": "loaded by hand", "requested_by": "ann", "requested_by_kind": "HUMAN",
        "requested_at": "2026-07-03T06:00:00.000Z"}]  # fmt: skip
    assert by_id[runs.ok]["gate_decisions"] == by_id[runs.ok]["interventions"] == []

    status, out, _ = cli(engine, "history", "--pipeline", "SALES")
    assert status == 0
    assert [(r["TASK_CODE"], r["RESULT"]) for r in table(out, "gate decisions")] == [("MART", "UNSATISFIED")]
    assert [(r["ACTION"], r["REQUESTED_BY"]) for r in table(out, "interventions")] == [("MARK", "ann")]


def test_history_pages_with_before(engine: EngineSetup, runs: Runs) -> None:
    first = cli_json(engine, "history", "--pipeline", "SALES", "--limit", "2")
    assert [r["pipeline_run_id"] for r in first["runs"]] == [runs.running, runs.failed]
    assert first["next_before"] == runs.failed

    second = cli_json(engine, "history", "--pipeline", "SALES", "--limit", "2", "--before", str(runs.failed))
    assert [r["pipeline_run_id"] for r in second["runs"]] == [runs.ok]
    assert second["next_before"] is None
    assert second["runs"][0] == cli_json(engine, "history", "--pipeline", "SALES")["runs"][2]

    status, out, _ = cli(engine, "history", "--pipeline", "SALES", "--limit", "2")
    assert status == 0 and out.rstrip().endswith(f"older runs: --before {runs.failed}")


def test_pipelines_lists_every_code_with_pause_and_newest_run(engine: EngineSetup, runs: Runs) -> None:
    assert cli(engine, "pause", "--pipeline", "OTHER", "--reason", "audit", "--by", "ann")[0] == 0

    doc = cli_json(engine, "pipelines")

    found = {p["pipeline_code"]: p for p in doc["pipelines"]}
    assert list(found) == ["IDLE", "OTHER", "SALES"]
    assert found["IDLE"]["latest_run"] is None and found["IDLE"]["pause"] is None
    assert found["SALES"]["latest_run"]["pipeline_run_id"] == runs.running
    assert found["SALES"]["latest_run"]["status"] == "IN-PROGRESS"
    assert (found["OTHER"]["pause"]["paused_by"], found["OTHER"]["pause"]["reason"]) == ("ann", "audit")
    assert found["OTHER"]["latest_run"] == {
        "pipeline_run_id": runs.other, "status": "SUCCESS", "run_key": "airflow:other_dag:o1",
        "run_date": "2026-07-01", "start_date": found["OTHER"]["latest_run"]["start_date"],
        "end_date": found["OTHER"]["latest_run"]["end_date"], "sla_status": None}  # fmt: skip
    status, out, _ = cli(engine, "pipelines")
    assert status == 0
    assert [(r["PIPELINE_CODE"], r["PAUSED"], r["LATEST_STATUS"]) for r in table("t\n" + out, "t", "PIPELINE_CODE")] == [
        ("IDLE", "no", "-"), ("OTHER", "yes", "SUCCESS"), ("SALES", "no", "IN-PROGRESS")]  # fmt: skip


def test_run_by_id_and_by_dag_run_is_the_run_history_shows(engine: EngineSetup, runs: Runs) -> None:
    add_gate_and_intervention(engine, runs.failed)
    history = {r["pipeline_run_id"]: r for r in cli_json(engine, "history", "--pipeline", "SALES")["runs"]}

    by_id = cli_json(engine, "run", "--id", str(runs.failed))
    by_key = cli_json(engine, "run", "--dag-id", "sales_dag", "--run-id", "r2")

    assert by_id == by_key
    assert [r["run"] for r in by_id["runs"]] == [history[runs.failed]]
    assert by_id["runs"][0]["pipeline"]["pipeline_code"] == "SALES"
    status, out, _ = cli(engine, "run", "--id", str(runs.other))
    assert status == 0 and out.startswith("pipeline OTHER (Other)")


@pytest.mark.parametrize(("args", "message"), [
    (["--id", "999999"], "no run has PIPELINE_RUN_ID 999999 in AUD_PIPELINES_RUN_LOG"),
    (["--dag-id", "sales_dag", "--run-id", "nope"], "no Engine run has RUN_KEY airflow:sales_dag:nope"),
])  # fmt: skip
def test_an_unknown_run_exits_4(engine: EngineSetup, runs: Runs, args: list[str], message: str) -> None:
    status, out, err = cli(engine, "run", *args)
    assert (status, out) == (4, "")
    assert err.startswith(f"error: {message}") and len(err.splitlines()) == 1


@pytest.mark.parametrize(("args", "message"), [
    (["run", "--dag-id", "d"], "--dag-id needs --run-id"),
    (["run", "--id", "1", "--run-id", "r"], "--run-id goes with --dag-id"),
    (["run", "--id", str(2**63)], "must be at most"),
    (["run"], "one of the arguments --id --dag-id is required"),
    (["history", "--pipeline", "S", "--before", "0"], "must be 1 or more"),
])  # fmt: skip
def test_run_and_before_arguments_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                              message: str) -> None:  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        main([*args, "--config", str(tmp_path / "none.yml")], io.StringIO(), io.StringIO())
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
