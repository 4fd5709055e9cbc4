"""Runs go on while the Engine DB's primary fails over (crash + promote) or switches over (clean handover).

Four spawned workers claim, record and finish runs of eight pipelines through the multi-host jdbc_url, a
connection per step, retrying as Airflow would (:mod:`tests.failover.workers`); each journals every
acknowledged step and every error. Midway the pair fails or switches over; meanwhile the test samples the
IN-PROGRESS runs on whichever node is primary. Afterwards the journals are held against the new primary
(:func:`judge`): nothing acknowledged is lost, nothing doubles, one IN-PROGRESS run per pipeline at most,
every error typed and retryable, writes resumed within seconds of the promotion, nothing left IN-PROGRESS.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from tests.failover import workers
from tests.failover.conftest import PIPELINES, WORKERS, FailoverEngine
from tests.reliability.conftest import Job, Pool

pytestmark = [pytest.mark.postgres, pytest.mark.failover]

#: Acknowledged steps (all workers) before the primary goes away, and seconds of work after the promotion.
STEPS_BEFORE = 60
SECONDS_AFTER = 4.0
#: The first acknowledged step on the new primary comes at most this long after the promotion.
RESUME_WITHIN = 15.0
JOB_TIMEOUT = 180.0


@dataclass
class Watch:
    """Samples the IN-PROGRESS runs per pipeline on the current primary while the workers run."""

    engine: FailoverEngine
    samples: int = 0
    failed_samples: int = 0
    doubled: list[tuple[Any, ...]] = field(default_factory=list)
    conn: Any = None

    def sample(self) -> None:
        try:
            if self.conn is None or self.conn.closed:
                self.conn = self.engine.admin()
            with self.conn.cursor() as cur:
                cur.execute(
                    "SELECT PIPELINE_ID, COUNT(*) FROM AUD_PIPELINES_RUN_LOG WHERE STATUS = 'IN-PROGRESS' "
                    "GROUP BY PIPELINE_ID HAVING COUNT(*) > 1"
                )
                found = cur.fetchall()
            self.samples += 1
            self.doubled.extend((time.time(), *row) for row in found)
        except psycopg2.Error:
            self.failed_samples += 1
            if self.conn is not None:
                self.conn.close()
            self.conn = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def journal(folder: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted(folder.glob("worker-*.jsonl")):
        events.extend(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line)
    return events


def acknowledged(folder: Path) -> int:
    return sum(1 for e in journal(folder) if e["kind"] == "ok")


def run_through(
    engine: FailoverEngine, pool: Pool, tmp_path: Path, operation: str, cut_first: bool = False
) -> tuple[Path, Watch, float]:
    """Start the workload, ``operation`` ("fail_over"/"switch_over") the pair midway, stop the workers after
    SECONDS_AFTER more seconds; returns the journal folder, the watch and the promotion's wall-clock time.

    ``cut_first``: before the failover, cut the standby off an asynchronous primary and let STEPS_BEFORE more
    steps be acknowledged that the standby never receives."""
    folder = tmp_path / "journals"
    folder.mkdir()
    stop = tmp_path / "stop"
    job = pool.send(workers.workload, engine.setup, range(WORKERS), pipelines=PIPELINES,
                    journal_dir=str(folder), stop_file=str(stop),
                    gate_wait=3.0 if cut_first else workers.GATE_WAIT)  # fmt: skip
    watch = Watch(engine)
    try:
        pump_until(
            job, watch, lambda: acknowledged(folder) >= STEPS_BEFORE, 60.0, "steps before the failover"
        )
        if cut_first:
            engine.pair.cut_replication()
            more = acknowledged(folder) + STEPS_BEFORE
            pump_until(job, watch, lambda: acknowledged(folder) >= more, 60.0, "steps the standby misses")
        getattr(engine.pair, operation)()
        engine.follow_primary()
        promoted = engine.pair.promoted_wall
        after = time.monotonic() + SECONDS_AFTER
        pump_until(
            job, watch, lambda: time.monotonic() > after, SECONDS_AFTER + 5, "work after the promotion"
        )
        stop.touch()
        pump_until(job, watch, lambda: job.finished, JOB_TIMEOUT, "workers finish their runs")
        job.wait(timeout=1.0)
    finally:
        stop.touch()
        watch.close()
    return folder, watch, promoted


def pump_until(job: Job, watch: Watch, done: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            job.pool.broken = True
            raise AssertionError(f"not within {timeout:g}s: {what}; reports: {job.messages}")
        if job.finished and not done():
            job.wait(timeout=1.0)  # raises with a worker's ERROR traceback
            raise AssertionError(f"the workers ended before {what}: {job.messages}")
        job.pump(0.05)
        watch.sample()


def judge(engine: FailoverEngine, folder: Path, watch: Watch, promoted: float) -> None:
    """Fail with every problem found, each named, and the summary."""
    problems, summary = examine(engine, folder, watch, promoted)
    assert not problems, "\n".join([f"{len(problems)} problem(s); summary {summary}", *problems[:60]])


def examine(
    engine: FailoverEngine, folder: Path, watch: Watch, promoted: float
) -> tuple[list[str], dict[str, Any]]:
    """Every problem of the issue's list, all at once, and a summary of the workload."""
    events = journal(folder)
    ok = [e for e in events if e["kind"] == "ok"]
    errors = [e for e in events if e["kind"] == "error"]
    problems: list[str] = [f"gave up: {e}" for e in events if e["kind"] == "gave_up"]

    runs = {r[0]: r for r in engine.rows(
        "SELECT r.RUN_KEY, r.PIPELINE_RUN_ID, r.STATUS, p.PIPELINE_CODE FROM AUD_PIPELINES_RUN_LOG r "
        "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID")}  # fmt: skip
    attempts = {r[0]: r for r in engine.rows(
        "SELECT a.ATTEMPT_ID, a.ATTEMPT_NUMBER, a.STATUS, a.TASK_RUN_ID, r.RUN_KEY, t.TASK_CODE "
        "FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "
        "JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = tr.PIPELINE_RUN_ID "
        "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID")}  # fmt: skip
    task_runs = {(r[0], r[1]): r for r in engine.rows(
        "SELECT r.RUN_KEY, t.TASK_CODE, tr.STATUS, tr.TASK_RUN_ID FROM AUD_TASK_RUN_LOG tr "
        "JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = tr.PIPELINE_RUN_ID "
        "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID")}  # fmt: skip

    # 1. Every acknowledged step is on the new primary.
    succeeded_try: dict[tuple[str, str], int] = {}
    for e in ok:
        step, key = e["step"], e.get("run_key")
        if step == "claim" and e["action"] != "BLOCKED":
            run = runs.get(key)
            if run is None or run[1] != e["pipeline_run_id"]:
                problems.append(f"lost claim: {e} (Engine: {run})")
        elif step == "start":
            attempt = attempts.get(e["attempt_id"])
            if attempt is None or attempt[1] != e["try_number"] or attempt[4] != key:
                problems.append(f"lost start: {e} (Engine: {attempt})")
        elif step == "end":
            attempt = attempts.get(e["attempt_id"])
            if attempt is None or attempt[2] != "SUCCESS":
                problems.append(f"lost end: {e} (Engine: {attempt})")
            succeeded_try[(key, e["task"])] = e["try_number"]
        elif step == "skipped":
            task_run = task_runs.get((key, e["task"]))
            if task_run is None or task_run[2] != "SKIPPED":
                problems.append(f"lost skip: {e} (Engine: {task_run})")
        elif step == "finish":
            run = runs.get(key)
            if run is None or run[2] != e["status"]:
                problems.append(f"lost finish: {e} (Engine: {run})")
            elif e["status"] != "SUCCESS":
                problems.append(f"run finished {e['status']}: {e}")

    # 2. Nothing doubled: one attempt per try, one SUCCESS attempt per task run (the try Airflow saw succeed),
    #    one consumption row per edge and downstream attempt, and per edge and consumed upstream run.
    per_try = Counter((a[3], a[1]) for a in attempts.values())
    problems += [f"doubled attempt: task run {k[0]} try {k[1]} x{n}" for k, n in per_try.items() if n > 1]
    successes: dict[tuple[str, str], list[int]] = defaultdict(list)
    for a in attempts.values():
        if a[2] == "SUCCESS":
            successes[(a[4], a[5])].append(a[1])
    for (key, task), tries in successes.items():
        seen = succeeded_try.get((key, task))
        if len(tries) > 1 or (seen is not None and tries != [seen]):
            problems.append(
                f"{key} {task}: SUCCESS attempts of tries {sorted(tries)}; Airflow saw try {seen} succeed"
            )
    for (key, task), seen in succeeded_try.items():
        if (key, task) not in successes:
            problems.append(f"{key} {task}: no SUCCESS attempt; Airflow saw try {seen} succeed")
    doubled_consumption = engine.rows(
        "SELECT TASK_DEPENDENCY_ID, CONSUMED_PIPELINE_RUN_ID, COUNT(*), MIN(PIPELINE_RUN_ID), MAX(PIPELINE_RUN_ID) "
        "FROM AUD_DEPENDENCY_CONSUMPTION GROUP BY TASK_DEPENDENCY_ID, CONSUMED_PIPELINE_RUN_ID HAVING COUNT(*) > 1"
    ) + engine.rows(
        "SELECT TASK_DEPENDENCY_ID, PIPELINE_RUN_ID, COUNT(*) FROM AUD_DEPENDENCY_CONSUMPTION "
        "GROUP BY TASK_DEPENDENCY_ID, PIPELINE_RUN_ID HAVING COUNT(*) > 1"
    )
    problems += [f"doubled consumption: {row}" for row in doubled_consumption]
    consumption = engine.rows("SELECT COUNT(*) FROM AUD_DEPENDENCY_CONSUMPTION")[0][0]

    # 3. Never two IN-PROGRESS runs of a pipeline (sampled while running), and none left once workers are done.
    problems += [f"two IN-PROGRESS runs sampled: {row}" for row in watch.doubled]
    left = [r for r in runs.values() if r[2] == "IN-PROGRESS"]
    problems += [f"run left IN-PROGRESS: {r}" for r in left]
    if watch.samples < 10:
        problems.append(f"only {watch.samples} samples of the IN-PROGRESS runs")

    # 4. Every error was a typed provider error that Airflow retries (no raw driver error).
    for e in errors:
        if not e["module"].startswith("airflow_provider_etl_craft") or e["retryable"] is not True:
            problems.append(
                f"untyped or not retryable: {e['step']} {e['module']}.{e['cls']} retryable={e['retryable']}: {e['line']}"
            )

    # 5. Writes resumed on the new primary within seconds of the promotion, from every worker.
    after = sorted(e["t"] for e in ok if e["t"] > promoted)
    if not after or after[0] - promoted > RESUME_WITHIN:
        problems.append(
            f"first acknowledged step {after[0] - promoted if after else None} s after the promotion"
        )
    workers_after = {e["worker"] for e in ok if e["t"] > promoted}
    if workers_after != set(range(WORKERS)):
        problems.append(f"only workers {sorted(workers_after)} acknowledged a step after the promotion")
    finished = [e for e in ok if e["step"] == "finish"]
    if not finished or not any(e["t"] > promoted for e in finished):
        problems.append("no run finished after the promotion")

    summary = {
        "acknowledged": len(ok),
        "runs_finished": len(finished),
        "errors": dict(Counter(f"{e['step']}:{e['cls']}:retryable={e['retryable']}" for e in errors)),
        "first_step_after_promotion_s": round(after[0] - promoted, 3) if after else None,
        "consumption_rows": consumption,
        "samples": watch.samples,
    }
    print(f"\nfailover summary: {summary}")
    return problems, summary


def test_a_crashed_primary_fails_over_and_every_acknowledged_step_survives(
    failover_engine: FailoverEngine, failover_pool: Pool, tmp_path: Path
) -> None:
    old = failover_engine.pair.primary
    folder, watch, promoted = run_through(failover_engine, failover_pool, tmp_path, "fail_over")
    assert failover_engine.pair.primary is not old and failover_engine.pair.down is old
    judge(failover_engine, folder, watch, promoted)


def test_a_switchover_hands_over_cleanly_and_the_old_primary_streams_again(
    failover_engine: FailoverEngine, failover_pool: Pool, tmp_path: Path
) -> None:
    pair = failover_engine.pair
    old = pair.primary
    folder, watch, promoted = run_through(failover_engine, failover_pool, tmp_path, "switch_over")
    assert pair.primary is not old and pair.standby is old and old.in_recovery()
    assert pair.sync_state() == "sync"  # the old primary is the new one's synchronous standby
    judge(failover_engine, folder, watch, promoted)


@pytest.mark.parametrize("failover_engine", ["multi-host"], indirect=True)  # one URL form is enough here
def test_the_tier_sees_what_an_asynchronous_standby_loses(
    failover_engine: FailoverEngine, failover_pool: Pool, tmp_path: Path
) -> None:
    """The tier's own check: with the standby cut off an asynchronous primary, steps the workers saw succeed
    are missing after the failover, and the judgement names them (what synchronous replication prevents)."""
    folder, watch, promoted = run_through(
        failover_engine, failover_pool, tmp_path, "fail_over", cut_first=True
    )
    problems, summary = examine(failover_engine, folder, watch, promoted)
    lost = [p for p in problems if p.startswith("lost ")]
    assert lost, f"nothing acknowledged was lost, yet the standby missed {STEPS_BEFORE} steps: {summary}"
