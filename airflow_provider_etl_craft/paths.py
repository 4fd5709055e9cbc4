"""Every file the provider opens is checked here first, so a bad path is one clear error naming its setting.

Config files, ``.env`` files, the SQLite Engine DB, certificate and key files and migration files all go
through :func:`checked_path` (and :func:`read_text` for the text ones): a NUL byte, a symbolic link loop, a
dangling link, a directory where a file belongs (or the reverse), an unreadable file and a file that is not
UTF-8 each raise the caller's error type (CONFIGURATION, or MIGRATION for migration files) instead of an
``OSError``, ``RuntimeError``, ``ValueError`` or ``UnicodeDecodeError`` from deep inside.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from airflow_provider_etl_craft.errors import ConfigurationError, EtlCraftError


def checked_path(
    path: str | os.PathLike[str],
    setting: str,
    *,
    kind: str = "file",
    must_exist: bool = True,
    error: type[EtlCraftError] = ConfigurationError,
) -> Path:
    """``path`` with ``~`` expanded and symbolic links resolved, after the checks above.

    :param setting: what the path came from, for the message (``Secrets.Path``, ``Engine.prod.key_file``).
    :param kind: ``file`` or ``directory``: what an existing path must be (``path``: either).
    :param must_exist: refuse a missing path (a SQLite Engine DB that init-db will create passes False).
    """
    text = os.fspath(path)
    if "\x00" in text:
        raise error(f"{setting}: the path {text!r} contains a NUL byte; fix the path")
    try:
        resolved = Path(text).expanduser().resolve()
    except RuntimeError:  # Python 3.11 and 3.12 report a symbolic link loop so
        raise error(f"{setting}: {text} is a loop of symbolic links; point it at a real {kind}") from None
    except OSError as exc:  # Python 3.13+: ELOOP
        if exc.errno == errno.ELOOP:
            raise error(f"{setting}: {text} is a loop of symbolic links; point it at a real {kind}") from None
        raise error(f"{setting}: cannot resolve {text} ({exc.strerror}); fix the path") from None
    if not must_exist and not resolved.exists():
        return resolved
    if not resolved.exists():
        dangling = (
            " is a symbolic link to nothing" if Path(text).expanduser().is_symlink() else " does not exist"
        )
        raise error(f"{setting}: {text}{dangling}; fix the path")
    if kind == "file" and resolved.is_dir():
        raise error(f"{setting}: {text} is a directory, not a file; fix the path")
    if kind == "directory" and not resolved.is_dir():
        raise error(f"{setting}: {text} is not a directory; fix the path")
    return resolved


def read_text(
    path: str | os.PathLike[str], setting: str, error: type[EtlCraftError] = ConfigurationError
) -> str:
    """The UTF-8 text of a file that passes :func:`checked_path`."""
    resolved = checked_path(path, setting, error=error)
    try:
        data = resolved.read_bytes()
    except OSError as exc:
        raise error(
            f"{setting}: cannot read {os.fspath(path)} ({exc.strerror}); let this user read it"
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error(
            f"{setting}: {os.fspath(path)} is not UTF-8 text (line {line}); save it as UTF-8"
        ) from None
