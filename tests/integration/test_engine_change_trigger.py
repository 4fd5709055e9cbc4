"""The deferred waits' trigger against real Engine DBs: what wakes it, what does not, and what it survives.

The trigger runs its own event loop in a thread (as in the triggerer); the test thread changes the Engine DB
through the run lifecycle, as other tasks would. Every poll and recheck interval is set far beyond the
test's own timeouts, so an event in time can only come from what the test means to prove (a PostgreSQL
notice, SQLite's data version, the stale fingerprint, the deadline).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from airflow_provider_etl_craft.runs import RunIdentity
from airflow_provider_etl_craft.runs.changes import watch_state
from airflow_provider_etl_craft.triggers import wait_hub
from airflow_provider_etl_craft.triggers.engine_change import EngineChangeTrigger
from harness.engines import EngineSetup, pg_profile_yaml, write_config
from harness.postgres import PgCluster, PgDatabase, PostgresUnavailable, find_bindir
from tests.fixtures.fix_pg import REQUIRE_ENV
from tests.reliability.conftest import seed, wait_until

WAITED, OTHER = "WAITED", "OTHER"
CONN_ID = "etl_craft_trigger_test"
NEVER = 600.0  # seconds: a poll or recheck that must not be what fires


class Running:
    """A trigger's ``run()`` in a thread of its own, with its first event (or error) kept."""

    def __init__(self, trigger: EngineChangeTrigger) -> None:
        self.event: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(trigger,), daemon=True)
        self._thread.start()

    def _main(self, trigger: EngineChangeTrigger) -> None:
        async def first() -> Any:
            return await trigger.run().__anext__()

        try:
            self.event = asyncio.run(first())
        except BaseException as exc:  # noqa: BLE001 - reported by result()
            self.error = exc

    def result(self, timeout: float) -> dict[str, Any]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the trigger fired nothing within {timeout}s"
        if self.error is not None:
            raise self.error
        return dict(self.event.payload)

    def fired(self) -> bool:
        return not self._thread.is_alive()


@pytest.fixture
def waited(engine: EngineSetup, monkeypatch: pytest.MonkeyPatch) -> EngineSetup:
    """``engine`` with pipelines WAITED and OTHER, an Airflow connection to it, and WAITED's run 1 IN-PROGRESS."""
    return _prepared(engine, monkeypatch)


def _prepared(engine: EngineSetup, monkeypatch: pytest.MonkeyPatch) -> EngineSetup:
    seed(engine, {WAITED: ["A"], OTHER: ["B"]})
    conn = {"conn_type": "etl_craft", "extra": {"config_path": str(engine.config_path)}}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
    with engine.hook().lifecycle(lock_timeout=10) as lc:
        assert lc.claim(WAITED, RunIdentity("holder", "run_1")).action == "CREATED"
    return engine


def seen(engine: EngineSetup) -> list[int]:
    with engine.hook().lifecycle() as lc:
        return watch_state(lc.engine, lc.conn, WAITED)


def trigger(seen_state: list[int], **overrides: Any) -> EngineChangeTrigger:
    kwargs: dict[str, Any] = {
        "etl_craft_conn_id": CONN_ID,
        "profile": None,
        "pipeline_code": WAITED,
        "seen": seen_state,
        "recheck_after": NEVER,
        "deadline": None,
        "poll_interval": NEVER,
        "listen": True,
    }
    kwargs.update(overrides)
    return EngineChangeTrigger(**kwargs)


def finish(engine: EngineSetup, code: str = WAITED, run_id: str = "run_1", holder: str = "holder") -> None:
    with engine.hook().lifecycle(lock_timeout=10) as lc:
        lc.finish_run(code, RunIdentity(holder, run_id), {"A": None, "B": None})


def listening(engine: EngineSetup) -> bool:
    """Whether the trigger's connection has read the fingerprint (it LISTENs before that)."""
    if engine.dialect != "postgresql":
        return True
    db: Any = engine.database
    with db.cluster.admin_connect(db.name) as admin, admin.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND state = 'idle' AND query LIKE %s",
            (db.name, "%SUM(r.PIPELINE_RUN_ID)%"),
        )
        return bool(cur.fetchone()[0])


@pytest.mark.smoke
def test_the_end_of_the_waited_run_wakes_the_trigger(waited: EngineSetup) -> None:
    running = Running(trigger(seen(waited)))
    wait_until(lambda: listening(waited), 30, "the trigger to watch", interval=0.05)
    assert not running.fired()
    finish(waited)
    assert running.result(30) == {"status": "changed", "pipeline_code": WAITED, "deadline": None}


def test_a_finish_committed_while_the_trigger_reads_the_fingerprint_still_wakes_it(
    waited: EngineSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finish commits right after the trigger's first fingerprint read (which saw the run still open):
    what the trigger watches for changes (LISTEN, SQLite's data_version) was set up before that read, so the
    commit is seen; reading SQLite's counter after the fingerprint left this commit in between, unseen."""
    original = wait_hub.read_fingerprints
    calls: list[int] = []

    def state_then_finish(*args: Any) -> list[list[int]]:
        found = original(*args)
        calls.append(len(calls))
        if len(calls) == 1:
            finish(waited)  # another connection commits the end of the waited run now
        return found

    before = seen(waited)
    monkeypatch.setattr(wait_hub, "read_fingerprints", state_then_finish)
    running = Running(trigger(before))
    assert running.result(30) == {"status": "changed", "pipeline_code": WAITED, "deadline": None}
    assert len(calls) >= 2  # looked again after the change was signalled


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_finish_in_one_call_wakes_the_trigger(waited: EngineSetup) -> None:
    # Every task recorded: the finish is ENGINE 0003's ETL_CRAFT_FINISH, which sends the notice itself.
    identity = RunIdentity("holder", "run_1")
    with waited.hook().lifecycle(lock_timeout=10) as lc:
        lc.finish_task(lc.start_task(WAITED, "A", identity, 1), "SUCCESS")
    running = Running(trigger(seen(waited)))
    wait_until(lambda: listening(waited), 30, "the trigger to watch", interval=0.05)
    with waited.hook().lifecycle(lock_timeout=10) as lc:
        calls: list[str] = []
        original = lc.engine.call_at_once
        lc.engine.call_at_once = lambda *a, **k: calls.append("one call") or original(*a, **k)  # type: ignore[method-assign]
        assert lc.finish_run(WAITED, identity, {"A": "success"}).status == "SUCCESS"
    assert calls == ["one call"]
    assert running.result(30)["status"] == "changed"


def test_a_change_before_the_trigger_started_fires_at_once(waited: EngineSetup) -> None:
    before = seen(waited)
    finish(waited)
    assert Running(trigger(before)).result(30)["status"] == "changed"


def test_changes_of_other_pipelines_do_not_wake_it_and_the_recheck_comes_in_time(waited: EngineSetup) -> None:
    running = Running(trigger(seen(waited), recheck_after=6))
    wait_until(lambda: listening(waited), 30, "the trigger to watch", interval=0.05)
    with waited.hook().lifecycle(lock_timeout=10) as lc:
        identity = RunIdentity("other", "run_1")
        assert lc.claim(OTHER, identity).action == "CREATED"
        lc.finish_task(lc.start_task(OTHER, "B", identity, 1), "SUCCESS")
    finish(waited, OTHER, holder="other")
    assert running.result(30)["status"] == "recheck"


def test_an_upstream_pipeline_is_watched_too(engine: EngineSetup, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = engine.config_path.parent / "reliability-migrations"
    _prepared(engine, monkeypatch)
    (folder / "0002_dependency.sql").write_text(
        "INSERT INTO CFG_PIPELINE_DEPENDENCY (PIPELINE_ID, DEPENDS_ON_PIPELINE_ID, DEPENDENCY_TYPE) "
        f"SELECT d.PIPELINE_ID, u.PIPELINE_ID, 'SUCCESS' FROM CFG_PIPELINES d, CFG_PIPELINES u "
        f"WHERE d.PIPELINE_CODE = '{WAITED}' AND u.PIPELINE_CODE = '{OTHER}';\n"
    )
    engine.hook().migrate(folder)
    with engine.hook().lifecycle(lock_timeout=10) as lc:
        assert lc.claim(OTHER, RunIdentity("other", "run_1")).action == "CREATED"
    running = Running(trigger(seen(engine)))
    wait_until(lambda: listening(engine), 30, "the trigger to watch", interval=0.05)
    finish(engine, OTHER, holder="other")
    assert running.result(30)["status"] == "changed"


def test_the_deadline_fires_timeout(waited: EngineSetup) -> None:
    deadline = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
    assert Running(trigger(seen(waited), deadline=deadline)).result(30)["status"] == "timeout"


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_without_listen_it_polls(waited: EngineSetup) -> None:
    running = Running(trigger(seen(waited), listen=False, poll_interval=0.5))
    wait_until(lambda: listening(waited), 30, "the trigger to watch", interval=0.05)
    finish(waited)
    assert running.result(30)["status"] == "changed"


def test_the_trigger_serializes_to_what_recreates_it() -> None:
    original = trigger([1, 2, 3, 0, 4], deadline="2026-12-04T00:00:00+00:00")
    path, kwargs = original.serialize()
    assert path == "airflow_provider_etl_craft.triggers.engine_change.EngineChangeTrigger"
    assert EngineChangeTrigger(**kwargs).serialize() == (path, kwargs)
    json.dumps(kwargs)  # what Airflow stores


# -- a PostgreSQL restart during a wait: a cluster of this module's own ------------------------------------


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[PgCluster]:
    try:
        bindir = find_bindir()
    except PostgresUnavailable as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{exc} (and {REQUIRE_ENV}=1)", pytrace=False)
        pytest.skip(str(exc))
    cluster = PgCluster.create(bindir, "postgres" if os.geteuid() == 0 else None)
    try:
        yield cluster
    finally:
        cluster.destroy()


def test_a_postgresql_restart_during_the_wait(
    own_cluster: PgCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = PgDatabase(own_cluster, own_cluster.create_database())
    monkeypatch.setenv("ENGINE_SECRET", db.password)
    engine = _prepared(
        EngineSetup(
            "postgresql",
            write_config(tmp_path / "engine", pg_profile_yaml(db)),
            {"ENGINE_SECRET": db.password},
            db,
        ),
        monkeypatch,
    )
    running = Running(trigger(seen(engine)))
    wait_until(lambda: listening(engine), 30, "the trigger to watch", interval=0.05)
    own_cluster.stop()
    own_cluster.start()
    assert not running.fired()
    # Only a connection opened again (and LISTENing again) can see the end: no poll, no recheck before 600 s.
    wait_until(lambda: _safe(listening, engine), 60, "the trigger to watch again", interval=0.1)
    finish(engine)
    assert running.result(30)["status"] == "changed"


def _safe(check: Any, *args: Any) -> bool:
    try:
        return bool(check(*args))
    except psycopg2.OperationalError:
        return False


def test_a_defect_in_the_shared_hub_fails_the_wait_instead_of_hanging_it(
    waited: EngineSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> list[list[int]]:
        raise ValueError("a defect in the hub")

    monkeypatch.setattr(wait_hub, "read_fingerprints", broken)
    with pytest.raises(ValueError, match="a defect in the hub"):
        Running(trigger(seen(waited))).result(30)


# -- the hand-back hold and a claim's wait (docs/deferred-waits.md) -----------------------------------------


class Timed(Running):
    """A :class:`Running` that also notes when the first event came out of ``run()``."""

    def __init__(self, trigger: EngineChangeTrigger) -> None:
        self.at: datetime | None = None
        super().__init__(trigger)

    def _main(self, trigger: EngineChangeTrigger) -> None:
        super()._main(trigger)
        self.at = datetime.now(UTC)


@pytest.mark.parametrize("status", ["changed", "recheck"])
def test_an_event_right_after_the_deferral_is_held_until_airflow_can_have_taken_it_in(
    waited: EngineSetup, status: str
) -> None:
    """The change already happened when the trigger starts (or the recheck is due at once): the event still
    waits for ``hold_until``, so Airflow's scheduler takes in the deferring process's exit first."""
    before = seen(waited)
    if status == "changed":
        finish(waited)
    hold_until = datetime.now(UTC) + timedelta(seconds=2)
    running = Timed(
        trigger(
            before, hold_until=hold_until.isoformat(), recheck_after=0.01 if status == "recheck" else NEVER
        )
    )
    assert running.result(30)["status"] == status
    assert running.at is not None and running.at >= hold_until


def test_a_claims_wait_is_not_woken_by_task_runs_ending_inside_the_run_it_waits_for(
    waited: EngineSetup,
) -> None:
    """A claim waits for the run to end; each task that ends inside it would otherwise wake the claim, which
    looks, finds the run still IN-PROGRESS and defers again, right before the next change."""
    running = Running(trigger(seen(waited), ignore_task_ends=True, recheck_after=6))
    wait_until(lambda: listening(waited), 30, "the trigger to watch", interval=0.05)
    identity = RunIdentity("holder", "run_1")
    with waited.hook().lifecycle(lock_timeout=10) as lc:
        lc.finish_task(lc.start_task(WAITED, "A", identity, 1), "SUCCESS")
    assert running.result(30)["status"] == "recheck"
    claim = Running(trigger(seen(waited), ignore_task_ends=True))
    wait_until(lambda: listening(waited), 30, "the trigger to watch", interval=0.05)
    finish(waited)
    assert claim.result(30)["status"] == "changed"


def test_a_trigger_serialized_before_the_hold_recreates_without_one() -> None:
    """A triggerer of this version re-creates a deferral an earlier version serialized (no hold, no claim
    flag): it fires as before."""
    _, kwargs = trigger([1, 2, 3, 0, 4]).serialize()
    older = {k: v for k, v in kwargs.items() if k not in ("hold_until", "ignore_task_ends")}
    recreated = EngineChangeTrigger(**older)
    assert recreated.hold_until is None and recreated.ignore_task_ends is False
