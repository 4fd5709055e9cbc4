"""Retention (docs/retention.md) on real Engine DBs, both dialects: what a purge keeps and deletes, that gates
decide as before, that the append-only tables still refuse every other writer, the dry run, the archive,
kill -9 in the middle of a purge, and how long a claim waits on a running purge (processes, not threads)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.cli.main import main as cli_main
from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import RunIdentity, TaskCounts
from airflow_provider_etl_craft.runs import purge as purge_module
from airflow_provider_etl_craft.runs.gates import Edge, Gates
from airflow_provider_etl_craft.runs.purge import MANIFEST, TABLES, Purge
from harness.engines import EngineSetup, engine_rows
from tests.integration.test_gates import Db, migration

KEYS = dict(TABLES)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(engine: EngineSetup, tmp_path: Path) -> Iterator[Db]:
    folder = tmp_path / "project-migrations"
    folder.mkdir()
    (folder / "0001_gates.sql").write_text(migration(), encoding="utf-8")
    hook = engine.hook()
    hook.migrate(folder)
    with hook.lifecycle(lock_timeout=30) as lc:
        yield Db(hook, lc)


def dump(hook: EngineDBHook, table: str) -> dict[int, dict[str, Any]]:
    """Every row of ``table`` by its key."""
    with closing(hook.engine.connect()) as conn, hook.engine.transaction(conn) as cur:
        cur.execute(f"SELECT * FROM {table}")  # noqa: S608 - a constant
        names = [d[0].upper() for d in cur.description or ()]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return {int(r[KEYS[table]]): r for r in rows}


def everything(hook: EngineDBHook) -> dict[str, dict[int, dict[str, Any]]]:
    return {table: dump(hook, table) for table in KEYS}


def purge(hook: EngineDBHook, **kwargs: Any) -> Any:
    with closing(hook.engine.connect()) as conn:
        return Purge(hook.engine, conn, kwargs.pop("cutoff", hook.engine.now()), **kwargs).run()


def verdicts(hook: EngineDBHook) -> dict[tuple[str, int], Any]:
    """What every pipeline edge and cross-pipeline task edge sees upstream now (``Gates.observe_latest``)."""
    gates = Gates(hook.engine)
    seen = {}
    with closing(hook.engine.connect()) as conn, hook.engine.transaction(conn) as cur:
        pipelines = [int(r[0]) for r in hook.engine.rows(cur, "SELECT PIPELINE_ID FROM CFG_PIPELINES")]
        for pipeline_id in pipelines:
            edges: list[Edge] = gates.pipeline_edges(cur, pipeline_id)
            tasks = hook.engine.rows(
                cur, "SELECT TASK_ID FROM CFG_TASKS WHERE PIPELINE_ID = ?", (pipeline_id,)
            )
            for (task_id,) in tasks:
                edges += [e for e in gates.task_edges(cur, pipeline_id, int(task_id)) if not e.same_pipeline]
            for edge in edges:
                seen[(edge.kind, edge.dependency_id)] = gates.observe_latest(cur, edge)
    return seen


def history(db: Db) -> dict[str, int]:
    """Runs a gate reads, runs that may go, and a kept run's pending consumption (see the test below)."""
    ids: dict[str, int] = {}
    ids["r1"] = db.upstream("SUCCESS_ROWS") or 0
    ids["a1"] = db.run_downstream_pipeline("P_ALWAYS", db.ident("a"))
    waiting = db.ident("p")
    ids["p"] = db.lc.claim(
        "P_SUCCESS", waiting
    ).pipeline_run_id  # its decision selected r1; it consumes at finish
    ids["r2"] = db.upstream("SUCCESS_ROWS") or 0
    ids["a2"] = db.run_downstream_pipeline("P_ALWAYS", db.ident("a"))
    ids["r3"] = db.upstream("FAILED") or 0
    ids["r4"] = db.upstream("SUCCESS_ROWS", backfill=True) or 0
    for name in (
        "s0",
        "s00",
    ):  # two finished runs of SAME: the newer one is what SAME's downstreams would read
        old = db.ident("same")
        ids[name] = db.lc.claim("SAME", old).pipeline_run_id
        db.lc.finish_run("SAME", old, {})
    ids["s1"] = db.lc.claim("SAME", db.ident("same")).pipeline_run_id  # IN-PROGRESS
    db.lc.pause("COND", "old maintenance", "ops")
    db.lc.resume("COND", "done", "ops")
    db.lc.pause("DOWN", "still paused", "ops")
    db._waiting = waiting  # type: ignore[attr-defined]
    return ids


def test_a_purge_keeps_what_gates_read_deletes_the_rest_and_gates_decide_as_before(db: Db) -> None:
    ids = history(db)
    before, seen = everything(db.hook), verdicts(db.hook)
    result = purge(db.hook, batch_size=1)

    after = everything(db.hook)
    runs = set(after["AUD_PIPELINES_RUN_LOG"])
    # Kept: the in-progress runs (p, s1); r1, which p's decision selected and p consumes when it succeeds; r2,
    # the newest consumption of the ALWAYS edge, and a2 that consumed it; r3, UP's newest finished non-backfill
    # run (what its downstream gates read); r4, UP's newest run; s00, SAME's newest finished run. Deleted: a1
    # and s0.
    assert runs == {ids[k] for k in ("r1", "p", "r2", "a2", "r3", "r4", "s00", "s1")}
    assert runs == set(before["AUD_PIPELINES_RUN_LOG"]) - {ids["a1"], ids["s0"]}
    for table, rows in after.items():
        for row in rows.values():
            if "PIPELINE_RUN_ID" in row and row["PIPELINE_RUN_ID"] is not None:
                assert int(row["PIPELINE_RUN_ID"]) in runs, (table, row)
    pauses = after["AUD_PIPELINE_PAUSES"].values()
    assert [p["REASON"] for p in pauses] == ["still paused"]  # the resumed pause went, the open one stays
    gone = {t: len(before[t]) - len(after[t]) for t in KEYS}
    assert gone["AUD_DEPENDENCY_CONSUMPTION"] == 1 and gone["AUD_GATE_DECISIONS"] == 1
    recorded = db.records(
        "SELECT STATUS, BATCHES, RUNS_DELETED, TASK_RUNS_DELETED, ATTEMPTS_DELETED, GATE_DECISIONS_DELETED, "
        "CONSUMPTIONS_DELETED, PAUSES_DELETED, INTERVENTIONS_DELETED, BATCH_OPEN, REQUESTED_BY FROM AUD_ENGINE_PURGES"
    )
    counts = (gone["AUD_PIPELINES_RUN_LOG"], gone["AUD_TASK_RUN_LOG"], gone["AUD_TASK_ATTEMPTS"],
              gone["AUD_GATE_DECISIONS"], gone["AUD_DEPENDENCY_CONSUMPTION"], gone["AUD_PIPELINE_PAUSES"],
              gone["AUD_RUN_INTERVENTIONS"])  # fmt: skip
    assert recorded == [("DONE", result.batches, *counts, "N", "etl-craft-airflow")]
    assert result.batches >= 3  # batch size 1: one per run, one per pause

    # Every gate reads what it read before the purge, and runs on as if nothing happened.
    assert verdicts(db.hook) == seen
    handle = db.lc.start_task("P_SUCCESS", "X", db._waiting, 1)  # type: ignore[attr-defined]
    db.lc.finish_task(handle, "SUCCESS")
    db.lc.finish_run("P_SUCCESS", db._waiting, {"X": "success"})  # type: ignore[attr-defined]
    assert db.consumed("P_SUCCESS") == [(ids["p"], ids["r1"], 1, None, None)]
    assert db.lc.claim("P_ALWAYS", db.ident("a")).action == "CREATED"  # r3 is newer than r2, consumed last
    again = db.lc.claim("P_FAILURE", db.ident("f"))
    assert again.action == "CREATED" and db.decisions(again.pipeline_run_id)[0][1] == ids["r3"]


def test_a_dry_run_changes_nothing_and_counts_what_the_purge_deletes(db: Db) -> None:
    history(db)
    before = everything(db.hook)
    dry = purge(db.hook, dry_run=True)
    assert everything(db.hook) == before
    assert db.records("SELECT COUNT(*) FROM AUD_ENGINE_PURGES") == [(0,)]
    real = purge(db.hook)
    assert dry.counts == real.counts and sum(real.counts.values()) > 0


def test_the_append_only_tables_refuse_every_other_writer_after_the_migration(
    db: Db, engine: EngineSetup
) -> None:
    ids = history(db)
    hook = db.hook
    for sql in (
        "DELETE FROM AUD_GATE_DECISIONS",
        "DELETE FROM AUD_DEPENDENCY_CONSUMPTION",
        f"DELETE FROM AUD_GATE_DECISIONS WHERE PIPELINE_RUN_ID = {ids['a1']}",
        "UPDATE AUD_GATE_DECISIONS SET REASON = 'x'",
    ):
        with pytest.raises(hook.engine.integrity_error()):
            engine_rows(hook, sql)
    # A purge that was killed leaves a RUNNING row: that alone opens nothing.
    engine_rows(
        hook,
        "INSERT INTO AUD_ENGINE_PURGES (STATUS, CUTOFF, BATCH_SIZE) VALUES ('RUNNING', ?, 1)",
        (hook.engine.to_db_time(hook.engine.now()),),
    )
    with pytest.raises(hook.engine.integrity_error()):
        engine_rows(hook, "DELETE FROM AUD_DEPENDENCY_CONSUMPTION")
    if engine.dialect == "postgresql":  # the marker of a purge, set by hand, does not reach an unfinished run
        with (
            closing(hook.engine.connect()) as conn,
            pytest.raises(hook.engine.integrity_error()),
            hook.engine.transaction(conn) as cur,
        ):
            cur.execute(
                "SELECT set_config('etl_craft_airflow.purge', (SELECT MAX(PURGE_ID)::text FROM AUD_ENGINE_PURGES), true)"
            )
            cur.execute(f"DELETE FROM AUD_GATE_DECISIONS WHERE PIPELINE_RUN_ID = {ids['p']}")
    assert len(dump(hook, "AUD_GATE_DECISIONS")) == len(
        db.records("SELECT DECISION_ID FROM AUD_GATE_DECISIONS")
    )
    assert db.decisions(ids["a1"])  # untouched


def test_the_archive_holds_every_deleted_row_with_a_checksum_manifest(db: Db, tmp_path: Path) -> None:
    history(db)
    before = everything(db.hook)
    result = purge(db.hook, batch_size=1, archive_dir=tmp_path / "archive")
    after = everything(db.hook)
    folder = Path(result.archive)
    manifest = [line.split("  ") for line in (folder / MANIFEST).read_text().splitlines()]
    assert manifest and {name for _, name in manifest} == {p.name for p in folder.glob("*.jsonl")}
    archived: dict[str, dict[int, dict[str, Any]]] = {t: {} for t in KEYS}
    for digest, name in manifest:
        data = (folder / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest
        table = name.split("-", 2)[2].removesuffix(".jsonl")
        for line in data.decode().splitlines():
            row = json.loads(line)
            archived[table][int(row[KEYS[table]])] = row
    for table in KEYS:
        deleted = {k: v for k, v in before[table].items() if k not in after[table]}
        assert set(archived[table]) == set(deleted), table
        for key, row in deleted.items():
            assert archived[table][key] == json.loads(json.dumps(row, default=_iso)), (table, key)


def _iso(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def seed_old_runs(db: Db, count: int) -> None:
    """``count`` finished SAME runs that ended 200 days ago, each with a task run and an attempt."""
    hook, old = db.hook, db.hook.engine.now() - timedelta(days=200)
    stamp = hook.engine.to_db_time(old)
    base = 100000
    engine_rows(
        hook,
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_RUN_ID, PIPELINE_ID, START_DATE, END_DATE, STATUS, RUN_KEY) "
        "SELECT ? + i, p.PIPELINE_ID, ?, ?, 'SUCCESS', 'old:' || CAST(i AS TEXT) FROM n, CFG_PIPELINES p "
        "WHERE p.PIPELINE_CODE = 'SAME'",
        (count, base, stamp, stamp),
    )
    engine_rows(
        hook,
        "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, STATUS, ATTEMPT_COUNT) SELECT t.TASK_ID, "
        "r.PIPELINE_RUN_ID, 'SUCCESS', 1 FROM AUD_PIPELINES_RUN_LOG r, CFG_TASKS t WHERE r.RUN_KEY LIKE 'old:%' "
        "AND t.TASK_CODE = 'A'",
    )
    engine_rows(
        hook,
        "INSERT INTO AUD_TASK_ATTEMPTS (TASK_RUN_ID, ATTEMPT_NUMBER, STATUS, TASK_LOG) SELECT tr.TASK_RUN_ID, 1, "
        "'SUCCESS', 'some log text of a finished attempt' FROM AUD_TASK_RUN_LOG tr JOIN AUD_PIPELINES_RUN_LOG r "
        "ON r.PIPELINE_RUN_ID = tr.PIPELINE_RUN_ID WHERE r.RUN_KEY LIKE 'old:%'",
    )


def start_worker(engine: EngineSetup, batch_size: int, pause: float, *more: str) -> subprocess.Popen[str]:
    env = {**engine.subprocess_env(), "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.purge_worker", str(engine.config_path), str(batch_size),
         str(pause), *more],
        cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_a_purge_killed_mid_way_is_recognised_and_the_next_one_finishes_it(
    db: Db, engine: EngineSetup, tmp_path: Path
) -> None:
    history(db)
    seed_old_runs(db, 40)
    worker = start_worker(engine, 5, 30.0)
    assert worker.stdout is not None
    for line in worker.stdout:
        if line.startswith("batch 2 "):
            break
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)
    first = db.records("SELECT PURGE_ID, STATUS, BATCHES, RUNS_DELETED, BATCH_OPEN FROM AUD_ENGINE_PURGES")
    assert first == [(first[0][0], "RUNNING", 2, 10, "N")]  # two whole batches, nothing of the third
    assert db.records("SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG") == [
        (10 + 40 - 10,)
    ]  # history, old runs, two batches of 5

    second = purge(db.hook, batch_size=50)
    assert second.interrupted == [first[0][0]]
    assert db.records(
        "SELECT PURGE_ID, STATUS, RESUMED_BY_PURGE_ID FROM AUD_ENGINE_PURGES ORDER BY PURGE_ID"
    ) == [
        (first[0][0], "INTERRUPTED", second.purge_id),
        (second.purge_id, "DONE", None),
    ]
    # Of the old runs only the newest stays: it is SAME's newest finished run now.
    assert db.records("SELECT RUN_KEY FROM AUD_PIPELINES_RUN_LOG WHERE RUN_KEY LIKE 'old:%'") == [("old:40",)]
    assert purge(db.hook).counts["RUNS_DELETED"] == 0  # nothing left to do


def test_a_claim_never_waits_a_second_on_a_running_purge(db: Db, engine: EngineSetup) -> None:
    history(db)
    seed_old_runs(db, 3000)
    worker = start_worker(engine, 100, 0.0)
    assert worker.stdout is not None
    assert worker.stdout.readline().startswith("start")
    waits, during = [], 0
    while worker.poll() is None:
        who = db.ident("cond")
        started = time.monotonic()
        outcome = db.lc.claim("COND", who)
        waits.append(time.monotonic() - started)
        assert outcome.action == "CREATED"
        db.lc.finish_run("COND", who, {})
        during += worker.poll() is None
    out = worker.stdout.read()
    assert worker.returncode == 0
    result = json.loads(out.splitlines()[-1])
    assert result["counts"]["RUNS_DELETED"] >= 2999 and result["batches"] >= 30
    assert during >= 3, "the purge ended before claims could run beside it"
    print(f"{len(waits)} claims, {during} while the purge ran; longest wait {max(waits):.3f} s")  # noqa: T201
    assert max(waits) < 1.0, sorted(waits)[-5:]


@pytest.mark.parametrize(("budget", "batches"), [(0.0, 1 + 31), (1e9, 5)])
def test_batches_are_sized_by_how_long_a_batch_takes(
    db: Db, monkeypatch: pytest.MonkeyPatch, budget: float, batches: int
) -> None:
    """39 deletable runs, at most 8 per batch: a batch over the time budget makes the next one smaller (here any
    batch is over a budget of 0 s: 8, then 1 at a time), one well under it lets the next grow up to the limit."""
    seed_old_runs(db, 40)
    monkeypatch.setattr(purge_module, "BATCH_BUDGET", budget)
    result = purge(db.hook, batch_size=8)
    assert (result.counts["RUNS_DELETED"], result.batches) == (39, batches)


def test_a_batch_asks_run_by_run_what_the_plan_reads_for_all_history(db: Db) -> None:
    """The batch's re-check (indexes, per run) names exactly the runs the plan's whole-history query protects:
    newest of a pipeline, newest finished non-backfill, both runs of an edge's newest consumption."""
    history(db)
    seed_old_runs(db, 5)
    every = [int(r[0]) for r in db.records("SELECT PIPELINE_RUN_ID FROM AUD_PIPELINES_RUN_LOG")]
    protected = {int(r[0]) for r in db.records(purge_module._PROTECTED) if r[0] is not None}
    among = purge_module._PROTECTED_AMONG.format(ids="(" + ", ".join("?" * len(every)) + ")")
    found = {int(r[0]) for r in engine_rows(db.hook, among, tuple(every))}
    assert db.records("SELECT COUNT(*) FROM AUD_DEPENDENCY_CONSUMPTION")[0][0] > 0
    assert found == protected and len(found) >= 5


def test_the_next_batch_size_follows_the_time_the_last_one_took() -> None:
    budget = purge_module.BATCH_BUDGET
    assert purge_module._next_size(100, 500, budget * 4) == 25  # four times too long: a quarter of the runs
    assert purge_module._next_size(100, 500, budget / 10) == 200  # well under: doubled
    assert purge_module._next_size(400, 500, budget / 10) == 500  # never above --batch-size
    assert purge_module._next_size(100, 500, budget / 2) == 100  # within: kept
    assert purge_module._next_size(1, 500, budget * 100) == 1  # never below one run


def test_the_cli_purges_with_documented_exit_statuses(db: Db, engine: EngineSetup, tmp_path: Path) -> None:
    history(db)

    def cli(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        return (
            cli_main(["purge", *args, "--config", str(engine.config_path)], out, err),
            out.getvalue(),
            err.getvalue(),
        )

    code, out, _ = cli("--older-than", "0s", "--dry-run", "--format", "json")
    assert code == 0 and json.loads(out)["dry_run"] is True and json.loads(out)["counts"]["RUNS_DELETED"] == 2
    code, _, err = cli("--older-than", "0s", "--pipeline", "NOPE")
    assert code == 4 and "NOPE" in err
    with pytest.raises(SystemExit) as usage:
        cli("--older-than", "ninety days")
    assert usage.value.code == 2
    code, out, _ = cli("--older-than", "90d")
    assert code == 0 and "deleted" in out  # nothing is 90 days old here
    assert db.records("SELECT RUNS_DELETED FROM AUD_ENGINE_PURGES") == [(0,)]
    code, out, _ = cli(
        "--older-than", "0s", "--pipeline", "P_ALWAYS", "--archive", str(tmp_path / "a"), "--by", "ops"
    )
    assert code == 0 and "archive:" in out and "AUD_PIPELINES_RUN_LOG" in out
    assert db.records("SELECT REQUESTED_BY, REQUESTED_BY_KIND, PIPELINE_CODE, RUNS_DELETED FROM AUD_ENGINE_PURGES "
                      "ORDER BY PURGE_ID")[-1] == ("ops", "HUMAN", "P_ALWAYS", 1)  # fmt: skip


def test_a_second_purge_while_one_runs_is_refused(db: Db) -> None:
    engine_rows(
        db.hook,
        "INSERT INTO AUD_ENGINE_PURGES (STATUS, HOST, PID, HEARTBEAT_AT, CUTOFF, BATCH_SIZE) "
        "VALUES ('RUNNING', 'elsewhere', 1, ?, ?, 1)",
        (
            db.hook.engine.to_db_time(db.hook.engine.now()),
            db.hook.engine.to_db_time(datetime(2026, 1, 1, tzinfo=UTC)),
        ),
    )
    from airflow_provider_etl_craft.errors import RunStateError

    with pytest.raises(RunStateError, match="still running"):
        purge(db.hook)


def test_a_purge_on_an_engine_db_etl_craft_made_passes_its_guards_which_stay_as_they_were(
    engine: EngineSetup,
) -> None:
    from tests.fixtures.etl_craft_made import build, etl_craft_connection, run

    build(engine)
    hook = engine.hook()
    assert hook.init_db().shared  # adopted: ENGINE 0005's adopt step adds only AUD_ENGINE_PURGES
    with hook.lifecycle(lock_timeout=30) as lc:  # DOWN consumes UP's second run: its first run and UP's go
        who = RunIdentity("down_dag", "run_1", run_date=datetime(2026, 1, 4, tzinfo=UTC))
        assert lc.claim("DOWN", who).action == "CREATED"
        lc.finish_task(lc.start_task("DOWN", "X", who, 1), "SUCCESS", TaskCounts(rows_written=1))
        lc.finish_run("DOWN", who, {"X": "success"})
    keys = ("schedule:up:1", "schedule:down:1")
    result = purge(hook)
    assert {k: v for k, v in result.counts.items() if v} == {
        "RUNS_DELETED": 2, "TASK_RUNS_DELETED": 2, "ATTEMPTS_DELETED": 2, "GATE_DECISIONS_DELETED": 1,
        "CONSUMPTIONS_DELETED": 1, "PAUSES_DELETED": 1, "INTERVENTIONS_DELETED": 1,
    }  # fmt: skip
    assert engine_rows(hook, "SELECT RUN_KEY FROM AUD_PIPELINES_RUN_LOG WHERE RUN_KEY IN (?, ?)", keys) == []
    with pytest.raises(Exception) as refused, etl_craft_connection(engine) as conn:  # noqa: PT011
        run(conn, engine.dialect, "DELETE FROM AUD_DEPENDENCY_CONSUMPTION")
    assert isinstance(refused.value, hook.engine.database_error())


def test_an_archive_that_cannot_be_written_stops_the_purge_before_it_deletes(db: Db, tmp_path: Path) -> None:
    history(db)
    before = everything(db.hook)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the archive folder should go")
    with pytest.raises(ConfigurationError, match="cannot write its archive") as stopped:
        purge(db.hook, archive_dir=blocked)
    assert "was not deleted" in str(stopped.value)
    assert everything(db.hook) == before
    assert db.records("SELECT STATUS, BATCHES, RUNS_DELETED, BATCH_OPEN FROM AUD_ENGINE_PURGES") == [
        ("FAILED", 0, 0, "N")
    ]
