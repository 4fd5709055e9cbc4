"""Finding craft-connector.yml: explicit path, then $ETL_CRAFT_CONFIG, then an upward search (as etl-craft)."""

from __future__ import annotations

import os
from pathlib import Path

from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.paths import checked_path

CONFIG_FILE_NAME = "craft-connector.yml"
CONFIG_ENV_VAR = "ETL_CRAFT_CONFIG"
#: The folder a project directory conventionally is: the search also finds ``etl-craft/craft-connector.yml``.
PROJECT_DIR_NAME = "etl-craft"


def locate_config(explicit: str | os.PathLike[str] | None = None, start: Path | None = None) -> Path:
    """Return the absolute path of the craft-connector.yml to use.

    The path is absolute but symbolic links in it are not followed: relative paths in the file resolve
    beside the path as found, as etl-craft resolves them.

    :param explicit: a path given by a hook argument, a connection extra or ``--config``; wins when set.
    :param start: where the upward search begins (default: the working directory).
    :raises ConfigurationError: when the named file does not exist, none is found, or a folder holds two.
    """
    if explicit:
        return _existing(Path(explicit), "the given config path")
    from_env = os.environ.get(CONFIG_ENV_VAR)
    if from_env:
        return _existing(Path(from_env), f"${CONFIG_ENV_VAR}")
    here = (start or Path.cwd()).absolute()
    for folder in (here, *here.parents):
        found = [
            candidate
            for candidate in (folder / CONFIG_FILE_NAME, folder / PROJECT_DIR_NAME / CONFIG_FILE_NAME)
            if candidate.is_file()
        ]
        if len(found) > 1:
            raise ConfigurationError(
                f"found both {found[0]} and {found[1]}; keep one, or pass --config PATH (or set "
                f"${CONFIG_ENV_VAR}) to choose"
            )
        if found:
            return found[0]
    raise ConfigurationError(
        f"no {CONFIG_FILE_NAME} found in {here} or any folder above it (nor {PROJECT_DIR_NAME}/{CONFIG_FILE_NAME} "
        f"in one); pass --config PATH, set ${CONFIG_ENV_VAR}, or create {CONFIG_FILE_NAME} there"
    )


def _existing(path: Path, what: str) -> Path:
    resolved = checked_path(path, what, kind="path", must_exist=False)
    given = path.expanduser().absolute()
    if resolved.is_dir():  # a provider convenience: a folder means the craft-connector.yml in it
        resolved, given = resolved / CONFIG_FILE_NAME, given / CONFIG_FILE_NAME
    if not resolved.is_file():
        raise ConfigurationError(f"{what} points at {given}, which does not exist; fix the path")
    return given
