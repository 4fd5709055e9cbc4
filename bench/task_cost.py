"""Part 9: what recording costs inside one task process — a recorded vs a plain task, each in a fresh interpreter.

Airflow runs every try in a process of its own, so what counts is one cold try: the DAG file's imports,
then the work around the callable. Each measured try runs in a new interpreter (``python -m
bench.task_cost --child``) that

1. imports Airflow's Task SDK, then the DAG file, and times the DAG file alone (``import_ms``: what the
   provider adds to a parse; the plain file imports nothing beyond Airflow);
2. runs the DAG with ``dag.test()`` (the task in this same process) with the operator timed around the
   callable: ``before_ms`` from the task runner's ``prepare_for_execution`` call (where a try begins its Engine
   DB, ahead of ``execute``: docs/performance.md) to the callable's start, so Airflow's own work between the
   two (rendering the templates, storing them) is in both kinds of try; ``after_ms`` from the callable's end
   to ``execute``'s return.

The plain DAG is one Airflow ``@task``; the recorded one is the same function as ``@etl_craft_task`` with
``pipeline_code`` given (no claim or finish task in the DAG, so nothing warms the process before it): this
parent process claims the Engine run before the child starts and finishes it afterwards. Both on a SQLite
and a PostgreSQL Engine DB; ``repeats`` tries each, alternating; medians, and recorded minus plain.

In a recorded try the child also times the provider's phases (:data:`PHASES`: the profile, the login, the
start and end statements…), by wrapping the functions that do them, so the table says where the extra goes. On
PostgreSQL the parent also logs in bare, with the driver alone and the Engine profile's connection settings, from
fresh interpreters (:func:`bare_login`): what a login and a first statement cost any client of that server.

On PostgreSQL it runs twice: in a cold interpreter, and with the driver (``psycopg2``) imported before the
DAG file, as in a task process under a real scheduler whose metadata database is PostgreSQL: the executor
forks it with the driver loaded (docs/benchmarks.md), so the import is not the provider's to pay there. Both
are reported; the target (a recorded try costs <= 30 ms more than a plain one) is judged on each.

``python -m bench.task_cost --workdir DIR --out result.json [--repeats N] [--skip-postgresql]``.
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
PIPELINE_CODE = "BENCH_TASK"
#: A recorded try may cost this much more than a plain one in its task process (ms, DAG import + around the call).
TARGET_MS = 30.0
#: Modules the child imports before it is timed (comma-separated): what the task process's parent had loaded.
PRELOAD_VAR = "ETL_CRAFT_BENCH_PRELOAD"
#: The result keys, their labels and what the child preloads.
VARIANTS = {
    "sqlite": ("SQLite", ""),
    "postgresql": ("PostgreSQL, cold interpreter", ""),
    "postgresql_driver_loaded": ("PostgreSQL, driver loaded", "psycopg2"),
}
TASK_CODE = "T01"
#: The provider's phases of a recorded try that the child times, in the order a try meets them.
PHASES = {
    "profile": "the Engine profile from the Airflow connection",
    "dialect": "the process's dialect for it",
    "login_start": "starting the login (the driver's import, where it is not loaded)",
    "modules": "loading the modules the try uses on its own thread (what the thread begun ahead has not loaded)",
    "login_wait": "waiting for the login (TLS, SCRAM, the schema check)",
    "start": "the start step (its statement opens the attempt)",
    "end": "the end step (its statement ends the attempt)",
}

PLAIN_DAG = '''"""Benchmark: one plain @task."""
import time
from datetime import datetime

from airflow.sdk import DAG, task

TIMES = {}

with DAG("bench_cost_plain", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 0}) as dag:

    @task(task_id="t01")
    def step() -> int:
        TIMES["callable_start"] = time.perf_counter()
        TIMES["callable_end"] = time.perf_counter()
        return 1

    step()
'''

RECORDED_DAG = '''"""Benchmark: the same function, recorded by the provider."""
import time
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_etl_craft.decorators import etl_craft_task

TIMES = {}

with DAG("bench_cost_recorded", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 0}) as dag:

    @etl_craft_task(task_id="t01", pipeline_code="__PIPELINE__")
    def step() -> int:
        TIMES["callable_start"] = time.perf_counter()
        TIMES["callable_end"] = time.perf_counter()
        return 1

    step()
'''


def _airflow_env(home: Path, engine_config: Path) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_ETL_CRAFT_DEFAULT": json.dumps(
            {"conn_type": "etl_craft", "extra": {"config_path": str(engine_config)}}
        ),
    }


# --------------------------------------------------------------------------- the child: one task process


def _time_phases() -> dict[str, float]:
    """Wrap the functions behind :data:`PHASES` so that each adds its time (ms) to the returned dict.

    A module the try has not loaded yet is wrapped once the try loads it (a ``sys.meta_path`` finder that
    answers for those modules only), so its import stays in the try's time, where the try pays it.
    ``modules`` is what ``try_engine`` spends beyond the profile, the dialect and the login's start: its imports.
    """
    import functools
    import importlib.machinery

    spent: dict[str, float] = {}

    def timed(owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[phase] = spent.get(phase, 0.0) + (time.perf_counter() - started) * 1000

        setattr(owner, name, wrapper)

    package = "airflow_provider_etl_craft"
    #: Per module: (attribute path, phase) of each function to time.
    pending: dict[str, tuple[tuple[str, str], ...]] = {
        f"{package}.config.connection": (("profile_for_conn_id", "profile"),),
        f"{package}.engine.reuse": (
            ("engine_for", "dialect"),
            ("log_in_ahead", "login_start"),
            ("_Login.take", "login_wait"),
        ),
        f"{package}.operators._engine": (("try_engine", "try_engine"),),
        f"{package}.runs.start": (("StartAttempt.__call__", "start"),),
        f"{package}.runs.attempts": (("EndAttempt.__call__", "end"),),
    }

    def wrap(module: Any, functions: tuple[tuple[str, str], ...]) -> None:
        for dotted, phase in functions:
            *owners, name = dotted.split(".")
            timed(functools.reduce(getattr, owners, module), name, phase)

    for name in [name for name in pending if name in sys.modules]:
        wrap(sys.modules[name], pending.pop(name))

    class AfterImport:
        @staticmethod
        def find_spec(name: str, path: Any = None, target: Any = None) -> Any:
            functions = pending.pop(name, None)
            spec = None if functions is None else importlib.machinery.PathFinder.find_spec(name, path)
            if functions is None or spec is None or spec.loader is None:
                return None
            load = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                load(module)
                wrap(module, functions)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, AfterImport())
    return spent


def _phases(spent: dict[str, float]) -> dict[str, float]:
    """:data:`PHASES` from the wrapped functions' times (a phase the try did not meet is 0)."""
    out = {phase: spent.get(phase, 0.0) for phase in PHASES if phase != "modules"}
    out["modules"] = spent.get("try_engine", 0.0) - out["profile"] - out["dialect"] - out["login_start"]
    return {phase: out[phase] for phase in PHASES}


def child(dag_file: Path, logical_date: str) -> dict[str, Any]:
    """One try in this fresh interpreter (see the module docstring); returns its timings."""
    import importlib
    import importlib.util
    import warnings

    warnings.filterwarnings("ignore")
    for name in filter(None, os.environ.get(PRELOAD_VAR, "").split(",")):
        importlib.import_module(name)  # loaded before the try, as the task process's parent had them
    started = time.perf_counter()
    import airflow.sdk  # noqa: F401 - Airflow itself, timed apart from the DAG file

    airflow_ms = (time.perf_counter() - started) * 1000
    spec = importlib.util.spec_from_file_location(f"bench_cost_{dag_file.stem}", dag_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    started = time.perf_counter()
    spec.loader.exec_module(module)
    import_ms = (time.perf_counter() - started) * 1000

    dag = module.dag
    # Only a recorded try: the provider's package itself is loaded in every Airflow process (its metadata).
    recorded = "airflow_provider_etl_craft.operators.task_run" in sys.modules
    spent = _time_phases() if recorded else None
    task = dag.get_task("t01")
    cls = type(task)
    execute, prepare = cls.execute, cls.prepare_for_execution
    marks: dict[str, float] = {}

    def timed_prepare(self: Any) -> Any:
        marks.setdefault("prepare_start", time.perf_counter())
        return prepare(self)

    # A cProfile of execute, to see where time goes.
    profile_to = os.environ.get("ETL_CRAFT_BENCH_PROFILE", "")

    def timed_execute(self: Any, context: Any) -> Any:
        profiler = None
        if profile_to:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        marks["execute_start"] = time.perf_counter()
        try:
            return execute(self, context)
        finally:
            marks["execute_end"] = time.perf_counter()
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(profile_to)

    cls.execute = timed_execute
    cls.prepare_for_execution = timed_prepare
    from airflow_provider_etl_craft.testing import run_dag_test

    when = datetime.fromisoformat(logical_date)
    run = run_dag_test(dag, logical_date=when, run_after=when)
    state = str(getattr(run, "state", run))
    times = module.TIMES
    if not state.endswith("success") or len(marks) != 3 or len(times) != 2:
        raise RuntimeError(
            f"{dag.dag_id} ended {state}; prepare/execute marks {marks}, callable marks {times}"
        )
    return {
        "airflow_import_ms": airflow_ms,
        "import_ms": import_ms,
        "before_ms": (times["callable_start"] - marks["prepare_start"]) * 1000,
        "after_ms": (marks["execute_end"] - times["callable_end"]) * 1000,
        **({} if spent is None else {"phases": _phases(spent)}),
        # The provider's modules beyond those every Airflow process loads (its metadata, the connection form).
        "provider_modules": sorted(
            m
            for m in sys.modules
            if m.startswith(("airflow_provider_etl_craft.operators", "airflow_provider_etl_craft.runs"))
        ),
        "heavy_modules": sorted(
            m
            for m in ("sqlparse", "psycopg2", "psycopg", "filelock", "boto3", "requests")
            if m in sys.modules
        ),
    }


# --------------------------------------------------------------------------- the parent


def _summary(samples: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("import_ms", "before_ms", "after_ms")
    out = {k: statistics.median(s[k] for s in samples) for k in keys}
    out["around_ms"] = statistics.median(s["before_ms"] + s["after_ms"] for s in samples)
    out["total_ms"] = statistics.median(s["import_ms"] + s["before_ms"] + s["after_ms"] for s in samples)
    return out


def _child_env(home: Path, engine_config: Path) -> dict[str, str]:
    """The environment of a try's fresh interpreter."""
    env = {
        **os.environ,
        **_airflow_env(home, engine_config),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        # As an installed provider: bytecode cached (the warm-up writes it, outside the source tree).
        "PYTHONPYCACHEPREFIX": str(home.parent / "pycache"),
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def measure_engine(
    name: str, engine_config: Path, home: Path, dags: dict[str, Path], repeats: int, log: Any
) -> dict[str, Any]:
    """``repeats`` cold tries of each DAG (alternating) on the Engine DB of ``engine_config``; ``name``: the
    variant (:data:`VARIANTS`), which says what the child preloads."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
    from airflow_provider_etl_craft.runs.identity import RunIdentity

    hook = EngineDBHook.from_config(engine_config)
    env = _child_env(home, engine_config)
    env[PRELOAD_VAR] = VARIANTS[name][1]
    samples: dict[str, list[dict[str, Any]]] = {"plain": [], "recorded": []}
    offset = timedelta(days=1000 * list(VARIANTS).index(name))  # each variant its own run keys
    base = datetime(2026, 1, 1, tzinfo=UTC) + offset
    order = ("plain", "recorded")
    for r in range(-1, repeats):  # r = -1: one warm-up of each (bytecode, the OS file cache), not counted
        for kind in order if r % 2 == 0 else reversed(order):
            logical_date = base + timedelta(days=r + 1, hours=0 if kind == "plain" else 12)
            identity = None
            if kind == "recorded":
                run_id = DagRun.generate_run_id(
                    run_type=DagRunType.MANUAL, logical_date=logical_date, run_after=logical_date
                )
                identity = RunIdentity("bench_cost_recorded", run_id, logical_date)
                with hook.lifecycle() as lc:
                    lc.claim(PIPELINE_CODE, identity)
            folder = {"AIRFLOW__CORE__DAGS_FOLDER": str(dags[kind].parent)}
            sample = run_child("bench.task_cost", {**env, **folder}, dags[kind], logical_date)
            if kind == "plain" and sample["provider_modules"]:
                raise RuntimeError(f"the plain try loaded the provider's {sample['provider_modules']}: a real plain "
                                   "task process does not, so the comparison would hide what they cost")  # fmt: skip
            if identity is not None:
                with hook.lifecycle() as lc:
                    finished = lc.finish_run(PIPELINE_CODE, identity, {TASK_CODE: "success"})
                if finished.status != "SUCCESS":
                    raise RuntimeError(f"run {identity.run_key} ended {finished.status}")
            if r >= 0:
                samples[kind].append(sample)
    plain, recorded = _summary(samples["plain"]), _summary(samples["recorded"])
    result = {
        "plain": plain,
        "recorded": recorded,
        "extra_ms": {k: recorded[k] - plain[k] for k in plain},
        "phases_ms": {p: statistics.median(s["phases"][p] for s in samples["recorded"]) for p in PHASES},
        "heavy_modules_in_recorded_task": samples["recorded"][-1]["heavy_modules"],
        "samples": samples,
    }
    log(f"  {name}: recorded - plain = {result['extra_ms']['around_ms']:.1f} ms around the callable, "
        f"{result['extra_ms']['import_ms']:.1f} ms importing the DAG file")  # fmt: skip
    return result


BARE_LOGIN = """
import json, sys, time
settings = json.loads(sys.stdin.read())
started = time.perf_counter()
import psycopg2
imported = time.perf_counter()
conn = psycopg2.connect(**settings["connect"])
connected = time.perf_counter()
conn.autocommit = True
with conn.cursor() as cur:
    cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (settings["schema"],))
    cur.fetchone()
queried = time.perf_counter()
conn.close()
print(json.dumps({"import_ms": (imported - started) * 1000, "connect_ms": (connected - imported) * 1000,
                  "first_query_ms": (queried - connected) * 1000}))
"""


def bare_login(engine_config: Path, home: Path, repeats: int) -> dict[str, float]:
    """``repeats`` logins to the Engine DB of ``engine_config`` with ``psycopg2`` alone, each in a fresh interpreter
    (the settings the dialect passes the driver, on stdin: they hold the secret): the driver's import (with the
    standard-library modules it needs, which a task process has loaded already: not comparable with the
    tries'), the connect (TLS, SCRAM, the server's new backend) and a first query (the schema check's).
    Medians, ms."""
    from airflow_provider_etl_craft.config import load_engine_profile
    from airflow_provider_etl_craft.engine.dialects.postgresql import PostgresDialect

    profile = load_engine_profile(engine_config)
    settings = json.dumps({"connect": PostgresDialect(profile).connect_kwargs(), "schema": profile.schema})
    runs = []
    for _ in range(repeats + 1):  # the first warms the OS file cache, not counted
        done = subprocess.run(
            [sys.executable, "-c", BARE_LOGIN],
            input=settings,
            capture_output=True,
            text=True,
            check=True,
            env=_child_env(home, engine_config),
        )
        runs.append(json.loads(done.stdout))
    return {key: statistics.median(run[key] for run in runs[1:]) for key in runs[0]}


def measure(workdir: Path, repeats: int, postgresql: bool, log: Any = print) -> dict[str, Any]:
    """Everything part 9 reports (see the module docstring)."""
    home = workdir / "airflow-home"
    (home / "dags").mkdir(parents=True, exist_ok=True)
    sqlite_config = workdir / "sqlite" / "craft-connector.yml"
    os.environ.update(_airflow_env(home, sqlite_config))
    os.environ.pop("ETL_CRAFT_CONFIG", None)
    from bench.engines import PgServer, init_engine, seed_pipelines, sqlite_engine

    migrated = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    if migrated.returncode != 0:
        raise RuntimeError(f"`airflow db migrate` failed:\n{migrated.stderr[-3000:]}")
    # Each DAG in a DAGs folder of its own: dag.test() parses its whole folder, and a plain try that also
    # parsed the recorded file would load the provider's modules, which a real plain task process never does.
    dags = {kind: home / "dags" / kind / f"bench_cost_{kind}.py" for kind in ("plain", "recorded")}
    for path in dags.values():
        path.parent.mkdir(exist_ok=True)
    dags["plain"].write_text(PLAIN_DAG)
    dags["recorded"].write_text(RECORDED_DAG.replace("__PIPELINE__", PIPELINE_CODE))

    results: dict[str, Any] = {"repeats": repeats}
    sqlite_config = sqlite_engine(workdir / "sqlite")
    seed_pipelines(init_engine(sqlite_config), [(PIPELINE_CODE, (TASK_CODE,))])
    results["sqlite"] = measure_engine("sqlite", sqlite_config, home, dags, repeats, log)
    if postgresql:
        pg = PgServer.start(workdir / "postgresql")
        try:
            seed_pipelines(init_engine(pg.config_path), [(PIPELINE_CODE, (TASK_CODE,))])
            for name in ("postgresql", "postgresql_driver_loaded"):
                results[name] = measure_engine(name, pg.config_path, home, dags, repeats, log)
            results["bare_login"] = bare_login(pg.config_path, home, repeats)
        finally:
            pg.stop()
    return results


def render(results: dict[str, Any]) -> str:
    """The side-by-side table: median ms in the task process, plain vs recorded."""
    lines = [
        f"Part 9: one cold try per task process, median of {results['repeats']} (ms)",
        f"{'Engine DB':<26}{'':<10}{'DAG import':>12}{'before call':>13}{'after call':>12}{'around':>10}",
    ]
    for engine in VARIANTS:
        part = results.get(engine)
        if not part:
            continue
        for kind in ("plain", "recorded", "extra_ms"):
            row = part[kind]
            label = "extra" if kind == "extra_ms" else kind
            lines.append(
                f"{engine:<26}{label:<10}{row['import_ms']:>12.1f}{row['before_ms']:>13.1f}"
                f"{row['after_ms']:>12.1f}{row['around_ms']:>10.1f}"
            )
    lines += [
        "   postgresql_driver_loaded: psycopg2 imported before the try, as a task process forked by",
        "   a scheduler whose metadata database is PostgreSQL has it",
    ]
    timed = {engine: (results.get(engine) or {}).get("phases_ms") for engine in VARIANTS}
    if any(timed.values()):
        lines += ["", "Where a recorded try's time goes: the provider's phases (median ms)"]
        lines.append(f"{'Engine DB':<26}" + "".join(f"{phase:>13}" for phase in PHASES))
        lines += [
            f"{engine:<26}" + "".join(f"{phases[phase]:>13.1f}" for phase in PHASES)
            for engine, phases in timed.items()
            if phases
        ]
        lines += [f"   {phase}: {text}" for phase, text in PHASES.items()]
    bare = results.get("bare_login")
    if bare:
        lines.append(
            f"Bare psycopg2 login to the same server from a fresh interpreter (median ms): connect "
            f"{bare['connect_ms']:.1f} (TLS, SCRAM, the server's new backend), first query {bare['first_query_ms']:.1f}"
        )
    return "\n".join(lines)


def targets(results: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Part 9's target per variant (the format of ``bench.report.targets``): DAG import + around the callable."""
    if not results or "error" in results:
        return []
    out = []
    for key, (label, _) in VARIANTS.items():
        if key not in results:
            continue
        extra = results[key]["extra_ms"]
        cost = extra["import_ms"] + extra["around_ms"]
        out.append({
            "target": f"a recorded task costs <= {TARGET_MS:g} ms more than a plain one in its task process ({label})",
            "measured": f"{cost:.1f} ms ({extra['import_ms']:.1f} DAG import + {extra['around_ms']:.1f} around the callable)",
            "value": cost, "met": cost <= TARGET_MS,
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = part_parser(__doc__, repeats=5)
    parser.add_argument("--skip-postgresql", action="store_true")
    return part_main(
        argv,
        parser,
        child,
        lambda args, workdir: measure(workdir, args.repeats, not args.skip_postgresql),
        render,
    )


if __name__ == "__main__":
    sys.exit(main())
