"""Part 3: what recording costs at the Airflow level — ``dag.test()`` of a plain and a recorded DAG.

Both DAGs chain the same ``tasks`` (20) trivial functions. The plain one uses Airflow's ``@task``; the
recorded one uses ``@etl_craft_task`` inside ``etl_craft_pipeline(...)``, so it also has the group's
``claim`` and ``finish`` tasks (that is part of what recording costs) and writes every run to a SQLite
Engine DB. After one warm-up run of each, they run ``repeats`` times alternating (ABBA order, to cancel
drift); the figure is the ratio of the medians.

Runs in its own interpreter (``python -m bench.airflow_overhead --workdir … --out …``) because Airflow
must be configured through the environment before it is first imported: a throwaway ``AIRFLOW_HOME``
under the work directory, the DAGs folder there, no examples, a SQLite metadata DB, then
``airflow db migrate`` once. Writes its result as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from airflow_provider_etl_craft.testing import run_dag_test

PIPELINE_CODE = "BENCH_DAG"
PLAIN_DAG_ID = "bench_plain_chain"
RECORDED_DAG_ID = "bench_recorded_chain"

PLAIN_DAG = '''"""Benchmark: __N__ chained plain @task functions."""
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

RECORDED_DAG = '''"""Benchmark: the same __N__ chained functions, each recorded by the provider (claim → … → finish)."""
from datetime import datetime

from airflow.sdk import DAG, chain

from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.task_groups.pipeline import etl_craft_pipeline

with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 0}) as dag:
    with etl_craft_pipeline("__PIPELINE__"):
        steps = []
        for i in range(1, __N__ + 1):

            @etl_craft_task(task_id=f"t{i:02d}")
            def step() -> int:
                return 1

            steps.append(step())
        chain(*steps)
'''


def configure_airflow(workdir: Path, engine_config: Path) -> Path:
    """Point Airflow at a throwaway home under ``workdir`` (before it is imported); return the DAGs folder."""
    home = workdir / "airflow-home"
    dags = home / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
        AIRFLOW__LOGGING__LOGGING_LEVEL="WARNING",
        AIRFLOW_CONN_ETL_CRAFT_DEFAULT=json.dumps(
            {"conn_type": "etl_craft", "extra": {"config_path": str(engine_config)}}
        ),
    )
    os.environ.pop("ETL_CRAFT_CONFIG", None)
    os.environ.pop("ETL_CRAFT_MIGRATIONS_DIR", None)
    return dags


def migrate_airflow_db() -> float:
    """``airflow db migrate`` with the venv's console script; returns the seconds it took."""
    started = time.perf_counter()
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run(
        [str(airflow), "db", "migrate"], capture_output=True, text=True, env=os.environ.copy()
    )
    if done.returncode != 0:
        raise RuntimeError(f"`airflow db migrate` failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def write_and_load(dags: Path, template: str, dag_id: str, tasks: int) -> Any:
    """Write a DAG file into the DAGs folder and load its ``dag`` (dag.test() needs the file there)."""
    path = dags / f"{dag_id}.py"
    text = (
        template.replace("__DAG_ID__", dag_id)
        .replace("__N__", str(tasks))
        .replace("__PIPELINE__", PIPELINE_CODE)
    )
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"bench_dag_{dag_id}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def timed_test(dag: Any) -> float:
    """Seconds one ``dag.test()`` took; raises unless the DAG run succeeded."""
    started = time.perf_counter()
    run = run_dag_test(dag)
    elapsed = time.perf_counter() - started
    state = str(getattr(run, "state", run))
    if not state.endswith("success"):
        raise RuntimeError(f"DAG {dag.dag_id} ended {state}")
    return elapsed


def measure(workdir: Path, tasks: int, repeats: int) -> dict[str, Any]:
    """Everything part 3 reports (see the module docstring)."""
    dags = configure_airflow(workdir, workdir / "engine-project" / "craft-connector.yml")
    # Only now may anything import Airflow (bench.engines imports the provider's hook).
    from bench.engines import init_engine, seed_pipelines, sqlite_engine, task_codes

    engine_config = sqlite_engine(workdir / "engine-project")
    migrate_seconds = migrate_airflow_db()
    hook = init_engine(engine_config)
    seed_pipelines(hook, [(PIPELINE_CODE, task_codes(tasks))])

    plain = write_and_load(dags, PLAIN_DAG, PLAIN_DAG_ID, tasks)
    recorded = write_and_load(dags, RECORDED_DAG, RECORDED_DAG_ID, tasks)
    warmup = {"plain": timed_test(plain), "recorded": timed_test(recorded)}
    times: dict[str, list[float]] = {"plain": [], "recorded": []}
    for r in range(repeats):
        order = (("plain", plain), ("recorded", recorded))
        for name, dag in order if r % 2 == 0 else reversed(order):
            times[name].append(timed_test(dag))

    runs = hook.get_records("SELECT STATUS, COUNT(*) FROM AUD_PIPELINES_RUN_LOG GROUP BY STATUS")
    task_runs = hook.get_records("SELECT STATUS, COUNT(*) FROM AUD_TASK_RUN_LOG GROUP BY STATUS")
    expected_runs = repeats + 1
    if dict(runs) != {"SUCCESS": expected_runs} or dict(task_runs) != {"SUCCESS": expected_runs * tasks}:
        raise RuntimeError(f"the recorded DAG did not record what it ran: runs {runs}, task runs {task_runs}")

    plain_median, recorded_median = statistics.median(times["plain"]), statistics.median(times["recorded"])
    return {
        "tasks": tasks,
        "repeats": repeats,
        "airflow_db_migrate_s": round(migrate_seconds, 2),
        "warmup_s": {k: round(v, 3) for k, v in warmup.items()},
        "plain_s": [round(t, 3) for t in times["plain"]],
        "recorded_s": [round(t, 3) for t in times["recorded"]],
        "plain_median_s": round(plain_median, 3),
        "recorded_median_s": round(recorded_median, 3),
        "ratio": recorded_median / plain_median,
        "extra_ms_per_task": (recorded_median - plain_median) / tasks * 1000,
        "plain_ms_per_task": plain_median / tasks * 1000,
        "engine_rows": {"runs": dict(runs), "task_runs": dict(task_runs)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    result = measure(args.workdir.resolve(), args.tasks, args.repeats)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
