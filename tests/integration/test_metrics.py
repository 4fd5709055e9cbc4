"""The provider's metrics (docs/metrics.md) reach a real UDP StatsD listener through Airflow's own ``Stats``.

Airflow's StatsD logger is configured from ``[metrics]`` in the process that sends, so each case runs its
sender in a subprocess whose environment points at the test's listener; the lifecycle core's reports (lock
wait, gate verdicts) are read in process from its listener registry on real Engine DBs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_etl_craft.runs import RunIdentity, events
from airflow_provider_etl_craft.runs.finish import run_duration
from harness.engines import EngineSetup, engine_rows
from harness.statsd import Metric, StatsdListener, named
from tests.conftest import SMOKE_ON_SQLITE
from tests.reliability.conftest import pipeline_sql, seed


@pytest.fixture
def statsd() -> Iterator[StatsdListener]:
    listener = StatsdListener()
    try:
        yield listener
    finally:
        listener.close()


def run_sender(statsd: StatsdListener, code: str, tags: bool = True, **env: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **statsd.env(tags), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


EVERY_EVENT = """
from airflow_provider_etl_craft import metrics
for outcome in ("CREATED", "RESUMED", "REOPENED", "BLOCKED", "WAITING", "SKIPPED"):
    metrics.claim("P1", outcome)
metrics.claim_wait("P1", "CREATED", 1.5)
metrics.run_finished("P1", "SUCCESS", 12.0, "BREACHED")
metrics.run_finished("P1", "FAILED", None, "MET")
metrics.attempt("P1", "T1", "FAILED")
metrics.gate("P1", None, "UNSATISFIED")
metrics.gate("P1", "T1", "SATISFIED")
metrics.lock_wait("P1", "claim", 0.25, "transaction")
metrics.engine_error("LOCK_TIMEOUT", True)
metrics.deferred_waits(3)
"""

#: (name, tags, value, kind) of every metric EVERY_EVENT sends (the hostname's gauge name is checked apart).
EXPECTED: list[tuple[str, dict[str, str], float, str]] = [
    *[
        (f"etl_craft.claim.{o.lower()}", {"pipeline": "P1", "outcome": o}, 1, "c")
        for o in ("CREATED", "RESUMED", "REOPENED", "BLOCKED", "WAITING", "SKIPPED")
    ],
    ("etl_craft.claim.wait", {"pipeline": "P1", "outcome": "CREATED"}, 1500, "ms"),
    ("etl_craft.pipeline.P1.claim_wait", {"pipeline": "P1", "outcome": "CREATED"}, 1500, "ms"),
    ("etl_craft.run.success", {"pipeline": "P1", "status": "SUCCESS"}, 1, "c"),
    ("etl_craft.pipeline.P1.run.success", {"pipeline": "P1", "status": "SUCCESS"}, 1, "c"),
    ("etl_craft.run.duration", {"pipeline": "P1", "status": "SUCCESS"}, 12000, "ms"),
    ("etl_craft.pipeline.P1.run_duration", {"pipeline": "P1", "status": "SUCCESS"}, 12000, "ms"),
    ("etl_craft.sla.breached", {"pipeline": "P1"}, 1, "c"),
    ("etl_craft.pipeline.P1.sla_breached", {"pipeline": "P1"}, 1, "c"),
    ("etl_craft.run.failed", {"pipeline": "P1", "status": "FAILED"}, 1, "c"),
    ("etl_craft.pipeline.P1.run.failed", {"pipeline": "P1", "status": "FAILED"}, 1, "c"),
    ("etl_craft.attempt.failed", {"pipeline": "P1", "task": "T1", "status": "FAILED"}, 1, "c"),
    ("etl_craft.gate.unsatisfied", {"pipeline": "P1", "level": "pipeline", "result": "UNSATISFIED"}, 1, "c"),
    (
        "etl_craft.gate.satisfied",
        {"pipeline": "P1", "task": "T1", "level": "task", "result": "SATISFIED"},
        1,
        "c",
    ),
    ("etl_craft.lock.wait", {"pipeline": "P1", "step": "claim", "how": "transaction"}, 250, "ms"),
    ("etl_craft.engine_error.lock_timeout", {"status": "LOCK_TIMEOUT", "retryable": "true"}, 1, "c"),
]


@pytest.mark.smoke
def test_every_event_is_sent_under_its_name_with_its_tags(statsd: StatsdListener) -> None:
    run_sender(statsd, EVERY_EVENT)
    count = len(EXPECTED) + 2  # the two deferred-waits gauges
    got = statsd.wait_for(lambda found: len(found) >= count, 10, "every event")
    assert len(got) == count, [m.name for m in got]
    simple = [(m.name, m.tags, m.value, m.kind) for m in got if "deferred_waits" not in m.name]
    assert sorted(simple, key=repr) == sorted(EXPECTED, key=repr)
    gauges = [m for m in got if "deferred_waits" in m.name]
    host = gauges[0].tags["hostname"]
    assert {(m.name, m.value, m.kind) for m in gauges} == {
        ("etl_craft.triggerer.deferred_waits", 3, "g"),
        (f"etl_craft.triggerer.deferred_waits.{host}", 3, "g"),
    }


def test_plain_statsd_gets_the_same_names_without_tags(statsd: StatsdListener) -> None:
    run_sender(statsd, EVERY_EVENT, tags=False)
    count = len(EXPECTED) + 2
    got = statsd.wait_for(lambda found: len(found) >= count, 10, "every event")
    assert all(m.tags == {} for m in got)
    assert {m.name for m in got} >= {name for name, *_ in EXPECTED}


def test_a_metrics_section_that_sends_nowhere_sends_nothing_and_raises_nothing(
    statsd: StatsdListener,
) -> None:
    run_sender(statsd, EVERY_EVENT, AIRFLOW__METRICS__STATSD_ON="False")
    # A sender with metrics on afterwards proves the listener was there to receive.
    run_sender(statsd, "from airflow_provider_etl_craft import metrics; metrics.claim('P2', 'CREATED')")
    got = statsd.wait_for(lambda found: bool(found), 10, "the second sender's claim")
    assert [m.tags.get("pipeline") for m in got] == ["P2"]


def test_an_unreachable_statsd_host_does_not_fail_the_sender(statsd: StatsdListener) -> None:
    # A name that does not resolve: Airflow falls back to sending nothing; the provider must not raise.
    run_sender(statsd, EVERY_EVENT, AIRFLOW__METRICS__STATSD_HOST="statsd.invalid")


WAITS = """
import asyncio, json, sys
from airflow_provider_etl_craft.triggers.engine_change import EngineChangeTrigger

def trigger(recheck):
    return EngineChangeTrigger(etl_craft_conn_id="etl_craft_metrics", profile=None, pipeline_code="WAITED",
                               seen=json.loads(sys.argv[1]), recheck_after=recheck, deadline=None,
                               poll_interval=600.0, listen=True)

async def main():
    async def first(t):
        return await t.run().__anext__()
    await asyncio.gather(first(trigger(1.0)), first(trigger(2.0)))

asyncio.run(main())
"""


@SMOKE_ON_SQLITE
def test_the_deferred_waits_of_a_triggerer_process_are_a_gauge(
    statsd: StatsdListener, engine: EngineSetup
) -> None:
    from airflow_provider_etl_craft.runs.changes import watch_state

    seed(engine, {"WAITED": ["A"]})
    with engine.hook().lifecycle(lock_timeout=10) as lc:
        assert lc.claim("WAITED", RunIdentity("holder", "run_1")).action == "CREATED"
        seen = watch_state(lc.engine, lc.conn, "WAITED")
    conn = {"conn_type": "etl_craft", "extra": {"config_path": str(engine.config_path)}}
    done = subprocess.run(
        [sys.executable, "-c", WAITS, json.dumps(seen)],
        env={**os.environ, **engine.env, **statsd.env(), "AIRFLOW_CONN_ETL_CRAFT_METRICS": json.dumps(conn)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    def gauge(found: list[Metric]) -> list[float]:
        return [m.value for m in named(found, "etl_craft.triggerer.deferred_waits")]

    # Two waits registered, then the first (1 s) and the second (2 s) end with a recheck.
    assert gauge(statsd.wait_for(lambda found: len(gauge(found)) >= 4, 10, "four gauges")) == [1, 2, 1, 0]


@pytest.mark.smoke
def test_the_lifecycle_core_reports_lock_waits_and_gate_verdicts(engine: EngineSetup) -> None:
    heard: list[tuple[str, dict[str, Any]]] = []

    def listener(event: str, fields: dict[str, Any]) -> None:
        heard.append((event, fields))

    folder = engine.config_path.parent / "metrics-migrations"
    folder.mkdir()
    dependency = (
        "INSERT INTO CFG_PIPELINE_DEPENDENCY (PIPELINE_ID, DEPENDS_ON_PIPELINE_ID, DEPENDENCY_TYPE, CREATED_BY) "
        "SELECT d.PIPELINE_ID, u.PIPELINE_ID, 'SUCCESS', 'test' FROM CFG_PIPELINES d, CFG_PIPELINES u "
        "WHERE d.PIPELINE_CODE = 'DOWN' AND u.PIPELINE_CODE = 'UP';\n"
    )
    (folder / "0001_metrics.sql").write_text(
        pipeline_sql("UP", ["U"]) + pipeline_sql("DOWN", ["D"]) + dependency
    )
    engine.hook().migrate(folder)
    events.listen(listener)
    try:
        with engine.hook().lifecycle(lock_timeout=10) as lc:
            assert lc.claim("UP", RunIdentity("up", "r1")).action == "CREATED"
            lc.finish_run("UP", RunIdentity("up", "r1"), {"U": "success"})
            assert lc.claim("DOWN", RunIdentity("down", "r1")).action == "CREATED"
    finally:
        events.unlisten(listener)
    locks = [f for e, f in heard if e == events.LOCK_WAIT]
    assert [(f["pipeline"], f["step"]) for f in locks] == [
        ("UP", "claim"),
        ("UP", "finish_run"),
        ("DOWN", "claim"),
    ]
    assert all(0 <= f["seconds"] < 10 and f["how"] in ("transaction", "one_call") for f in locks)
    gates = [f for e, f in heard if e == events.GATE]
    assert gates == [{"pipeline": "DOWN", "task": None, "result": "SATISFIED"}]


def test_the_run_duration_is_read_back_after_a_finish_that_did_not_return_it(engine: EngineSetup) -> None:
    seed(engine, {"TIMED": ["T"]})
    identity = RunIdentity("timed", "r1")
    with engine.hook().lifecycle(lock_timeout=10) as lc:
        assert lc.claim("TIMED", identity).action == "CREATED"
        lc.finish_task(lc.start_task("TIMED", "T", identity, 1), "SUCCESS")
        outcome = lc.finish_run("TIMED", identity, {"T": "success"})
        read = run_duration(lc.engine, lc.conn, outcome.pipeline_run_id)
    # PostgreSQL's one-call finish returns no dates; the transaction form (SQLite) knows the duration.
    assert (outcome.duration is None) == (engine.dialect == "postgresql")
    ((started, ended),) = engine_rows(
        engine.hook(), "SELECT START_DATE, END_DATE FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID = ?",
        (outcome.pipeline_run_id,),
    )  # fmt: skip
    expected = (
        engine.hook().engine.from_db_time(ended) - engine.hook().engine.from_db_time(started)
    ).total_seconds()
    assert read == pytest.approx(expected) and read > 0
    if outcome.duration is not None:
        assert outcome.duration == pytest.approx(expected, abs=0.001)  # SQLite stores milliseconds
