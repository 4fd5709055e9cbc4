"""Part 10: what OpenLineage adds to a recorded task — the same try with Airflow's listener on and off.

Run in the OpenLineage venv (``.venv-openlineage``, which ``make bench`` builds: the main venv has no
OpenLineage), as part 9 runs: each measured try is a fresh interpreter (``python -m bench.lineage_cost
--child``) running part 9's recorded one-task DAG with ``dag.test()``, on a SQLite Engine DB whose run this
parent claims before and finishes after. With the listener **on**, Airflow's OpenLineage integration writes
every event to a file transport (the START and COMPLETE events of the try carry the ``etl_craft_run`` facet,
checked); **off** is the same process with ``[openlineage] disabled``. Tries alternate on/off.

``listener_ms`` is what the task runner's listener calls take in the try (``on_task_instance_running`` before
``execute``, ``…_success`` after: the OpenLineage listener builds each event, our facets included, and sends it
from a process it forks and waits for). ``facets_ms`` is the provider's own share of those calls (its
``get_openlineage_facets_on_*``, timed in the listener's forks). ``outside_ms`` is the provider's lineage work
in the task process itself, outside the listener's calls: loading the facets module before the first fork and
reading the task's declared target with the attempt's end (both only with the listener on). A recorded try's
lineage cost is on minus off of ``listener_ms + outside_ms``.

The listener's own work (a fork per call, Airflow's event for the try, the transport) is paid by every task
with lineage on, recorded or not, so the same is measured for part 9's plain one-task DAG, in the same
interleaved rounds. What the provider adds per task, the target, is the recorded try's lineage cost minus the
plain try's.
The try as ``dag.test()`` runs it (``try_ms``) and the whole task process (``process_ms``, from Airflow's import
to ``dag.test()``'s end, with the integration's imports and the DAG run's own events, which a deployment's
scheduler sends) are shown beside them; they vary by far more than the listener costs.

``python -m bench.lineage_cost --workdir DIR --out result.json [--repeats N]``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.isolated import part_main, part_parser, run_child

ROOT = Path(__file__).resolve().parents[1]
#: What the provider's lineage may add per task (docs/benchmarks.md): a recorded try's lineage cost (on minus off,
#: medians) minus a plain try's.
LINEAGE_TARGET_MS = 50.0
#: The tries measured: part 9's DAGs, each with the listener off and on.
KINDS = ("plain", "recorded")
#: The venv ``make test-lineage`` / ``make bench`` build with the [openlineage] extra, relative to the repo root.
LINEAGE_PYTHON = ROOT / ".venv-openlineage" / "bin" / "python"
MODES = ("off", "on")
#: What each try reports (ms): the listener's calls, the task try, the task process.
KEYS = ("listener_ms", "facets_ms", "outside_ms", "try_ms", "process_ms")
#: Where the child's forks append how long each call of the provider's lineage methods took (ms, one a line).
FACETS_LOG = "ETL_CRAFT_BENCH_FACETS_LOG"


# --------------------------------------------------------------------------- the child: one task process


#: The listener calls of a task try (Airflow's task runner calls them around ``execute``).
TRY_HOOKS = frozenset(
    {
        "on_task_instance_running",
        "on_task_instance_success",
        "on_task_instance_failed",
        "on_task_instance_skipped",
    }
)


def child(dag_file: Path, logical_date: str) -> dict[str, Any]:
    """One try in this fresh interpreter: part 9's child, with ``dag.test()``'s task try and the task runner's
    listener calls timed (the calls through pluggy's hook-call monitoring of Airflow's listener manager)."""
    started = time.perf_counter()
    import airflow.sdk.definitions.dag as dag_module
    from airflow.sdk.listener import get_listener_manager

    from bench.task_cost import child as task_child

    calls: dict[str, float] = {}
    listener_ms: list[float] = []

    def before(hook_name: str, hook_impls: Any, kwargs: Any) -> None:
        if hook_name in TRY_HOOKS:
            calls[hook_name] = time.perf_counter()

    def after(outcome: Any, hook_name: str, hook_impls: Any, kwargs: Any) -> None:
        if hook_name in calls:
            listener_ms.append((time.perf_counter() - calls.pop(hook_name)) * 1000)

    get_listener_manager().pm.add_hookcall_monitoring(before, after)
    outside_ms: list[float] = []
    if dag_file.stem == "bench_cost_recorded":  # a plain try's process loads none of the provider
        _time_facets(Path(os.environ[FACETS_LOG]))
        outside_ms = _time_outside()
    run_task = dag_module._run_task
    tries: list[float] = []

    def timed_run_task(**kwargs: Any) -> Any:
        begun = time.perf_counter()
        try:
            return run_task(**kwargs)
        finally:
            tries.append((time.perf_counter() - begun) * 1000)

    dag_module._run_task = timed_run_task
    sample = task_child(dag_file, logical_date)
    if len(tries) != 1 or len(listener_ms) != 2:
        raise RuntimeError(f"expected one task try and two listener calls, timed {tries} and {listener_ms}")
    return {**sample, "listener_ms": sum(listener_ms), "outside_ms": sum(outside_ms), "try_ms": tries[0],
            "process_ms": (time.perf_counter() - started) * 1000}  # fmt: skip


def _time_facets(log_file: Path) -> None:
    """Time the provider's part of each listener call (its ``get_openlineage_facets_on_*``), which runs in the
    process the listener forks: each call appends its ms to ``log_file``."""
    from airflow_provider_etl_craft.operators import _lineage

    lineage = _lineage._lineage

    def timed(operator: Any, when: str, task_instance: Any) -> Any:
        begun = time.perf_counter()
        try:
            return lineage(operator, when, task_instance)
        finally:
            with log_file.open("a") as sink:
                sink.write(f"{(time.perf_counter() - begun) * 1000}\n")

    _lineage._lineage = timed


def _time_outside() -> list[float]:
    """Time the provider's lineage work in the task process, outside the listener's calls: the facets module's
    load before the first fork (``_lineage.warm``) and the declared target's read with the end
    (``task_run._declared_target``). Returns the list each call appends its ms to."""
    from airflow_provider_etl_craft.operators import _lineage, task_run

    spent: list[float] = []

    def timed(function: Any) -> Any:
        def call(*args: Any) -> Any:
            begun = time.perf_counter()
            try:
                return function(*args)
            finally:
                spent.append((time.perf_counter() - begun) * 1000)

        return call

    _lineage.warm = timed(_lineage.warm)
    task_run._declared_target = timed(task_run._declared_target)
    return spent


# --------------------------------------------------------------------------- the parent


def _mode_env(env: dict[str, str], mode: str, events: Path) -> dict[str, str]:
    out = {**env, "AIRFLOW__OPENLINEAGE__NAMESPACE": "etl-craft-bench"}
    if mode == "on":
        transport = {"type": "file", "log_file_path": str(events), "append": True}
        out["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps(transport)
        out["AIRFLOW__OPENLINEAGE__DISABLED"] = "False"
    else:
        out["AIRFLOW__OPENLINEAGE__DISABLED"] = "True"
    return out


def _facet_events(events: Path) -> int:
    """Events in the file transport's file that carry the ``etl_craft_run`` facet."""
    if not events.exists():
        return 0
    lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    return sum(1 for e in lines if "etl_craft_run" in e.get("run", {}).get("facets", {}))


def _try(hook: Any, env: dict[str, str], dag_file: Path, logical_date: datetime) -> dict[str, Any]:
    """One try of the plain DAG, or one claimed, tried and finished run of the recorded one."""
    if dag_file.stem != "bench_cost_recorded":
        return {**run_child("bench.lineage_cost", env, dag_file, logical_date), "facets_ms": 0.0}
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    from airflow_provider_etl_craft.runs.identity import RunIdentity
    from bench.task_cost import PIPELINE_CODE, TASK_CODE

    run_id = DagRun.generate_run_id(
        run_type=DagRunType.MANUAL, logical_date=logical_date, run_after=logical_date
    )
    identity = RunIdentity("bench_cost_recorded", run_id, logical_date)
    with hook.lifecycle() as lc:
        lc.claim(PIPELINE_CODE, identity)
    facets_log = Path(env[FACETS_LOG])
    facets_log.unlink(missing_ok=True)
    sample = run_child("bench.lineage_cost", env, dag_file, logical_date)
    lines = facets_log.read_text().split() if facets_log.exists() else []
    sample["facets_ms"] = sum(float(line) for line in lines)
    with hook.lifecycle() as lc:
        finished = lc.finish_run(PIPELINE_CODE, identity, {TASK_CODE: "success"})
    if finished.status != "SUCCESS":
        raise RuntimeError(f"run {identity.run_key} ended {finished.status}")
    return sample


def _summary(samples: list[dict[str, Any]]) -> dict[str, float]:
    return {key: statistics.median(s[key] for s in samples) for key in KEYS}


def measure(workdir: Path, repeats: int, log: Any = print) -> dict[str, Any]:
    """Everything part 10 reports (see the module docstring)."""
    from bench import task_cost
    from bench.engines import init_engine, seed_pipelines, sqlite_engine

    home = workdir / "airflow-home"
    (home / "dags").mkdir(parents=True, exist_ok=True)
    config = sqlite_engine(workdir / "sqlite")
    os.environ.update(task_cost._airflow_env(home, config))
    os.environ.pop("ETL_CRAFT_CONFIG", None)
    migrated = subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
                              capture_output=True, text=True, env=os.environ.copy())  # fmt: skip
    if migrated.returncode != 0:
        raise RuntimeError(f"`airflow db migrate` failed:\n{migrated.stderr[-3000:]}")
    dags = {kind: home / "dags" / f"bench_cost_{kind}.py" for kind in KINDS}
    dags["plain"].write_text(task_cost.PLAIN_DAG)
    dags["recorded"].write_text(task_cost.RECORDED_DAG.replace("__PIPELINE__", task_cost.PIPELINE_CODE))
    hook = init_engine(config)
    seed_pipelines(hook, [(task_cost.PIPELINE_CODE, (task_cost.TASK_CODE,))])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONPYCACHEPREFIX": str(workdir / "pycache")}  # fmt: skip
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    variants = [(kind, mode) for kind in KINDS for mode in MODES]
    samples: dict[str, list[dict[str, Any]]] = {f"{kind}/{mode}": [] for kind, mode in variants}
    events = workdir / "events.jsonl"
    env[FACETS_LOG] = str(workdir / "facets-ms.txt")
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for r in range(-1, repeats):  # r = -1: one warm-up of each (bytecode, the OS file cache), not counted
        for i, (kind, mode) in enumerate(variants if r % 2 == 0 else reversed(variants)):
            logical_date = base + timedelta(days=r + 1, hours=i)
            sample = _try(hook, _mode_env(env, mode, events), dags[kind], logical_date)
            if r >= 0:
                samples[f"{kind}/{mode}"].append(sample)
    facet_events = _facet_events(events)
    if facet_events < 2 * (repeats + 1):  # a START and a COMPLETE per recorded try with the listener on
        raise RuntimeError(f"the listener wrote {facet_events} events with our facet for {repeats + 1} tries")
    result: dict[str, Any] = {"repeats": repeats, "facet_events": facet_events, "samples": samples}
    for kind in KINDS:
        off, on = _summary(samples[f"{kind}/off"]), _summary(samples[f"{kind}/on"])
        result[kind] = {"off": off, "on": on, "extra_ms": {k: on[k] - off[k] for k in off}}
    log(f"  lineage cost per task: recorded {lineage_cost(result, 'recorded'):.1f} ms, plain "
        f"{lineage_cost(result, 'plain'):.1f} ms; the provider adds {provider_cost(result):.1f} ms")  # fmt: skip
    return result


def section(result: dict[str, Any] | None) -> str:
    """The printed part 10: per DAG, the listener's calls, ours, the try and the process, listener off and on."""
    title = "10. OpenLineage: a plain and a recorded task with Airflow's listener off and on (file transport)"
    if not result:
        return ""
    if "error" in result:
        return f"{title}: FAILED: {result['error']}"
    lines = [f"{title},\n   one cold try per task process, median of {result['repeats']} (ms); "
             f"{result['facet_events']} events carried the etl_craft_run facet",
             f"   {'':<19}{'listener calls':>16}{'ours in them':>14}{'ours outside':>14}{'task try':>10}"
             f"{'process':>10}"]  # fmt: skip
    for kind in KINDS:
        for key, label in (("off", "off"), ("on", "on"), ("extra_ms", "on - off")):
            row = result[kind][key]
            lines.append(
                f"   {kind + ' ' + label:<19}{row['listener_ms']:>16.1f}{row['facets_ms']:>14.1f}"
                f"{row['outside_ms']:>14.1f}{row['try_ms']:>10.1f}{row['process_ms']:>10.1f}"
            )
    lines.append(f"   the provider adds {provider_cost(result):.1f} ms per task (recorded lineage cost "
                 f"{lineage_cost(result, 'recorded'):.1f} - plain {lineage_cost(result, 'plain'):.1f})")  # fmt: skip
    return "\n".join(lines)


def lineage_cost(result: dict[str, Any], kind: str) -> float:
    """A try's lineage cost: on minus off of the listener's calls and of the provider's lineage work outside them."""
    extra = result[kind]["extra_ms"]
    return float(extra["listener_ms"] + extra["outside_ms"])


def provider_cost(result: dict[str, Any]) -> float:
    """The target's figure: what lineage costs a recorded try beyond what it costs a plain one."""
    return lineage_cost(result, "recorded") - lineage_cost(result, "plain")


def targets(result: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Part 10's target with what was measured (the format of ``bench.report.targets``)."""
    if not result:
        return []
    what = (f"OpenLineage: what the provider adds per task <= {LINEAGE_TARGET_MS:g} ms (a recorded try's lineage "
            "cost - a plain try's)")  # fmt: skip
    if "error" in result:
        return [{"target": what, "measured": f"FAILED: {result['error']}", "value": None, "met": False}]
    added = provider_cost(result)
    on = result["recorded"]["on"]
    measured = (f"{added:.1f} ms (recorded {lineage_cost(result, 'recorded'):.1f} ms: its listener calls "
                f"{on['listener_ms']:.1f} ms, the provider's facets {on['facets_ms']:.1f} ms of them, "
                f"{on['outside_ms']:.1f} ms outside them; plain {lineage_cost(result, 'plain'):.1f} ms)")  # fmt: skip
    return [{"target": what, "measured": measured, "value": added, "met": added <= LINEAGE_TARGET_MS}]


def main(argv: list[str] | None = None) -> int:
    parser = part_parser(__doc__, repeats=7)
    return part_main(argv, parser, child, lambda args, workdir: measure(workdir, args.repeats), section)


if __name__ == "__main__":
    sys.exit(main())
