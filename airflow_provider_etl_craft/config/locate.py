"""Finding craft-connector.yml: explicit path, then $ETL_CRAFT_CONFIG, then an upward search."""

from __future__ import annotations

import os
from pathlib import Path

from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.paths import checked_path

CONFIG_FILE_NAME = "craft-connector.yml"
CONFIG_ENV_VAR = "ETL_CRAFT_CONFIG"


def locate_config(explicit: str | os.PathLike[str] | None = None, start: Path | None = None) -> Path:
    """Return the absolute path of the craft-connector.yml to use.

    :param explicit: a path given by a hook argument, a connection extra or ``--config``; wins when set.
    :param start: where the upward search begins (default: the working directory).
    :raises ConfigurationError: when the named file does not exist or none is found.
    """
    if explicit:
        return _existing(Path(explicit), "the given config path")
    from_env = os.environ.get(CONFIG_ENV_VAR)
    if from_env:
        return _existing(Path(from_env), f"${CONFIG_ENV_VAR}")
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / CONFIG_FILE_NAME
        if candidate.is_file():
            return candidate
    raise ConfigurationError(
        f"no {CONFIG_FILE_NAME} found in {here} or any folder above it; "
        f"pass --config PATH, set ${CONFIG_ENV_VAR}, or create {CONFIG_FILE_NAME} there"
    )


def _existing(path: Path, what: str) -> Path:
    path = checked_path(path, what, kind="path", must_exist=False)
    if path.is_dir():
        path = path / CONFIG_FILE_NAME
    if not path.is_file():
        raise ConfigurationError(f"{what} points at {path}, which does not exist; fix the path")
    return path
