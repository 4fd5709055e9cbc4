"""Secrets sources (environment, .env file, Airflow Variables) and variable resolution with profile twins."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.paths import checked_path, read_text

VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONVENTIONAL_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
#: How a missing variable shows when its name is used as written: upper case with an underscore
#: (``ENGINE_USER``), unlike an ordinary value (``dev``, ``password``, ``etl_craft``). etl-craft warns on the same.
LOOKS_LIKE_A_VARIABLE = re.compile(r"^[A-Z][A-Z0-9]*_[A-Z0-9_]+$")
_DOTENV_LINE = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$")
SOURCE_TYPES = ("environment", "file", "airflow")


@dataclass
class SecretsSource:
    """Where variable names are looked up. ``names`` is empty when the source cannot list its keys."""

    kind: str
    lookup: Callable[[str], str | None]
    names: Callable[[], Iterable[str]] = field(default=lambda: ())

    def get(self, name: str) -> str | None:
        return self.lookup(name)


def environment_source() -> SecretsSource:
    """Variables from the process environment."""
    return SecretsSource("environment", os.environ.get, lambda: os.environ.keys())


def dotenv_source(path: Path) -> SecretsSource:
    """Variables from a ``.env`` file (``KEY=VALUE``, ``#`` comments, optional ``export``, optional quotes)."""
    values = parse_dotenv(path)
    return SecretsSource("file", values.get, values.keys)


def airflow_source() -> SecretsSource:
    """Variables through Airflow Variables, so whatever secrets backend Airflow has configured serves them."""
    return SecretsSource("airflow", _compat.get_variable)


def parse_dotenv(path: Path) -> dict[str, str]:
    """Parse a .env file; errors name the file and line, never the line's content (it may hold a secret).

    :raises ConfigurationError: unreadable file or a line that is not ``KEY=VALUE``.
    """
    lines = read_text(path, "Secrets.Path (relative paths resolve beside craft-connector.yml)").splitlines()
    values: dict[str, str] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _DOTENV_LINE.match(line)
        if not match:
            raise ConfigurationError(f"{path}: line {number} is not KEY=VALUE; fix or comment it out with #")
        key, value = match.group(1), _dotenv_value(match.group(2).strip())
        if value is None:
            raise ConfigurationError(
                f"{path}: line {number} has an unterminated quote or text after the closing quote"
            )
        if "\x00" in value:
            raise ConfigurationError(
                f"{path}: line {number}: the value of {key} contains a NUL byte, which no database login "
                "accepts; fix the value"
            )
        values[key] = value
    return values


def _dotenv_value(text: str) -> str | None:
    """A .env value: quoted (text after the closing quote may only be a comment) or bare (`` #`` starts a comment)."""
    if text[:1] in ("'", '"'):
        end = text.find(text[0], 1)
        if end < 0 or not (text[end + 1 :].strip() == "" or text[end + 1 :].lstrip().startswith("#")):
            return None
        return text[1:end]
    return re.split(r"\s+#", text, maxsplit=1)[0].rstrip()


def build_source(secrets_section: dict[str, object], base_dir: Path, config_path: Path) -> SecretsSource:
    """Build the source named by ``Secrets.Source_type`` (default ``environment``).

    :raises ConfigurationError: unknown source type or missing ``Secrets.Path`` for ``file``.
    """
    kind = secrets_section.get("Source_type", "environment")
    if kind == "environment":
        return environment_source()
    if kind == "airflow":
        return airflow_source()
    if kind == "file":
        rel = secrets_section.get("Path")
        if not isinstance(rel, str) or not rel.strip():
            raise ConfigurationError(
                f"{config_path}: Secrets.Path is required when Secrets.Source_type is 'file'; "
                "set it to the .env file (relative paths resolve beside craft-connector.yml)"
            )
        return dotenv_source(checked_path(base_dir / rel, "Secrets.Path"))
    raise ConfigurationError(
        f"{config_path}: Secrets.Source_type is '{kind}'; use one of {', '.join(SOURCE_TYPES)}"
    )


def twin_name(variable: str, profile: str) -> str:
    """The profile-specific twin of a variable: ``ENGINE_SECRET`` for ``prod`` → ``ENGINE_PROD_SECRET``.

    The profile name (upper-cased) goes after the first ``_``-separated word; a name without ``_`` gets
    it as a suffix (``TOKEN`` → ``TOKEN_PROD``).
    """
    tag = re.sub(r"[^A-Za-z0-9_]", "_", profile).upper()
    head, sep, rest = variable.partition("_")
    return f"{head}_{tag}_{rest}" if sep else f"{variable}_{tag}"


@dataclass(frozen=True)
class SettingSource:
    """Where one setting's value came from: ``variable`` (the name whose value was used), or the text as written."""

    setting: str
    written: str
    variable: str | None = None

    @property
    def looks_like_a_missing_variable(self) -> bool:
        """Used as written, although the text reads like the name of a variable that is not set."""
        return self.variable is None and bool(LOOKS_LIKE_A_VARIABLE.fullmatch(self.written))


class Resolver:
    """Turns setting texts into values: a defined variable (profile twin first) replaces the text.

    ``sources`` records, per setting, which variable gave its value or that its text was used as written:
    a text naming a variable that is not set falls back to itself, which is how a missing variable shows.
    """

    def __init__(self, source: SecretsSource, profile: str, origin: str) -> None:
        self.source, self.profile, self.origin = source, profile, origin
        self.sources: dict[str, SettingSource] = {}

    def value(self, setting: str, raw: object) -> str | None:
        """Resolve an ordinary setting: a literal, or the name of a variable that is set."""
        if raw is None:
            return None
        if not isinstance(raw, str | int | float) or isinstance(raw, bool):
            raise ConfigurationError(f"{self.origin}: {setting} must be a text value")
        text = str(raw)
        if VARIABLE_NAME.fullmatch(text):
            for name in (twin_name(text, self.profile), text):
                found = self.source.get(name)
                if found:
                    self.sources[setting] = SettingSource(setting, text, name)
                    return found
        self.sources[setting] = SettingSource(setting, text)
        return text

    def secret(self, setting: str, raw: object) -> str:
        """Resolve a setting that must name a variable holding a secret; the value is masked.

        :raises ConfigurationError: a value that is not a variable name, an unset or an empty variable.
          Messages name the setting and the variable, never a value.
        """
        if not isinstance(raw, str) or not VARIABLE_NAME.fullmatch(raw):
            raise ConfigurationError(
                f"{self.origin}: {setting} must be the NAME of a variable in the {self.source.kind} secrets "
                f"source, not the secret itself; put the secret in a variable and write its name here"
            )
        twin = twin_name(raw, self.profile)
        for name in (twin, raw):
            found = self.source.get(name)
            if found is None:
                continue
            if found == "":
                raise ConfigurationError(
                    f"{self.origin}: {setting} names variable {self._shown(name)}, which is set but empty "
                    f"in the {self.source.kind} secrets source; give it the secret's value"
                )
            _compat.mask_secret(found)
            self.sources[setting] = SettingSource(setting, raw, name)
            return found
        if not _CONVENTIONAL_NAME.fullmatch(raw):
            raise ConfigurationError(
                f"{self.origin}: {setting} names a variable that is not set in the {self.source.kind} secrets "
                f"source (the name is not shown: it is not UPPER_CASE and may be a pasted secret); "
                f"write the name of the variable that holds the secret"
            )
        hint = self._suggest(raw, twin)
        raise ConfigurationError(
            f"{self.origin}: {setting} names variable {raw} (or its profile twin {twin}), which is not set in "
            f"the {self.source.kind} secrets source; set it{hint}"
        )

    @staticmethod
    def display(written: object, resolved: str | None) -> str:
        """How a resolved setting may appear in a message: quoted when literal, else only its variable's name."""
        if resolved == written:
            return f"'{resolved}'"
        return f"(the value of variable {written})"

    def _shown(self, name: str) -> str:
        return name if _CONVENTIONAL_NAME.fullmatch(name) else "(name not shown)"

    def _suggest(self, *names: str) -> str:
        known = [n for n in self.source.names() if _CONVENTIONAL_NAME.fullmatch(n)]
        close = sorted({m for n in names for m in difflib.get_close_matches(n, known, n=3, cutoff=0.8)})
        return f" (did you mean {', '.join(close)}?)" if close else ""
