"""``etl-craft-airflow``: init-db, migrate, check, status and history outside Airflow; exit statuses per SPEC §11."""

from __future__ import annotations

import argparse
import getpass
import json
import math
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, TextIO

from airflow_provider_etl_craft import __version__, _compat
from airflow_provider_etl_craft.cli.tables import format_table
from airflow_provider_etl_craft.errors import EtlCraftError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs.queries import RunQueries, as_json

Command = Callable[[EngineDBHook, argparse.Namespace, TextIO], int]


def _init_db(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    print(hook.init_db(args.lock_timeout).message, file=out)
    return 0


def _migrate(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    result = hook.migrate(args.migrations_dir, args.lock_timeout)
    print(result.init.message, file=out)
    for label in result.applied:
        print(f"applied {label}", file=out)
    print(f"{len(result.applied)} migration(s) applied", file=out)
    return 0


def _check(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    """Each stage prints one line; the first failing stage prints ``[FAIL]`` and its error ends the run."""

    def line(status: str, what: str) -> None:
        print(f"[{status}] {what}", file=out)

    try:
        return _check_stages(hook, args, line)
    except EtlCraftError as exc:
        line("FAIL", f"{getattr(exc, 'check_stage', 'check')}: {exc}")
        raise


def _check_stages(hook: EngineDBHook, args: argparse.Namespace, line: Callable[[str, str], None]) -> int:
    from airflow_provider_etl_craft.engine.migrations import (
        find_migrations_dir,
        migration_files,
        pending_migrations,
    )
    from airflow_provider_etl_craft.engine.schema import Verdict, check_schema

    with _stage("config"):
        profile = hook.engine_profile
    line(" OK ", f"config: {profile.describe()}")
    for key in profile.secrets:
        line(" OK ", f"secret: {profile.setting(key)} resolved (value not shown)")
    engine = hook.engine
    with _stage("connection"):
        conn = hook.get_conn()
    with closing(conn):
        line(" OK ", f"connection: {engine.describe()}")
        with _stage("schema"):
            state = check_schema(engine, conn)
        line(" OK ", f"schema: {profile.schema}")
        if state.verdict is Verdict.EMPTY:
            line("WARN", "tables: no Engine tables yet; run `etl-craft-airflow init-db`")
            return 0
        if state.verdict is Verdict.PARTIAL:
            problem = state.problem()
            assert problem is not None  # a partial schema always has one
            line("FAIL", f"tables: {problem}")
            return problem.exit_code
        line(" OK ", f"tables: all {len(state.present)} Engine tables present")
        with _stage("migrations"):
            project_dir = find_migrations_dir(args.migrations_dir, profile.base_dir)
            pending = pending_migrations(engine, conn, migration_files(engine.name, project_dir))
    if pending:
        line(
            "WARN",
            f"migrations: {len(pending)} pending ({', '.join(p.label for p in pending)}); run `migrate`",
        )
    else:
        line(" OK ", "migrations: none pending")
    return 0


@contextmanager
def _stage(name: str) -> Iterator[None]:
    """Tag an error with the check stage it happened in, for the ``[FAIL] <stage>:`` line."""
    try:
        yield
    except EtlCraftError as exc:
        exc.check_stage = name  # type: ignore[attr-defined]
        raise


# -- status and history ------------------------------------------------------------------------------

#: Table columns: header and key in the JSON document (the table shows the same, masked values).
RUN_COLUMNS = (("PIPELINE_RUN_ID", "pipeline_run_id"), ("STATUS", "status"), ("RUN_KEY", "run_key"),
               ("RUN_DATE", "run_date"), ("START_DATE", "start_date"), ("END_DATE", "end_date"),
               ("SLA_STATUS", "sla_status"), ("OUTPUT_REVISION", "output_revision"),
               ("TRIGGER_KIND", "trigger_kind"), ("TASKS", "tasks"))  # fmt: skip
TASK_COLUMNS = (("PIPELINE_RUN_ID", "pipeline_run_id"), ("TASK_CODE", "task_code"), ("STATUS", "status"),
                ("ATTEMPT_COUNT", "attempt_count"), ("SOURCE", "source_count"), ("TARGET", "target_count"), ("INSERT", "insert_count"),
                ("UPDATE", "update_count"), ("DELETE", "delete_count"), ("ROWS_WRITTEN", "rows_written"),
                ("START_DATE", "start_date"), ("END_DATE", "end_date"), ("ERROR_MESSAGE", "error_message"))  # fmt: skip
ATTEMPT_COLUMNS = (("PIPELINE_RUN_ID", "pipeline_run_id"), ("TASK_CODE", "task_code"), ("MAP_INDEX", "map_index"),
                   ("ATTEMPT_NUMBER", "attempt_number"), ("STATUS", "status"), ("HOST", "host"), ("PID", "pid"),
                   ("STARTED_AT", "started_at"), ("ENDED_AT", "ended_at"), ("ERROR_MESSAGE", "error_message"))  # fmt: skip
#: Only error messages are shortened in tables (``--format json`` has them whole).
CELL_WIDTHS = {"ERROR_MESSAGE": 60}


@contextmanager
def _run_queries(hook: EngineDBHook) -> Iterator[RunQueries]:
    with closing(hook.get_conn()) as conn:
        queries = RunQueries(hook.engine, conn)
        queries.check_tables()
        yield queries


def _status(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    """The pipeline, its open pause, and its IN-PROGRESS run (else its latest run) with task runs and attempts."""
    with _run_queries(hook) as queries:
        pipeline = queries.pipeline(args.pipeline)
        pause = queries.open_pause(pipeline.pipeline_id)
        run = queries.current_or_latest_run(args.pipeline)
    doc = _masked({"pipeline": as_json(pipeline), "pause": as_json(pause), "run": as_json(run)})
    if args.format == "json":
        return _print_json(doc, out)
    print(_describe_pipeline(doc["pipeline"], doc["pause"]), file=out)
    if run is None:
        print(f"no runs of pipeline {doc['pipeline']['pipeline_code']} yet", file=out)
        return 0
    print(f"\n{'current' if run.status == 'IN-PROGRESS' else 'latest'} run", file=out)
    _print_runs([doc["run"]], out)
    return 0


def _history(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    """The newest ``--limit`` runs of the pipeline, newest first, then their task runs and attempts."""
    with _run_queries(hook) as queries:
        pipeline = queries.pipeline(args.pipeline)
        runs = queries.recent_runs(args.pipeline, args.limit)
    doc = _masked({"pipeline": as_json(pipeline), "runs": as_json(runs)})
    if args.format == "json":
        return _print_json(doc, out)
    print(_describe_pipeline(doc["pipeline"], None), file=out)
    if not runs:
        print(f"no runs of pipeline {doc['pipeline']['pipeline_code']} yet", file=out)
        return 0
    print(f"\n{len(runs)} most recent run(s), newest first (--limit {args.limit})", file=out)
    _print_runs(doc["runs"], out)
    return 0


def _masked(value: Any) -> Any:
    """Every text value through Airflow's secret masker (a secret an error message echoed shows as ``***``)."""
    if isinstance(value, str):
        return str(_compat.redact(value))
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    return value


def _print_json(doc: dict[str, Any], out: TextIO) -> int:
    print(json.dumps(doc, indent=2), file=out)
    return 0


def _describe_pipeline(pipeline: dict[str, Any], pause: dict[str, Any] | None) -> str:
    sla = pipeline["sla_in_hours"]
    text = (
        f"pipeline {pipeline['pipeline_code']} ({pipeline['pipeline_name'] or 'no name'}): "
        f"{'active' if pipeline['active_flag'] == 'Y' else 'retired'} (ACTIVE_FLAG={pipeline['active_flag']}), "
        f"SLA {'none' if sla is None else f'{sla:g} hours'}"
    )
    if pause is not None:
        by = f" by {pause['paused_by']} ({pause['paused_by_kind']})" if pause["paused_by"] else ""
        text += f"\npaused since {pause['paused_at']}{by}: {pause['reason'] or 'no reason given'}"
    return text


def _print_runs(runs: list[dict[str, Any]], out: TextIO) -> None:
    """Runs, then all their task runs, then all their attempts: three tables joined by PIPELINE_RUN_ID."""
    summaries = [
        {**run, "tasks": ", ".join(f"{n} {s}" for s, n in run["task_status_counts"].items()) or None}
        for run in runs
    ]
    tasks = [{"pipeline_run_id": run["pipeline_run_id"], **task} for run in runs for task in run["task_runs"]]
    attempts = [
        {**attempt, "pipeline_run_id": task["pipeline_run_id"], "task_code": task["task_code"]}
        for task in tasks
        for attempt in task["attempts"]
    ]
    print(_table(RUN_COLUMNS, summaries), file=out)
    print(f"\ntask runs\n{_table(TASK_COLUMNS, tasks)}", file=out)
    print(f"\nattempts\n{_table(ATTEMPT_COLUMNS, attempts)}", file=out)


def _table(columns: Sequence[tuple[str, str]], items: list[dict[str, Any]]) -> str:
    if not items:
        return "(none)"
    rows = [[item[key] for _, key in columns] for item in items]
    return format_table([header for header, _ in columns], rows, max_width=None, widths=CELL_WIDTHS)


def _pause(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    """Open a pause: claims skip their DAG runs, running runs start no new task, until resume."""
    with hook.lifecycle() as lifecycle:
        pause_id = lifecycle.pause(args.pipeline, args.reason, args.by)
    print(f"pipeline {args.pipeline} paused by {args.by} (pause {pause_id}): {args.reason}", file=out)
    return 0


def _resume(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    with hook.lifecycle() as lifecycle:
        pause = lifecycle.resume(args.pipeline, args.reason, args.by)
    print(
        f"pipeline {args.pipeline} resumed by {args.by} (pause {pause.pause_id} by {pause.paused_by}, "
        f"reason: {pause.reason or 'none given'})",
        file=out,
    )
    return 0


COMMANDS: dict[str, tuple[Command, str]] = {
    "init-db": (_init_db, "create the Engine tables (safe to repeat: an up-to-date Engine DB is left alone)"),
    "migrate": (_migrate, "init-db if needed, then apply packaged and project migrations in file-name order"),
    "check": (_check, "check settings, secrets, connection, schema, tables and pending migrations"),
    "status": (
        _status,
        "show a pipeline, its open pause, and its running (else latest) run with task runs and attempts",
    ),
    "history": (_history, "show a pipeline's most recent runs, newest first, with task runs and attempts"),
    "pause": (_pause, "pause a pipeline: its DAG runs' claims skip, running runs start no new task"),
    "resume": (_resume, "end a pipeline's pause"),
}
#: Commands that change a pipeline's pause: --pipeline, --reason, --by.
PAUSES = ("pause", "resume")
#: Commands that take the migrate lock, so --lock-timeout.
LOCKING = ("init-db", "migrate")
#: Read-only commands: no lock, so no --lock-timeout; --pipeline and --format instead.
RUN_VIEWS = ("status", "history")
DEFAULT_HISTORY_LIMIT = 20


def _text(value: str) -> str:
    """Free text from the command line: the OS may hand over bytes that are not UTF-8 (surrogate-escaped)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(
            f"is not valid UTF-8 text ({value.encode('utf-8', 'backslashreplace').decode('ascii', 'replace')})"
        ) from None
    if "\x00" in value:
        raise argparse.ArgumentTypeError("contains a NUL character")
    return value


def _seconds(text: str) -> float:
    """A finite, non-negative number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, 0 or more, got {text!r}")
    return value


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of runs (1 or more), got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _add_view_arguments(cmd: argparse.ArgumentParser, name: str) -> None:
    cmd.add_argument(
        "--pipeline", required=True, type=_text, metavar="CODE", help="PIPELINE_CODE in CFG_PIPELINES"
    )
    cmd.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table (default) or one JSON document; timestamps are ISO-8601 UTC in both",
    )
    if name == "history":
        cmd.add_argument(
            "--limit",
            type=_at_least_one,
            default=DEFAULT_HISTORY_LIMIT,
            metavar="N",
            help=f"how many runs to show, newest first (default {DEFAULT_HISTORY_LIMIT})",
        )


def _default_actor() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="craft-connector.yml (default: $ETL_CRAFT_CONFIG, else search upwards from here)",
    )
    common.add_argument(
        "--profile",
        metavar="NAME",
        type=_text,
        default=argparse.SUPPRESS,
        help="Engine profile (default: Engine.Profile, Secrets.Profile, or the only one)",
    )
    common.add_argument(
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="on an error, print the traceback too",
    )
    parser = argparse.ArgumentParser(
        prog="etl-craft-airflow",
        parents=[common],
        description="Administer an etl-craft Engine DB and inspect its runs outside Airflow.",
        epilog="Exit status: 0 ok, 1 failure, 2 usage, 3 configuration, 4 metadata, 9 run state, "
        "12 Engine DB, 13 migration, 14 lock timeout, 20 stale transition.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        if name in RUN_VIEWS:
            _add_view_arguments(cmd, name)
            continue
        if name in PAUSES:
            cmd.add_argument(
                "--pipeline", required=True, type=_text, metavar="CODE", help="PIPELINE_CODE in CFG_PIPELINES"
            )
            cmd.add_argument(
                "--reason", required=True, type=_text, help="why (stored in AUD_PIPELINE_PAUSES)"
            )
            cmd.add_argument(
                "--by",
                default=_default_actor(),
                type=_text,
                metavar="NAME",
                help="who (default: the login name; stored with kind HUMAN)",
            )
            continue
        if name in LOCKING:
            cmd.add_argument(
                "--lock-timeout",
                type=_seconds,
                default=300.0,
                metavar="SECONDS",
                help="how long to wait for the migrate lock (default 300)",
            )
        if name in ("migrate", "check"):
            cmd.add_argument(
                "--migrations-dir",
                metavar="DIR",
                default=None,
                type=_typed_path,
                help="project migrations, relative to the working directory (default: "
                "$ETL_CRAFT_MIGRATIONS_DIR, else migrations/ beside craft-connector.yml)",
            )
        else:
            cmd.set_defaults(migrations_dir=None)
    return parser


def _typed_path(value: str) -> str:
    """A path typed on the command line resolves against the working directory, as in every CLI.

    (Only paths written inside craft-connector.yml resolve beside that file.)
    """
    return str(Path(value).absolute()) if value else value


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status (the console script exits with it)."""
    out, err = out or sys.stdout, err or sys.stderr
    args = build_parser().parse_args(argv)
    hook = EngineDBHook.from_config(getattr(args, "config", None), getattr(args, "profile", None))
    command, _ = COMMANDS[args.command]
    verbose = getattr(args, "verbose", False)
    try:
        with _classified(hook):
            return command(hook, args, out)
    except EtlCraftError as exc:
        if verbose:
            traceback.print_exc(file=err)
        print(_printable(f"error: {exc}"), file=err)
        return exc.exit_code
    except Exception as exc:  # a defect of the provider: one line, the traceback on request
        if verbose:
            traceback.print_exc(file=err)
        detail = (str(exc).strip().splitlines() or [""])[0]
        hint = "" if verbose else "; re-run with --verbose for the traceback"
        print(
            _printable(f"error: unexpected internal error ({type(exc).__name__}: {detail}){hint}"), file=err
        )
        return 1


def _printable(text: str) -> str:
    """A message that any terminal can print: bytes the OS gave us that are not UTF-8 (a path, a name) are
    shown as ``\\udcXX`` escapes rather than failing the print."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@contextmanager
def _classified(hook: EngineDBHook) -> Iterator[None]:
    """Driver errors from any command leave as the provider's typed errors (the dialect classifies them)."""
    try:
        yield
    except EtlCraftError:
        raise
    except Exception as exc:
        try:
            engine = hook.engine
        except EtlCraftError:
            raise exc from None
        if isinstance(exc, engine.database_error()):
            raise engine.classify(exc) from exc
        raise


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
