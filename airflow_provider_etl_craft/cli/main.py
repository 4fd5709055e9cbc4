"""``etl-craft-airflow``: init-db, migrate, check, validate, status and history outside Airflow; exit statuses per docs/errors.md."""

from __future__ import annotations

import argparse
import getpass
import json
import math
import sys
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, TextIO

from airflow_provider_etl_craft import __version__
from airflow_provider_etl_craft.cli.tables import format_table
from airflow_provider_etl_craft.engine.actor import ActorKind
from airflow_provider_etl_craft.engine.schema import MIGRATE_LOCK_TIMEOUT
from airflow_provider_etl_craft.errors import EtlCraftError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import commands
from airflow_provider_etl_craft.runs.queries import MAX_LIMIT

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
    """Every check of the Engine setup, one line each, then the summary; exit 1 when any check failed."""
    from airflow_provider_etl_craft.engine import doctor

    checks = doctor.run_checks(
        getattr(args, "config", None), getattr(args, "profile", None), args.migrations_dir
    )
    shown = [doctor.Check(c.name, c.status, commands.masked(c.message)) for c in checks]
    if args.format == "json":
        _print_json({"checks": [c.as_dict() for c in shown], "summary": doctor.summary(shown)}, out)
    else:
        for check in shown:
            print(_printable(f"[{check.status.value:<4}] {check.name}: {check.message}"), file=out)
        print(doctor.summary_line(shown), file=out)
    return doctor.exit_status(shown)


# -- status and history ------------------------------------------------------------------------------

#: Table columns: header and key in the JSON document (the table shows the same, masked values).
PIPELINE_COLUMNS = (("PIPELINE_CODE", "pipeline_code"), ("PIPELINE_NAME", "pipeline_name"),
                    ("ACTIVE_FLAG", "active_flag"), ("SLA_IN_HOURS", "sla_in_hours"), ("PAUSED", "paused"),
                    ("LATEST_RUN_ID", "latest_run_id"), ("LATEST_STATUS", "latest_status"),
                    ("LATEST_SLA", "latest_sla"))  # fmt: skip
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
GATE_COLUMNS = (("PIPELINE_RUN_ID", "pipeline_run_id"), ("TASK_CODE", "task_code"),
                ("DEPENDS_ON_PIPELINE", "depends_on_pipeline_code"), ("DEPENDS_ON_TASK", "depends_on_task_code"),
                ("RESULT", "result"), ("REASON", "reason"), ("DECIDED_AT", "decided_at"))  # fmt: skip
INTERVENTION_COLUMNS = (("PIPELINE_RUN_ID", "pipeline_run_id"), ("TASK_CODE", "task_code"), ("ACTION", "action"),
                        ("FROM_STATUS", "from_status"), ("TO_STATUS", "to_status"), ("REASON", "reason"),
                        ("REQUESTED_BY", "requested_by"), ("REQUESTED_AT", "requested_at"))  # fmt: skip
#: Only error messages and reasons are shortened in tables (``--format json`` has them whole).
CELL_WIDTHS = {"ERROR_MESSAGE": 60, "REASON": 60}


def _pipelines(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    """Every pipeline with its open pause and newest run."""
    doc = commands.pipelines(hook)
    if args.format == "json":
        return _print_json(doc, out)
    rows = [
        {
            **p,
            "paused": "yes" if p["pause"] else "no",
            "latest_run_id": (p["latest_run"] or {}).get("pipeline_run_id"),
            "latest_status": (p["latest_run"] or {}).get("status"),
            "latest_sla": (p["latest_run"] or {}).get("sla_status"),
        }
        for p in doc["pipelines"]
    ]
    print(_table(PIPELINE_COLUMNS, rows) if rows else "no pipelines in CFG_PIPELINES yet", file=out)
    return 0


def _status(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    """The pipeline, its open pause, and its IN-PROGRESS run (else its latest run) with all its details."""
    doc = commands.status(hook, args.pipeline)
    if args.format == "json":
        return _print_json(doc, out)
    print(_describe_pipeline(doc["pipeline"], doc["pause"]), file=out)
    run = doc["run"]
    if run is None:
        print(f"no runs of pipeline {doc['pipeline']['pipeline_code']} yet", file=out)
        return 0
    print(f"\n{'current' if run['status'] == 'IN-PROGRESS' else 'latest'} run", file=out)
    _print_runs([run], out)
    return 0


def _history(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    """The newest ``--limit`` runs of the pipeline (below ``--before``), newest first, with their details."""
    doc = commands.history(hook, args.pipeline, args.limit, args.before)
    if args.format == "json":
        return _print_json(doc, out)
    print(_describe_pipeline(doc["pipeline"], None), file=out)
    runs = doc["runs"]
    if not runs:
        print(f"no runs of pipeline {doc['pipeline']['pipeline_code']} yet", file=out)
        return 0
    print(f"\n{len(runs)} most recent run(s), newest first (--limit {args.limit})", file=out)
    _print_runs(runs, out)
    if doc["next_before"] is not None:
        print(f"\nolder runs: --before {doc['next_before']}", file=out)
    return 0


def _run(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    """One run by ``--id``, or the Engine run(s) of an Airflow DAG run by ``--dag-id`` and ``--run-id``."""
    if args.id is not None:
        doc = commands.run_by_id(hook, args.id)
    else:
        doc = commands.run_by_dag_run(hook, args.dag_id, args.run_id)
    if args.format == "json":
        return _print_json(doc, out)
    for found in doc["runs"]:
        print(_describe_pipeline(found["pipeline"], None), file=out)
        _print_runs([found["run"]], out)
    return 0


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
    """Runs, then their task runs, attempts, gate decisions and interventions, joined by PIPELINE_RUN_ID."""
    summaries = [
        {**run, "tasks": ", ".join(f"{n} {s}" for s, n in run["task_status_counts"].items()) or None}
        for run in runs
    ]

    def of_runs(key: str) -> list[dict[str, Any]]:
        return [{"pipeline_run_id": run["pipeline_run_id"], **item} for run in runs for item in run[key]]

    tasks = of_runs("task_runs")
    attempts = [
        {**attempt, "pipeline_run_id": task["pipeline_run_id"], "task_code": task["task_code"]}
        for task in tasks
        for attempt in task["attempts"]
    ]
    print(_table(RUN_COLUMNS, summaries), file=out)
    print(f"\ntask runs\n{_table(TASK_COLUMNS, tasks)}", file=out)
    print(f"\nattempts\n{_table(ATTEMPT_COLUMNS, attempts)}", file=out)
    for title, columns, key in (
        ("gate decisions", GATE_COLUMNS, "gate_decisions"),
        ("interventions", INTERVENTION_COLUMNS, "interventions"),
    ):
        items = of_runs(key)
        if items:
            print(f"\n{title}\n{_table(columns, items)}", file=out)


def _table(columns: Sequence[tuple[str, str]], items: list[dict[str, Any]]) -> str:
    if not items:
        return "(none)"
    rows = [[item[key] for _, key in columns] for item in items]
    return format_table([header for header, _ in columns], rows, max_width=None, widths=CELL_WIDTHS)


def _validate(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    """A ``[FAIL] <pipeline>: <problem>`` line per problem of the pipelines' dependency graphs, then what was
    checked; exit 1 when anything failed (a claim of that pipeline is refused), as etl-craft's ``validate``."""
    doc = commands.validate(hook, args.pipeline)
    status = 1 if doc["problems"] else 0
    if args.format == "json":
        _print_json(doc, out)
        return status
    for problem in doc["problems"]:
        print(f"[FAIL] {problem['pipeline_code']}: {problem['message']}", file=out)
    print(
        f"checked {doc['pipelines']} pipeline(s) and {doc['tasks']} task(s): {doc['failed']} failed", file=out
    )
    return status


def _pause(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    """Open a pause: claims skip their DAG runs, running runs start no new task, until resume."""
    doc = commands.pause(hook, args.pipeline, args.reason, args.by)
    print(
        f"pipeline {doc['pipeline_code']} paused by {doc['paused_by']} (pause {doc['pause_id']}): {doc['reason']}",
        file=out,
    )
    return 0


def _resume(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    doc = commands.resume(hook, args.pipeline, args.reason, args.by)
    print(
        f"pipeline {doc['pipeline_code']} resumed by {doc['resumed_by']} (pause {doc['pause_id']} by "
        f"{doc['paused_by']}, reason: {doc['reason'] or 'none given'})",
        file=out,
    )
    return 0


def _purge(hook: EngineDBHook, args: argparse.Namespace, out: TextIO) -> int:
    """Delete (or, with --dry-run, count) finished runs older than --older-than and their rows, in batches."""
    doc = commands.purge(
        hook,
        args.older_than,
        pipeline=args.pipeline,
        batch_size=args.batch_size,
        archive_dir=args.archive,
        dry_run=args.dry_run,
        by=args.by,
        kind=ActorKind.HUMAN,
    )
    if args.format == "json":
        return _print_json(doc, out)
    scope = f"pipeline {doc['pipeline_code']}" if doc["pipeline_code"] else "every pipeline"
    head = "dry run: would delete" if doc["dry_run"] else f"purge {doc['purge_id']} deleted"
    print(f"{head} runs of {scope} that ended before {doc['cutoff']} ({doc['batches']} batch(es))", file=out)
    rows = [{"table": _COUNT_TABLES[column], "rows": count} for column, count in doc["counts"].items()]
    print(_table((("TABLE", "table"), ("ROWS", "rows")), rows), file=out)
    print(
        f"{doc['runs_kept']} old run(s) kept: newest runs, runs gates still read, and runs they refer to",
        file=out,
    )
    if doc["interrupted_purges"]:
        print(f"continued interrupted purge(s) {', '.join(map(str, doc['interrupted_purges']))}", file=out)
    if doc["archive"]:
        print(
            f"archive: {doc['archive']} (JSON Lines per table and batch, checked by MANIFEST.sha256)",
            file=out,
        )
    return 0


_COUNT_TABLES = {
    "RUNS_DELETED": "AUD_PIPELINES_RUN_LOG", "TASK_RUNS_DELETED": "AUD_TASK_RUN_LOG",
    "ATTEMPTS_DELETED": "AUD_TASK_ATTEMPTS", "GATE_DECISIONS_DELETED": "AUD_GATE_DECISIONS",
    "CONSUMPTIONS_DELETED": "AUD_DEPENDENCY_CONSUMPTION", "PAUSES_DELETED": "AUD_PIPELINE_PAUSES",
    "INTERVENTIONS_DELETED": "AUD_RUN_INTERVENTIONS",
}  # fmt: skip


COMMANDS: dict[str, tuple[Command, str]] = {
    "init-db": (_init_db, "create the Engine tables (safe to repeat: an up-to-date Engine DB is left alone)"),
    "migrate": (_migrate, "init-db if needed, then apply packaged and project migrations in file-name order"),
    "check": (
        _check,
        "check the file, profile, each setting, secret, auth mode, connection, schema, tables and migrations; "
        "report every problem, exit 1 if any check failed",
    ),
    "pipelines": (_pipelines, "list every pipeline with its open pause and newest run"),
    "status": (
        _status,
        "show a pipeline, its open pause, and its running (else latest) run with task runs and attempts",
    ),
    "history": (_history, "show a pipeline's most recent runs, newest first, with task runs and attempts"),
    "run": (_run, "show one run by --id, or the Engine run of an Airflow DAG run by --dag-id and --run-id"),
    "validate": (
        _validate,
        "check the dependency graph of every active pipeline (or --pipeline); exit 1 on a problem",
    ),
    "pause": (_pause, "pause a pipeline: its DAG runs' claims skip, running runs start no new task"),
    "resume": (_resume, "end a pipeline's pause"),
    "purge": (
        _purge,
        "delete finished runs older than --older-than with their task runs, attempts, gate decisions and "
        "consumption, in short batches; keeps what gates still read (docs/retention.md)",
    ),
}
#: Commands that change a pipeline's pause: --pipeline, --reason, --by.
PAUSES = ("pause", "resume")
#: Commands that take the migrate lock, so --lock-timeout.
LOCKING = ("init-db", "migrate")
#: Read-only commands: no lock, so no --lock-timeout; --format instead.
RUN_VIEWS = ("pipelines", "status", "history", "run", "validate")
DEFAULT_HISTORY_LIMIT = commands.DEFAULT_PAGE
MAX_RUN_ID = MAX_LIMIT


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
    if name in ("status", "history"):
        cmd.add_argument(
            "--pipeline", required=True, type=_text, metavar="CODE", help="PIPELINE_CODE in CFG_PIPELINES"
        )
    if name == "validate":
        cmd.add_argument(
            "--pipeline",
            default=None,
            type=_text,
            metavar="CODE",
            help="check only this pipeline (default: every active one)",
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
        cmd.add_argument(
            "--before",
            type=_run_id,
            default=None,
            metavar="RUN_ID",
            help="only runs with a lower PIPELINE_RUN_ID (the next page: history prints the value to use)",
        )
    if name == "run":
        which = cmd.add_mutually_exclusive_group(required=True)
        which.add_argument("--id", type=_run_id, metavar="RUN_ID", help="PIPELINE_RUN_ID")
        which.add_argument("--dag-id", type=_text, metavar="DAG_ID", help="Airflow DAG id (with --run-id)")
        cmd.add_argument("--run-id", type=_text, metavar="RUN_ID", help="Airflow DAG run id (with --dag-id)")


def _age(text: str) -> timedelta:
    from airflow_provider_etl_craft.runs.purge import parse_age

    try:
        return parse_age(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _batch_size(text: str) -> int:
    from airflow_provider_etl_craft.runs.purge import MAX_BATCH_SIZE

    value = _at_least_one(text)
    if value > MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_BATCH_SIZE} runs per batch, got {value}")
    return value


def _add_purge_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--older-than",
        required=True,
        type=_age,
        metavar="AGE",
        help="delete runs that ended more than AGE ago: a number and a unit s, m, h, d or w (e.g. 90d)",
    )
    cmd.add_argument("--dry-run", action="store_true", help="count what would go; change nothing")
    cmd.add_argument(
        "--batch-size",
        type=_batch_size,
        default=None,
        metavar="N",
        help="at most N runs per batch (default 500); batches are sized to take about 0.25 s each",
    )
    cmd.add_argument(
        "--pipeline", type=_text, default=None, metavar="CODE", help="only runs of this PIPELINE_CODE"
    )
    cmd.add_argument(
        "--archive",
        type=_typed_path,
        default=None,
        metavar="DIR",
        help="write each batch's rows to DIR before deleting them (JSON Lines and a sha256 manifest)",
    )
    _add_by_argument(cmd, "AUD_ENGINE_PURGES")
    cmd.add_argument(
        "--format", choices=("table", "json"), default="table", help="table (default) or one JSON document"
    )  # fmt: skip


def _run_id(text: str) -> int:
    """A ``PIPELINE_RUN_ID``: a whole number from 1 to 2**63-1 (both engines' id range)."""
    value = _at_least_one(text)
    if value > MAX_RUN_ID:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_RUN_ID}, got {value}")
    return value


def _default_actor() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The ``etl-craft-airflow`` parser: the common options, then one sub-command per :data:`COMMANDS` entry."""
    common = _common_options()
    parser = argparse.ArgumentParser(
        prog="etl-craft-airflow",
        parents=[common],
        description="Administer an etl-craft Engine DB and inspect its runs outside Airflow.",
        epilog="Exit status: 0 ok, 1 failure (validate: a problem found), 2 usage, 3 configuration, 4 metadata, "
        "5 graph, 6 self dependency, 7 dependency cycle, 8 unknown task, 9 run state, "
        "12 Engine DB, 13 migration, 14 lock timeout, 20 stale transition. purge: 4 unknown --pipeline, "
        "9 another purge is running, 12 Engine DB not migrated to the latest ENGINE version.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        if name in RUN_VIEWS:
            _add_view_arguments(cmd, name)
        elif name == "purge":
            _add_purge_arguments(cmd)
        elif name in PAUSES:
            _add_pause_arguments(cmd)
        else:
            _add_schema_arguments(cmd, name)
    return parser


def _common_options() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name."""
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
    return common


def _add_pause_arguments(cmd: argparse.ArgumentParser) -> None:
    """pause / resume: which pipeline, why, and who."""
    cmd.add_argument(
        "--pipeline", required=True, type=_text, metavar="CODE", help="PIPELINE_CODE in CFG_PIPELINES"
    )
    cmd.add_argument("--reason", required=True, type=_text, help="why (stored in AUD_PIPELINE_PAUSES)")
    _add_by_argument(cmd)


def _add_by_argument(cmd: argparse.ArgumentParser, table: str | None = None) -> None:
    """--by: who asks (default: the login name), stored (in ``table``, where named) with kind HUMAN."""
    stored = f"stored in {table}" if table else "stored"
    cmd.add_argument(
        "--by",
        default=_default_actor(),
        type=_text,
        metavar="NAME",
        help=f"who (default: the login name; {stored} with kind HUMAN)",
    )


def _add_schema_arguments(cmd: argparse.ArgumentParser, name: str) -> None:
    """init-db, migrate, check and the other Engine DB commands: the migrate lock's wait, check's format, the migrations folder."""
    if name in LOCKING:
        cmd.add_argument(
            "--lock-timeout",
            type=_seconds,
            default=MIGRATE_LOCK_TIMEOUT,
            metavar="SECONDS",
            help=f"how long to wait for the migrate lock (default {MIGRATE_LOCK_TIMEOUT:g})",
        )
    if name == "check":
        cmd.add_argument(
            "--format",
            choices=("text", "json"),
            default="text",
            help="text: one [OK  ]/[WARN]/[FAIL] line per check and a summary (default); json: one document",
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


def _typed_path(value: str) -> str:
    """A path typed on the command line resolves against the working directory, as in every CLI.

    (Only paths written inside craft-connector.yml resolve beside that file.)
    """
    return str(Path(value).absolute()) if value else value


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status (the console script exits with it)."""
    out, err = out or sys.stdout, err or sys.stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "dag_id", None) is not None and not args.run_id:
        parser.error("run: --dag-id needs --run-id (the Airflow DAG run id)")
    if getattr(args, "id", None) is not None and getattr(args, "run_id", None) is not None:
        parser.error("run: --run-id goes with --dag-id, not with --id")
    hook = EngineDBHook.from_config(getattr(args, "config", None), getattr(args, "profile", None))
    command, _ = COMMANDS[args.command]
    verbose = getattr(args, "verbose", False)
    try:
        with commands.classified(hook):
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


def run() -> NoReturn:
    """The ``etl-craft-airflow`` console script: exits with :func:`main`'s status."""
    sys.exit(main())


if __name__ == "__main__":
    run()
