"""The resolved Engine profile: which database, which schema, which auth mode, with secrets kept out of repr."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_etl_craft.auth import AUTH_KEYS, AUTH_MODES, NO_AUTH, AuthMode
from airflow_provider_etl_craft.config.load import load_connector_file
from airflow_provider_etl_craft.config.locate import locate_config
from airflow_provider_etl_craft.config.secrets import Resolver, SecretsSource, build_source
from airflow_provider_etl_craft.engine.url import (
    PostgresTarget,
    SqliteTarget,
    Target,
    parse_jdbc_url,
    resolve_beside,
)
from airflow_provider_etl_craft.errors import ConfigurationError

#: A plain PostgreSQL identifier; folded to lower case as PostgreSQL folds unquoted names.
SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


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
    """Locate craft-connector.yml, pick the active Engine profile and resolve it.

    :param config_path: explicit file; else ``$ETL_CRAFT_CONFIG``, else an upward search.
    :param profile: explicit profile name; else ``Engine.Profile``, ``Secrets.Profile``, or the only one.
    :raises ConfigurationError: any problem with the file or the active profile.
    """
    path = locate_config(config_path)
    connector = load_connector_file(path)
    source = build_source(connector.secrets, connector.base_dir, path)
    name = select_profile(connector.profiles, connector.engine, connector.secrets, source, profile, str(path))
    resolver = Resolver(source, name, str(path))
    return build_profile(
        name, connector.profiles[name], resolver, str(path), f"Engine.{name}", connector.base_dir
    )


def select_profile(
    profiles: Mapping[str, Any],
    engine: Mapping[str, Any],
    secrets: Mapping[str, Any],
    source: SecretsSource,
    explicit: str | None,
    origin: str,
    plain: Resolver | None = None,
) -> str:
    """Choose the active profile: explicit, ``Engine.Profile``, ``Secrets.Profile``, or the only one.

    :param plain: the resolver of the selectors (its ``sources`` then say where each selector's value came from).
    """
    if not profiles:
        raise ConfigurationError(
            f"{origin}: Engine has no profiles; add one, e.g. Engine: {{dev: {{jdbc_url: …}}}}"
        )
    plain = plain or Resolver(source, "", origin)
    chosen, where, written = explicit, "the requested profile", explicit
    for section, mapping in (("Engine", engine), ("Secrets", secrets)):
        if not chosen and mapping.get("Profile") is not None:
            written = mapping["Profile"]
            chosen, where = _selector(plain, f"{section}.Profile", written, profiles), f"{section}.Profile"
    listed = ", ".join(sorted(profiles))
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


def _via(written: object, resolved: object) -> str:
    # Profile names are not secrets: show the name, and the variable it came from.
    return "" if written == resolved else f" (from variable {written})"


def _selector(resolver: Resolver, setting: str, raw: object, profiles: Mapping[str, Any]) -> str | None:
    value = resolver.value(setting, raw)
    if value in profiles:
        return value
    if value == raw and isinstance(raw, str) and raw.isupper():
        return None  # an UPPER_CASE variable that is not set selects nothing: the next rule decides
    return value


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

    :param secret_values: secrets given directly (an inline Airflow connection's password) instead of
        variable names to look up.
    :raises ConfigurationError: the first setting that is wrong.
    """
    return ProfileSettings(settings, resolver, origin, prefix, base_dir, secret_values or {}).profile(name)


@dataclass(frozen=True)
class ProfileSettings:
    """One profile's settings, resolved and checked one step at a time, each step raising for its setting.

    :func:`build_profile` runs the steps in order and stops at the first error; the doctor
    (``engine/doctor.py``) runs each on its own, so ``check`` reports every wrong setting at once.
    """

    settings: Mapping[str, Any]
    resolver: Resolver
    origin: str
    prefix: str
    base_dir: Path | None
    secret_values: Mapping[str, str] = field(default_factory=dict)

    def setting(self, key: str) -> str:
        return f"{self.prefix}.{key}"

    def profile(self, name: str) -> EngineProfile:
        """Every step in order: the resolved profile, or the first setting's error."""
        target = self.target()
        schema = self.schema(target)
        mode = self.auth_mode(target)
        self.unused_keys(target, mode)
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

    def target(self) -> Target:
        """``jdbc_url``: the database."""
        url = self.resolver.value(self.setting("jdbc_url"), self.settings.get("jdbc_url"))
        if not url:
            raise ConfigurationError(
                f"{self.origin}: {self.setting('jdbc_url')} is required, e.g. jdbc:sqlite:engine/etl-craft.db"
            )
        return parse_jdbc_url(url, f"{self.origin}: {self.setting('jdbc_url')}", self.base_dir)

    def schema(self, target: Target) -> str:
        """``schema``: required on PostgreSQL (folded to lower case); ``main`` by default on SQLite."""
        raw = self.resolver.value(self.setting("schema"), self.settings.get("schema"))
        if isinstance(target, PostgresTarget):
            return _schema(raw, self.origin, self.setting("schema"))
        schema = raw or "main"
        if not SCHEMA_NAME.fullmatch(schema):
            raise ConfigurationError(
                f"{self.origin}: {self.setting('schema')} must be a plain identifier (conventionally 'main')"
            )
        return schema

    def auth_mode(self, target: Target) -> AuthMode:
        """``auth_mode``: one of the PostgreSQL modes; absent or ``none`` on SQLite."""
        written = self.settings.get("auth_mode")
        raw = self.resolver.value(self.setting("auth_mode"), written)
        if isinstance(target, PostgresTarget):
            return _auth_mode(raw, Resolver.display(written, raw), self.origin, self.setting("auth_mode"))
        if raw not in (None, "none"):
            raise ConfigurationError(
                f"{self.origin}: {self.setting('auth_mode')} is {Resolver.display(written, raw)}, but SQLite "
                "takes no auth_mode; remove it (or write 'none')"
            )
        return NO_AUTH

    def unused_keys(self, target: Target, mode: AuthMode) -> None:
        """Keys, or a password, that the auth mode does not take (SQLite takes none)."""
        if isinstance(target, SqliteTarget):
            extra = sorted(k for k in AUTH_KEYS if self.settings.get(k) is not None)
            if extra:
                raise ConfigurationError(
                    f"{self.origin}: {', '.join(self.setting(k) for k in extra)} has no meaning for a SQLite "
                    "Engine DB; remove it"
                )
            return
        unexpected = sorted(k for k in AUTH_KEYS if self.settings.get(k) is not None and k not in mode.keys)
        if unexpected:
            raise ConfigurationError(
                f"{self.origin}: {', '.join(self.setting(k) for k in unexpected)} not used by auth_mode "
                f"'{mode.name}'; remove it (auth_mode '{mode.name}' takes {', '.join(mode.keys)})"
            )
        stray = sorted(k for k in self.secret_values if k not in mode.secret_keys)
        if stray:
            raise ConfigurationError(
                f"{self.origin}: auth_mode '{mode.name}' takes no stored secret, but a password is set; clear the "
                f"password field (the mode's credentials come from {', '.join(mode.keys)})"
            )

    def key(self, mode: AuthMode, key: str) -> str | None:
        """One key of the auth mode: a secret from its variable, a path made absolute, or a plain value.

        :returns: None for an optional key that is not set.
        """
        if key in mode.secret_keys:
            given = self.secret_values.get(key)
            if given:
                return given
            if self.settings.get(key) is not None:
                return self.resolver.secret(self.setting(key), self.settings[key])
        else:
            value = self.resolver.value(self.setting(key), self.settings.get(key))
            if value not in (None, ""):
                assert value is not None
                return str(resolve_beside(value, self.base_dir)) if key in mode.path_keys else value
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
    if not raw:
        raise ConfigurationError(
            f"{origin}: {setting} is required for PostgreSQL; use one of {', '.join(sorted(AUTH_MODES))}"
        )
    if raw in AUTH_MODES:
        return AUTH_MODES[raw]
    raise ConfigurationError(
        f"{origin}: {setting} {shown} is not an auth mode; use one of {', '.join(sorted(AUTH_MODES))}"
    )
