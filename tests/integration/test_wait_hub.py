"""Deferred waits share connections: a triggerer process with many waits holds one Engine DB connection per
Engine DB (docs in ``airflow_provider_etl_craft/triggers/wait_hub.py``), a notice wakes the waits that watch
its pipeline, and a claim of another task goes through meanwhile.

The triggerer is a process of its own (``wait_hub_process.py``) running every trigger in one event loop, as
Airflow's triggerer does.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from contextlib import closing
from typing import Any

import pytest

from airflow_provider_etl_craft.engine.dialects.postgresql import DEFAULT_APPLICATION_NAME
from airflow_provider_etl_craft.runs import RunIdentity
from airflow_provider_etl_craft.runs.changes import watch_state
from harness.engines import EngineSetup
from tests.integration.wait_hub_process import CONN_ID
from tests.reliability.conftest import seed

PER_PIPELINE = 5


class Triggerer:
    """The stand-in triggerer process and the lines it prints."""

    def __init__(self, engine: EngineSetup, waits: list[tuple[str, list[int]]], listen: bool) -> None:
        env = {
            **engine.subprocess_env(),
            f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(
                {"conn_type": "etl_craft", "extra": {"config_path": str(engine.config_path)}}
            ),
            "PYTHONPATH": os.getcwd(),
        }
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.wait_hub_process",
                json.dumps(waits),
                "1" if listen else "0",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def next(self, prefix: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line.startswith(prefix):
                return line

    def events(self, count: int, timeout: float = 120) -> list[tuple[int, str]]:
        return [(int(p[1]), p[2]) for p in (self.next("EVENT ", timeout).split() for _ in range(count))]

    def quiet(self, seconds: float) -> bool:
        try:
            line = self.lines.get(timeout=seconds)
        except queue.Empty:
            return True
        self.lines.put(line)
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def engine_sessions(engine: EngineSetup) -> int:
    """Sessions of the provider on the Engine DB (PostgreSQL), this test's own admin session aside."""
    db: Any = engine.database
    with closing(db.cluster.admin_connect(db.name)) as admin, admin.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (db.name, DEFAULT_APPLICATION_NAME),
        )
        return int(cur.fetchone()[0])


@pytest.mark.parametrize(
    ("engine", "pipelines", "listen"),
    [("postgresql", 200, True), ("postgresql", 40, False), ("sqlite", 40, True)],
    indirect=["engine"],
    ids=["postgresql-listen-1000", "postgresql-poll-200", "sqlite-200"],
)
def test_many_waits_share_one_connection_and_each_wakes_on_its_pipeline(
    engine: EngineSetup, pipelines: int, listen: bool
) -> None:
    codes = [f"P{n:03d}" for n in range(pipelines)]
    seed(engine, {**{code: ["A"] for code in codes}, "SIDE": ["A"]})
    hook = engine.hook()
    with hook.lifecycle() as lc:
        for code in codes:
            assert lc.claim(code, RunIdentity("holder", f"{code}_1")).action == "CREATED"
        seen = {code: watch_state(lc.engine, lc.conn, code) for code in codes}
    waits = [(code, seen[code]) for code in codes for _ in range(PER_PIPELINE)]
    triggerer = Triggerer(engine, waits, listen)
    try:
        assert triggerer.next("READY").startswith(f"READY {len(waits)} hubs=1")
        if engine.dialect == "postgresql":
            assert engine_sessions(engine) == 1  # one connection for every wait
        with hook.lifecycle() as lc:  # another task's claim meanwhile
            assert lc.claim("SIDE", RunIdentity("side", "run_1")).action == "CREATED"

        with hook.lifecycle() as lc:
            lc.finish_run(codes[0], RunIdentity("holder", f"{codes[0]}_1"), {"A": None})
        first = triggerer.events(PER_PIPELINE)
        assert sorted(i for i, _ in first) == list(range(PER_PIPELINE))  # the waits of that pipeline only
        assert {status for _, status in first} == {"changed"}
        assert triggerer.quiet(1.5)  # no other wait fired

        with hook.lifecycle() as lc:
            for code in codes[1:]:
                lc.finish_run(code, RunIdentity("holder", f"{code}_1"), {"A": None})
        rest = triggerer.events(len(waits) - PER_PIPELINE)
        assert sorted(i for i, _ in rest) == list(range(PER_PIPELINE, len(waits)))
        assert {status for _, status in rest} == {"changed"}
        assert triggerer.next("OPENED") == "OPENED 1"  # never more than the one connection
    finally:
        triggerer.stop()
