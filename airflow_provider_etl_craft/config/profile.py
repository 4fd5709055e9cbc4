"""The resolved Engine profile: which database, which schema, which auth mode, with secrets kept out of repr."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from msgspec import Struct, field

from airflow_provider_etl_craft.auth.base import NO_AUTH, AuthMode
from airflow_provider_etl_craft.config.load import (
    NAME_KEY,
    TARGET_KEYS,
    ConnectorFile,
    load_connector_file,
    profile_keys,
    refuse_unknown,
)
from airflow_provider_etl_craft.config.locate import locate_config
from airflow_provider_etl_craft.config.secrets import (
    LOOKS_LIKE_A_VARIABLE,
    Resolver,
    SecretsSource,
    beside_config,
    build_source,
)
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


class EngineProfile(Struct, frozen=True):
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
    secrets: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__struct_fields__ if n != "secrets")
        return f"{type(self).__name__}({shown})"

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
    name = select_profile(connector, source, profile)
    refuse_unknown_keys(connector, name)
    return active_profile(connector, name, source).profile(name)


def refuse_unknown_keys(connector: ConnectorFile, name: str) -> None:
    """Refuse a key the active profile, or the Engine section, may not hold.

    Only the active profile is checked: another environment's profile may hold what this one does not. A section
    setting that the active profile sets too is overridden there; any other but ``Name`` is unknown.

    :raises ConfigurationError: naming the unknown keys and where they are.
    """
    block = connector.profiles[name]
    known = TARGET_KEYS | {NAME_KEY}
    if not known.issuperset(block):  # keys beyond the target's: the auth modes' are known too
        known |= profile_keys()
    refuse_unknown(connector.path, f"Engine.{name}", block, known)
    section_only = {k: v for k, v in connector.settings.items() if k not in block}
    refuse_unknown(connector.path, "Engine", section_only, frozenset({NAME_KEY}))


def active_profile(connector: ConnectorFile, name: str, source: SecretsSource) -> ProfileSettings:
    """The steps of the active profile of ``connector``, with its ``Name`` (the profile's, else the section's)."""
    block = connector.profiles[name]
    prefix = f"Engine.{name}"
    return ProfileSettings(
        settings={k: v for k, v in block.items() if k != NAME_KEY},
        resolver=Resolver(source, name, str(connector.path)),
        origin=str(connector.path),
        prefix=prefix,
        base_dir=connector.base_dir,
        name_setting=f"{prefix}.{NAME_KEY}" if NAME_KEY in block else f"Engine.{NAME_KEY}",
        written_name=block.get(NAME_KEY, connector.settings.get(NAME_KEY)),
    )


def select_profile(
    connector: ConnectorFile, source: SecretsSource, explicit: str | None, *, plain: Resolver | None = None
) -> str:
    """Choose the active profile of ``connector``: explicit, ``Engine.Profile``, ``Secrets.Profile``, or the only one.

    ``Engine.Profile`` and ``Secrets.Profile`` are text or the name of a variable; a name no variable defines
    is used as written, so an unset ``ETL_CRAFT_PROFILE`` selects a profile of that name (and fails naming it).

    :param plain: the resolver of the selectors (its ``sources`` then say where each selector's value came from).
    """
    profiles, engine, secrets = connector.profiles, connector.engine, connector.secrets
    origin = str(connector.path)
    if plain is None:
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
    if LOOKS_LIKE_A_VARIABLE.fullmatch(resolved):
        return f" (no variable {resolved} is set, so the text itself was used)"
    return ""


def build_profile(
    name: str,
    settings: Mapping[str, Any],
    resolver: Resolver,
    *,
    origin: str,
    prefix: str,
    base_dir: Path | None,
    secret_values: Mapping[str, str] | None = None,
) -> EngineProfile:
    """Validate one profile's settings and resolve them into an :class:`EngineProfile`.

    Keys the auth mode does not use are accepted and ignored, as etl-craft does; a ``secret`` beside a
    PostgreSQL mode that takes none must still name a set variable (etl-craft checks it).

    :param origin: where the settings come from (a file, an Airflow connection), for messages.
    :param prefix: how a setting is named in messages (``Engine.prod``, ``connection 'etl_craft_default'``).
    :param base_dir: folder relative paths resolve against (None: no file, so no relative paths).
    :param secret_values: secrets given directly (an inline Airflow connection's password) instead of
        variable names to look up.
    :raises ConfigurationError: the first setting that is wrong.
    """
    return ProfileSettings(
        settings=settings,
        resolver=resolver,
        origin=origin,
        prefix=prefix,
        base_dir=base_dir,
        secret_values=secret_values or {},
    ).profile(name)


class ProfileSettings(Struct, frozen=True):
    """One profile's settings, resolved and checked one step at a time, each step raising for its setting.

    :meth:`profile` runs the steps in order and stops at the first error (the order every command reads them in);
    the doctor (``engine/doctor.py``) runs each on its own, so ``check`` reports every wrong setting at once.
    """

    settings: Mapping[str, Any]
    resolver: Resolver
    origin: str
    prefix: str
    base_dir: Path | None
    secret_values: Mapping[str, str] = field(default_factory=dict)
    #: Where ``Name`` is written (``Engine.Name`` or ``Engine.<profile>.Name``) and its text; None: no Name.
    name_setting: str | None = None
    written_name: object = None

    def setting(self, key: str) -> str:
        return f"{self.prefix}.{key}"

    def _value(self, key: str) -> str | None:
        return self.resolver.value(self.setting(key), self.settings.get(key), key)

    def profile(self, name: str) -> EngineProfile:
        """Every step in order: the resolved profile, or the first setting's error."""
        self.engine_name()
        target = self.target()
        # Both values are read before either is checked; SQLite checks auth_mode first, PostgreSQL the schema.
        self._value("schema")
        self._value("auth_mode")
        if isinstance(target, SqliteTarget):
            mode = self.auth_mode(target)
            schema = self.schema(target)
        else:
            schema = self.schema(target)
            mode = self.auth_mode(target)
        self.unused_secret(target, mode)
        secrets: dict[str, str] = {}
        fields: dict[str, str] = {}
        for key in mode.keys:
            value = self.key(mode, key)
            if value is not None:
                (secrets if key in mode.secret_keys else fields)[key] = value
        user = fields.pop("user", None)
        return EngineProfile(
            name=name, origin=self.origin, setting_prefix=self.prefix, target=target, base_dir=self.base_dir,
            schema=schema, auth=mode, user=user, fields=fields, secrets=secrets,
        )  # fmt: skip

    def engine_name(self) -> str | None:
        """``Name`` (Postgres, PostgreSQL or SQLite in any case, or a variable holding one) must match the jdbc_url.

        As etl-craft: checked once the jdbc_url names an engine, before the login settings are.

        :returns: the engine the jdbc_url names, that ``Name`` was checked against; None when no ``Name`` is
            written or the jdbc_url names no engine (nothing to check it against).
        """
        url = self._value("jdbc_url") or ""
        dialect = next((d for prefix, d in URL_DIALECTS.items() if url.lower().startswith(prefix)), None)
        if dialect is None or self.name_setting is None:
            return None
        written = self.resolver.text(self.name_setting, self.written_name, NAME_KEY)
        if written is None:
            return None
        if ENGINE_NAMES.get(written.lower()) != dialect:
            raise ConfigurationError(
                f"{self.origin}: {self.name_setting} is {Resolver.display(self.written_name, written)}, but the "
                f"jdbc_url is a {ENGINE_DISPLAY[dialect]} URL; write Name: {ENGINE_DISPLAY[dialect]} (in any "
                f"case: {', '.join(ENGINE_NAMES)}), or remove Name"
            )
        return dialect

    def target(self) -> Target:
        """``jdbc_url``: the database."""
        url = self._value("jdbc_url")
        if not url:
            raise ConfigurationError(
                f"{self.origin}: {self.setting('jdbc_url')} is required, e.g. jdbc:sqlite:engine/etl-craft.db"
            )
        return parse_jdbc_url(url, f"{self.origin}: {self.setting('jdbc_url')}", self.base_dir)

    def schema(self, target: Target) -> str:
        """``schema``: required on PostgreSQL (folded to lower case); ``main`` when absent on SQLite."""
        raw = self._value("schema")
        if isinstance(target, PostgresTarget):
            return _schema(raw, self.origin, self.setting("schema"))
        schema = raw or DEFAULT_SQLITE_SCHEMA
        if not IDENTIFIER.fullmatch(schema):
            raise ConfigurationError(
                f"{self.origin}: {self.setting('schema')} must be a plain identifier (conventionally 'main')"
            )
        return schema

    def auth_mode(self, target: Target) -> AuthMode:
        """``auth_mode``: one of the PostgreSQL modes; absent, empty or ``none`` on SQLite."""
        written = self.settings.get("auth_mode")
        raw = self._value("auth_mode")
        if isinstance(target, PostgresTarget):
            return _auth_mode(raw, Resolver.display(written, raw), self.origin, self.setting("auth_mode"))
        if raw and raw != "none":  # absent or empty: none, the only mode SQLite has
            raise ConfigurationError(
                f"{self.origin}: {self.setting('auth_mode')} is {Resolver.display(written, raw)}, but SQLite "
                "takes no auth_mode; remove it (or write 'none')"
            )
        return NO_AUTH

    def ignored_keys(self, mode: AuthMode) -> list[str]:
        """The settings written that the auth mode does not use (SQLite uses none): ignored, as etl-craft does."""
        beside = TARGET_KEYS | {NAME_KEY}
        written = sorted(k for k, v in self.settings.items() if v is not None and k not in beside)
        if not written:
            return []  # nothing but the target and its name: the registry is not needed to say so
        from airflow_provider_etl_craft.auth import AUTH_KEYS

        return [self.setting(k) for k in written if k in AUTH_KEYS and k not in mode.keys]

    def unused_secret(self, target: Target, mode: AuthMode) -> None:
        """A secret the PostgreSQL auth mode does not take: a password given for it (an inline connection) is
        refused, and a written ``secret`` must still name a set variable, as etl-craft checks it."""
        if not isinstance(target, PostgresTarget):
            return  # SQLite reads no login setting at all
        if any(k not in mode.secret_keys for k in self.secret_values):
            raise ConfigurationError(
                f"{self.origin}: auth_mode '{mode.name}' takes no stored secret, but a password is set; clear the "
                f"password field (the mode's credentials come from {', '.join(mode.keys)})"
            )
        if self.settings.get("secret") is not None and "secret" not in mode.keys:
            self.resolver.secret(self.setting("secret"), self.settings["secret"])  # checked, then unused

    def key(self, mode: AuthMode, key: str) -> str | None:
        """One key of the auth mode: a secret from its variable, a path beside the file, or a plain value.

        :returns: None for an optional key that is not set (or set empty).
        """
        if key in mode.secret_keys:
            given = self.secret_values.get(key)
            if given:
                return given
            if self.settings.get(key) is not None:
                return self.resolver.secret(self.setting(key), self.settings[key], key)
        else:
            found = self._value(key)
            if found:
                return (
                    str(beside_config(found, self.base_dir or Path.cwd())) if key in mode.path_keys else found
                )
        if key in mode.required_keys:
            raise ConfigurationError(
                f"{self.origin}: {self.setting(key)} is required by auth_mode '{mode.name}'"
            )
        return None


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
    from airflow_provider_etl_craft.auth import AUTH_MODES

    if not raw:
        raise ConfigurationError(
            f"{origin}: {setting} is required for PostgreSQL; use one of {', '.join(sorted(AUTH_MODES))}"
        )
    if raw in AUTH_MODES:
        return AUTH_MODES[raw]
    raise ConfigurationError(
        f"{origin}: {setting} {shown} is not an auth mode; use one of {', '.join(sorted(AUTH_MODES))}"
    )
