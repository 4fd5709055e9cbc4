"""Deferred waits at scale: how many Engine DB sessions 1,000 waits in one triggerer hold, and how soon each wakes.

A stand-in triggerer process (``tests/integration/wait_hub_process.py``: every trigger in one asyncio event
loop, as Airflow's triggerer runs them) waits on ``pipelines x per_pipeline`` deferred claims, each behind an
IN-PROGRESS run of its pipeline. The benchmark counts the provider's sessions on the server
(``pg_stat_activity``), then finishes the runs one after another and takes, for each wait, the time from its
run's finish returning to the trigger's event (both read from ``CLOCK_MONOTONIC``, one clock for every process
of the machine).
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from bench import engines

ROOT = Path(__file__).resolve().parents[1]
CONN_ID = "etl_craft_hub_test"  # the stand-in triggerer's connection id


def measure(
    pg: engines.PgServer, hook: Any, pipelines: int, per_pipeline: int, log: Callable[[str], None]
) -> dict[str, Any]:
    from airflow_provider_etl_craft.engine.dialects.postgresql import DEFAULT_APPLICATION_NAME
    from airflow_provider_etl_craft.runs import RunIdentity
    from airflow_provider_etl_craft.runs.changes import watch_state

    codes = [f"BENCH_WAIT_{n:04d}" for n in range(pipelines)]
    engines.seed_pipelines(hook, [(code, ["A"]) for code in codes])
    with hook.lifecycle() as lc:
        for code in codes:
            lc.claim(code, RunIdentity("bench_holder", f"{code}_1"))
        seen = {code: watch_state(lc.engine, lc.conn, code) for code in codes}
    waits = [(code, seen[code]) for code in codes for _ in range(per_pipeline)]
    env = {
        **os.environ,
        f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(
            {"conn_type": "etl_craft", "extra": {"config_path": str(pg.config_path)}}
        ),
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.wait_hub_process", json.dumps(waits), "1"],
        stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.strip())

    threading.Thread(target=read, daemon=True).start()

    def next_line(prefix: str) -> str:
        while True:
            line = lines.get(timeout=300)
            if line.startswith(prefix):
                return line

    try:
        registering = time.monotonic()
        next_line("READY")
        registered_s = time.monotonic() - registering
        with closing(pg.cluster.admin_connect(pg.database.name)) as admin, admin.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
                (pg.database.name, DEFAULT_APPLICATION_NAME),
            )
            sessions = int(engines.scalar(cur))
        log(f"  {len(waits)} waits registered in {registered_s:.1f} s on {sessions} Engine DB session(s)")
        finished: dict[str, float] = {}
        with hook.lifecycle() as lc:
            for code in codes:
                lc.finish_run(code, RunIdentity("bench_holder", f"{code}_1"), {"A": None})
                finished[code] = time.monotonic()
        latencies = []
        for _ in waits:
            _, index, status, at = next_line("EVENT ").split()
            assert status == "changed", status
            latencies.append((float(at) - finished[waits[int(index)][0]]) * 1000)
        latencies.sort()
        return {
            "waits": len(waits),
            "pipelines": pipelines,
            "sessions": sessions,
            "registered_s": registered_s,
            "wake_ms": {
                "median": statistics.median(latencies),
                "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
                "max": latencies[-1],
            },
        }
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
