"""Paths the provider opens, checked in one helper (issue 14): each oddity is one CLI error line with a documented
status, naming the setting and the path — never an ``OSError``, ``RuntimeError`` or ``UnicodeDecodeError``."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_provider_etl_craft.cli.main import main

SQLITE = "Engine:\n  t:\n    jdbc_url: {url}\n    schema: main\n"


def write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "craft-connector.yml"
    path.write_text(text, encoding="utf-8")
    return path


def loop(folder: Path) -> Path:
    """Two symbolic links pointing at each other; the first."""
    folder.mkdir(parents=True, exist_ok=True)
    os.symlink(folder / "loop-b", folder / "loop-a")
    os.symlink(folder / "loop-a", folder / "loop-b")
    return folder / "loop-a"


def config_loop(tmp: Path) -> list[str]:
    return ["check", "--config", str(loop(tmp))]


def config_not_utf8(tmp: Path) -> list[str]:
    path = tmp / "craft-connector.yml"
    path.write_bytes("Engine:\n  t:\n    jdbc_url: jdbc:sqlite:caf\xe9.db\n".encode("latin-1"))
    return ["check", "--config", str(path)]


def sqlite_loop(tmp: Path) -> list[str]:
    return ["init-db", "--config", str(write(tmp, SQLITE.format(url=f"jdbc:sqlite:{loop(tmp / 'db')}")))]


def sqlite_nul(tmp: Path) -> list[str]:
    return ["init-db", "--config", str(write(tmp, SQLITE.format(url='"jdbc:sqlite:a\\0b.db"')))]


def secrets(tmp: Path, path: str, env: bytes | None = None) -> list[str]:
    if env is not None:
        (tmp / ".env").write_bytes(env)
    text = (
        f"Secrets:\n  Source_type: file\n  Path: {path}\n"
        "Engine:\n  t:\n    jdbc_url: jdbc:postgresql://127.0.0.1:9/x\n    schema: s\n    user: u\n"
        "    auth_mode: password\n    secret: PW\n"
    )
    return ["check", "--config", str(write(tmp, text))]


def migrations(tmp: Path, make: Callable[[Path], None]) -> list[str]:
    config = write(tmp, SQLITE.format(url="jdbc:sqlite:engine.db"))
    folder = tmp / "migrations"
    folder.mkdir()
    make(folder)
    return ["migrate", "--config", str(config)]


def key_file_loop(tmp: Path) -> list[str]:
    text = (
        "Engine:\n  t:\n    jdbc_url: jdbc:postgresql://127.0.0.1:9/x\n    schema: s\n    user: u\n"
        f"    auth_mode: key_file\n    key_file: {loop(tmp / 'keys')}\n    cert_file: client.crt\n"
    )
    (tmp / "client.crt").write_text("not used")
    return ["check", "--config", str(write(tmp, text))]


TOO_LONG = "n" * 256  # one byte over NAME_MAX (255) on Linux file systems


def sqlite_at(url: str) -> Callable[[Path], list[str]]:
    return lambda tmp: ["init-db", "--config", str(write(tmp, SQLITE.format(url=url)))]


def sqlite_under_a_file(tmp: Path) -> list[str]:
    (tmp / "plain-file").write_text("not a folder")
    return sqlite_at("jdbc:sqlite:plain-file/engine.db")(tmp)


def key_file_at(path: str) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        (tmp / "keys").mkdir()
        text = (
            "Engine:\n  t:\n    jdbc_url: jdbc:postgresql://127.0.0.1:9/x\n    schema: s\n    user: u\n"
            f"    auth_mode: key_file\n    key_file: {path}\n"
        )
        return ["check", "--config", str(write(tmp, text))]

    return make


CASES = [
    pytest.param(sqlite_at(f"jdbc:sqlite:{TOO_LONG}.db"), 3, "Engine.t.jdbc_url: ",
                 "a name in it is longer than the file system allows", id="sqlite-name-too-long"),
    pytest.param(sqlite_at(f"jdbc:sqlite:{TOO_LONG}/engine.db"), 3, "Engine.t.jdbc_url: ",
                 "a name in it is longer than the file system allows", id="sqlite-folder-name-too-long"),
    pytest.param(sqlite_under_a_file, 3, "Engine.t.jdbc_url: ", "a part of it that should be a folder is a file",
                 id="sqlite-under-a-file"),
    pytest.param(lambda t: secrets(t, f"{TOO_LONG}/.env"), 1, "Secrets.Path: ",
                 "a name in it is longer than the file system allows", id="secrets-path-too-long"),
    pytest.param(key_file_at(f"keys/{TOO_LONG}/client.key"), 1, "Engine.t.key_file",
                 "a name in it is longer than the file system allows", id="key-file-too-long"),
    pytest.param(config_loop, 1, "the given config path: ", "is a loop of symbolic links", id="config-symlink-loop"),
    pytest.param(config_not_utf8, 1, "craft-connector.yml", "is not UTF-8 text (line 3)", id="config-not-utf8"),
    pytest.param(sqlite_loop, 3, "Engine.t.jdbc_url: ", "is a loop of symbolic links", id="sqlite-symlink-loop"),
    pytest.param(sqlite_nul, 3, "Engine.t.jdbc_url: ", "contains a NUL byte", id="sqlite-path-nul"),
    pytest.param(lambda t: secrets(t, str(loop(t / "env"))), 1, "Secrets.Path: ", "is a loop of symbolic links",
                 id="secrets-path-symlink-loop"),
    pytest.param(lambda t: secrets(t, '"a\\0b"'), 1, "Secrets.Path: ", "contains a NUL byte", id="secrets-path-nul"),
    pytest.param(lambda t: secrets(t, "."), 1, "Secrets.Path", "is a directory, not a file", id="secrets-path-dir"),
    pytest.param(lambda t: secrets(t, ".env", b"PW=ab\x00cd\n"), 1, "Engine.t.secret names variable PW",
                 "contains a NUL byte", id="dotenv-secret-nul"),
    pytest.param(lambda t: secrets(t, ".env", b"PW=caf\xe9\n"), 1, "Secrets.Path", "is not UTF-8 text (line 1)",
                 id="dotenv-not-utf8"),
    pytest.param(lambda t: migrations(t, lambda f: os.symlink(f / "gone.sql", f / "0001_a.sql")), 13,
                 "migration PROJECT 0001_a.sql: ", "is a symbolic link to nothing", id="migration-dangling-link"),
    pytest.param(lambda t: migrations(t, lambda f: (f / "0001_a.sql").mkdir()), 13, "migration PROJECT 0001_a.sql: ",
                 "is a directory, not a file", id="migration-directory"),
    pytest.param(lambda t: migrations(t, lambda f: (f / "0001_a.sql").write_bytes(b"SELECT 1;\n-- caf\xe9\n")), 13,
                 "migration PROJECT 0001_a.sql: ", "is not UTF-8 text (line 2)", id="migration-not-utf8"),
    pytest.param(key_file_loop, 1, "Engine.t.key_file", "is a loop of symbolic links", id="key-file-symlink-loop"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "status", "setting", "problem"), CASES)
def test_a_bad_path_is_one_error_line_naming_the_setting(
    make: Callable[[Path], list[str]], status: int, setting: str, problem: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    argv = make(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    assert main(argv, out, err) == status, out.getvalue() + err.getvalue()
    text = out.getvalue() + err.getvalue()
    # check reports it as its one failed check (the checks that need it say "not checked"); others as an error
    prefix = "[FAIL] " if argv[0] == "check" else "error: "
    (line,) = [
        line for line in text.splitlines() if line.startswith(prefix) and ": not checked: " not in line
    ]
    assert setting in line and problem in line, text
    assert "Traceback" not in text and "unexpected internal error" not in text
