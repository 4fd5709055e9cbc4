"""The task process's one Engine DB connection, and the login started ahead of its first use
(:mod:`airflow_provider_etl_craft.engine.reuse`, docs/performance.md "In the task process").

On PostgreSQL the login runs in a thread while the try loads its modules; the first borrow takes that very
session (the server sees one backend, and the borrowed connection is it), a refused login surfaces at the
borrow exactly as a login made there would, and a login nobody takes is closed. SQLite logs in on use.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import closing
from typing import Any

import pytest

from airflow_provider_etl_craft.engine import reuse
from airflow_provider_etl_craft.errors import EtlCraftError
from airflow_provider_etl_craft.runs.lifecycle import lent_lifecycle
from harness.engines import EngineSetup

#: Sessions of the Engine role in the Engine database, as the server lists them (backend pids).
SESSIONS = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND usename = %s"


def _sessions(setup: EngineSetup) -> list[int]:
    db = setup.database
    assert db is not None
    with closing(db.cluster.admin_connect()) as admin, admin.cursor() as cur:
        cur.execute(SESSIONS, (db.name, db.user))
        return sorted(row[0] for row in cur.fetchall())


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("the condition did not hold within the timeout")
        time.sleep(0.02)


def _engine(setup: EngineSetup) -> Any:
    hook = setup.hook()
    return reuse.engine_for(hook.engine_profile)


def _backend_pid(lifecycle: Any) -> int:
    with closing(lifecycle.conn.cursor()) as cur:
        cur.execute("SELECT pg_backend_pid()")
        return int(cur.fetchone()[0])


@pytest.mark.postgres
def test_the_first_borrow_takes_the_session_the_login_ahead_opened(
    make_engine: Callable[[str], EngineSetup],
) -> None:
    setup = make_engine("postgresql")
    setup.hook().init_db()
    engine = _engine(setup)
    assert _sessions(setup) == []

    reuse.log_in_ahead(engine)
    assert reuse.open_count() == 1  # the login under way counts as the process's connection
    _wait_for(lambda: len(_sessions(setup)) == 1)  # logged in before anything borrowed it
    [ahead] = _sessions(setup)
    reuse.log_in_ahead(engine)  # a second call while one is under way (or done) starts nothing more

    with lent_lifecycle(engine) as lifecycle:
        assert _backend_pid(lifecycle) == ahead
    with lent_lifecycle(engine) as lifecycle:  # given back idle, kept: the next borrow gets it again
        assert _backend_pid(lifecycle) == ahead
    reuse.log_in_ahead(engine)  # a connection is kept: nothing is started
    assert _sessions(setup) == [ahead]
    assert reuse.open_count() == 1


@pytest.mark.postgres
def test_a_refused_login_ahead_fails_the_borrow_as_a_login_made_there_would(
    make_engine: Callable[[str], EngineSetup], monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = make_engine("postgresql")
    setup.hook().init_db()
    monkeypatch.setenv("ENGINE_SECRET", "not-the-password")

    def refusal(ahead: bool) -> EtlCraftError:
        reuse.close_all()
        engine = _engine(setup)
        if ahead:
            reuse.log_in_ahead(engine)
        with pytest.raises(EtlCraftError) as raised, lent_lifecycle(engine):
            pytest.fail("the login was refused: nothing is lent")
        assert reuse.open_count() == 0  # nothing kept, no login left under way
        return raised.value

    inline, ahead = refusal(ahead=False), refusal(ahead=True)
    assert type(ahead) is type(inline)
    assert (ahead.case, ahead.retryable, str(ahead)) == (inline.case, inline.retryable, str(inline))
    assert "not-the-password" not in str(ahead)

    monkeypatch.setenv("ENGINE_SECRET", setup.env["ENGINE_SECRET"])  # the next try logs in again
    reuse.close_all()
    engine = _engine(setup)
    reuse.log_in_ahead(engine)
    with lent_lifecycle(engine) as lifecycle:
        assert _backend_pid(lifecycle) in _sessions(setup)


@pytest.mark.postgres
def test_a_login_ahead_nobody_takes_is_closed(make_engine: Callable[[str], EngineSetup]) -> None:
    setup = make_engine("postgresql")
    setup.hook().init_db()
    reuse.log_in_ahead(_engine(setup))
    reuse.close_all()  # at interpreter exit, or a try that failed before its first step
    assert reuse.open_count() == 0
    _wait_for(lambda: _sessions(setup) == [])


def test_sqlite_logs_in_on_use(make_engine: Callable[[str], EngineSetup]) -> None:
    """A SQLite connection belongs to the thread that opened it: nothing is opened ahead."""
    setup = make_engine("sqlite")
    setup.hook().init_db()
    engine = _engine(setup)
    reuse.log_in_ahead(engine)
    assert reuse.open_count() == 0
    with lent_lifecycle(engine) as lifecycle:
        assert lifecycle.engine.query(lifecycle.conn, "SELECT COUNT(*) FROM CFG_PIPELINES")[0][0] == 0
    assert reuse.open_count() == 1


@pytest.mark.postgres
def test_a_forked_child_leaves_the_parents_login_ahead_alone(
    make_engine: Callable[[str], EngineSetup],
) -> None:
    """A child forked while the parent's login ahead is not taken yet neither takes nor closes it (closing it
    would end the parent's session): it opens its own, and the parent's first borrow still gets its session."""
    import gc
    import os

    setup = make_engine("postgresql")
    setup.hook().init_db()
    engine = _engine(setup)
    reuse.log_in_ahead(engine)
    _wait_for(lambda: len(_sessions(setup)) == 1)
    [ahead] = _sessions(setup)

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its own session's backend, then drop everything it inherited
        status = 1
        try:
            child_engine = reuse.engine_for(engine.profile)
            with lent_lifecycle(child_engine) as lifecycle:
                os.write(write, str(_backend_pid(lifecycle)).encode())
            reuse.close_all()
            gc.collect()
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_backend = int(pipe.read() or 0)
    assert os.waitpid(pid, 0)[1] == 0
    assert child_backend not in (0, ahead)

    with lent_lifecycle(engine) as lifecycle:
        assert _backend_pid(lifecycle) == ahead
    _wait_for(lambda: _sessions(setup) == [ahead])  # the child's session ended, the parent's did not
