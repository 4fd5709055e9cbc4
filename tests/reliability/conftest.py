"""Shared pieces of the reliability tests: seeded Engine DBs, a pool of spawned workers, killable children.

The Engine profile comes from the ``engine`` fixture of ``tests/conftest.py`` (SQLite, then PostgreSQL on the
session's throwaway cluster). Every helper here builds its own hook from the craft-connector.yml, so the
test process reads the Engine DB exactly as a separate worker would.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.engines import EngineSetup, engine_rows
from tests.reliability import workers

SPAWN = multiprocessing.get_context("spawn")
POOL_SIZE = 16
#: Seconds a spawned worker may take to import Airflow and the provider (16 at once on 2 cores: ~30 s).
POOL_START_TIMEOUT = 180.0
CHILDREN = Path(__file__).with_name("children.py")


# -- seeding the Engine DB ----------------------------------------------------------------------------------


def pipeline_sql(code: str, tasks: Iterable[str], handler: str = "PYTHON") -> str:
    """A project migration's INSERTs for one active pipeline and its active tasks (valid on both dialects)."""
    lines = [
        "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY) "
        f"VALUES ('{code}', 'Reliability {code}', 24, 'FULL', 'reliability');"
    ]
    for task in tasks:
        lines.append(
            "INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY) "
            f"SELECT '{task}', 'ETL', PIPELINE_ID, '{handler}', 'reliability' FROM CFG_PIPELINES "
            f"WHERE PIPELINE_CODE = '{code}' AND ACTIVE_FLAG = 'Y';"
        )
    return "\n".join(lines) + "\n"


def seed(engine: EngineSetup, pipelines: dict[str, Sequence[str]]) -> None:
    """init-db plus one project migration creating ``{pipeline_code: [task_code, …]}`` (call once per DB)."""
    folder = engine.config_path.parent / "reliability-migrations"
    folder.mkdir()
    text = "".join(pipeline_sql(code, tasks) for code, tasks in pipelines.items())
    (folder / "0001_reliability.sql").write_text(text, encoding="utf-8")
    result = engine.hook().migrate(folder)
    assert result.applied[-1] == "PROJECT 0001_reliability.sql", result


def rows(engine: EngineSetup, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` (``?`` placeholders) read on a fresh connection."""
    return engine_rows(engine.hook(), sql, params)


def scalar(engine: EngineSetup, sql: str, *params: Any) -> Any:
    found = rows(engine, sql, *params)
    assert len(found) == 1 and len(found[0]) == 1, found
    return found[0][0]


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.005) -> Any:
    """Poll ``check()`` until it returns something truthy (returned); fail naming ``what`` past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what} (last seen: {found!r})")
        time.sleep(interval)


def table_counts(engine: EngineSetup) -> dict[str, int]:
    """Row count of every CFG_/AUD_ table the lifecycle touches (proves a table is still there, and intact)."""
    tables = ("CFG_PIPELINES", "CFG_TASKS", "AUD_PIPELINES_RUN_LOG", "AUD_TASK_RUN_LOG", "AUD_TASK_ATTEMPTS",
              "AUD_RUN_INTERVENTIONS", "SCHEMA_MIGRATIONS")  # fmt: skip
    return {table: int(scalar(engine, f"SELECT COUNT(*) FROM {table}")) for table in tables}


# -- a pool of spawned workers ------------------------------------------------------------------------------
#
# Importing Airflow (which EngineDBHook needs) takes ~3 s of CPU per process, so sixteen workers are spawned
# once per session and then run one command at a time; every command and every report carries a token, so a
# report left over from a failed test can never be mistaken for one of the next test.


@dataclass
class Job:
    """One command sent to some workers; ``messages`` collects their reports as they arrive."""

    pool: Pool
    token: str
    workers: tuple[int, ...]
    #: Kept until the job ends: a manager proxy (a barrier) sent to the workers must outlive their use of it.
    kwargs: dict[str, Any] = field(default_factory=dict)
    messages: list[tuple[int, str, Any]] = field(default_factory=list)

    @property
    def done(self) -> set[int]:
        return {i for i, kind, _ in self.messages if kind in ("DONE", "ERROR")}

    @property
    def finished(self) -> bool:
        return self.done >= set(self.workers)

    def pump(self, timeout: float) -> None:
        """Take the reports that arrive within ``timeout`` seconds into their jobs (this one or another one
        running at the same time); return early once this job is finished."""
        deadline = time.monotonic() + timeout
        while not self.finished:
            try:
                token, index, kind, payload = self.pool.outbox.get(
                    timeout=max(0.0, deadline - time.monotonic())
                )
            except queue.Empty:
                return
            job = self.pool.jobs.get(token)
            if job is not None:  # else a report of an earlier, failed test: dropped
                job.messages.append((index, kind, payload))
            if time.monotonic() >= deadline:
                return

    def wait(self, timeout: float) -> list[tuple[int, str, Any]]:
        """Every report, once every worker of the job is done; fail (and retire the pool) past ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.finished:
            dead = [i for i in self.workers if i not in self.done and not self.pool.procs[i].is_alive()]
            if dead or time.monotonic() > deadline:
                alive = {i: self.pool.procs[i].is_alive() for i in self.workers}
                self.pool.broken = True
                pending = sorted(set(self.workers) - self.done)
                raise AssertionError(f"workers {pending} did not finish within {timeout:.0f}s (deadlock?) or died {dead}; "
                                     f"alive: {alive}; reports so far: {self.messages}")  # fmt: skip
            self.pump(min(1.0, max(0.0, deadline - time.monotonic())))
        errors = [m for m in self.messages if m[1] == "ERROR"]
        assert not errors, "\n\n".join(f"worker {i}:\n{text}" for i, _, text in errors)
        return self.messages

    def of_kind(self, kind: str) -> list[tuple[int, Any]]:
        return [(i, payload) for i, k, payload in self.messages if k == kind]

    def expect(self, kind: str, count: int, timeout: float = 120.0) -> list[tuple[int, Any]]:
        """The first ``count`` reports of ``kind``, pumped as they arrive; fail (and retire the pool) if a
        worker of the job errs, dies or ends without sending its report, or past ``timeout``."""
        deadline = time.monotonic() + timeout
        while len(self.of_kind(kind)) < count:
            errors = [m for m in self.messages if m[1] == "ERROR"]
            dead = [i for i in self.workers if i not in self.done and not self.pool.procs[i].is_alive()]
            if errors or dead or self.finished or time.monotonic() > deadline:
                self.pool.broken = True
                raise AssertionError(f"{len(self.of_kind(kind))} of {count} {kind} reports within {timeout:.0f}s; "
                                     f"dead workers {dead}; reports so far: {self.messages}")  # fmt: skip
            self.pump(0.01)
        return self.of_kind(kind)[:count]


@dataclass
class Pool:
    procs: list[Any]
    inboxes: list[Any]
    outbox: Any
    manager: Any
    pids: dict[int, int]
    broken: bool = False
    #: Jobs by token: reports are filed into their own job whichever job reads the outbox.
    jobs: dict[str, Job] = field(default_factory=dict)

    @classmethod
    def start(cls, size: int = POOL_SIZE) -> Pool:
        manager = SPAWN.Manager()
        outbox = SPAWN.Queue()
        inboxes = [SPAWN.Queue() for _ in range(size)]
        procs = [SPAWN.Process(target=workers.worker_main, args=(i, inboxes[i], outbox), daemon=True,
                               name=f"reliability-worker-{i}") for i in range(size)]  # fmt: skip
        for proc in procs:
            proc.start()
        pool = cls(procs, inboxes, outbox, manager, {})
        deadline = time.monotonic() + POOL_START_TIMEOUT
        while len(pool.pids) < size:
            try:
                token, index, kind, pid = outbox.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pool.close()
                raise AssertionError(
                    f"only {len(pool.pids)} of {size} workers started in {POOL_START_TIMEOUT}s"
                ) from None
            assert token is None and kind == "READY", (token, index, kind, pid)
            pool.pids[index] = pid
        return pool

    def barrier(self, parties: int) -> Any:
        """A barrier the workers (and the test, when counted in ``parties``) can wait on."""
        return self.manager.Barrier(parties)

    def send(self, function: Any, engine: EngineSetup, workers: Iterable[int], **kwargs: Any) -> Job:
        """Run ``function(hook, report, index=i, **kwargs)`` on each of ``workers``."""
        job = Job(self, uuid.uuid4().hex, tuple(workers), kwargs)
        command = pickle.dumps((function, str(engine.config_path), engine.env, kwargs))
        self.jobs[job.token] = job
        for index in job.workers:
            self.inboxes[index].put((job.token, command))
        return job

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        deadline = time.monotonic() + 1
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():  # stuck (a failed test) or slow to shut Airflow down: end our own child
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(timeout=15)
        self.manager.shutdown()


@pytest.fixture(scope="session")
def _pool_holder() -> Iterator[dict[str, Pool]]:
    holder: dict[str, Pool] = {}
    yield holder
    if "pool" in holder:
        holder["pool"].close()


@pytest.fixture
def pool(_pool_holder: dict[str, Pool]) -> Pool:
    """The session's sixteen spawned workers (started on first use; replaced if a test left them stuck)."""
    current = _pool_holder.get("pool")
    if current is not None and (current.broken or not all(p.is_alive() for p in current.procs)):
        current.close()
        current = None
    if current is None:
        current = _pool_holder["pool"] = Pool.start()
    return current


# -- children to kill ---------------------------------------------------------------------------------------


class Child:
    """``children.py <command>`` in a subprocess; :meth:`ready` waits for its READY line."""

    def __init__(self, engine: EngineSetup, command: str, *args: object) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILDREN), command, str(engine.config_path), *map(str, args)],
            env=engine.subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self._buffer = b""

    def ready(self, timeout: float = 120.0) -> list[str]:
        """The words after READY; fails with the child's stderr if it exits or stays silent."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            readable, _, _ = select.select([fd], [], [], max(0.0, left))
            chunk = os.read(fd, 4096) if readable else b""
            if not chunk:
                self.kill()
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise AssertionError(
                    f"child {self.proc.args[2:4]} never became ready (exit {self.proc.returncode}):\n{err}"
                )
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        words = line.decode().split()
        assert words and words[0] == "READY", line
        return words[1:]

    def kill(self) -> float:
        """``kill -9`` the child and reap it; return the monotonic time it was seen dead."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        return time.monotonic()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Children a test starts are appended here and killed at the end whatever happens."""
    started: list[Child] = []
    yield started
    for child in started:
        child.close()
