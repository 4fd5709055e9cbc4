"""Named Engine DB locks across real OS processes: waiting, kill -9, timeouts, per-schema keys."""

from __future__ import annotations

import ctypes
import io
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.engine.locks import advisory_key
from airflow_provider_etl_craft.engine.schema import ENGINE_TABLES
from airflow_provider_etl_craft.errors import ConfigurationError, LockTimeoutError
from harness.engines import EngineSetup, pg_profile_yaml, write_config

HOLDER = """
import sys
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
hook = EngineDBHook.from_config(sys.argv[1])
with hook.lock(sys.argv[2], timeout=30):
    print("locked", flush=True)
    sys.stdin.readline()          # hold until the test writes a line (or kills us)
print("released", flush=True)
"""


@contextmanager
def holder(setup: EngineSetup, name: str) -> Iterator[subprocess.Popen[str]]:
    """A separate process holding lock ``name`` until its stdin gets a line."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(setup.config_path), name], env=setup.subprocess_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked", proc.stderr.read()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout is not None and proc.stdout.readline().strip() == "released"


#: Seconds a process may take to start (it imports Airflow) and reach the lock, on a loaded machine too.
REACH_TIMEOUT = 120.0
IN_OPEN = 0x20  # <sys/inotify.h>


@contextmanager
def lock_file_opens(path: Path) -> Iterator[Callable[[float], bool]]:
    """Watch ``path`` with inotify; yields ``opened(timeout)``: True once somebody opened it after the watch began.

    A SQLite-profile lock is a lock file that every attempt to take it opens (filelock opens it, tries flock,
    closes it again while another process holds it, and retries), so an open seen while the holder holds the
    lock is another process's attempt at it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    if fd < 0 or libc.inotify_add_watch(fd, os.fsencode(path), IN_OPEN) < 0:
        raise OSError(ctypes.get_errno(), f"inotify on {path}")

    def opened(timeout: float) -> bool:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable and os.read(fd, 4096))

    try:
        yield opened
    finally:
        os.close(fd)


def wait_until_blocked(setup: EngineSetup, waiter: subprocess.Popen[str]) -> None:
    """Until ``waiter`` has tried the lock and is waiting for it (the test's holder has it all along).

    PostgreSQL shows the waiter's ungranted advisory lock in pg_locks; with SQLite the waiter's attempts open
    the lock file (seen with inotify), and it is still running, so it has not got the lock."""
    deadline = time.monotonic() + REACH_TIMEOUT
    if setup.dialect == "sqlite":
        if not sys.platform.startswith("linux"):
            pytest.skip("seeing a lock attempt on a SQLite profile's lock file needs inotify (Linux)")
        lock_file = setup.hook().engine.path.with_name("etl-craft.db.migrate.lock")
        assert lock_file.exists()  # the holder's
        with lock_file_opens(lock_file) as opened:
            while not opened(0.1):  # filelock retries every 50 ms, so a waiter that started is seen
                assert waiter.poll() is None, waiter.communicate()
                assert time.monotonic() < deadline, "the waiter never tried the lock"
        assert waiter.poll() is None, waiter.communicate()
        return
    admin = setup.database.cluster.admin_connect(setup.database.name)
    with closing(admin), admin.cursor() as cur:
        while True:
            cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            if cur.fetchone()[0] == 1:
                return
            assert waiter.poll() is None, waiter.communicate()
            assert time.monotonic() < deadline, "the waiter never blocked on the advisory lock"
            time.sleep(0.05)


def test_second_process_waits_for_migrate_while_the_first_holds_it(engine: EngineSetup) -> None:
    with holder(engine, "migrate") as first:
        second = subprocess.Popen(
            [sys.executable, "-m", "airflow_provider_etl_craft.cli.main", "init-db", "--config", str(engine.config_path)],
            env=engine.subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_until_blocked(engine, second)
        assert second.poll() is None
        hook = engine.hook()
        assert not hook.engine.table_names(hook.get_conn()) & ENGINE_TABLES  # nothing done while waiting
        release(first)
        out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert "initialised" in out


def test_kill_9_of_the_holder_frees_the_lock_at_once(engine: EngineSetup) -> None:
    with holder(engine, "pipeline:SALES") as proc:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        with engine.hook().lock("pipeline:SALES", timeout=10):
            pass


def test_a_lock_timeout_names_the_lock(engine: EngineSetup) -> None:
    timeout = pytest.raises(LockTimeoutError, match=r"lock 'pipeline:SALES' .*not acquired within 0\.5s")
    with holder(engine, "pipeline:SALES"), timeout, engine.hook().lock("pipeline:SALES", timeout=0.5):
        pass
    with holder(engine, "migrate"):
        err = io.StringIO()
        assert (
            main(
                ["init-db", "--lock-timeout", "0.5", "--config", str(engine.config_path)], io.StringIO(), err
            )
            == 14
        )
        assert "lock 'migrate'" in err.getvalue() and err.getvalue().count("error:") == 1


def test_advisory_keys_are_stable_signed_64_bit_and_differ_by_schema() -> None:
    key = advisory_key("etl_craft", "migrate")
    assert key == advisory_key("etl_craft", "migrate")
    assert -(2**63) <= key < 2**63
    assert key != advisory_key("etl_craft_b", "migrate")
    assert key != advisory_key("etl_craft", "pipeline:migrate")


@pytest.mark.postgres
def test_two_engine_schemas_in_one_database_do_not_share_locks(make_engine, tmp_path) -> None:
    first = make_engine("postgresql", tmp_path / "a")
    db = first.database
    admin = db.cluster.admin_connect(db.name)
    with closing(admin), admin.cursor() as cur:
        cur.execute(f"CREATE SCHEMA etl_craft_b AUTHORIZATION {db.user}")
    second_config = write_config(tmp_path / "b", pg_profile_yaml(db, schema="etl_craft_b"))
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

    with holder(first, "migrate"):
        with EngineDBHook.from_config(second_config).lock("migrate", timeout=5):
            pass
        with pytest.raises(LockTimeoutError), first.hook().lock("migrate", timeout=0.5):
            pass


@pytest.mark.postgres
def test_the_lock_wait_bound_does_not_outlive_the_wait(make_engine) -> None:
    """lock_timeout bounds only the advisory-lock wait: it is back to 0 while the lock is held and after a timeout."""
    setup = make_engine("postgresql")
    hook = setup.hook()
    with closing(hook.get_conn()) as conn:
        lock_timeout = lambda: hook.engine.query(conn, "SHOW lock_timeout")[0][0]  # noqa: E731
        with hook.engine.lock("pipeline:SALES", timeout=5, conn=conn):
            assert lock_timeout() == "0"
            held = hook.engine.query(conn, "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = "
                                     "pg_backend_pid()")[0][0]  # fmt: skip
            assert held == 1
        assert lock_timeout() == "0"
        with holder(setup, "pipeline:SALES"):
            with pytest.raises(LockTimeoutError), hook.engine.lock("pipeline:SALES", timeout=0.3, conn=conn):
                pass
            assert lock_timeout() == "0"


# -- locks taken inside the transaction that needs them (PostgreSQL advisory transaction locks) -------------


def advisory_rows(setup: EngineSetup, name: str) -> list[tuple[int, bool]]:
    """(pid, granted) of every advisory lock on ``name``'s key, seen from a separate admin connection."""
    key = advisory_key(setup.database.schema, name)
    admin = setup.database.cluster.admin_connect(setup.database.name)
    with closing(admin), admin.cursor() as cur:
        cur.execute(
            "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s "
            "AND objsubid = 1 ORDER BY granted DESC",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        )
        return [(int(pid), bool(granted)) for pid, granted in cur.fetchall()]


@pytest.mark.postgres
def test_a_locked_transaction_holds_the_lock_until_its_commit_or_rollback(make_engine) -> None:
    """The lock belongs to the transaction: the server drops it at COMMIT and at ROLLBACK, nothing else does."""
    setup = make_engine("postgresql")
    hook = setup.hook()
    with closing(hook.get_conn()) as conn:
        with hook.engine.transaction(conn, lock="pipeline:SALES", lock_timeout=5) as cur:
            cur.execute("SELECT pg_backend_pid(), current_setting('lock_timeout'), current_schema()")
            pid, bound, schema = cur.fetchone()
            assert advisory_rows(setup, "pipeline:SALES") == [(pid, True)]
            assert bound == "0"  # the wait bound ended with the wait
            assert schema == setup.database.schema
        assert advisory_rows(setup, "pipeline:SALES") == []
        with pytest.raises(RuntimeError, match="boom"), hook.engine.transaction(conn, lock="pipeline:SALES"):
            assert len(advisory_rows(setup, "pipeline:SALES")) == 1
            raise RuntimeError("boom")
        assert advisory_rows(setup, "pipeline:SALES") == []
        assert hook.engine.query(conn, "SELECT current_setting('lock_timeout')") == [("0",)]


@pytest.mark.postgres
def test_a_second_connection_waits_then_times_out_and_gets_the_lock_after_the_rollback(make_engine) -> None:
    setup = make_engine("postgresql")
    hook = setup.hook()
    key = advisory_key(setup.database.schema, "pipeline:SALES")
    with closing(hook.get_conn()) as first, closing(hook.get_conn()) as second:
        message = rf"lock 'pipeline:SALES' \(advisory key {key} for schema {setup.database.schema}\) .*0\.3s"
        with (
            pytest.raises(RuntimeError, match="first ends"),
            hook.engine.transaction(first, lock="pipeline:SALES"),
        ):
            started = time.monotonic()
            with (
                pytest.raises(LockTimeoutError, match=message),
                hook.engine.transaction(second, lock="pipeline:SALES", lock_timeout=0.3),
            ):
                pytest.fail("the second connection got a lock the first holds")
            assert 0.25 <= time.monotonic() - started < 5  # it waited for its bound, not less
            assert [granted for _, granted in advisory_rows(setup, "pipeline:SALES")] == [True]
            # the failed wait left the second connection usable, outside any transaction
            assert hook.engine.query(second, "SELECT current_setting('lock_timeout')") == [("0",)]
            raise RuntimeError("first ends")  # ROLLBACK
        with hook.engine.transaction(second, lock="pipeline:SALES", lock_timeout=0.3):
            pass
    assert advisory_rows(setup, "pipeline:SALES") == []


@pytest.mark.postgres
def test_a_session_lock_of_a_not_yet_upgraded_worker_blocks_the_transaction_lock(make_engine) -> None:
    """Old releases took ``pg_advisory_lock`` on the same key: both kinds exclude each other during an upgrade."""
    setup = make_engine("postgresql")
    hook = setup.hook()
    key = advisory_key(setup.database.schema, "pipeline:SALES")
    with closing(hook.get_conn()) as old_worker, closing(hook.get_conn()) as conn:
        with old_worker.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (key,))
        with (
            pytest.raises(LockTimeoutError, match="pipeline:SALES"),
            hook.engine.transaction(conn, lock="pipeline:SALES", lock_timeout=0.3),
        ):
            pass
        with old_worker.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s)", (key,))
            assert cur.fetchone() == (True,)
        # and the other way round: the new transaction lock blocks an old worker's session lock
        with (
            hook.engine.transaction(conn, lock="pipeline:SALES", lock_timeout=0.3),
            old_worker.cursor() as cur,
        ):
            cur.execute("SELECT pg_try_advisory_lock(%s)", (key,))
            assert cur.fetchone() == (False,)


@pytest.mark.postgres
def test_a_session_unlock_on_a_session_that_does_not_hold_the_lock_is_an_error(make_engine) -> None:
    """As behind a transaction pooler, where the unlock reaches another server session than the lock."""
    setup = make_engine("postgresql")
    hook = setup.hook()
    with closing(hook.get_conn()) as conn:
        not_held = r"lock 'pipeline:SALES' .*not held by the session"
        with (
            pytest.raises(ConfigurationError, match=not_held),
            hook.lock("pipeline:SALES", timeout=5, conn=conn),
        ):
            hook.engine.query(conn, "SELECT pg_advisory_unlock_all()")  # the lock is gone from this session
        # the locked code's own error is never replaced
        with pytest.raises(RuntimeError, match="body"), hook.lock("pipeline:SALES", timeout=5, conn=conn):
            hook.engine.query(conn, "SELECT pg_advisory_unlock_all()")
            raise RuntimeError("body")
    assert advisory_rows(setup, "pipeline:SALES") == []
