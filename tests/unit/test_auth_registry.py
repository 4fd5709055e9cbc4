"""The auth-mode registry is the one declaration of each mode: profiles, connections, the form and docs/auth.md agree."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from airflow.models.connection import Connection

from airflow_provider_etl_craft.auth import AUTH_MODES, AuthMode, Field
from airflow_provider_etl_craft.auth.sts import RoleKeys
from airflow_provider_etl_craft.config import load_engine_profile
from airflow_provider_etl_craft.config.connection import profile_from_connection
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.provider_info_source import CONN_FIELDS

AUTH_PAGE = Path(__file__).resolve().parents[2] / "docs" / "auth.md"
SLOT_NAMES = {"login": "login", "password": "password", "extra": "extras"}
#: A value for every key some mode takes (no identifier-like text, so no variable lookup intervenes).
VALUES = {
    "user": "etl-user",
    "key_file": "/opt/etl/tls/client.key",
    "cert_file": "/opt/etl/tls/client.crt",
    "client_id": "etl-craft.client",
    "token_url": "https://login.example.com/oauth2/token",
    "scope": "db.read",
    "issuer": "https://login.example.com",
    "region": "eu-west-1",
    "role_arn": "arn:aws:iam::123456789012:role/etl-craft",
}
SECRET_VARIABLE, SECRET_VALUE = "AUTH_REGISTRY_SECRET", "registry-secret-7c1e"


def _keys(keys: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"`{key}`" for key in keys) or "—"


def _connection_mapping(mode: AuthMode) -> str:
    slots = {slot: [f.key for f in mode.fields if f.conn == slot] for slot in SLOT_NAMES}
    return "; ".join(f"{SLOT_NAMES[slot]}: {_keys(keys)}" for slot, keys in slots.items() if keys)


def render_table() -> str:
    """The table of auth modes in docs/auth.md, as the registry declares them."""
    rows = [
        "| mode | credential | required keys | optional keys | secret keys | path keys | driver | Airflow connection |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in AUTH_MODES.values():
        cells = [
            f"`{mode.name}`",
            mode.summary,
            _keys(mode.required_keys),
            _keys(mode.optional_keys),
            _keys(mode.secret_keys),
            _keys(mode.path_keys),
            mode.driver,
            _connection_mapping(mode),
        ]
        rows.append(f"| {' | '.join(cells)} |")
    return "\n".join(rows)


def page_table() -> str:
    """The first table of docs/auth.md."""
    lines = AUTH_PAGE.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def test_the_docs_table_of_auth_modes_is_the_registry() -> None:
    expected = render_table()
    assert page_table() == expected, f"update the table of docs/auth.md to:\n{expected}"


def test_a_key_shared_by_modes_means_the_same_in_each() -> None:
    """The loader and the connection treat a key alike whatever the mode (a secret's label may differ)."""
    seen: dict[str, tuple[str, Field]] = {}
    for mode in AUTH_MODES.values():
        assert len(set(mode.keys)) == len(mode.fields), f"{mode.name} declares a key twice"
        for field in mode.fields:
            first_mode, first = seen.setdefault(field.key, (mode.name, field))
            shape = (field.secret, field.path, field.conn)
            assert shape == (first.secret, first.path, first.conn), (
                f"{field.key}: {mode.name} declares it unlike {first_mode}"
            )


def test_the_connection_form_has_a_field_for_every_extra_of_every_mode() -> None:
    """One form field per extra key, labelled alike by every mode that takes it and naming those modes."""
    auth_mode = CONN_FIELDS["auth_mode"]["schema"]["enum"]
    assert auth_mode == [None, *AUTH_MODES]
    for mode in AUTH_MODES.values():
        for field in mode.fields:
            if field.conn == "extra":
                assert CONN_FIELDS[field.key]["label"] == field.label
                assert mode.name in CONN_FIELDS[field.key]["description"]
            else:
                assert field.key not in CONN_FIELDS


class _Posted(dict[str, str]):
    """Form data as WTForms reads a POST."""

    def getlist(self, key: str) -> list[str]:
        return [self[key]] if key in self else []


def test_the_form_widgets_accept_exactly_the_registered_modes() -> None:
    """Airflow 3.0/3.1 validate the form with these WTForms fields."""
    pytest.importorskip("wtforms")
    from wtforms import Form

    form_class = type("ConnectionForm", (Form,), EngineDBHook.get_connection_form_widgets())
    for value, valid in [*((name, True) for name in AUTH_MODES), ("kerberos", False), ("", True)]:
        assert form_class(_Posted(auth_mode=value)).validate() is valid, value


@pytest.mark.parametrize("name", list(AUTH_MODES))
def test_a_profile_and_an_inline_connection_of_a_mode_resolve_alike(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every key of the mode, written in craft-connector.yml or held by a connection, gives the same profile."""
    mode = AUTH_MODES[name]
    monkeypatch.setenv(SECRET_VARIABLE, SECRET_VALUE)
    written = {f.key: SECRET_VARIABLE if f.secret else VALUES[f.key] for f in mode.fields}
    config = tmp_path / "craft-connector.yml"
    settings = {
        "jdbc_url": "jdbc:postgresql://db.internal:5432/etl_craft",
        "schema": "etl_craft",
        "auth_mode": name,
        **written,
    }
    config.write_text(json.dumps({"Engine": {"prod": settings}}), encoding="utf-8")
    held = {
        slot: {f.key: VALUES.get(f.key, SECRET_VALUE) for f in mode.fields if f.conn == slot}
        for slot in SLOT_NAMES
    }
    conn = Connection(
        conn_id="registry",
        conn_type="etl_craft",
        host="db.internal",
        port=5432,
        schema="etl_craft",
        login=held["login"].get("user"),
        password=next(iter(held["password"].values()), None),
        extra=json.dumps({"engine_schema": "etl_craft", "auth_mode": name, **held["extra"]}),
    )

    from_file, from_conn = load_engine_profile(config), profile_from_connection(conn)

    assert from_file.auth is from_conn.auth is mode
    assert (from_file.user, dict(from_file.fields)) == (from_conn.user, dict(from_conn.fields))
    assert dict(from_file.secrets) == dict(from_conn.secrets) == {k: SECRET_VALUE for k in mode.secret_keys}
    assert from_file.user == VALUES["user"]


def test_a_secret_field_is_the_connections_password_and_nothing_else_is() -> None:
    with pytest.raises(ValueError, match="secret"):
        Field("secret", "Secret", "a secret", secret=True)
    with pytest.raises(ValueError, match="secret"):
        Field("region", "Region", "a region", conn="password")


def test_the_registry_records_are_values_that_travel() -> None:
    """Modes compare, hash, pickle and deep-copy as values (a profile carries its mode into a task's operator
    and a pickled executor payload), and a mode's repr names it and nothing else."""
    for name, mode in AUTH_MODES.items():
        assert pickle.loads(pickle.dumps(mode)) == mode
        assert copy.deepcopy(mode) == mode and hash(copy.deepcopy(mode)) == hash(mode)
        assert repr(mode) == f"{type(mode).__name__}(name={name!r})"
    assert AUTH_MODES["password"] != AUTH_MODES["token"]


def test_assumed_role_credentials_never_show_their_secrets() -> None:
    keys = RoleKeys("AKIAEXAMPLE", "wJalr-secret-access-key", "session-token-value", datetime.now(UTC))
    for shown in (repr(keys), str(keys), f"{keys!r}", repr([keys])):
        assert "AKIAEXAMPLE" in shown
        assert "wJalr-secret-access-key" not in shown and "session-token-value" not in shown


def test_the_registry_loads_only_for_a_profile_that_has_auth_keys(tmp_path: Path) -> None:
    """A SQLite profile takes no auth mode: resolving it (as every recorded try does) loads none of the modes'
    modules; a PostgreSQL profile loads the registry on its first use (docs/performance.md)."""
    sqlite = tmp_path / "sqlite" / "craft-connector.yml"
    sqlite.parent.mkdir()
    sqlite.write_text(
        f"Engine:\n  Name: sqlite\n  test:\n    jdbc_url: jdbc:sqlite:{tmp_path / 'engine.db'}\n"
    )
    postgres = tmp_path / "postgres" / "craft-connector.yml"
    postgres.parent.mkdir()
    postgres.write_text(
        "Engine:\n  test:\n    jdbc_url: jdbc:postgresql://db.example:5432/etl\n    schema: etl\n"
        "    user: etl\n    auth_mode: token\n    secret: ENGINE_SECRET\n"
    )
    probe = (
        "import sys\n"
        "from airflow_provider_etl_craft.config import load_engine_profile\n"
        "modes = lambda: sorted(m for m in sys.modules if m.startswith('airflow_provider_etl_craft.auth.')\n"
        "                       and m != 'airflow_provider_etl_craft.auth.base')\n"
        f"assert load_engine_profile({str(sqlite)!r}, 'test').auth.name == 'none'\n"
        "print(modes())\n"
        f"assert load_engine_profile({str(postgres)!r}, 'test').auth.name == 'token'\n"
        "print(modes())\n"
    )
    env = {**os.environ, "ENGINE_SECRET": "s3cret"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    after_sqlite, after_postgres = done.stdout.strip().splitlines()[-2:]
    assert after_sqlite == "[]"
    assert "airflow_provider_etl_craft.auth.password" in after_postgres
