"""The resolved Engine profile: which database, which schema, which auth mode, with secrets kept out of repr."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from airflow_provider_etl_craft.auth import AUTH_MODES, NO_AUTH, AuthMode
from airflow_provider_etl_craft.config.load import NAME_KEY, PROFILE_KEYS, load_connector_file, refuse_unknown
from airflow_provider_etl_craft.config.locate import locate_config
from airflow_provider_etl_craft.config.secrets import Resolver, SecretsSource, beside_config, build_source
from airflow_provider_etl_craft.engine.url import (
    POSTGRES_PREFIX,
    SQLITE_PREFIX,
    PostgresTarget,
    SqliteTarget,
    Target,
    parse_jdbc_url,
)
from airflow_provider_etl_craft.errors import ConfigurationError

#: A plain identifier, as etl-craft checks a schema.
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A plain PostgreSQL identifier (at most 63 bytes); folded to lower case as PostgreSQL folds unquoted names.
SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: The schema of a SQLite profile that names none (etl-craft requires one; SQLite has only ``main``).
DEFAULT_SQLITE_SCHEMA = "main"
#: ``Name`` spellings etl-craft accepts (compared lower-cased) and the jdbc_url dialect each means.
ENGINE_NAMES = {"postgres": "postgresql", "postgresql": "postgresql", "sqlite": "sqlite"}
ENGINE_DISPLAY = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}
URL_DIALECTS = {SQLITE_PREFIX: "sqlite", POSTGRES_PREFIX: "postgresql"}
#: Text that reads like a variable name: an unset variable shows up this way.
_LOOKS_LIKE_A_VARIABLE = re.compile(r"^[A-Z][A-Z0-9]*_[A-Z0-9_]+$")


@dataclass(frozen=True)
class EngineProfile:
    """Everything needed to open Engine DB connections. ``secrets`` never appears in ``repr``.

    ``auth`` is the resolved mode (``NO_AUTH`` for SQLite); its name is ``auth.name``.
    """

    name: str
    origin: str
    setting_prefix: str
    target: Target
    schema: str
    auth: AuthMode
    user: str | None = None
    fields: Mapping[str, str] = field(default_factory=dict)
    #: Folder of craft-connector.yml (None for an inline Airflow connection): relative paths, migrations/.
    base_dir: Path | None = None
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def dialect_name(self) -> str:
        return self.target.dialect_name

    def setting(self, key: str) -> str:
        """Dotted name of one of this profile's settings, for messages (``Engine.prod.auth_mode``)."""
        return f"{self.setting_prefix}.{key}"

    def describe(self) -> str:
        return f"profile '{self.name}' ({self.target.describe()}, schema {self.schema}) from {self.origin}"


def load_engine_profile(config_path: str | Path | None = None, profile: str | None = None) -> EngineProfile:
    """Locate craft-connector.yml, pick the active Engine profile and resolve it as etl-craft does.

    :param config_path: explicit file; else ``$ETL_CRAFT_CONFIG``, else an upward search.
    :param profile: explicit profile name; else ``Engine.Profile``, ``Secrets.Profile``, or the only one.
    :raises ConfigurationError: any problem with the file or the active profile.
    """
    path = locate_config(config_path)
    connector = load_connector_file(path)
    source = build_source(connector.secrets, connector.base_dir, path)
    name = select_profile(connector.profiles, connector.engine, connector.secrets, source, profile, str(path))
    block = connector.profiles[name]
    prefix = f"Engine.{name}"
    # Only the active profile is checked: another environment's profile may hold what this one does not.
    refuse_unknown(path, prefix, block, PROFILE_KEYS | {NAME_KEY})
    # A section setting that the active profile sets too is overridden there; any other but Name is unknown.
    section_only = {k: v for k, v in connector.settings.items() if k not in block}
    refuse_unknown(path, "Engine", section_only, frozenset({NAME_KEY}))
    resolver = Resolver(source, name, str(path))
    declared = f"{prefix}.{NAME_KEY}" if NAME_KEY in block else f"Engine.{NAME_KEY}"
    written_name = block.get(NAME_KEY, connector.settings.get(NAME_KEY))
    settings = {k: v for k, v in block.items() if k != NAME_KEY}
    # As etl-craft: Name is checked once the jdbc_url names an engine, before the login settings are.
    url = resolver.value(f"{prefix}.jdbc_url", settings.get("jdbc_url"), "jdbc_url") or ""
    dialect = next((d for prefix_, d in URL_DIALECTS.items() if url.lower().startswith(prefix_)), None)
    if dialect:
        _check_name(resolver, declared, written_name, dialect, str(path))
    return build_profile(name, settings, resolver, str(path), prefix, connector.base_dir)


def _check_name(resolver: Resolver, setting: str, raw: object, dialect: str, origin: str) -> None:
    """``Name`` (Postgres, PostgreSQL or SQLite in any case, or a variable holding one) must match the jdbc_url."""
    written = resolver.text(setting, raw, NAME_KEY)
    if written is None:
        return
    if ENGINE_NAMES.get(written.lower()) != dialect:
        raise ConfigurationError(
            f"{origin}: {setting} is {Resolver.display(raw, written)}, but the jdbc_url is a "
            f"{ENGINE_DISPLAY[dialect]} URL; write Name: {ENGINE_DISPLAY[dialect]} (in any case: "
            f"{', '.join(ENGINE_NAMES)}), or remove Name"
        )


def select_profile(
    profiles: Mapping[str, Any],
    engine: Mapping[str, Any],
    secrets: Mapping[str, Any],
    source: SecretsSource,
    explicit: str | None,
    origin: str,
) -> str:
    """Choose the active profile: explicit, ``Engine.Profile``, ``Secrets.Profile``, or the only one.

    ``Engine.Profile`` and ``Secrets.Profile`` are text or the name of a variable; a name no variable defines
    is used as written, so an unset ``ETL_CRAFT_PROFILE`` selects a profile of that name (and fails naming it).
    """
    plain = Resolver(source, None, origin)
    # Both are read (and so checked) even when the first decides, as etl-craft reads them.
    by_secrets = plain.text("Secrets.Profile", secrets.get("Profile"))
    by_engine = plain.text("Engine.Profile", engine.get("Profile"))
    chosen, where, written = explicit, "the requested profile", explicit
    if not chosen and by_engine:
        chosen, where, written = by_engine, "Engine.Profile", engine["Profile"]
    elif not chosen and by_secrets:
        chosen, where, written = by_secrets, "Secrets.Profile", secrets["Profile"]
    if not profiles:
        raise ConfigurationError(
            f"{origin}: Engine has no profiles; add one, e.g. Engine: {{dev: {{jdbc_url: …}}}}"
        )
    listed = ", ".join(sorted(map(str, profiles)))
    if not chosen:
        if len(profiles) == 1:
            return next(iter(profiles))
        raise ConfigurationError(
            f"{origin}: no Engine profile selected and there are several ({listed}); set Engine.Profile, "
            "Secrets.Profile (or the variable it names), or pass --profile"
        )
    if chosen not in profiles:
        raise ConfigurationError(
            f"{origin}: {where} selects profile '{chosen}'{_via(written, chosen)}, which does not exist; "
            f"profiles: {listed}"
        )
    return chosen


def _via(written: object, resolved: str) -> str:
    # Profile names are not secrets: show the name, and the variable it came from.
    if not isinstance(written, str) or written.strip() != resolved:
        return f" (from variable {written})"
    if _LOOKS_LIKE_A_VARIABLE.fullmatch(resolved):
        return f" (no variable {resolved} is set, so the text itself was used)"
    return ""


def build_profile(
    name: str,
    settings: Mapping[str, Any],
    resolver: Resolver,
    origin: str,
    prefix: str,
    base_dir: Path | None,
    secret_values: Mapping[str, str] | None = None,
) -> EngineProfile:
    """Validate one profile's settings and resolve them into an :class:`EngineProfile`.

    Keys the auth mode does not use are accepted and ignored, as etl-craft does; a ``secret`` beside a
    PostgreSQL mode that takes none must still name a set variable (etl-craft checks it).

    :param secret_values: secrets given directly (an inline Airflow connection's password) instead of
        variable names to look up.
    """

    def setting(key: str) -> str:
        return f"{prefix}.{key}"

    def value(key: str) -> str | None:
        return resolver.value(setting(key), settings.get(key), key)

    url = value("jdbc_url")
    if not url:
        raise ConfigurationError(
            f"{origin}: {setting('jdbc_url')} is required, e.g. jdbc:sqlite:engine/etl-craft.db"
        )
    target = parse_jdbc_url(url, f"{origin}: {setting('jdbc_url')}", base_dir)
    schema_raw = value("schema")
    auth_raw = value("auth_mode")
    common = partial(
        EngineProfile, name=name, origin=origin, setting_prefix=prefix, target=target, base_dir=base_dir
    )
    if isinstance(target, SqliteTarget):
        return _sqlite_profile(common, settings, schema_raw, auth_raw, origin, setting)
    assert isinstance(target, PostgresTarget)
    schema = _schema(schema_raw, origin, setting("schema"))
    mode = _auth_mode(
        auth_raw, Resolver.display(settings.get("auth_mode"), auth_raw), origin, setting("auth_mode")
    )
    stray = sorted(k for k in (secret_values or {}) if k not in mode.secret_keys)
    if stray:
        raise ConfigurationError(
            f"{origin}: auth_mode '{mode.name}' takes no stored secret, but a password is set; clear the password "
            f"field (the mode's credentials come from {', '.join(mode.keys)})"
        )
    if settings.get("secret") is not None and "secret" not in mode.keys:
        resolver.secret(setting("secret"), settings["secret"])  # checked as etl-craft checks it, then unused
    secrets: dict[str, str] = {}
    fields: dict[str, str] = {}
    for key in mode.keys:
        given = (secret_values or {}).get(key)
        if key in mode.secret_keys:
            if given:
                secrets[key] = given
            elif settings.get(key) is not None:
                secrets[key] = resolver.secret(setting(key), settings[key], key)
            elif key in mode.required_keys:
                raise ConfigurationError(f"{origin}: {setting(key)} is required by auth_mode '{mode.name}'")
            continue
        found = value(key)
        if not found:
            if key in mode.required_keys:
                raise ConfigurationError(f"{origin}: {setting(key)} is required by auth_mode '{mode.name}'")
            continue
        if key in mode.path_keys:
            found = str(beside_config(found, base_dir or Path.cwd()))
        fields[key] = found
    user = fields.pop("user", None)
    return common(schema=schema, auth=mode, user=user, fields=fields, secrets=secrets)


def _sqlite_profile(
    common: Callable[..., EngineProfile],
    settings: Mapping[str, Any],
    schema_raw: str | None,
    auth_raw: str | None,
    origin: str,
    setting: Callable[[str], str],
) -> EngineProfile:
    if auth_raw and auth_raw != "none":  # absent or empty: none, the only mode SQLite has
        raise ConfigurationError(
            f"{origin}: {setting('auth_mode')} is {Resolver.display(settings.get('auth_mode'), auth_raw)}, but SQLite "
            "takes no auth_mode; remove it "
            "(or write 'none')"
        )
    # user, secret and the modes' keys mean nothing to SQLite: etl-craft ignores them unread, and so does this.
    schema = schema_raw or DEFAULT_SQLITE_SCHEMA
    if not IDENTIFIER.fullmatch(schema):
        raise ConfigurationError(
            f"{origin}: {setting('schema')} must be a plain identifier (conventionally 'main')"
        )
    return common(schema=schema, auth=NO_AUTH)


def _schema(raw: str | None, origin: str, setting: str) -> str:
    if not raw:
        raise ConfigurationError(
            f"{origin}: {setting} is required for PostgreSQL: the existing schema that holds the Engine tables"
        )
    if not SCHEMA_NAME.fullmatch(raw):
        raise ConfigurationError(
            f"{origin}: {setting} must be a plain identifier (letters, digits, _; not starting with a digit; "
            "at most 63 characters)"
        )
    return raw.lower()


def _auth_mode(raw: str | None, shown: str, origin: str, setting: str) -> AuthMode:
    if not raw:
        raise ConfigurationError(
            f"{origin}: {setting} is required for PostgreSQL; use one of {', '.join(sorted(AUTH_MODES))}"
        )
    if raw in AUTH_MODES:
        return AUTH_MODES[raw]
    raise ConfigurationError(
        f"{origin}: {setting} {shown} is not an auth mode; use one of {', '.join(sorted(AUTH_MODES))}"
    )
