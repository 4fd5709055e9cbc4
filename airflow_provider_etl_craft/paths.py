"""Every file the provider opens is checked here first, so a bad path is one clear error naming its setting.

Config files, ``.env`` files, the SQLite Engine DB, certificate and key files and migration files all go
through :func:`checked_path` (and :func:`read_text` for the text ones): a NUL byte, a symbolic link loop, a
dangling link, a directory where a file belongs (or the reverse), a path the operating system refuses (a name
longer than NAME_MAX, a file used as a folder, a folder this user may not search), an unreadable file and a
file that is not UTF-8 each raise the caller's error type (CONFIGURATION, or MIGRATION for migration files)
instead of an ``OSError``, ``RuntimeError``, ``ValueError`` or ``UnicodeDecodeError`` from deep inside.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from airflow_provider_etl_craft.errors import ConfigurationError, EtlCraftError

#: Why the operating system refused a path, by errno: what the message says and how to fix it.
_REFUSALS = {
    errno.ENAMETOOLONG: "a name in it is longer than the file system allows (255 bytes per name); shorten it",
    errno.ENOTDIR: "a part of it that should be a folder is a file; fix the path",
    errno.EACCES: "this user may not search a folder in it; fix the path or the folder's permissions",
    errno.EPERM: "this user may not search a folder in it; fix the path or the folder's permissions",
}


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
        raise _refused(exc, setting, text, kind=kind, error=error) from None
    try:
        exists = resolved.exists()
        if not must_exist and not exists:
            _check_ancestors(resolved)
            return resolved
        if not exists:
            dangling = (
                " is a symbolic link to nothing"
                if Path(text).expanduser().is_symlink()
                else " does not exist"
            )
            raise error(f"{setting}: {text}{dangling}; fix the path")
        is_dir = resolved.is_dir()
    except OSError as exc:  # stat() refused the path: ENAMETOOLONG, EACCES, … (ENOENT/ENOTDIR read as absent)
        raise _refused(exc, setting, text, kind=kind, error=error) from None
    if kind == "file" and is_dir:
        raise error(f"{setting}: {text} is a directory, not a file; fix the path")
    if kind == "directory" and not is_dir:
        raise error(f"{setting}: {text} is not a directory; fix the path")
    return resolved


def _check_ancestors(path: Path) -> None:
    """A path still to be created: its nearest existing ancestor must be a folder (pathlib reads ENOTDIR as absent)."""
    for ancestor in path.parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(ancestor))
            return


def _refused(
    exc: OSError, setting: str, text: str, *, kind: str, error: type[EtlCraftError]
) -> EtlCraftError:
    """The caller's error for a path the operating system refused, classified by ``errno``."""
    if exc.errno == errno.ELOOP:
        return error(f"{setting}: {text} is a loop of symbolic links; point it at a real {kind}")
    why = (
        _REFUSALS.get(exc.errno or 0)
        or f"the system refuses it ({exc.strerror or type(exc).__name__}); fix the path"
    )
    return error(f"{setting}: {_short(text)} cannot be used: {why}")


def _short(text: str, keep: int = 120) -> str:
    """A path for a message: a name too long for the system is shortened so the message stays readable."""
    return text if len(text) <= keep else f"{text[: keep // 2]}…{text[-keep // 2 :]} ({len(text)} characters)"


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
