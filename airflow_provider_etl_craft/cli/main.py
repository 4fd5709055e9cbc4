"""``etl-craft-airflow``: init-db, migrate and check outside Airflow; exit statuses per SPEC §11."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from typing import TextIO

from airflow_provider_etl_craft import __version__
from airflow_provider_etl_craft.errors import EtlCraftError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

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
    from airflow_provider_etl_craft.engine.schema import ENGINE_TABLES

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
        line(" OK ", f"schema: {profile.schema}")
        present = engine.table_names(conn) & ENGINE_TABLES
        if not present:
            line("WARN", "tables: no Engine tables yet; run `etl-craft-airflow init-db`")
            return 0
        if present != ENGINE_TABLES:
            line("FAIL", f"tables: partial Engine schema, missing {', '.join(sorted(ENGINE_TABLES - present))}")
            return 12
        line(" OK ", f"tables: all {len(ENGINE_TABLES)} Engine tables present")
        with _stage("migrations"):
            project_dir = find_migrations_dir(args.migrations_dir, profile.base_dir)
            pending = pending_migrations(engine, conn, migration_files(engine.name, project_dir))
    if pending:
        line("WARN", f"migrations: {len(pending)} pending ({', '.join(p.label for p in pending)}); run `migrate`")
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


COMMANDS: dict[str, tuple[Command, str]] = {
    "init-db": (_init_db, "create the Engine tables (safe to repeat: an up-to-date Engine DB is left alone)"),
    "migrate": (_migrate, "init-db if needed, then apply packaged and project migrations in file-name order"),
    "check": (_check, "check settings, secrets, connection, schema, tables and pending migrations"),
}


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS,
                        help="craft-connector.yml (default: $ETL_CRAFT_CONFIG, else search upwards from here)")
    common.add_argument("--profile", metavar="NAME", default=argparse.SUPPRESS,
                        help="Engine profile (default: Engine.Profile, Secrets.Profile, or the only one)")  # fmt: skip
    parser = argparse.ArgumentParser(
        prog="etl-craft-airflow", parents=[common],
        description="Administer an etl-craft Engine DB outside Airflow.",
        epilog="Exit status: 0 ok, 1 failure, 2 usage, 3 configuration, 4 metadata, 9 run state, "
               "12 Engine DB, 13 migration, 14 lock timeout, 20 stale transition.",
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        cmd.add_argument("--lock-timeout", type=float, default=300.0, metavar="SECONDS",
                         help="how long to wait for the migrate lock (default 300)")  # fmt: skip
        if name in ("migrate", "check"):
            cmd.add_argument("--migrations-dir", metavar="DIR", default=None,
                             help="project migrations (default: $ETL_CRAFT_MIGRATIONS_DIR, else migrations/ "
                                  "beside craft-connector.yml)")  # fmt: skip
        else:
            cmd.set_defaults(migrations_dir=None)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status (the console script exits with it)."""
    out, err = out or sys.stdout, err or sys.stderr
    args = build_parser().parse_args(argv)
    hook = EngineDBHook.from_config(getattr(args, "config", None), getattr(args, "profile", None))
    command, _ = COMMANDS[args.command]
    try:
        return command(hook, args, out)
    except EtlCraftError as exc:
        print(f"error: {exc}", file=err)
        return exc.exit_code


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
