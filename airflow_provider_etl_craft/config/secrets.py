"""Secrets sources (environment, .env file, Airflow Variables) and resolving settings through them.

The reading rules follow etl-craft's own; docs/etl-craft-parity.md lists them and the few deliberate extensions.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from msgspec import Struct, field

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.paths import checked_path, read_text

VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONVENTIONAL_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
#: How a missing variable shows when its name is used as written: upper case with an underscore
#: (``ENGINE_USER``), unlike an ordinary value (``dev``, ``password``, ``etl_craft``). etl-craft warns on the same.
LOOKS_LIKE_A_VARIABLE = re.compile(r"^[A-Z][A-Z0-9]*_[A-Z0-9_]+$")
SOURCE_TYPES = ("environment", "file", "airflow")
#: ``Secrets.Source_type`` when the file names none (etl-craft requires it; the provider assumes the environment).
DEFAULT_SOURCE_TYPE = "environment"
_EXPORT = "export "
_BOM = "\ufeff"


class SecretsSource(Struct):
    """Where variable names are looked up. ``names`` is empty when the source cannot list its keys."""

    kind: str
    lookup: Callable[[str], str | None]
    names: Callable[[], Iterable[str]] = field(default=lambda: ())
    #: The ``.env`` file read (``file`` sources only), for reports.
    location: Path | None = None

    def get(self, name: str) -> str | None:
        """The variable's value; ``None`` when it is not defined (a defined empty variable is ``""``)."""
        return self.lookup(name)


def environment_source() -> SecretsSource:
    """Variables from the process environment."""
    return SecretsSource("environment", os.environ.get, lambda: os.environ.keys())


def dotenv_source(path: Path) -> SecretsSource:
    """Variables from a ``.env`` file, read once."""
    values = parse_dotenv(path)
    return SecretsSource("file", values.get, values.keys, path)


def airflow_source() -> SecretsSource:
    """Variables through Airflow Variables, so whatever secrets backend Airflow has configured serves them."""
    return SecretsSource("airflow", _compat.get_variable)


def parse_dotenv(path: Path) -> dict[str, str]:
    """Read a ``.env`` file as etl-craft reads it (see :func:`parse_dotenv_text`).

    :raises ConfigurationError: a file that cannot be read or is not UTF-8; the message never shows its text.
    """
    return parse_dotenv_text(
        read_text(path, "Secrets.Path (relative paths resolve beside craft-connector.yml)")
    )


def parse_dotenv_text(text: str) -> dict[str, str]:
    """``KEY=VALUE`` per line; nothing in a .env file is an error.

    A leading byte-order mark is dropped. Blank lines, lines starting with ``#`` and lines without ``=`` are
    skipped; ``export `` before a key is dropped. Key and value are stripped and one matching pair of quotes
    (``"`` or ``'``) around the value is removed. No escapes, no trailing comments (``a # b`` is the value),
    no multi-line values; a key written twice keeps its last value.
    """
    values: dict[str, str] = {}
    for line in text.removeprefix(_BOM).splitlines():
        entry = line.strip()
        if not entry or entry.startswith("#") or "=" not in entry:
            continue
        if entry.startswith(_EXPORT):
            entry = entry[len(_EXPORT) :].lstrip()
        key, _, value = entry.partition("=")
        values[key.strip()] = _unquote(value.strip())
    return values


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def beside_config(written: str, base_dir: Path) -> Path:
    """A path from the file: ``~`` expanded, a relative one joined to the file's folder, ``..`` folded as text."""
    path = Path(written).expanduser()
    return Path(os.path.normpath(path if path.is_absolute() else base_dir / path))


def build_source(secrets_section: dict[str, object], base_dir: Path, config_path: Path) -> SecretsSource:
    """Build the source ``Secrets.Source_type`` names (any case; ``environment`` when absent).

    ``Source_type`` and ``Path`` may themselves name process environment variables: the source they describe
    does not exist yet.

    :raises ConfigurationError: unknown source type, ``Path`` missing for ``file`` or given for another type.
    """
    setup = Resolver(environment_source(), None, str(config_path))
    written = setup.text("Secrets.Source_type", secrets_section.get("Source_type"))
    kind = (written or DEFAULT_SOURCE_TYPE).lower()
    if kind not in SOURCE_TYPES:
        raise ConfigurationError(
            f"{config_path}: Secrets.Source_type is {Resolver.display(secrets_section.get('Source_type'), written)}; "
            f"use one of {', '.join(SOURCE_TYPES)}"
        )
    where = setup.text("Secrets.Path", secrets_section.get("Path"))
    if kind != "file":
        if where is not None:
            raise ConfigurationError(
                f"{config_path}: Secrets.Path is used only with Source_type: file (this file's is {kind}); "
                "remove Secrets.Path or set Source_type: file"
            )
        return environment_source() if kind == "environment" else airflow_source()
    if where is None:
        raise ConfigurationError(
            f"{config_path}: Secrets.Path is required when Secrets.Source_type is 'file'; "
            "set it to the .env file (relative paths resolve beside craft-connector.yml)"
        )
    return dotenv_source(checked_path(beside_config(where, base_dir), "Secrets.Path"))


def twin_name(variable: str, profile: str, field_name: str) -> str | None:
    """The profile-specific twin of ``variable`` for the setting ``field_name``, as etl-craft forms it.

    The upper-cased profile goes before the field's suffix: for ``prod``, ``ENGINE_SECRET`` (field ``secret``)
    becomes ``ENGINE_PROD_SECRET`` and ``ENGINE_JDBC_URL`` (field ``jdbc_url``) ``ENGINE_PROD_JDBC_URL``. Case
    is ignored when matching the suffix and the rest of the name keeps its case. A name that already ends in
    ``_PROD_<FIELD>`` is its own twin; a name that does not end in ``_<FIELD>`` has none (``None``).
    """
    suffix = f"_{field_name.upper()}"
    tag = profile.upper()
    upper = variable.upper()
    if upper.endswith(f"_{tag}{suffix}"):
        return variable
    if upper.endswith(suffix):
        cut = len(variable) - len(suffix)
        return f"{variable[:cut]}_{tag}{variable[cut:]}"
    return None


class SettingSource(Struct, frozen=True):
    """Where one setting's value came from: ``variable`` (the name whose value was used), or the text as written.

    ``twin`` is the profile twin looked up first (None when the setting has none); ``variable`` is the twin when
    the twin was the one defined.
    """

    setting: str
    written: str
    variable: str | None = None
    twin: str | None = None

    @property
    def looks_like_a_missing_variable(self) -> bool:
        """Used as written, although the text reads like the name of a variable that is not set."""
        return self.variable is None and bool(LOOKS_LIKE_A_VARIABLE.fullmatch(self.written))


class Resolver:
    """Turns setting texts into values: a defined variable (its profile twin first) replaces the text.

    ``sources`` records, per setting, which variable gave its value (the twin when that was the one defined) or
    that its text was used as written: a text naming a variable that is not set falls back to itself, which is
    how a missing variable shows.

    :param profile: the active profile, for twins; ``None`` where a setting has none (``Secrets``, ``Profile``).
    """

    def __init__(self, source: SecretsSource, profile: str | None, origin: str) -> None:
        self.source, self.profile, self.origin = source, profile, origin
        self.sources: dict[str, SettingSource] = {}

    def _lookup(self, written: str, field_name: str | None) -> tuple[str, str | None]:
        """The variable ``written`` selects (its twin when that is defined) and its value (``None``: undefined)."""
        twin = self._twin(written, field_name)
        if twin is not None:
            found = self.source.get(twin)
            if found is not None:
                return twin, found
        return written, self.source.get(written)

    def value(self, setting: str, raw: object, field_name: str | None = None) -> str | None:
        """Resolve an ordinary setting: the value of the variable it names when that is defined, else its text.

        Text is stripped, and so is a variable's value; a defined empty variable gives ``""``. Numbers and
        booleans are used as their text. ``field_name`` (the setting's key) enables the profile twin.
        """
        if raw is None:
            return None
        if isinstance(raw, list | dict):
            raise ConfigurationError(
                f"{self.origin}: {setting} must be a single value, not a list or mapping"
            )
        if not isinstance(raw, str):
            self.sources[setting] = SettingSource(setting, str(raw))
            return str(raw)
        written = raw.strip()
        if VARIABLE_NAME.fullmatch(written):
            name, found = self._lookup(written, field_name)
            if found is not None:
                if "\x00" in found:
                    raise ConfigurationError(
                        f"{self.origin}: {setting} names variable {self._shown(name)}, whose value contains a NUL "
                        "byte; fix the value"
                    )
                self.sources[setting] = SettingSource(setting, written, name, self._twin(written, field_name))
                return found.strip()
        self.sources[setting] = SettingSource(setting, written, None, self._twin(written, field_name))
        return written

    def text(self, setting: str, raw: object, field_name: str | None = None) -> str | None:
        """Resolve a setting that must be non-empty text (``Profile``, ``Name``, ``Source_type``, ``Path``)."""
        if raw is None:
            return None
        value = self.value(setting, raw, field_name) if isinstance(raw, str) else None
        if not value:
            raise ConfigurationError(f"{self.origin}: {setting} must be a non-empty text value")
        return value

    def secret(self, setting: str, raw: object, field_name: str = "secret") -> str:
        """Resolve a setting that must name a defined, non-blank variable holding a secret; the value is masked.

        :raises ConfigurationError: a value that is not a variable name, an undefined or a blank variable.
          Messages name the setting and the variable, never a value.
        """
        if not isinstance(raw, str) or not VARIABLE_NAME.fullmatch(raw.strip()):
            raise ConfigurationError(
                f"{self.origin}: {setting} must be the NAME of a variable in the {self.source.kind} secrets "
                f"source, not the secret itself; put the secret in a variable and write its name here"
            )
        written = raw.strip()
        name, found = self._lookup(written, field_name)
        if found is None:
            if not _CONVENTIONAL_NAME.fullmatch(written):
                raise ConfigurationError(
                    f"{self.origin}: {setting} names a variable that is not set in the {self.source.kind} secrets "
                    f"source (the name is not shown: it is not UPPER_CASE and may be a pasted secret); "
                    f"write the name of the variable that holds the secret"
                )
            twin = self._twin(written, field_name)
            names = f"{written} (or its profile twin {twin})" if twin and twin != written else written
            raise ConfigurationError(
                f"{self.origin}: {setting} names variable {names}, which is not set in the {self.source.kind} "
                f"secrets source; set it{self._suggest(written, twin or written)}"
            )
        if not found.strip():
            raise ConfigurationError(
                f"{self.origin}: {setting} names variable {self._shown(name)}, which is set but empty in the "
                f"{self.source.kind} secrets source; give it the secret's value"
            )
        if "\x00" in found:
            raise ConfigurationError(
                f"{self.origin}: {setting} names variable {self._shown(name)}, whose value contains a NUL byte, "
                "which no login accepts; fix the value"
            )
        _compat.mask_secret(found)
        self.sources[setting] = SettingSource(setting, written, name, self._twin(written, field_name))
        return found

    def _twin(self, written: str, field_name: str | None) -> str | None:
        """The profile twin looked up before ``written`` (None: no active profile, no field, or no twin)."""
        if not (self.profile and field_name and VARIABLE_NAME.fullmatch(written)):
            return None
        return twin_name(written, self.profile, field_name)

    @staticmethod
    def display(written: object, resolved: str | None) -> str:
        """How a resolved setting may appear in a message: quoted when literal, else only its variable's name."""
        if isinstance(written, str) and resolved == written.strip():
            return f"'{resolved}'"
        return f"(the value of variable {written})"

    def _shown(self, name: str) -> str:
        return name if _CONVENTIONAL_NAME.fullmatch(name) else "(name not shown)"

    def _suggest(self, *names: str) -> str:
        import difflib  # for a missing variable's message only: a resolution that works never loads it

        known = [n for n in self.source.names() if _CONVENTIONAL_NAME.fullmatch(n)]
        close = sorted({m for n in names for m in difflib.get_close_matches(n, known, n=3, cutoff=0.8)})
        return f" (did you mean {', '.join(close)}?)" if close else ""
