"""The checks of ``etl-craft-airflow check``: every problem of an Engine setup at once, as etl-craft's ``doctor``.

Each check names what it looked at and says ``OK``, ``WARN`` (it works, but look at this) or ``FAIL`` (this
stops runs). Unlike a command, the checks do not stop at the first problem: the file, the secrets source, the
profile, each setting, the secret, the auth mode, the Engine DB kind, then the connection, the schema, the
tables and the migrations. A check that cannot run because one it needs failed is still listed, as ``FAIL``
with a message starting ``not checked:`` and naming that check: etl-craft's doctor has exactly these three
statuses and one summary of them, and a check that did not run has not passed (docs/check.md).

The CLI renders the list; ``EngineDBHook.test_connection`` runs the Engine DB part (:func:`engine_db_checks`).
Messages never hold a secret: a value that came from a variable is named by its variable only.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_etl_craft.auth import AUTH_KEYS, AuthMode, keys_in
from airflow_provider_etl_craft.config.load import ConnectorFile, load_connector_file
from airflow_provider_etl_craft.config.locate import locate_config
from airflow_provider_etl_craft.config.profile import (
    EngineProfile,
    ProfileSettings,
    active_profile,
    refuse_unknown_keys,
    select_profile,
)
from airflow_provider_etl_craft.config.secrets import Resolver, SecretsSource, SettingSource, build_source
from airflow_provider_etl_craft.engine.dialects import EngineDialect, dialect_for
from airflow_provider_etl_craft.engine.url import PostgresTarget, Target
from airflow_provider_etl_craft.errors import ConfigurationError, EtlCraftError

if TYPE_CHECKING:
    from airflow_provider_etl_craft.engine.migrations import MigrationFile
    from airflow_provider_etl_craft.engine.schema import SchemaState


class Status(enum.Enum):
    """What a check found; the text form is etl-craft's ``[OK  ]``, ``[WARN]``, ``[FAIL]``."""

    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Check:
    """One thing ``check`` looked at, and what it found."""

    name: str
    status: Status
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status.value, "message": self.message}


def ok(name: str, message: str) -> Check:
    return Check(name, Status.OK, message)


def warn(name: str, message: str) -> Check:
    return Check(name, Status.WARN, message)


def fail(name: str, message: str) -> Check:
    return Check(name, Status.FAIL, message)


def not_checked(names: Sequence[str], because: str) -> list[Check]:
    """Checks that could not run: ``because`` names the failed check they need."""
    return [fail(name, f"not checked: {because}") for name in names]


#: Auth modes run against a live server by this provider's tests (SQLite's ``none`` has nothing to run).
VERIFIED_AUTH_MODES = frozenset({"none", "password", "key_file"})
#: Why each other mode is only as good as the vendor's documentation; ``check`` warns when one is in use.
UNVERIFIED_AUTH_MODES = {
    "token": "the token is checked here only as a PostgreSQL password, never by a pooler or proxy that issues "
    "such tokens",
    "oauth": "the token endpoint in the tests is a stand-in, not a real identity provider",
    "sso": "a device-flow login someone completes in a browser: meant for interactive use, no unattended "
    "worker can complete it, and no test does",
    "sts": "the RDS IAM token is signed with test credentials; no live RDS instance has accepted one here",
}

SETTINGS_CHECK = "Settings"
SECRET_CHECK = "Engine DB secret"
AUTH_CHECK = "Engine DB auth"
KIND_CHECK = "Engine DB kind"
CONNECTION_CHECK = "Engine DB connection"
SCHEMA_CHECK = "Engine DB schema"
TABLES_CHECK = "Engine DB tables"
MIGRATIONS_CHECK = "Engine DB migrations"
ENGINE_DB_CHECKS = (CONNECTION_CHECK, SCHEMA_CHECK, TABLES_CHECK, MIGRATIONS_CHECK)
#: Every check that needs the active profile's settings, in the order they are listed.
PROFILE_CHECKS = (SETTINGS_CHECK, SECRET_CHECK, AUTH_CHECK, KIND_CHECK, *ENGINE_DB_CHECKS)


def summary(checks: Sequence[Check]) -> dict[str, int]:
    """How many checks found each status: ``ok``, ``warning``, ``failed``."""
    return {
        key: sum(1 for c in checks if c.status is status)
        for key, status in (("ok", Status.OK), ("warning", Status.WARN), ("failed", Status.FAIL))
    }


def summary_line(checks: Sequence[Check]) -> str:
    """etl-craft's last line: ``N ok, N warning(s), N failed``."""
    counts = summary(checks)
    return f"{counts['ok']} ok, {counts['warning']} warning(s), {counts['failed']} failed"


def exit_status(checks: Sequence[Check]) -> int:
    """1 when any check failed, else 0: warnings do not change it (as etl-craft's doctor)."""
    return 1 if any(c.status is Status.FAIL for c in checks) else 0


# -- the whole setup -----------------------------------------------------------------------------------------


def run_checks(
    config_path: str | Path | None = None,
    profile: str | None = None,
    migrations_dir: str | Path | None = None,
) -> list[Check]:
    """Check a craft-connector.yml Engine setup end to end and return every finding, failures included.

    :param config_path: ``--config``; else ``$ETL_CRAFT_CONFIG``, else an upward search.
    :param profile: ``--profile``; else ``Engine.Profile``, ``Secrets.Profile``, or the only profile.
    :param migrations_dir: ``--migrations-dir`` for the project migrations.
    """
    rest = ("Secrets source", "Engine profile", *PROFILE_CHECKS)
    try:
        path = locate_config(config_path)
        connector = load_connector_file(path)
    except EtlCraftError as exc:
        return [fail("Configuration", str(exc)), *not_checked(rest, "needs Configuration, which failed")]
    checks = [ok("Configuration", f"{path} found and parsed")]
    try:
        source = build_source(connector.secrets, connector.base_dir, path)
    except EtlCraftError as exc:
        return [
            *checks,
            fail("Secrets source", str(exc)),
            *not_checked(rest[1:], "needs Secrets source, which failed"),
        ]
    checks.append(ok("Secrets source", _describe_source(source)))
    selectors = Resolver(source, None, str(path))
    try:
        name = select_profile(connector, source, profile, plain=selectors)
    except EtlCraftError as exc:
        return [
            *checks,
            fail("Engine profile", str(exc)),
            *not_checked(PROFILE_CHECKS, "needs Engine profile, which failed"),
        ]
    chosen = _profile_check(name, profile, selectors, connector)
    checks.append(chosen)
    steps = active_profile(connector, name, source)
    found, resolved = _settings(name, steps)
    checks += found
    if chosen.status is Status.FAIL:  # a key the profile may not hold: its settings are still checked
        return [*checks, *not_checked(ENGINE_DB_CHECKS, "needs Engine profile, which failed")]
    if resolved is None:
        return [*checks, *not_checked(ENGINE_DB_CHECKS, "needs every setting of the profile, and one failed")]
    return [*checks, *engine_db_checks(dialect_for(resolved), migrations_dir)]


def _describe_source(source: SecretsSource) -> str:
    if source.kind == "file":
        return f"the .env file {source.location} (Secrets.Source_type: file)"
    if source.kind == "airflow":
        return "Airflow Variables and Airflow's secrets backend (Secrets.Source_type: airflow)"
    return "the process environment (Secrets.Source_type: environment)"


def _profile_check(name: str, explicit: str | None, selectors: Resolver, connector: ConnectorFile) -> Check:
    """The active profile, what chose it, and whether it holds only keys a profile may hold.

    ``--profile`` decides first, then ``Engine.Profile``, then ``Secrets.Profile``; both selectors are read
    either way. A selector that did not decide but names a variable that is not set is a warning: where it
    decides, its text selects a profile of that name.
    """
    read = selectors.sources
    decided = None if explicit else read.get("Engine.Profile", read.get("Secrets.Profile"))
    if explicit:
        how = "--profile"
    elif decided is not None:
        how = decided.setting + (f" (from variable {decided.variable})" if decided.variable else "")
    else:
        how = "being the only profile"
    text = f"'{name}', chosen by {how}"
    try:
        refuse_unknown_keys(connector, name)
    except EtlCraftError as exc:
        return fail("Engine profile", f"{text}; {exc}")
    missing = [
        s
        for s in read.values()
        if s is not decided and s.looks_like_a_missing_variable and s.written not in connector.profiles
    ]
    if not missing:
        return ok("Engine profile", text)
    named = "; ".join(
        f"{s.setting} names variable {s.written}, which is not set in the {selectors.source.kind} secrets source: "
        f"where it decides, it selects a profile '{s.written}', which does not exist"
        for s in missing
    )
    return warn("Engine profile", f"{text}; {named}: set the variable, or fix the name")


def _settings(name: str, steps: ProfileSettings) -> tuple[list[Check], EngineProfile | None]:
    """One line per setting of the profile, then the secret, auth mode and Engine DB kind.

    :returns: the lines, and the resolved profile when every setting is valid (else None).
    """
    lines = _SettingLines(steps)
    target = _target(lines)
    # The keys an auth mode may take that the profile sets: unknown until its auth_mode is known.
    written_keys = [
        steps.setting(k)
        for k in AUTH_KEYS
        if steps.settings.get(k) is not None and k not in keys_in("password")
    ]  # the secret has its own line
    if target is None:
        rest = (steps.setting("schema"), steps.setting("auth_mode"), *written_keys, *PROFILE_CHECKS[1:4])
        return [*lines.checks, *not_checked(rest, f"needs {steps.setting('jdbc_url')}, which failed")], None
    with lines.setting(steps.setting("schema")):
        steps.schema(target)
    mode = _auth_mode(lines, target)
    if mode is None:
        because = f"needs {steps.setting('auth_mode')}, which failed"
        return [
            *lines.checks,
            *not_checked([*written_keys, *PROFILE_CHECKS[1:3]], because),
            _kind(target),
        ], None
    for key in mode.keys:
        if key in mode.secret_keys or (key not in mode.required_keys and steps.settings.get(key) is None):
            continue
        with lines.setting(steps.setting(key)):
            steps.key(mode, key)
    checks = [*lines.checks, _secret(steps, mode, target)]
    valid = lines.valid and checks[-1].status is not Status.FAIL
    checks += [_auth(mode, target), _kind(target)]
    return checks, steps.profile(name) if valid else None


class _SettingLines:
    """The lines of a profile's settings, one per setting whose step ran in :meth:`setting`'s block."""

    def __init__(self, steps: ProfileSettings) -> None:
        self.steps = steps
        self.checks: list[Check] = []
        self.valid = True  # no setting failed

    @contextmanager
    def setting(self, where: str) -> Iterator[list[str]]:
        """Append the line of the setting whose step runs in the block; the block may add how to show it."""
        shown: list[str] = []
        try:
            yield shown
        except EtlCraftError as exc:
            self.valid = False
            self.checks.append(fail(where, str(exc) + _hint(self.steps.resolver, where)))
            return
        source = self.steps.resolver.sources.get(where)
        self.checks.append(_setting_line(where, source, shown[0] if shown else None, self.steps.resolver))


def _target(lines: _SettingLines) -> Target | None:
    """The ``jdbc_url`` line (and the ``Name`` line, when written): the Engine DB, None when it failed."""
    steps = lines.steps
    target: Target | None = None
    with lines.setting(steps.setting("jdbc_url")) as shown:
        target = steps.target()
        shown.append(target.describe())  # host, port and database (credentials are refused in the URL)
    if steps.name_setting is not None and steps.written_name is not None:
        checked: str | None = None
        with lines.setting(steps.name_setting):
            checked = steps.engine_name()
        if checked is None and lines.checks[-1].status is not Status.FAIL:  # the jdbc_url names no engine
            lines.checks[-1:] = not_checked(
                [steps.name_setting], f"needs {steps.setting('jdbc_url')}, which failed"
            )
    return target


def _auth_mode(lines: _SettingLines, target: Target) -> AuthMode | None:
    """The ``auth_mode`` line (saying which written keys it ignores, as etl-craft does): the mode, or None."""
    steps = lines.steps
    mode: AuthMode | None = None
    with lines.setting(steps.setting("auth_mode")):
        mode = steps.auth_mode(target)
    if mode is not None and steps.ignored_keys(mode):
        last = lines.checks[-1]
        lines.checks[-1] = warn(
            last.name, f"{last.message}; {_ignored(steps.ignored_keys(mode), mode, target)}"
        )
    return mode


def _setting_line(where: str, source: SettingSource | None, shown: str | None, resolver: Resolver) -> Check:
    """A setting that resolved: from which variable (its value not shown), or the text as written."""
    if source is None:  # not written: the default applies
        return ok(where, "not set: the default applies")
    if source.variable:
        return ok(where, f"from variable {source.variable} (value not shown)")
    text = f"{shown or repr(source.written)}, as written"
    if source.looks_like_a_missing_variable:
        twin = (
            f" (nor its profile twin {source.twin})" if source.twin and source.twin != source.written else ""
        )
        return warn(
            where,
            f"{text}, but it reads like a variable name: no variable {source.written}{twin} is set in the "
            f"{resolver.source.kind} secrets source, so the text itself is the value; set the variable, or write "
            "the value you mean",
        )
    return ok(where, text)


def _ignored(settings: Sequence[str], mode: AuthMode, target: Target) -> str:
    """Why settings the profile holds are not used: the auth mode takes none of them (SQLite takes none at all)."""
    listed = ", ".join(settings)
    verb, them = ("is", "it") if len(settings) == 1 else ("are", "them")
    if not isinstance(target, PostgresTarget):
        return f"{listed} {verb} not used by a SQLite Engine DB and ignored, as etl-craft ignores {them}; remove {them}"
    return (
        f"{listed} {verb} not used by auth_mode '{mode.name}' (it takes {', '.join(mode.keys)}) and ignored, as "
        f"etl-craft ignores {them}; remove {them}, or set the auth_mode that takes {them}"
    )


def _hint(resolver: Resolver, where: str) -> str:
    """Why a wrong value may be a missing variable: it was used as written, and reads like a variable name."""
    source = resolver.sources.get(where)
    if source is None or not source.looks_like_a_missing_variable:
        return ""
    return (
        f" (no variable {source.written} is set in the {resolver.source.kind} secrets source, so the text was "
        "used as written)"
    )


def _secret(steps: ProfileSettings, mode: AuthMode, target: Target) -> Check:
    """The secret the auth mode presents: its variable is set and not empty (the value is never shown)."""
    if not isinstance(target, PostgresTarget):
        return ok(SECRET_CHECK, "none: a SQLite Engine DB has nothing to log in with")
    try:
        steps.unused_secret(target, mode)  # a secret the mode does not take must still name a set variable
    except EtlCraftError as exc:
        return fail(SECRET_CHECK, str(exc))
    if not mode.secret_keys:
        return ok(SECRET_CHECK, f"none: auth_mode {mode.name} presents no stored secret")
    found = []
    for key in mode.secret_keys:
        where = steps.setting(key)
        try:
            value = steps.key(mode, key)
        except EtlCraftError as exc:
            return fail(SECRET_CHECK, str(exc))
        if value is None:
            found.append(f"{where} not set (optional for auth_mode {mode.name})")
            continue
        source = steps.resolver.sources[where]
        found.append(f"{where} resolved from {source.variable} (value not shown)")
    return ok(SECRET_CHECK, "; ".join(found))


def _auth(mode: AuthMode, target: Target) -> Check:
    """A warning for an auth mode not run against a live server here, saying why."""
    if not isinstance(target, PostgresTarget):
        return ok(AUTH_CHECK, "none: a SQLite Engine DB is a file; its permissions are the access control")
    if mode.name in VERIFIED_AUTH_MODES:
        return ok(AUTH_CHECK, f"auth_mode {mode.name}, verified against a live PostgreSQL server")
    return warn(
        AUTH_CHECK,
        f"auth_mode {mode.name} follows the vendor's documentation but has not been verified against a live "
        f"service here ({UNVERIFIED_AUTH_MODES[mode.name]}): it can be used, but success is not guaranteed",
    )


def _kind(target: Target) -> Check:
    """SQLite is one file on one machine: a warning when Airflow's default executor runs tasks elsewhere."""
    if isinstance(target, PostgresTarget):
        return ok(KIND_CHECK, "PostgreSQL: one database that workers on every machine share")
    from airflow_provider_etl_craft.operators._topology import SAME_MACHINE_EXECUTORS, task_executor

    executor = task_executor(None)
    if executor in SAME_MACHINE_EXECUTORS:
        return ok(
            KIND_CHECK,
            f"SQLite suits one machine, and Airflow's executor here is {executor}; its writes are serialized: "
            "use PostgreSQL in production",
        )
    return warn(
        KIND_CHECK,
        f"SQLite suits one machine, but Airflow's default executor here ([core] executor) is {executor}, which "
        "runs tasks on other machines: claims of such tasks are refused. Use a PostgreSQL Engine DB, or "
        f"run the DAGs with {' or '.join(sorted(SAME_MACHINE_EXECUTORS))}",
    )


def _reached(dialect: EngineDialect, conn: Any) -> str:
    """On PostgreSQL, which server the session is on and that it is the primary (a multi-host URL names
    several); a standby is refused, since the provider writes on every step."""
    from airflow_provider_etl_craft.engine.dialects.postgresql import PostgresDialect

    if not isinstance(dialect, PostgresDialect):
        return ""
    with dialect.classified(conn):
        server, standby = dialect.reached(conn)
    if standby:
        raise ConfigurationError(
            f"{dialect.describe()} reached {server}, a standby (in recovery), which accepts no writes, and the "
            "provider writes on every step; point jdbc_url at the primary (with several hosts: "
            "targetServerType=primary)"
        )
    return f"; reached {server}, the primary"


# -- the Engine DB -------------------------------------------------------------------------------------------


def engine_db_checks(dialect: EngineDialect, migrations_dir: str | Path | None = None) -> list[Check]:
    """Connection, schema, tables and migrations of one Engine DB; the same list ``test_connection`` judges.

    Each needs the one before it: after a failure the rest are listed as not checked.
    """
    from airflow_provider_etl_craft.engine.schema import ENGINE_TABLES

    try:
        with dialect.classified():
            conn = dialect.login()
    except EtlCraftError as exc:
        return _failed_at([], str(exc))
    checks: list[Check] = []
    with closing(conn):
        try:  # one step per name of ENGINE_DB_CHECKS, in order: the first to fail is the one after ``checks``
            checks.append(_connection_check(dialect, conn))
            checks.append(_schema_check(dialect, conn))
            state = _tables(dialect, conn)
            checks.append(ok(TABLES_CHECK, f"all {len(ENGINE_TABLES)} Engine tables present"))
            pending, folder = _pending(dialect, conn, state, migrations_dir)
        except (EtlCraftError, _CheckFailed) as exc:
            return _failed_at(checks, str(exc))
    if pending:
        return _failed_at(
            checks,
            f"{len(pending)} pending: {', '.join(p.label for p in pending)}; apply with "
            "`etl-craft-airflow migrate` or EngineInitDbOperator(apply_migrations=True)",
        )
    return [*checks, ok(MIGRATIONS_CHECK, f"none pending (packaged ENGINE migrations, {folder})")]


class _CheckFailed(Exception):
    """A check of the Engine DB found what it looks for wrong (not an error of the Engine DB)."""


def _failed_at(checks: list[Check], message: str) -> list[Check]:
    """``checks``, then the failure of the Engine DB check after them, then the rest as not checked."""
    name = ENGINE_DB_CHECKS[len(checks)]
    rest = ENGINE_DB_CHECKS[len(checks) + 1 :]
    return [*checks, fail(name, message), *not_checked(rest, f"needs {name}, which failed")]


def _connection_check(dialect: EngineDialect, conn: Any) -> Check:
    """Who logged in where (on PostgreSQL: the server reached, which must be the primary)."""
    who = f" as {dialect.profile.user}" if dialect.profile.user else ""
    return ok(CONNECTION_CHECK, f"{dialect.describe()}{who}{_reached(dialect, conn)}")


def _schema_check(dialect: EngineDialect, conn: Any) -> Check:
    """The profile's schema exists, and transactions resolve names in it."""
    with dialect.classified(conn):
        dialect.require_schema(conn)
        dialect.verify_schema(conn)
    profile = dialect.profile
    if isinstance(profile.target, PostgresTarget):
        return ok(SCHEMA_CHECK, f"{profile.schema} exists and transactions resolve names in it")
    return ok(SCHEMA_CHECK, f"{profile.schema}: a SQLite file is its own schema")


def _tables(dialect: EngineDialect, conn: Any) -> SchemaState:
    """The Engine tables' state, when all are present.

    :raises _CheckFailed: none or only some are.
    """
    from airflow_provider_etl_craft.engine.schema import Verdict, schema_state

    with dialect.classified(conn):
        state = schema_state(dialect, conn)
    if state.verdict is Verdict.EMPTY:
        raise _CheckFailed(
            f"{state.where} holds no Engine tables yet; create them with `etl-craft-airflow init-db` or "
            "an EngineInitDbOperator task"
        )
    if state.verdict is Verdict.PARTIAL:
        raise _CheckFailed(str(state.problem()))
    return state


def _pending(
    dialect: EngineDialect, conn: Any, state: SchemaState, migrations_dir: str | Path | None
) -> tuple[list[MigrationFile], str]:
    """The migrations still to apply, and which folder's PROJECT migrations were judged (as said on the line).

    :raises _CheckFailed: a shared Engine DB that lacks the packaged schema's own ledger row.
    """
    from airflow_provider_etl_craft.engine.migrations import (
        find_migrations_dir,
        migration_files,
        pending_migrations,
    )
    from airflow_provider_etl_craft.engine.schema import SCHEMA_VERSION

    if state.shared and SCHEMA_VERSION not in state.applied:
        raise _CheckFailed(str(state.problem()))
    with dialect.classified(conn):
        project_dir = find_migrations_dir(migrations_dir, dialect.profile.base_dir)
        judged = frozenset({"ENGINE", "PROJECT"} if project_dir else {"ENGINE"})
        files = migration_files(dialect.name, project_dir, state.shared)
        pending = pending_migrations(dialect, conn, files, sources=judged, shared=state.shared)
    folder = (
        f"project migrations from {project_dir}"
        if project_dir
        else "PROJECT migrations not judged: no migrations folder is known (--migrations-dir, "
        "$ETL_CRAFT_MIGRATIONS_DIR or migrations/ beside craft-connector.yml)"
    )
    return list(pending), folder


__all__ = [
    "Check",
    "Status",
    "engine_db_checks",
    "exit_status",
    "run_checks",
    "summary",
    "summary_line",
]
