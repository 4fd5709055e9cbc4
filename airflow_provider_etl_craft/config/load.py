"""Strict YAML loading of craft-connector.yml: duplicate keys and unknown names are refused."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from msgspec import Struct

from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.paths import read_text

#: Sections of a real etl-craft file, in the order etl-craft requires; the provider reads Secrets and Engine.
SECTIONS = ("Secrets", "Orchestration", "Engine", "Warehouse", "Cloning", "Docs_site")
KNOWN_SECTIONS = frozenset(SECTIONS)
SECRETS_KEYS = frozenset({"Source_type", "Profile", "Path"})
#: The keys of an Engine profile that name its target; beside them it may hold ``Name`` and its auth mode's keys.
TARGET_KEYS = frozenset({"jdbc_url", "schema", "auth_mode"})
#: The one setting the Engine section may hold beside ``Profile`` and its profiles (a profile may hold it too).
NAME_KEY = "Name"
#: A mapping under Engine with this name is a setting, not a profile (etl-craft nests it in its sections).
NOT_A_PROFILE = frozenset({"Email"})


def profile_keys() -> frozenset[str]:
    """Every key an Engine profile may hold but ``Name``: the target's and every key some auth mode takes.

    A function, not a constant: it reads the auth registry, which a profile holding only target keys (SQLite's)
    never needs to load (docs/performance.md).
    """
    from airflow_provider_etl_craft.auth import AUTH_KEYS

    return TARGET_KEYS | frozenset(AUTH_KEYS)


class _DuplicateKey(Exception):
    def __init__(self, key: object, line: int, first_line: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first_line = key, line, first_line


class _Strict(yaml.constructor.SafeConstructor):
    """SafeConstructor that refuses a key written twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # As etl-craft: keys are checked after '<<' merges, so a key a merge already gives is a duplicate too.
        self.flatten_mapping(node)
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:
                raise _BadKey(line) from None
            if first is not None:
                raise _DuplicateKey(key, line, first)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


class _StrictLoader(_Strict, yaml.SafeLoader):
    """PyYAML's own parser, in Python: its errors are the ones users see."""


#: The same rules on libyaml's parser (PyYAML's C binding, when built with it): four to eight times faster on a
#: craft-connector.yml, which a task process reads once per try (docs/performance.md, "In the task process").
_FastStrictLoader: type | None = (
    type("_FastStrictLoader", (_Strict, yaml.CSafeLoader), {})
    if getattr(yaml, "__with_libyaml__", False)
    else None
)


def _parse(text: str) -> Any:
    """The document in ``text``, as :class:`_StrictLoader` reads it.

    libyaml reads it first where it can: a text the Python reader accepts (no character it refuses, such as
    NUL) that libyaml parses without error gives the same document. Anything libyaml refuses is read again by
    the Python parser, so every error, and every message, is that parser's.
    """
    if _FastStrictLoader is not None and not yaml.reader.Reader.NON_PRINTABLE.search(text):
        try:
            return yaml.load(text, Loader=_FastStrictLoader)  # noqa: S506 - a SafeLoader with strict mappings
        except Exception:  # noqa: S110 - read again below, for the Python parser's error
            pass
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - _StrictLoader is a SafeLoader


class _BadKey(Exception):
    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class ConnectorFile(Struct, frozen=True):
    """The parts of craft-connector.yml the provider reads, already checked for unknown names."""

    path: Path
    secrets: dict[str, Any]
    engine: dict[str, Any]

    @property
    def base_dir(self) -> Path:
        """Folder every relative path in the file resolves against: the file's own (links not followed)."""
        return self.path.parent

    @property
    def profiles(self) -> dict[str, dict[str, Any]]:
        """Every mapping under ``Engine`` is a profile (except a setting etl-craft nests, see NOT_A_PROFILE)."""
        return {k: v for k, v in self.engine.items() if isinstance(v, dict) and k not in NOT_A_PROFILE}

    @property
    def settings(self) -> dict[str, Any]:
        """The Engine section's own settings: everything beside ``Profile`` and the profiles."""
        profiles = self.profiles
        return {k: v for k, v in self.engine.items() if k != "Profile" and k not in profiles}


def load_connector_file(path: Path) -> ConnectorFile:
    """Parse and structurally validate ``path``.

    :raises ConfigurationError: bad YAML, duplicate keys, unknown sections or keys, wrong shapes.
    """
    text = read_text(path, str(path))
    try:
        document = _parse(text)
    except _DuplicateKey as dup:
        raise ConfigurationError(
            f"{path}: key '{dup.key}' appears twice (lines {dup.first_line} and {dup.line}; a key a '<<' merge "
            "brings counts); keep only one"
        ) from None
    except _BadKey as bad:
        raise ConfigurationError(
            f"{path}: the key at line {bad.line} is a list or mapping; keys must be plain names"
        ) from None
    except RecursionError:
        raise ConfigurationError(
            f"{path}: lists or mappings nested too deeply for the YAML parser; flatten the file"
        ) from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigurationError(f"{path}: not valid YAML{at}: {problem}; fix the syntax") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigurationError(f"{path}: the top level must be a mapping of sections (Secrets, Engine, …)")
    unknown = sorted(str(k) for k in document if k not in KNOWN_SECTIONS)
    if unknown:
        raise ConfigurationError(
            f"{path}: unknown section(s) {', '.join(unknown)}; known sections are {', '.join(SECTIONS)}"
        )
    present = list(document)
    expected = [name for name in SECTIONS if name in document]
    if present != expected:
        raise ConfigurationError(
            f"{path}: the sections are in the order {', '.join(present)}; etl-craft reads them only in the order "
            f"{', '.join(expected)}: move them"
        )
    secrets = _section(path, document, "Secrets", required=False)
    refuse_unknown(path, "Secrets", secrets, SECRETS_KEYS)
    engine = _section(path, document, "Engine", required=True)
    return ConnectorFile(path=path, secrets=secrets, engine=engine)


def _section(path: Path, document: dict[str, Any], name: str, *, required: bool) -> dict[str, Any]:
    value = document.get(name)
    if value is None:
        if required:
            raise ConfigurationError(f"{path}: no '{name}' section; add {name}: with at least one profile")
        return {}
    if not isinstance(value, dict):
        raise ConfigurationError(f"{path}: section '{name}' must be a mapping")
    return value


def refuse_unknown(path: Path | str, where: str, mapping: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """Refuse keys of ``mapping`` not in ``allowed``, naming them and ``where`` they are."""
    unknown = sorted(str(k) for k in mapping if k not in allowed)
    if unknown:
        raise ConfigurationError(
            f"{path}: unknown key(s) in {where}: {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )
