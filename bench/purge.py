"""Part 8: the purge on years of history — how fast it deletes, and how long a claim waits beside it.

On the history Engine DB of part 7 (:mod:`bench.history`), ``etl-craft-airflow purge --older-than …`` runs in
a process of its own (the installed CLI, ``--format json``). Meanwhile this process claims and finishes runs
of some of the pipelines whose history is being deleted, back to back on one connection, and times each
claim call. Before the purge starts, the same loop runs alone for a while: the claim times without a purge.

Throughput is the purge's own record (``AUD_ENGINE_PURGES``): rows deleted ÷ (``ENDED_AT`` − ``STARTED_AT``),
planning included. The claims counted "during the purge" are those that began between those two instants;
both clocks are this machine's wall clock (the purge writes its times from Python, not from the server).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import history

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "bench_purge_claims"
#: A claim beside a running purge never waits this long (the issue's target).
CLAIM_WAIT_TARGET_S = 1.0


def claim_codes(pipelines: int, count: int = 4) -> list[str]:
    """Pipelines whose history the purge deletes, for the claim loop (not the one part 7 runs)."""
    return [f"HIST_{n:04d}" for n in range(2, min(pipelines, count + 1) + 1)]


def claim_loop(hook: Any, codes: list[str], stop: Callable[[], bool]) -> list[tuple[float, float]]:
    """Claim and finish runs of ``codes`` in turn until ``stop()``; (wall-clock start, seconds) of each claim."""
    from airflow_provider_etl_craft.runs.identity import RunIdentity

    claims: list[tuple[float, float]] = []
    with hook.lifecycle() as lc:
        n = 0
        while not stop():
            code = codes[n % len(codes)]
            n += 1
            who = RunIdentity(DAG_ID, f"claim__{uuid.uuid4().hex}", datetime.now(UTC))
            at, started = time.time(), time.perf_counter()
            outcome = lc.claim(code, who)
            claims.append((at, time.perf_counter() - started))
            if outcome.action != "CREATED":
                raise RuntimeError(f"claim of {code} returned {outcome.action}, expected CREATED")
            lc.finish_run(code, who, {})
    return claims


def _ms(seconds: list[float]) -> dict[str, float | int]:
    if not seconds:
        return {"n": 0}
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"n": len(ordered), "median_ms": round(statistics.median(ordered) * 1000, 3),
            "p99_ms": round(p99 * 1000, 3), "max_ms": round(ordered[-1] * 1000, 3)}  # fmt: skip


def measure(pair: history.EnginePair, pipelines: int, older_than_days: int, batch_size: int,
            baseline_s: float, log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """Purge ``pair.history`` of runs older than ``older_than_days`` while claims run; see the module doc."""
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

    hook = EngineDBHook.from_config(pair.history)
    codes = claim_codes(pipelines)
    before = history.table_counts(hook)
    until = time.monotonic() + baseline_s
    alone = claim_loop(hook, codes, lambda: time.monotonic() >= until)

    cmd = [sys.executable, "-m", "airflow_provider_etl_craft.cli.main", "purge", "--config", str(pair.history),
           "--older-than", f"{older_than_days}d", "--batch-size", str(batch_size), "--by", "bench",
           "--format", "json"]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    launched = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        beside = claim_loop(hook, codes, lambda: proc.poll() is not None)
        out, err = proc.communicate(timeout=3600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    process_s = time.perf_counter() - launched
    if proc.returncode != 0:
        raise RuntimeError(f"purge exited {proc.returncode}: {err.strip()[-2000:]}")
    doc = json.loads(out)
    engine = hook.engine
    with closing(engine.connect()) as conn:
        row = engine.query(
            conn, "SELECT STATUS, STARTED_AT, ENDED_AT, BATCHES FROM AUD_ENGINE_PURGES WHERE PURGE_ID = ?",
            (doc["purge_id"],),
        )[0]  # fmt: skip
    status, started_at, ended_at = row[0], engine.from_db_time(row[1]), engine.from_db_time(row[2])
    assert started_at is not None and ended_at is not None and status == "DONE", row
    start, end = started_at.timestamp(), ended_at.timestamp()
    purge_s = end - start
    during = [seconds for at, seconds in beside if start <= at <= end]
    counts = doc["counts"]
    after = history.table_counts(hook)
    result = {
        "dialect": pair.dialect,
        "older_than_days": older_than_days,
        "batch_size": batch_size,
        "batches": doc["batches"],
        "before": before,
        "after": after,
        "counts": counts,
        "runs_kept": doc["runs_kept"],
        "purge_s": round(purge_s, 3),
        "process_s": round(process_s, 3),
        "runs_per_s": round(counts["RUNS_DELETED"] / purge_s, 1),
        "attempts_per_s": round(counts["ATTEMPTS_DELETED"] / purge_s, 1),
        "claim_codes": codes,
        "claims_alone": _ms([seconds for _, seconds in alone]),
        "claims_during": _ms(during),
        "claims_beside_process": len(beside),
    }
    log(f"  {pair.dialect}: purged {counts['RUNS_DELETED']:,} runs / {counts['ATTEMPTS_DELETED']:,} attempts in "
        f"{purge_s:.1f} s ({result['runs_per_s']:,.0f} runs/s, {result['attempts_per_s']:,.0f} attempts/s); "
        f"{len(during)} claims during it, longest {result['claims_during'].get('max_ms', 0):.0f} ms")  # fmt: skip
    return result
