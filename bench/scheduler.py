"""Part 5: the provider under a real scheduler — one Airflow deployment, two measurements.

The deployment is the test suite's (``harness/deployment.py``): api-server, scheduler, dag-processor
and triggerer as processes, LocalExecutor, the metadata DB on a throwaway PostgreSQL cluster, a SQLite and
a PostgreSQL Engine DB. Its scheduler settings are the harness's, unchanged (recorded in the result).

* **Overhead**: a recorded chain (``etl_craft_pipeline`` with ``tasks`` ``@etl_craft_task`` functions, so
  claim + tasks + finish) against a plain chain of as many ``@task`` functions (``tasks`` + 2), so only the
  bookkeeping differs. Each DAG runs once to warm up, then ``repeats`` times in ABBA order; one run's time
  is its ``end_date - start_date`` in the metadata DB. Per Engine DB: the ratio of the medians.
* **Hand-off latency**: run A of a pipeline is claimed by this process through the lifecycle API under a run
  key that is not an Airflow one (so no waiting claim closes it as abandoned); then the DAG whose claim is
  run B is triggered, and once B's claim waits (``up_for_reschedule`` or ``deferred`` in the metadata DB),
  A is finished. Latency = START_DATE of B's Engine run - END_DATE of A's (both written by the Engine
  lifecycle, on this machine's clock); the claim task's ``end_date`` is the cross-check. ``reschedule``
  mode (the default, with the real default poke interval) runs its hand-offs on distinct pipelines at once
  and finishes the A runs spread evenly over one poke interval, so every phase of the poke cycle is
  sampled; ``deferrable`` mode finishes them one at a time, each after the previous B has claimed.

Runs in its own interpreter (``python -m bench.scheduler --workdir … --out …``): Airflow and the deployment
are configured through the environment. Writes its result as JSON to ``--out``; the deployment and its
cluster are stopped on every exit.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MODES = ("reschedule", "deferrable")
ENGINES = ("sqlite", "pg")
ENGINE_NAMES = {"sqlite": "SQLite", "pg": "PostgreSQL"}
#: Scheduler-side settings recorded with the result (the harness's; none changed here).
SETTING_PREFIXES = ("AIRFLOW__SCHEDULER__", "AIRFLOW__CORE__EXECUTOR", "AIRFLOW__CORE__PARALLELISM",
                    "AIRFLOW__WORKERS__", "AIRFLOW__TRIGGERER__", "AIRFLOW__DAG_PROCESSOR__")  # fmt: skip
#: Targets: recorded ÷ plain; hand-off seconds (median, max; None: no target) per "engine/mode".
OVERHEAD_TARGET = 1.05
#: A recorded task's process may take this much longer than a plain one's (ms, medians from the task logs).
TASK_PROCESS_TARGET_MS = 30.0
HANDOFF_TARGETS: dict[str, tuple[float, float | None]] = {
    "pg/deferrable": (1.0, 2.0),
    "sqlite/deferrable": (2.0, None),
}
_RUN_TIMEOUT = 900.0
_WAIT_TIMEOUT = 300.0

PLAIN_DAG = '''"""Benchmark: __N__ chained plain @task functions (as many Airflow tasks as the recorded chain)."""
from datetime import datetime

from airflow.sdk import DAG, chain, task

with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 0}) as dag:
    steps = []
    for i in range(1, __N__ + 1):

        @task(task_id=f"t{i:02d}")
        def step() -> int:
            return 1

        steps.append(step())
    chain(*steps)
'''

RECORDED_DAG = '''"""Benchmark: __N__ chained recorded functions, claim -> ... -> finish."""
from datetime import datetime

from airflow.sdk import DAG, chain

from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.task_groups.pipeline import etl_craft_pipeline

with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 0}) as dag:
    with etl_craft_pipeline("__PIPELINE__", etl_craft_conn_id="__CONN_ID__"):
        steps = []
        for i in range(1, __N__ + 1):

            @etl_craft_task(task_id=f"t{i:02d}")
            def step() -> int:
                return 1

            steps.append(step())
        chain(*steps)
'''

# One file, one DAG per pipeline: claim (waiting as CLAIM says) -> WORK -> finish.
HANDOFF_DAGS = '''"""Benchmark: hand-off DAGs, one per pipeline; the claim waits while another run is IN-PROGRESS."""
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.task_groups.pipeline import etl_craft_pipeline

CLAIM = __CLAIM__

for code, dag_id in __PAIRS__:
    with DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
             default_args={"retries": 0}) as dag:
        with etl_craft_pipeline(code, etl_craft_conn_id="__CONN_ID__", claim_kwargs=CLAIM):

            @etl_craft_task(task_code="WORK")
            def work() -> int:
                return 1

            work()
    globals()[dag_id] = dag
'''


def render(template: str, **values: Any) -> str:
    text = template
    for key, value in values.items():
        text = text.replace(f"__{key.upper()}__", str(value))
    return text


def deferrable_supported() -> bool:
    """Whether ``ClaimPipelineRunOperator`` takes ``deferrable=`` (named in its own ``__init__``)."""
    from airflow_provider_etl_craft.operators.pipeline_run import ClaimPipelineRunOperator

    return "deferrable" in inspect.signature(ClaimPipelineRunOperator.__init__).parameters


def _seconds(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "max": None, "min": None}
    return {"median": round(statistics.median(values), 3), "max": round(max(values), 3),
            "min": round(min(values), 3)}  # fmt: skip


#: The task log lines that bound the phases of a task process (Airflow's own, in every try's log).
_PARSED = "Worker startup parse complete"  # carries dag_file_parse_ms
_PHASE_MARKS = ("::endgroup::", "::group::Post Execute")  # pre-execute ends / the operator has returned


def task_process_ms(log_file: Path) -> dict[str, float] | None:
    """One try's task process, from its task log (JSON lines, each with a timestamp): ``parse`` = the DAG
    file's parse as Airflow times it (``dag_file_parse_ms``); ``execute`` = from the end of pre-execute to the
    start of post-execute (the operator's ``execute``: for a recorded task, its bookkeeping around the
    callable); ``process`` = the first log line to the last. None when the log lacks a mark (another line).
    """
    try:
        events = [
            json.loads(line)
            for line in log_file.read_text(encoding="utf-8").splitlines()
            if line.startswith("{")
        ]
    except (OSError, ValueError):
        return None
    stamps = [datetime.fromisoformat(str(e.get("timestamp", "")).replace("Z", "+00:00")) for e in events]
    names = [str(e.get("event", "")) for e in events]
    parse = next(
        (e["dag_file_parse_ms"] for e in events if e.get("event") == _PARSED and "dag_file_parse_ms" in e),
        None,
    )
    if parse is None or not all(mark in names for mark in _PHASE_MARKS):
        return None
    ended, post = names.index(_PHASE_MARKS[0]), names.index(_PHASE_MARKS[1])
    return {"parse": float(parse), "execute": (stamps[post] - stamps[ended]).total_seconds() * 1000,
            "process": (stamps[-1] - stamps[0]).total_seconds() * 1000}  # fmt: skip


class Bench:
    """The running deployment and what the two measurements need of it."""

    def __init__(self, deployment: Any, log: Callable[[str], None]) -> None:
        self.d = deployment
        self.log = log
        self.last_task_s = 0.0
        #: The last DAG run's task processes by task_id (:func:`task_process_ms`).
        self.last_processes: dict[str, dict[str, float]] = {}

    # -- DAG files ---------------------------------------------------------------------------------------

    def write(self, name: str, source: str, dag_ids: list[str]) -> Path:
        """Write one DAG file (atomically) and wait until each of its DAGs is parsed, active and unpaused."""
        path = self.d.dags / f"{name}.py"
        tmp = self.d.root / f".{name}.py.tmp"
        tmp.write_text(source, encoding="utf-8")
        os.replace(tmp, path)

        def parsed() -> bool:
            errors = self.d.meta("SELECT stacktrace FROM import_error WHERE filename IN (%s, %s)", str(path),
                                 path.name)  # fmt: skip
            if errors:
                raise RuntimeError(f"DAG file {path.name} failed to import:\n{errors[0][0]}")
            rows = self.d.meta(
                "SELECT d.dag_id FROM dag d JOIN serialized_dag s ON s.dag_id = d.dag_id "
                "WHERE d.dag_id = ANY(%s) AND NOT d.is_paused AND NOT d.is_stale",
                dag_ids,
            )
            return len({r[0] for r in rows}) == len(dag_ids)

        self.d.wait_until(parsed, 180, f"the DAGs of {path.name} to be parsed")
        return path

    def run_dag(self, dag_id: str) -> float:
        """Trigger one DAG run, wait for it; its end_date - start_date (seconds) from the metadata DB."""
        run_id = self.d.trigger(dag_id)
        state = self.d.wait_run(dag_id, run_id, timeout=_RUN_TIMEOUT)
        run = self.d.dag_run(dag_id, run_id)
        if state != "success":
            raise RuntimeError(f"DAG run {run_id} of {dag_id} ended {state}:\n{self.d.report([dag_id])}")
        ((busy,),) = self.d.meta("SELECT COALESCE(SUM(EXTRACT(EPOCH FROM end_date - start_date)), 0) FROM task_instance "
                                 "WHERE dag_id = %s AND run_id = %s", dag_id, run_id)  # fmt: skip
        self.last_task_s = float(busy)  # the time inside its task instances (the rest is scheduling)
        logs = self.d.logs / f"dag_id={dag_id}" / f"run_id={run_id}"
        self.last_processes = {
            path.parent.name.removeprefix("task_id="): times
            for path in sorted(logs.glob("task_id=*/attempt=1.log"))
            if (times := task_process_ms(path)) is not None
        }
        return float((run["end_date"] - run["start_date"]).total_seconds())

    # -- (d) overhead ------------------------------------------------------------------------------------

    def overhead(self, tasks: int, repeats: int) -> dict[str, Any]:
        from bench.engines import task_codes

        plain_id = "bench_sched_plain"
        files = [self.write(plain_id, render(PLAIN_DAG, dag_id=plain_id, n=tasks + 2), [plain_id])]
        self.log(f"  warm-up: {plain_id}")
        warmup = {"plain": round(self.run_dag(plain_id), 3)}
        out: dict[str, Any] = {"tasks": tasks, "airflow_tasks": tasks + 2, "repeats": repeats,
                               "warmup_s": warmup, "engines": {}}  # fmt: skip
        for key in ENGINES:
            engine = self.d.engines[key]
            code, dag_id = f"BENCH_SCHED_CHAIN_{key.upper()}", f"bench_sched_recorded_{key}"
            engine.add_pipeline(code, list(task_codes(tasks)))
            source = render(RECORDED_DAG, dag_id=dag_id, n=tasks, pipeline=code, conn_id=engine.conn_id)
            files.append(self.write(dag_id, source, [dag_id]))
            self.log(f"  warm-up: {dag_id}")
            warmup[key] = round(self.run_dag(dag_id), 3)
            times: dict[str, list[float]] = {"plain": [], "recorded": []}
            busy: dict[str, list[float]] = {"plain": [], "recorded": []}
            # Per task process (a recorded chain's claim and finish apart): name -> phase -> one value per try.
            processes: dict[str, dict[str, list[float]]] = {}
            for r in range(repeats):
                order = [("plain", plain_id), ("recorded", dag_id)]
                for name, dag in order if r % 2 == 0 else order[::-1]:
                    times[name].append(self.run_dag(dag))
                    busy[name].append(self.last_task_s)
                    for task_id, phases in self.last_processes.items():
                        role = task_id.rsplit(".", 1)[-1] if task_id.endswith((".claim", ".finish")) else name
                        for phase, value in phases.items():
                            processes.setdefault(role, {}).setdefault(phase, []).append(value)
                    self.log(f"  {ENGINE_NAMES[key]} round {r + 1}: {name} {times[name][-1]:.2f} s")
            runs = engine.runs(code)
            statuses = sorted({str(run["STATUS"]) for run in runs})
            if len(runs) != repeats + 1 or statuses != ["SUCCESS"]:
                raise RuntimeError(f"the recorded DAG on {key} left runs {statuses} x {len(runs)}")
            plain_m, recorded_m = statistics.median(times["plain"]), statistics.median(times["recorded"])
            out["engines"][key] = {
                "plain_s": [round(t, 3) for t in times["plain"]],
                "recorded_s": [round(t, 3) for t in times["recorded"]],
                "in_tasks_median_s": {k: round(statistics.median(v), 3) for k, v in busy.items()},
                "plain_median_s": round(plain_m, 3),
                "recorded_median_s": round(recorded_m, 3),
                "ratio": recorded_m / plain_m,
                "extra_ms_per_task": (recorded_m - plain_m) / tasks * 1000,
                "task_process_ms": {
                    role: {
                        "n": len(phases["parse"]),
                        **{p: round(statistics.median(v), 1) for p, v in phases.items()},
                    }
                    for role, phases in sorted(processes.items())
                },
            }
        for path in files:  # less for the dag-processor to re-parse during the hand-offs
            path.unlink()
        return out

    # -- (a) hand-off latency ------------------------------------------------------------------------------

    def handoffs(self, key: str, mode: str, n: int, poke_interval: float) -> dict[str, Any]:
        """``n`` hand-offs on ``n`` pipelines of Engine DB ``key``, the claims waiting in ``mode``."""
        from airflow_provider_etl_craft.runs.counts import TaskCounts

        engine = self.d.engines[key]
        hook = engine.setup.hook()
        tag = f"{key}_{mode}"
        pairs = [(f"BENCH_HANDOFF_{tag.upper()}_{i:02d}", f"bench_handoff_{tag}_{i:02d}") for i in range(n)]
        for code, _ in pairs:
            engine.add_pipeline(code, ["WORK"])
        claim = ({"mode": "reschedule", "poke_interval": poke_interval} if mode == "reschedule"
                 else {"deferrable": True})  # fmt: skip
        path = self.write(f"bench_handoff_{tag}", render(HANDOFF_DAGS, claim=repr(claim), pairs=repr(pairs),
                                                         conn_id=engine.conn_id), [d for _, d in pairs])  # fmt: skip
        waiting_state = "up_for_reschedule" if mode == "reschedule" else "deferred"
        items: list[Handoff] = []
        for code, dag_id in pairs:
            a = OutsideRun(
                dag_id="bench", run_id=f"{dag_id}__A__{time.time_ns()}", run_date=datetime.now(UTC)
            )
            with hook.lifecycle(60) as lc:
                outcome = lc.claim(code, a, task_codes=["WORK"], where="bench")
                if outcome.action != "CREATED":
                    raise RuntimeError(f"run A of {code}: claim returned {outcome.action}")
                handle = lc.start_task(code, "WORK", a, 1)
                lc.finish_task(handle, "SUCCESS", TaskCounts(rows_written=1))
            items.append(Handoff(code, dag_id, f"{code.lower()}.claim", a))
        for item in items:
            item.run_id = self.d.trigger(item.dag_id)

        def all_waiting() -> bool:
            return all(self.claim_ti(item)[0] == waiting_state for item in items)

        self.d.wait_until(all_waiting, _WAIT_TIMEOUT, f"every B claim to be {waiting_state}")
        self.log(f"  {ENGINE_NAMES[key]} {mode}: {n} B claims are {waiting_state}; finishing the A runs")
        gap = poke_interval / n if mode == "reschedule" else None
        started = time.monotonic()
        for i, item in enumerate(items):
            if gap is not None:
                time.sleep(max(0.0, started + i * gap - time.monotonic()))
            with hook.lifecycle(60) as lc:
                done = lc.finish_run(item.code, item.a, {"WORK": "success"})
            if done.status != "SUCCESS":
                raise RuntimeError(f"run A of {item.code} ended {done.status}")
            if gap is None:  # one at a time: the next A only after this B has claimed
                self.d.wait_until(lambda item=item: self.b_start(engine, item), _WAIT_TIMEOUT,
                                  f"run B of {item.code} to claim")  # fmt: skip
        self.d.wait_until(lambda: all(self.b_start(engine, item) for item in items), _WAIT_TIMEOUT,
                          "every B run to claim")  # fmt: skip
        for item in items:
            state = self.d.wait_run(item.dag_id, item.run_id, timeout=_WAIT_TIMEOUT)
            if state != "success":
                raise RuntimeError(
                    f"DAG run B of {item.dag_id} ended {state}:\n{self.d.report([item.dag_id])}"
                )
        latencies, ti_latencies, queued, tries, rows = [], [], [], [], []
        for item in items:
            ((a_end,),) = engine.rows(
                "SELECT END_DATE FROM AUD_PIPELINES_RUN_LOG WHERE RUN_KEY = ?", item.a.run_key
            )
            a_end_at = hook.engine.from_db_time(a_end)
            b_start_at = hook.engine.from_db_time(self.b_start(engine, item))
            _, ti_end, try_number, queued_at = self.claim_ti(item)
            latency = (b_start_at - a_end_at).total_seconds()
            ti_latency = (ti_end - a_end_at).total_seconds()
            # When the scheduler queued the claim's last look: A end -> queued is the wake-up (reschedule date
            # or trigger) plus the scheduler; queued -> B start is the executor, the task's start and the claim.
            queued_after = (queued_at - a_end_at).total_seconds() if queued_at else None
            latencies.append(latency)
            ti_latencies.append(ti_latency)
            if queued_after is not None:
                queued.append(queued_after)
            tries.append(int(try_number))
            rows.append({"pipeline": item.code, "latency_s": round(latency, 3),
                         "claim_ti_end_latency_s": round(ti_latency, 3), "claim_tries": int(try_number),
                         "queued_after_a_end_s": None if queued_after is None else round(queued_after, 3),
                         "reschedules": self.d.reschedules(item.dag_id, item.run_id, item.claim_task)})  # fmt: skip
        path.unlink()
        return {
            "n": n,
            "latency_s": _seconds(latencies),
            "claim_ti_end_latency_s": _seconds(ti_latencies),
            "queued_after_a_end_s": _seconds(queued),
            "claims_retried": sum(1 for t in tries if t > 1),
            "release": "spread evenly over one poke interval" if gap is not None else "one at a time",
            "claim_kwargs": claim,
            "handoffs": rows,
        }

    def claim_ti(self, item: Handoff) -> tuple[Any, Any, Any, Any]:
        """``(state, end_date, try_number, queued_dttm)`` of run B's claim task instance."""
        rows = self.d.meta("SELECT state, end_date, try_number, queued_dttm FROM task_instance WHERE dag_id = %s AND run_id = %s "
                           "AND task_id = %s", item.dag_id, item.run_id, item.claim_task)  # fmt: skip
        return tuple(rows[0]) if rows else (None, None, None, None)

    @staticmethod
    def b_start(engine: Any, item: Handoff) -> Any:
        """START_DATE of run B's Engine run (None until its claim has succeeded)."""
        rows = engine.rows("SELECT START_DATE FROM AUD_PIPELINES_RUN_LOG WHERE RUN_KEY = ?",
                           f"airflow:{item.dag_id}:{item.run_id}")  # fmt: skip
        return rows[0][0] if rows else None


def _outside_identity() -> type:
    from airflow_provider_etl_craft.runs.identity import RunIdentity

    class _OutsideRun(RunIdentity, frozen=True):
        """A run started outside Airflow: its key is not ``airflow:…``, so no claim closes it as abandoned."""

        @property
        def run_key(self) -> str:
            return f"bench:{self.dag_id}:{self.run_id}"

        @property
        def actor(self) -> str:
            return self.run_key

    return _OutsideRun


OutsideRun: Any = None  # set by measure() once Airflow may be imported


@dataclass
class Handoff:
    code: str
    dag_id: str
    claim_task: str
    a: Any
    run_id: str = ""


def measure(
    workdir: Path, tasks: int, repeats: int, handoffs: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """Start the deployment, run both measurements, stop it (on every exit)."""
    global OutsideRun
    from airflow_provider_etl_craft.settings import OPTIONS
    from harness.airflow_home import make_throwaway_home
    from harness.deployment import AirflowDeployment
    from harness.postgres import PgCluster, _server_os_user, find_bindir

    airflow_home = make_throwaway_home()  # this process's own Airflow home, as the test session has one
    OutsideRun = _outside_identity()
    poke_interval = float(OPTIONS["claim_poke_interval"].default)
    deferrable = deferrable_supported()
    result: dict[str, Any] = {"poke_interval_s": poke_interval, "deferrable_available": deferrable,
                              "load_average": {"at_start": os.getloadavg()}}  # fmt: skip
    cluster = PgCluster.create(find_bindir(), _server_os_user())
    deployment = None
    try:
        log(
            f"  PostgreSQL {cluster.version} on {cluster.host}:{cluster.port}; starting the Airflow deployment"
        )
        started = time.perf_counter()
        deployment = AirflowDeployment.start(cluster, workdir / "deployment")
        result["deployment_start_s"] = round(time.perf_counter() - started, 1)
        result["settings"] = {k: v for k, v in sorted(deployment.env.items()) if k.startswith(SETTING_PREFIXES)
                              and not k.endswith(("_PATH", "_FOLDER"))}  # fmt: skip
        for name in ("claim_poke_interval", "wait_poll_interval", "wait_listen"):  # the provider's defaults
            if name in OPTIONS:
                result["settings"][f"[etl_craft] {name}"] = OPTIONS[name].default
        bench = Bench(deployment, log)
        log(
            f"  overhead: {tasks}-task recorded chain vs {tasks + 2}-task plain chain, warm-up + {repeats} ABBA"
        )
        result["overhead"] = bench.overhead(tasks, repeats)
        result["handoff"] = {}
        for key in ENGINES:
            for mode in MODES:
                if mode == "deferrable" and not deferrable:
                    result["handoff"][f"{key}/{mode}"] = {
                        "not_available": "ClaimPipelineRunOperator takes no deferrable= argument"
                    }
                    continue
                if handoffs <= 0:
                    result["handoff"][f"{key}/{mode}"] = {"not_available": "not measured (--handoffs 0)"}
                    continue
                log(f"  hand-off, {ENGINE_NAMES[key]}, {mode}: {handoffs} pipelines")
                result["handoff"][f"{key}/{mode}"] = bench.handoffs(key, mode, handoffs, poke_interval)
        result["scheduler_log_races"] = sum(
            "finished with state success, but the task instance's state attribute is" in line
            for line in deployment.component_log("scheduler").read_text(errors="replace").splitlines()
        )
    except Exception:
        if deployment is not None:
            log(deployment.report([]))
        raise
    finally:
        result["load_average"]["at_end"] = os.getloadavg()
        if deployment is not None:
            deployment.stop()
        cluster.destroy()
        shutil.rmtree(airflow_home, ignore_errors=True)
    return result


# --------------------------------------------------------------------------- the report (bench.report calls these)


def section(result: dict[str, Any] | None, table: Callable[..., str]) -> str:
    """The printed part 5: recorded vs plain DAG runs, then hand-off latency per Engine DB and wait mode."""
    title = "5. Under a real scheduler (LocalExecutor deployment)"
    if not result:
        return f"{title}: not measured"
    if "error" in result:
        return f"{title}: FAILED: {result['error']}"
    over = result["overhead"]
    lines = [f"{title}: DAG run end_date - start_date of a {over['tasks']}-task recorded chain (claim + tasks + "
             f"finish) vs {over['airflow_tasks']} chained plain @task,\n   1 warm-up + {over['repeats']} "
             "alternating (ABBA) runs each"]  # fmt: skip
    rows = []
    for key, part in over["engines"].items():
        rows.append([f"{ENGINE_NAMES[key]} Engine DB", f"{part['plain_median_s']:.2f}",
                     f"{part['recorded_median_s']:.2f}", f"{part['ratio']:.2f}x",
                     f"{part['extra_ms_per_task']:+.0f}", f"<= {OVERHEAD_TARGET:.2f}x",
                     " ".join(f"{t:.1f}" for t in part["plain_s"]) + " / "
                     + " ".join(f"{t:.1f}" for t in part["recorded_s"])])  # fmt: skip
    lines.append(table(["", "plain s", "recorded s", "ratio", "ms/task", "target", "runs s (plain / recorded)"],
                       rows, "lrrrrll"))  # fmt: skip
    for key, part in over["engines"].items():
        if "in_tasks_median_s" in part:
            busy = part["in_tasks_median_s"]
            lines.append(f"   {ENGINE_NAMES[key]}: inside task instances (sum of end - start, median) plain "
                         f"{busy['plain']:.2f} s, recorded {busy['recorded']:.2f} s; the rest is scheduling")  # fmt: skip
    rows = []
    for key, part in over["engines"].items():
        procs = part.get("task_process_ms") or {}
        plain = procs.get("plain")
        for role in ("plain", "recorded", "claim", "finish"):
            if role not in procs:
                continue
            p = procs[role]
            extra = "" if plain is None or role == "plain" else f"{p['process'] - plain['process']:+.1f}"
            rows.append([f"{ENGINE_NAMES[key]}, {role}", p["n"], f"{p['parse']:.1f}", f"{p['execute']:.1f}",
                         f"{p['process']:.1f}", extra])  # fmt: skip
    if rows:
        lines.append("   One task process (median ms, from each try's task log): the DAG file's parse as Airflow times "
                     "it, the operator's execute,\n   the process from its first log line to its last, and that "
                     "minus a plain task's (target for a recorded task: <= +30)")  # fmt: skip
        lines.append(table(["Engine DB, task", "n", "parse", "execute", "process", "extra"], rows, "lrrrrr"))
    lines.append(f"   Claim hand-off: run A (claimed outside Airflow) ends -> run B's waiting claim succeeds; B start - "
                 f"A end in the Engine DB (claim_poke_interval {result['poke_interval_s']:g} s);\n   also seconds after A's "
                 "end: the claim task instance's end_date, and when the scheduler queued its successful look")  # fmt: skip
    rows = []
    for name, part in result["handoff"].items():
        key, mode = name.split("/")
        label = f"{ENGINE_NAMES[key]}, {mode}"
        if "not_available" in part:
            rows.append([label, "-", "not available", "", "", "", "", part["not_available"]])
            continue
        lat, ti, q = part["latency_s"], part["claim_ti_end_latency_s"], part.get("queued_after_a_end_s") or {}
        median_t, max_t = HANDOFF_TARGETS.get(name, (None, None))
        target = " ".join(t for t in (f"median <= {median_t:g}" if median_t else "",
                                      f"max <= {max_t:g}" if max_t else "") if t)  # fmt: skip
        rows.append([label, part["n"], f"{lat['median']:.2f}", f"{lat['max']:.2f}",
                     f"{ti['median']:.2f} / {ti['max']:.2f}",
                     "n/a" if q.get("median") is None else f"{q['median']:.2f} / {q['max']:.2f}", target,
                     f"{part['release']}; {part['claims_retried']} claim(s) retried"])  # fmt: skip
    lines.append(table(["Engine DB, wait mode", "n", "median s", "max s", "claim TI end (median / max)",
                        "claim queued (median / max)", "target", "how"], rows, "lrrrrrll"))  # fmt: skip
    settings = ", ".join(f"{k.replace('AIRFLOW__', '').lower()}={v}" for k, v in result["settings"].items())
    lines.append(textwrap.fill(f"settings (the test harness's, unchanged): {settings}", 110,
                               initial_indent="   ", subsequent_indent="     "))  # fmt: skip
    load = result.get("load_average", {})
    if "at_end" in load:
        lines.append(f"   load average (1/5/15 min) around part 5: {' '.join(f'{x:.2f}' for x in load['at_start'])} at "
                     f"start, {' '.join(f'{x:.2f}' for x in load['at_end'])} at end")  # fmt: skip
    return "\n".join(lines)


def targets(result: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Part 5's targets with what was measured (the format of ``bench.report.targets``)."""
    if not result or "error" in result:
        return []
    out: list[dict[str, Any]] = []
    for key, part in result["overhead"]["engines"].items():
        out.append({"target": f"real scheduler: recorded DAG run <= {OVERHEAD_TARGET:.2f}x the plain one "
                              f"({ENGINE_NAMES[key]})",
                    "measured": f"{part['ratio']:.3f}x", "value": part["ratio"],
                    "met": part["ratio"] <= OVERHEAD_TARGET})  # fmt: skip
        procs = part.get("task_process_ms") or {}
        if "plain" in procs and "recorded" in procs:
            plain, recorded = procs["plain"], procs["recorded"]
            extra = recorded["process"] - plain["process"]
            out.append({"target": f"real scheduler: a recorded task process <= {TASK_PROCESS_TARGET_MS:g} ms more than "
                                  f"a plain one ({ENGINE_NAMES[key]})",
                        "measured": f"{extra:+.1f} ms (parse {recorded['parse'] - plain['parse']:+.1f}, execute "
                                    f"{recorded['execute'] - plain['execute']:+.1f}; medians of {recorded['n']} / "
                                    f"{plain['n']} tries)",
                        "value": extra, "met": extra <= TASK_PROCESS_TARGET_MS})  # fmt: skip
    for name, (median_t, max_t) in HANDOFF_TARGETS.items():
        key, mode = name.split("/")
        part = result["handoff"].get(name, {})
        what = f"hand-off {mode} {ENGINE_NAMES[key]}: median <= {median_t:g} s" + (
            f", max <= {max_t:g} s" if max_t else ""
        )
        if "latency_s" not in part:
            out.append({"target": what, "measured": "not available", "value": None, "met": None})
            continue
        lat = part["latency_s"]
        met = lat["median"] <= median_t and (max_t is None or lat["max"] <= max_t)
        out.append({"target": what, "measured": f"median {lat['median']:.2f} s, max {lat['max']:.2f} s (n={part['n']})",
                    "value": lat["median"], "met": met})  # fmt: skip
    return out


def run_part(workdir: Path, tasks: int, repeats: int, handoffs: int) -> dict[str, Any]:
    """Part 5 in a fresh interpreter; its log goes to ``workdir/scheduler/scheduler.log``."""
    from bench.isolated import run_isolated

    return run_isolated("bench.scheduler", workdir / "scheduler", "scheduler.log", 5,
                        "--tasks", str(tasks), "--repeats", str(repeats), "--handoffs", str(handoffs))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--handoffs", type=int, default=10, help="per Engine DB and wait mode; 0: overhead only"
    )
    args = parser.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)

    def log(message: str) -> None:
        print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", flush=True)

    result = measure(args.workdir.resolve(), args.tasks, args.repeats, args.handoffs, log)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
