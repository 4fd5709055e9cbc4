"""``python -m bench`` (``make bench``): measure what recording etl-craft runs costs, print a report, write JSON.

1. Bookkeeping cost of one pipeline run on SQLite and PostgreSQL — round trips counted per operation by
   proxies around the DB-API connection (:mod:`bench.counting` defines one round trip) and checked against
   pg_stat_statements; wall time per run (:mod:`bench.bookkeeping`).
2. Contention on PostgreSQL: runs/s from 1, 4, 16 processes sharing ONE pipeline, a connection per step, against
   a one-row INSERT transaction on a new connection each, same server, same run (:mod:`bench.contention`).
3. Airflow-level overhead: ``dag.test()`` of a plain vs a recorded 20-task DAG (:mod:`bench.airflow_overhead`,
   in a subprocess).
4. Credential calls per pipeline run for ``auth_mode: sts`` and ``oauth``: AssumeRole calls and token requests
   counted at a loopback STS / OAuth token server, from 1 and 2 processes (:mod:`bench.credentials`).
5. Under a real scheduler (:mod:`bench.scheduler`, in a subprocess): recorded vs plain DAG runs and claim
   hand-off latency in an Airflow deployment (LocalExecutor, SQLite and PostgreSQL Engine DBs).
6. Deferred waits at scale (:mod:`bench.waits`): the Engine DB sessions 1,000 waits in one triggerer hold,
   and how soon each wakes after its blocking run ends.
7. History (:mod:`bench.history`): a full run and the CLI's ``status``, ``history`` and ``pipelines`` on an Engine
   DB holding 1,000,000 attempts of history (40,000 runs, 200 pipelines, three years) ÷ the same on an empty
   one, PostgreSQL and SQLite, side by side.
8. Purge (:mod:`bench.purge`): ``etl-craft-airflow purge`` on that history — runs/s and attempts/s deleted —
   and the claim times of another process claiming beside it, against the same claims without a purge.
9. A recorded task's own cost in its task process (:mod:`bench.task_cost`, in a subprocess): one cold try per
   fresh interpreter, recorded vs plain, on SQLite and PostgreSQL Engine DBs.
10. OpenLineage's cost per task (:mod:`bench.lineage_cost`, in a subprocess of the OpenLineage venv
   ``.venv-openlineage``, which ``make bench`` builds): part 9's cold tries with Airflow's listener on and off,
   a plain and a recorded task; what the provider adds is the difference.

**One round trip** is one statement or transaction-control message sent to the database and waited for:
with psycopg2 in autocommit mode (the provider's connections) every ``cursor.execute`` is one round trip —
``BEGIN``, ``COMMIT``, ``SELECT pg_advisory_lock(…)`` included; ``commit()``/``rollback()`` count only when a
transaction is open; fetching from a client-side cursor and ``close()`` are free. Opening a connection is
reported on its own line: one login (PostgreSQL: TLS + SCRAM, several network exchanges, counted as one)
plus the setup statements the dialect runs. SQLite is in-process: the same rule counts statements handed
to the library. Details in :mod:`bench.counting`.

PostgreSQL is a throwaway cluster started for the run (never the machine's server on 5432) and removed at
the end, with everything else under a temporary work directory. ``--quick`` is a small smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.isolated import run_isolated
from bench.lineage_cost import LINEAGE_PYTHON

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).resolve().with_name("results.json")
BOOK_PIPELINE = "BENCH_BOOK"
#: The parts ``--skip`` and ``--only`` name (part 1 is two: its SQLite and its PostgreSQL half).
PARTS = (
    "sqlite",
    "postgresql",
    "contention",
    "airflow",
    "credentials",
    "scheduler",
    "waits",
    "history",
    "purge",
    "taskcost",
    "lineage",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="JSON results file (default: %(default)s)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a fast smoke run: few runs, short windows, 1 and 2 procs"
    )
    parser.add_argument(
        "--runs", type=int, help="part 1: pipeline runs per dialect and mode (default 30; quick 3)"
    )
    parser.add_argument("--tasks", type=int, help="part 1: tasks per pipeline run (default 10; quick 3)")
    parser.add_argument(
        "--seconds", type=float, help="part 2: seconds per measurement (default 8; quick 1.5)"
    )
    parser.add_argument(
        "--procs",
        help="part 2: process counts sharing one pipeline, comma-separated (default 1,4,16; quick 1,2)",
    )
    parser.add_argument(
        "--retry-ms", type=float, default=2.0, help="part 2: sleep after a BLOCKED claim, ms (default 2)"
    )
    parser.add_argument("--contention-tasks", type=int, default=3, help="part 2: tasks per run (default 3)")
    parser.add_argument(
        "--cred-runs", type=int, help="part 4: pipeline runs per process and auth mode (default 5; quick 2)"
    )
    parser.add_argument("--cred-tasks", type=int, help="part 4: tasks per pipeline run (default 10; quick 3)")
    parser.add_argument("--dag-tasks", type=int, help="part 3: tasks in the DAG (default 20; quick 5)")
    parser.add_argument(
        "--dag-repeats", type=int, help="part 3: measured runs of each DAG (default 4; quick 1)"
    )
    parser.add_argument(
        "--sched-repeats",
        type=int,
        help="part 5: ABBA rounds of each DAG (default 5: a DAG run varies by a second with the scheduler loop; quick 1)",
    )
    parser.add_argument(
        "--handoffs", type=int, help="part 5: hand-offs per Engine DB and wait mode (default 10; quick 3)"
    )
    parser.add_argument(
        "--waits",
        type=int,
        help="part 6: deferred waits in one triggerer, 5 per pipeline (default 1000; quick 100)",
    )
    parser.add_argument(
        "--task-repeats", type=int, help="part 9: cold tries of each task per Engine DB (default 7; quick 2)"
    )
    parser.add_argument(
        "--lineage-repeats",
        type=int,
        help="part 10: cold tries with the listener on and off (default 7; quick 2)",
    )
    parser.add_argument(
        "--lineage-python",
        type=Path,
        default=LINEAGE_PYTHON,
        help="part 10: the interpreter of a venv with the [openlineage] extra (default: %(default)s)",
    )
    parser.add_argument(
        "--history-dialects",
        default="postgresql,sqlite",
        help="parts 7 and 8: Engine DB dialects, comma-separated (default %(default)s)",
    )
    parser.add_argument("--history-pipelines", type=int, help="part 7: pipelines (default 200; quick 10)")
    parser.add_argument("--history-runs", type=int, help="part 7: runs of history (default 40000; quick 200)")
    parser.add_argument(
        "--history-attempts", type=int, help="part 7: attempts of history (default 1000000; quick 5000)"
    )
    parser.add_argument(
        "--history-repeats", type=int, help="part 7: full runs on each Engine DB (default 30; quick 3)"
    )
    parser.add_argument(
        "--cli-repeats", type=int, help="part 7: runs of each CLI command on each DB (default 10; quick 2)"
    )
    parser.add_argument(
        "--purge-older-than", type=int, default=90, help="part 8: purge runs older than this many days (90)"
    )
    parser.add_argument("--purge-batch", type=int, default=500, help="part 8: purge batch size (default 500)")
    parser.add_argument(
        "--purge-baseline", type=float, help="part 8: seconds of claims without a purge (default 5; quick 1)"
    )
    parser.add_argument(
        "--skip", action="append", default=[], choices=PARTS, help="leave a part out (repeatable)"
    )
    parser.add_argument(
        "--only", help=f"run only these parts, comma-separated (of {', '.join(PARTS)}); overrides --skip"
    )
    parser.add_argument("--keep-workdir", action="store_true", help="keep the temporary work directory")
    args = parser.parse_args(argv)
    quick = args.quick
    args.runs = args.runs or (3 if quick else 30)
    args.tasks = args.tasks or (3 if quick else 10)
    args.seconds = args.seconds or (1.5 if quick else 8.0)
    args.procs = tuple(int(p) for p in (args.procs or ("1,2" if quick else "1,4,16")).split(","))
    args.cred_runs = args.cred_runs or (2 if quick else 5)
    args.cred_tasks = args.cred_tasks or (3 if quick else 10)
    args.dag_tasks = args.dag_tasks or (5 if quick else 20)
    args.dag_repeats = args.dag_repeats or (1 if quick else 4)
    args.sched_repeats, args.handoffs = (
        args.sched_repeats or (1 if quick else 5),
        args.handoffs or (3 if quick else 10),
    )
    args.waits = args.waits or (100 if quick else 1000)
    if args.only:
        only = set(args.only.split(","))
        unknown = only - set(PARTS)
        if unknown:
            parser.error(
                f"--only: unknown part(s) {', '.join(sorted(unknown))}; the parts are {', '.join(PARTS)}"
            )
        args.skip = [part for part in PARTS if part not in only]
    args.history_dialects = tuple(d for d in args.history_dialects.split(",") if d)
    if set(args.history_dialects) - {"postgresql", "sqlite"}:
        parser.error("--history-dialects: postgresql and/or sqlite")
    args.history_pipelines = args.history_pipelines or (10 if quick else 200)
    args.history_runs = args.history_runs or (200 if quick else 40_000)
    args.history_attempts = args.history_attempts or (5_000 if quick else 1_000_000)
    args.history_repeats = args.history_repeats or (3 if quick else 30)
    args.cli_repeats = args.cli_repeats or (2 if quick else 10)
    args.purge_baseline = args.purge_baseline or (1.0 if quick else 5.0)
    args.task_repeats = args.task_repeats or (2 if quick else 7)
    args.lineage_repeats = args.lineage_repeats or (2 if quick else 7)
    return args


def log(message: str) -> None:
    print(message, flush=True)


def commit() -> str:
    """The measured commit (``git describe --always --dirty``): figures are only comparable per commit."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=ROOT,
                              capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    return done.stdout.strip()


def run_airflow_part(workdir: Path, tasks: int, repeats: int) -> dict[str, Any]:
    """Part 3 in a fresh interpreter (Airflow is configured before its first import there)."""
    return run_isolated("bench.airflow_overhead", workdir / "airflow", "dag-test.log", 3,
                        "--tasks", str(tasks), "--repeats", str(repeats))  # fmt: skip


def run_history_parts(dialect: str, args: argparse.Namespace, workdir: Path, pg: Any, results: dict[str, Any],
                      failures: list[str]) -> None:  # fmt: skip
    """Parts 7 and 8 on one dialect: write the history, measure on it, then purge it."""
    from bench import history
    from bench import purge as purge_part

    sizes = history.Sizes(args.history_pipelines, args.history_runs, args.history_attempts)
    log(f"parts 7-8, {dialect}: an empty Engine DB and one with {sizes.runs:,} runs / {sizes.attempts:,} attempts "
        f"of history over {sizes.pipelines} pipelines")  # fmt: skip
    try:
        pair = history.prepare(dialect, workdir / f"history-{dialect}", sizes, pg, log)
        if "history" not in args.skip:
            log(f"part 7, {dialect}: {args.history_repeats} full runs on each DB (alternating), "
                f"{args.cli_repeats} x status/history/pipelines")  # fmt: skip
            results.setdefault("history", {})[dialect] = history.measure(
                pair, args.history_repeats, args.cli_repeats, log
            )
        if "purge" not in args.skip:
            log(f"part 8, {dialect}: purge --older-than {args.purge_older_than}d --batch-size {args.purge_batch} "
                f"in its own process, claims beside it ({args.purge_baseline:g} s of claims alone first)")  # fmt: skip
            results.setdefault("purge", {})[dialect] = purge_part.measure(
                pair, sizes.pipelines, args.purge_older_than, args.purge_batch, args.purge_baseline, log
            )
    except (RuntimeError, AssertionError, ValueError) as exc:
        for part in ("history", "purge"):
            if part not in args.skip:
                results.setdefault(part, {}).setdefault(dialect, {"error": str(exc).splitlines()[0]})
        failures.append(f"parts 7-8 on {dialect}: {exc}")


def run_task_cost_part(workdir: Path, repeats: int) -> dict[str, Any]:
    """Part 9 in a fresh interpreter (it configures Airflow, then starts one interpreter per try)."""
    return run_isolated(
        "bench.task_cost", workdir / "task-cost", "task-cost.log", 9, "--repeats", str(repeats)
    )


def run_lineage_part(workdir: Path, repeats: int, python: Path) -> dict[str, Any]:
    """Part 10 in a fresh interpreter of the OpenLineage venv (the main venv has no OpenLineage)."""
    if not python.exists():
        raise RuntimeError(
            f"part 10 needs {python} (make test-lineage or make bench builds .venv-openlineage)"
        )
    return run_isolated("bench.lineage_cost", workdir / "lineage", "lineage-cost.log", 10,
                        "--repeats", str(repeats), python=python)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    # Imported here, not at module level: spawned worker processes re-import this module as __mp_main__,
    # and should not pay for Airflow twice.
    from bench import bookkeeping, contention, credentials, engines, report, scheduler, waits

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    args = parse_args(argv)
    started, started_at = time.perf_counter(), datetime.now(UTC)
    workdir = Path(tempfile.mkdtemp(prefix="etl-craft-bench-"))
    results: dict[str, Any] = {
        "commit": commit(),
        "mode": "quick" if args.quick else "full",
        "started": f"{started_at:%Y-%m-%d %H:%M:%S} UTC",
        "options": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "bookkeeping": {},
        "load_average_at_start": os.getloadavg(),
    }
    failures: list[str] = []
    pg: Any = None  # engines.PgServer while the cluster runs
    log(f"work directory: {workdir}")
    try:
        codes = engines.task_codes(args.tasks)
        if "sqlite" not in args.skip:
            log(f"part 1, SQLite: {args.runs} runs x 2 modes of claim + {args.tasks} tasks + finish")
            hook = engines.init_engine(engines.sqlite_engine(workdir / "sqlite"))
            engines.seed_pipelines(hook, [(BOOK_PIPELINE, codes)])
            results["bookkeeping"]["sqlite"] = bookkeeping.measure(
                hook, "sqlite", BOOK_PIPELINE, codes, args.runs
            )

        history_parts = not {"history", "purge"} <= set(args.skip)
        history_pg = history_parts and "postgresql" in args.history_dialects
        if not {"postgresql", "contention", "credentials", "waits"} <= set(args.skip) or history_pg:
            log("starting a throwaway PostgreSQL cluster")
            pg = engines.PgServer.start(workdir / "postgresql")
            log(f"  PostgreSQL {pg.cluster.version} on {pg.cluster.host}:{pg.cluster.port}"
                f"{' with pg_stat_statements' if pg.statements_view else ''}")  # fmt: skip
            hook = engines.init_engine(pg.config_path)
            if "postgresql" not in args.skip:
                log(f"part 1, PostgreSQL: {args.runs} runs x 2 modes of claim + {args.tasks} tasks + finish")
                engines.seed_pipelines(hook, [(BOOK_PIPELINE, codes)])
                results["bookkeeping"]["postgresql"] = bookkeeping.measure(
                    hook, "postgresql", BOOK_PIPELINE, codes, args.runs, pg.statement_count
                )
            if "contention" not in args.skip:
                log(
                    f"part 2, contention: {args.procs} processes, {args.seconds:g} s each, lifecycle and baseline"
                )
                results["contention"] = contention.measure(
                    pg.config_path,
                    hook,
                    args.procs,
                    args.seconds,
                    engines.task_codes(args.contention_tasks),
                    log,
                    args.retry_ms / 1000,
                )
            if "credentials" not in args.skip:
                log(f"part 4, credentials: sts, oauth and oauth with a 2 s token; {args.cred_runs} runs x "
                    f"{args.cred_tasks} tasks per process, a connection per step, from 1 and 2 processes")  # fmt: skip
                results["credentials"] = credentials.measure(
                    pg,
                    workdir / "credentials",
                    (1, 2),
                    args.cred_runs,
                    engines.task_codes(args.cred_tasks),
                    log,
                )
            if "waits" not in args.skip:
                log(
                    f"part 6, deferred waits: {args.waits} waits in one triggerer process, each run's end wakes 5"
                )
                results["waits"] = waits.measure(pg, hook, max(1, args.waits // 5), 5, log)
            if history_pg:
                run_history_parts("postgresql", args, workdir, pg, results, failures)
            results["machine"] = engines.machine(pg)
            pg.stop()
            pg = None
        if history_parts and "sqlite" in args.history_dialects:
            run_history_parts("sqlite", args, workdir, None, results, failures)

        if "airflow" not in args.skip:
            log(f"part 3, Airflow: airflow db migrate, then dag.test() of a {args.dag_tasks}-task DAG, plain and "
                f"recorded, 1 warm-up + {args.dag_repeats} runs each")  # fmt: skip
            try:
                results["airflow"] = run_airflow_part(workdir, args.dag_tasks, args.dag_repeats)
            except RuntimeError as exc:
                results["airflow"] = {"error": str(exc).splitlines()[0]}
                failures.append(str(exc))
        if "scheduler" not in args.skip:
            log(f"part 5, real scheduler: {args.dag_tasks}-task chains x (1 + {args.sched_repeats} ABBA), "
                f"{args.handoffs} claim hand-offs per Engine DB and wait mode")  # fmt: skip
            try:
                results["scheduler"] = scheduler.run_part(
                    workdir, args.dag_tasks, args.sched_repeats, args.handoffs
                )
            except RuntimeError as exc:
                results["scheduler"] = {"error": str(exc).splitlines()[0]}
                failures.append(str(exc))
        if "taskcost" not in args.skip:
            log(
                f"part 9, task process: {args.task_repeats} cold tries of a plain and a recorded task per Engine DB"
            )
            try:
                results["task_cost"] = run_task_cost_part(workdir, args.task_repeats)
            except RuntimeError as exc:
                results["task_cost"] = {"error": str(exc).splitlines()[0]}
                failures.append(str(exc))
        if "lineage" not in args.skip:
            log(f"part 10, OpenLineage: {args.lineage_repeats} cold tries of a plain and a recorded task, listener on "
                f"and off, in {args.lineage_python}")  # fmt: skip
            try:
                results["lineage"] = run_lineage_part(workdir, args.lineage_repeats, args.lineage_python)
            except RuntimeError as exc:
                results["lineage"] = {"error": str(exc).splitlines()[0]}
                failures.append(str(exc))
    finally:
        if pg is not None:
            pg.stop()
        if args.keep_workdir:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    results.setdefault("machine", engines.machine(None))
    results["machine"]["load_average"] = {
        "at_start": results.pop("load_average_at_start"),
        "at_end": os.getloadavg(),
    }
    results["targets"] = report.targets(results)
    results["took_s"] = time.perf_counter() - started
    text = report.render(results)
    results["report"] = text
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print()
    print(text)
    print(f"\nresults written to {args.out}")
    for failure in failures:
        print(f"\nerror: {failure}", file=sys.stderr)
    checks = [part["fresh"]["check"] for part in results["bookkeeping"].values()]
    if any(check.get("match") is False for check in checks):
        print(
            "error: the round-trip counter disagrees with the independent count (see above)", file=sys.stderr
        )
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
