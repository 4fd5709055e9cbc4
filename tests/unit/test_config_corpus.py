"""A corpus of malformed craft-connector.yml files: each one is refused with a clear, secret-free message.

Every case is ``(yaml_text, env, expected_fragment)``:

- ``yaml_text`` is written to ``craft-connector.yml`` in a fresh folder;
- ``env`` holds environment variables, except keys containing a ``.``, which are files written beside
  the config (e.g. ``secrets.env`` for the ``file`` secrets source);
- ``<SECRET>`` in either is replaced by a distinctive value per case (``TOPSECRET-<id>-value``) that must
  never appear in a message, on stdout or on stderr.

The same corpus runs through ``load_engine_profile`` and through the CLI (``etl-craft-airflow check``):
in-process for every case, and as real subprocesses for a few representative ones.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.config import load_engine_profile
from airflow_provider_etl_craft.errors import ConfigurationError

SECRET_PLACEHOLDER = "<SECRET>"

#: Variables some case relies on being unset unless it sets them itself.
VARIABLES_CLEARED = (
    "ETL_CRAFT_CONFIG",
    "ETL_CRAFT_PROFILE",
    "ETL_CRAFT_MIGRATIONS_DIR",
    "ENGINE_URL",
    "ENGINE_USER",
    "ENGINE_PROD_USER",
    "ENGINE_SECRET",
    "ENGINE_PROD_SECRET",
    "ENGINE_SECRT",
    "ENGINE_PROD_SECRT",
    "my_db_password",
    "my_PROD_db_password",
)

#: Text that must not be shown for a case, besides its ``<SECRET>`` value.
NEVER_SHOWN = {
    "secret-is-a-literal-password": ("s3cr3t-P@ss!",),
    "secret-lowercase-name-unset": ("my_db_password", "my_PROD_db_password"),
}

#: Cases whose message is about the .env secrets file rather than craft-connector.yml itself.
DOTENV_ORIGIN = {"secrets-file-does-not-exist": "missing.env"}

PG_ENV = {"ENGINE_USER": "etl_user", "ENGINE_SECRET": SECRET_PLACEHOLDER}

_PG_DEFAULTS = {
    "jdbc_url": "jdbc:postgresql://db.internal:5432/etl_craft",
    "schema": "etl_craft",
    "user": "ENGINE_USER",
    "auth_mode": "password",
    "secret": "ENGINE_SECRET",
}


def pg(**settings: str | None) -> str:
    """A file with one PostgreSQL profile ``prod``: valid defaults, ``settings`` override (None removes)."""
    merged = {**_PG_DEFAULTS, **settings}
    lines = [f"    {key}: {value}" for key, value in merged.items() if value is not None]
    return "Engine:\n  prod:\n" + "\n".join(lines) + "\n"


def sqlite(**settings: str) -> str:
    """A file with one SQLite profile ``dev`` plus the given extra settings."""
    lines = [
        f"    {key}: {value}"
        for key, value in {"jdbc_url": "jdbc:sqlite:engine/etl-craft.db", **settings}.items()
    ]
    return "Engine:\n  dev:\n" + "\n".join(lines) + "\n"


def file_source(path: str | None) -> str:
    """A PostgreSQL profile whose secrets come from a .env file (``Secrets.Path`` omitted when None)."""
    secrets = "Secrets:\n  Source_type: file\n" + (f"  Path: {path}\n" if path else "")
    return secrets + pg()


TWO_PROFILES = """\
Engine:
  dev:
    jdbc_url: jdbc:sqlite:engine/etl-craft.db
  prod:
    jdbc_url: jdbc:postgresql://db.internal/etl_craft
    schema: etl_craft
    user: ENGINE_USER
    auth_mode: password
    secret: ENGINE_SECRET
"""

CORPUS = [
    # --- YAML itself -------------------------------------------------------------------------------
    pytest.param(
        "Engine:\n  prod: [jdbc_url, schema\n", PG_ENV, "not valid YAML", id="yaml-unclosed-flow-sequence"
    ),
    pytest.param(
        "Engine:\n  prod:\n    schema: a\n   user: b\n", PG_ENV, "not valid YAML", id="yaml-bad-indentation"
    ),
    pytest.param(pg() + pg(), PG_ENV, "key 'Engine' appears twice", id="duplicate-top-level-section"),
    pytest.param(
        pg(schema="etl_craft\n    schema: other"),
        PG_ENV,
        "key 'schema' appears twice",
        id="duplicate-key-in-profile",
    ),
    pytest.param(
        TWO_PROFILES.replace("  prod:", "  dev:", 1),
        PG_ENV,
        "key 'dev' appears twice",
        id="duplicate-profile",
    ),
    pytest.param(
        "Engine:\n  ? [dev, prod]\n  : {jdbc_url: 'jdbc:sqlite:x.db'}\n",
        {},
        "key at line 2",
        id="yaml-unhashable-key",
    ),
    # --- structure ---------------------------------------------------------------------------------
    pytest.param("- Secrets\n- Engine\n", {}, "top level must be a mapping", id="top-level-is-a-list"),
    pytest.param("just some text\n", {}, "top level must be a mapping", id="top-level-is-a-scalar"),
    pytest.param("", {}, "no 'Engine' section", id="empty-file"),
    pytest.param(
        pg() + "Orchestrations:\n  x: 1\n",
        PG_ENV,
        "unknown section(s) Orchestrations",
        id="unknown-top-level-section",
    ),
    pytest.param("Secrets:\n  Source_type: environment\n", {}, "no 'Engine' section", id="engine-missing"),
    pytest.param(
        "Secrets: environment\n" + pg(),
        PG_ENV,
        "section 'Secrets' must be a mapping",
        id="secrets-section-not-a-mapping",
    ),
    pytest.param(
        "Secrets:\n  Sourcetype: environment\n" + pg(),
        PG_ENV,
        "unknown key(s) in Secrets: Sourcetype",
        id="unknown-key-in-secrets",
    ),
    pytest.param(
        "Engine:\n  - jdbc:sqlite:x.db\n",
        {},
        "section 'Engine' must be a mapping",
        id="engine-section-is-a-list",
    ),
    pytest.param("Engine: {}\n", {}, "Engine has no profiles", id="engine-empty"),
    pytest.param("Engine:\n  Profile: prod\n", {}, "Engine has no profiles", id="engine-only-a-selector"),
    pytest.param(
        "Engine:\n  prod: jdbc:sqlite:x.db\n",
        {},
        "Engine has no profiles",
        id="engine-profile-not-a-mapping",
    ),
    pytest.param(
        pg(password="<SECRET>"),
        PG_ENV,
        "unknown key(s) in Engine.prod: password",
        id="unknown-key-in-profile",
    ),
    pytest.param(
        pg(schema="[a, b]"), PG_ENV, "Engine.prod.schema must be a single value", id="setting-is-a-list"
    ),
    # --- profile selection -------------------------------------------------------------------------
    pytest.param(TWO_PROFILES, PG_ENV, "several (dev, prod)", id="several-profiles-none-selected"),
    pytest.param(
        "Secrets:\n  Profile: ETL_CRAFT_PROFILE\n" + TWO_PROFILES,
        PG_ENV,
        "Secrets.Profile selects profile 'ETL_CRAFT_PROFILE' (no variable ETL_CRAFT_PROFILE is set",
        id="several-profiles-selector-variable-unset",
    ),
    pytest.param(
        TWO_PROFILES.replace("Engine:\n", "Engine:\n  Profile: staging\n"),
        PG_ENV,
        "Engine.Profile selects profile 'staging', which does not exist",
        id="engine-profile-names-missing-profile",
    ),
    pytest.param(
        "Secrets:\n  Profile: ETL_CRAFT_PROFILE\n" + TWO_PROFILES,
        {**PG_ENV, "ETL_CRAFT_PROFILE": "staging"},
        "Secrets.Profile selects profile 'staging'",
        id="secrets-profile-variable-names-missing-profile",
    ),
    # --- secrets -----------------------------------------------------------------------------------
    pytest.param(
        pg(),
        {"ENGINE_USER": "etl_user"},
        "Engine.prod.secret names variable ENGINE_SECRET",
        id="secret-unset",
    ),
    pytest.param(
        pg(),
        {"ENGINE_USER": "etl_user", "ENGINE_SECRET": ""},
        "Engine.prod.secret names variable ENGINE_SECRET, which is set but empty",
        id="secret-set-but-empty",
    ),
    pytest.param(
        pg(),
        {**PG_ENV, "ENGINE_PROD_SECRET": ""},
        "Engine.prod.secret names variable ENGINE_PROD_SECRET, which is set but empty",
        id="secret-profile-twin-set-but-empty",
    ),
    pytest.param(
        pg(secret='"s3cr3t-P@ss!"'),
        PG_ENV,
        "Engine.prod.secret must be the NAME of a variable",
        id="secret-is-a-literal-password",
    ),
    pytest.param(
        pg(secret='"<SECRET>"'),
        PG_ENV,
        "Engine.prod.secret must be the NAME of a variable",
        id="secret-is-the-secret-itself",
    ),
    pytest.param(
        pg(secret="my_db_password"),
        PG_ENV,
        "Engine.prod.secret names a variable that is not set",
        id="secret-lowercase-name-unset",
    ),
    pytest.param(
        pg(secret="ENGINE_SECRT"), PG_ENV, "did you mean ENGINE_SECRET", id="secret-name-typo-suggested"
    ),
    pytest.param(
        pg(auth_mode="ENGINE_SECRET"),  # a mistake: auth_mode names the secret's variable
        PG_ENV,
        "Engine.prod.auth_mode",
        id="auth-mode-names-the-secret-variable",
    ),
    # --- jdbc_url ----------------------------------------------------------------------------------
    pytest.param(pg(jdbc_url=None), PG_ENV, "Engine.prod.jdbc_url is required", id="url-missing"),
    pytest.param(
        pg(jdbc_url="jdbc:postgresql://db.internal/etl_craft?password=<SECRET>"),
        PG_ENV,
        "credential key 'password'",
        id="url-query-password",
    ),
    pytest.param(
        pg(jdbc_url="jdbc:postgresql://db.internal/etl_craft?sslmode=require&user=etl_user"),
        PG_ENV,
        "credential key 'user'",
        id="url-query-user",
    ),
    pytest.param(
        pg(jdbc_url="jdbc:postgresql://db.internal/etl_craft?sslpassword=<SECRET>"),
        PG_ENV,
        "credential key 'sslpassword'",
        id="url-query-sslpassword",
    ),
    pytest.param(
        pg(jdbc_url="jdbc:postgresql://etl_user:<SECRET>@db.internal/etl_craft"),
        PG_ENV,
        "credentials in the URL are refused",
        id="url-user-password-at-host",
    ),
    pytest.param(
        pg(jdbc_url="jdbc:postgresql://db.internal/etl_craft?sslmood=require"),
        PG_ENV,
        "unknown query setting 'sslmood'",
        id="url-unknown-query-key",
    ),
    pytest.param(
        pg(jdbc_url="jdbc:mysql://db.internal/etl_craft"),
        PG_ENV,
        "Engine.prod.jdbc_url must start with 'jdbc:sqlite:' or 'jdbc:postgresql://'",
        id="url-bad-scheme",
    ),
    pytest.param(
        pg(jdbc_url="postgresql://db.internal/etl_craft"),
        PG_ENV,
        "Engine.prod.jdbc_url must start with",
        id="url-without-jdbc-prefix",
    ),
    pytest.param(
        pg(jdbc_url="jdbc:postgresql://db.internal:5432/"), PG_ENV, "no database name", id="url-no-database"
    ),
    pytest.param(
        pg(jdbc_url="jdbc:postgresql://db.internal:54x2/etl_craft"),
        PG_ENV,
        "port is not a number",
        id="url-port-not-a-number",
    ),
    pytest.param(
        pg(jdbc_url="jdbc:postgresql://db.internal:99999/etl_craft"),
        PG_ENV,
        "port is not a number",
        id="url-port-out-of-range",
    ),
    pytest.param(
        pg(jdbc_url="jdbc:postgresql://[::1:5432/etl_craft"),
        PG_ENV,
        "the host is not a valid bracketed IPv6 address",
        id="url-ipv6-unclosed-bracket",
    ),
    pytest.param(
        pg(jdbc_url="jdbc:postgresql://[db.internal]:5432/etl_craft"),
        PG_ENV,
        "the host is not a valid bracketed IPv6 address",
        id="url-ipv6-brackets-around-a-name",
    ),
    pytest.param(
        pg(jdbc_url="jdbc:postgresql://db.invalid:0/etl_craft"),
        PG_ENV,
        "port is not a number",
        id="url-port-zero",
    ),
    pytest.param(
        "Engine:\n  dev:\n    jdbc_url: 'jdbc:sqlite:'\n",
        {},
        "in-memory SQLite is refused",
        id="sqlite-in-memory-empty-path",
    ),
    pytest.param(
        "Engine:\n  dev:\n    jdbc_url: 'jdbc:sqlite::memory:'\n",
        {},
        "in-memory SQLite is refused",
        id="sqlite-in-memory-memory",
    ),
    # --- schema ------------------------------------------------------------------------------------
    pytest.param(
        pg(schema="etl-craft"), PG_ENV, "Engine.prod.schema must be a plain identifier", id="schema-hyphen"
    ),
    pytest.param(
        pg(schema="1abc"), PG_ENV, "Engine.prod.schema must be a plain identifier", id="schema-leading-digit"
    ),
    pytest.param(
        pg(schema="'a\"b'"), PG_ENV, "Engine.prod.schema must be a plain identifier", id="schema-quote"
    ),
    pytest.param(
        sqlite(schema="etl-craft"),
        {},
        "Engine.dev.schema must be a plain identifier",
        id="sqlite-schema-hyphen",
    ),
    pytest.param(
        pg(schema=None), PG_ENV, "Engine.prod.schema is required for PostgreSQL", id="postgres-schema-missing"
    ),
    # --- auth modes --------------------------------------------------------------------------------
    pytest.param(
        sqlite(auth_mode="password"),
        {},
        "Engine.dev.auth_mode is 'password', but SQLite takes no auth_mode",
        id="sqlite-auth-mode",
    ),
    pytest.param(
        pg(auth_mode=None),
        PG_ENV,
        "Engine.prod.auth_mode is required for PostgreSQL",
        id="postgres-auth-mode-missing",
    ),
    pytest.param(
        pg(auth_mode="kerberos"),
        PG_ENV,
        "Engine.prod.auth_mode 'kerberos' is not an auth mode",
        id="auth-mode-unknown",
    ),
    pytest.param(
        pg(auth_mode="oauth"),
        PG_ENV,
        "Engine.prod.client_id is required by auth_mode 'oauth'",
        id="oauth-mode-client-id-missing",
    ),
    pytest.param(
        pg(user=None),
        PG_ENV,
        "Engine.prod.user is required by auth_mode 'password'",
        id="password-mode-user-missing",
    ),
    pytest.param(
        pg(secret=None),
        PG_ENV,
        "Engine.prod.secret is required by auth_mode 'password'",
        id="password-mode-secret-missing",
    ),
    # --- secrets sources ---------------------------------------------------------------------------
    pytest.param(
        "Secrets:\n  Source_type: vault\n" + pg(),
        PG_ENV,
        "Secrets.Source_type is 'vault'",
        id="secrets-source-type-unknown",
    ),
    pytest.param(file_source(None), PG_ENV, "Secrets.Path is required", id="secrets-file-without-path"),
    pytest.param(file_source("missing.env"), PG_ENV, "Secrets.Path", id="secrets-file-does-not-exist"),
    pytest.param(
        file_source("secrets.env"),
        {"secrets.env": "ENGINE_USER=etl_user\n", **PG_ENV},
        "not set in the file secrets source",
        id="file-source-ignores-the-environment",
    ),
    pytest.param(
        "Secrets:\n  Source_type: environment\n  Path: secrets.env\n" + pg(),
        PG_ENV,
        "Secrets.Path is used only with Source_type: file",
        id="secrets-path-beside-environment-source",
    ),
    pytest.param(
        "Secrets:\n  Source_type: SECRETS_SOURCE\n" + pg(),
        {**PG_ENV, "SECRETS_SOURCE": "vault"},
        "Secrets.Source_type is (the value of variable SECRETS_SOURCE)",
        id="secrets-source-type-variable-unknown",
    ),
    pytest.param(
        pg(),
        {**PG_ENV, "ENGINE_SECRET": "  \t "},
        "Engine.prod.secret names variable ENGINE_SECRET, which is set but empty",
        id="secret-blank",
    ),
    pytest.param(
        pg(secret="ENGINE_SECRET"),
        {"ENGINE_USER": "etl_user", "ENGINE_SECRET": "<SECRET>", "ENGINE_PROD_SECRET": ""},
        "Engine.prod.secret names variable ENGINE_PROD_SECRET, which is set but empty",
        id="secret-twin-defined-empty-wins",
    ),
    pytest.param(
        pg(auth_mode="sts", region="eu-west-1", secret="ENGINE_STS_SECRET"),
        PG_ENV,
        "Engine.prod.secret names variable ENGINE_STS_SECRET",
        id="secret-beside-a-mode-without-one-must-still-be-set",
    ),
    # --- Name, section layout, merges ----------------------------------------------------------------
    pytest.param(
        "Engine:\n  Name: SQLite\n" + pg().removeprefix("Engine:\n"),
        PG_ENV,
        "Engine.Name is 'SQLite', but the jdbc_url is a PostgreSQL URL",
        id="name-section-mismatch",
    ),
    pytest.param(
        sqlite(Name="Postgres"),
        {},
        "Engine.dev.Name is 'Postgres', but the jdbc_url is a SQLite URL",
        id="name-profile-mismatch",
    ),
    pytest.param(
        "Engine:\n  Name: Postgres\n" + sqlite(Name="MySQL").removeprefix("Engine:\n"),
        {},
        "Engine.dev.Name is 'MySQL', but the jdbc_url is a SQLite URL",
        id="name-profile-wins-and-unknown-name-mismatches",
    ),
    pytest.param(sqlite(Name="''"), {}, "Engine.dev.Name must be a non-empty text value", id="name-empty"),
    pytest.param(
        sqlite(Name="[SQLite]"), {}, "Engine.dev.Name must be a non-empty text value", id="name-list"
    ),
    pytest.param(
        "Engine:\n  schema: shared\n" + sqlite().removeprefix("Engine:\n"),
        {},
        "unknown key(s) in Engine: schema",
        id="engine-section-setting-the-profile-lacks",
    ),
    pytest.param(
        "Engine:\n  Email: {host: x}\n" + sqlite().removeprefix("Engine:\n"),
        {},
        "unknown key(s) in Engine: Email",
        id="engine-email-mapping-is-not-a-profile",
    ),
    pytest.param(
        pg() + "Secrets:\n  Source_type: environment\n",
        PG_ENV,
        "the sections are in the order Engine, Secrets",
        id="sections-out-of-order",
    ),
    pytest.param(
        "Engine:\n  dev: &d\n    jdbc_url: jdbc:sqlite:a.db\n  prod:\n    <<: *d\n    jdbc_url: jdbc:sqlite:b.db\n"
        "  Profile: prod\n",
        {},
        "key 'jdbc_url' appears twice",
        id="merge-override-is-a-duplicate",
    ),
    pytest.param(
        sqlite().replace("dev", "only").replace("Engine:", "Secrets:\n  Profile: ETL_CRAFT_PROFILE\nEngine:"),
        {},
        "Secrets.Profile selects profile 'ETL_CRAFT_PROFILE'",
        id="unset-selector-variable-with-one-profile",
    ),
    pytest.param(
        pg(jdbc_url="JDBC:postgresql://db.internal:5432/etl_craft"),
        PG_ENV,
        "write the prefix jdbc: in lower case",
        id="url-upper-case-jdbc-prefix-postgres",
    ),
]

#: Run as real subprocesses too (the in-process CLI run covers every case).
SUBPROCESS_CASES = (
    "yaml-unclosed-flow-sequence",
    "secret-unset",
    "url-user-password-at-host",
    "sqlite-in-memory-memory",
)


def _secret_for(request: pytest.FixtureRequest) -> str:
    return f"TOPSECRET-{request.node.callspec.id}-value"


def _write_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, yaml_text: str, env: dict[str, str], secret: str
) -> Path:
    """Write the config (and side files beside it), set the environment; return the config path."""
    for name in VARIABLES_CLEARED:
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "craft-connector.yml"
    config.write_text(yaml_text.replace(SECRET_PLACEHOLDER, secret), encoding="utf-8")
    for key, value in env.items():
        value = value.replace(SECRET_PLACEHOLDER, secret)
        if "." in key:
            (tmp_path / key).write_text(value, encoding="utf-8")
        else:
            monkeypatch.setenv(key, value)
    return config.resolve()


def _failures(printed: str) -> list[str]:
    """``check``'s failed checks, without those it could not run because of them."""
    return [
        line for line in printed.splitlines() if line.startswith("[FAIL] ") and ": not checked: " not in line
    ]


def _hidden(request: pytest.FixtureRequest, secret: str) -> list[str]:
    return [secret, *NEVER_SHOWN.get(request.node.callspec.id, ())]


@pytest.mark.parametrize(("yaml_text", "env", "expected_fragment"), CORPUS)
def test_load_refuses_malformed_config(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    yaml_text: str,
    env: dict[str, str],
    expected_fragment: str,
) -> None:
    secret = _secret_for(request)
    config = _write_case(tmp_path, monkeypatch, yaml_text, env, secret)

    with pytest.raises(ConfigurationError) as caught:
        load_engine_profile(config)

    message = str(caught.value)
    assert expected_fragment in message
    origin = DOTENV_ORIGIN.get(request.node.callspec.id)
    assert str((tmp_path / origin).resolve() if origin else config) in message
    for text in _hidden(request, secret):
        assert text not in message


@pytest.mark.parametrize(("yaml_text", "env", "expected_fragment"), CORPUS)
def test_cli_check_reports_malformed_config(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    yaml_text: str,
    env: dict[str, str],
    expected_fragment: str,
) -> None:
    secret = _secret_for(request)
    config = _write_case(tmp_path, monkeypatch, yaml_text, env, secret)
    out, err = io.StringIO(), io.StringIO()

    status = main(["check", "--config", str(config)], out=out, err=err)

    assert status == 1  # check reports the problem as a failed check, with every other check
    assert err.getvalue() == ""
    assert [line for line in _failures(out.getvalue()) if expected_fragment in line], out.getvalue()
    assert re.fullmatch(r"\d+ ok, \d+ warning\(s\), [1-9]\d* failed", out.getvalue().splitlines()[-1])
    for text in _hidden(request, secret):
        assert text not in out.getvalue()
        assert text not in err.getvalue()


@pytest.mark.parametrize(
    ("yaml_text", "env", "expected_fragment"), [case for case in CORPUS if case.id in SUBPROCESS_CASES]
)
def test_cli_subprocess_reports_malformed_config(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    yaml_text: str,
    env: dict[str, str],
    expected_fragment: str,
) -> None:
    secret = _secret_for(request)
    config = _write_case(tmp_path, monkeypatch, yaml_text, env, secret)

    result = subprocess.run(
        [sys.executable, "-m", "airflow_provider_etl_craft.cli.main", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        env=dict(os.environ),  # monkeypatch already applied the case's variables to os.environ
        cwd=tmp_path,
        timeout=120,
    )

    assert result.returncode == 1, result.stderr
    assert result.stderr == ""
    assert [line for line in _failures(result.stdout) if expected_fragment in line], result.stdout
    for text in _hidden(request, secret):
        assert text not in result.stdout
        assert text not in result.stderr


def test_corpus_is_large_and_ids_are_unique() -> None:
    ids = [case.id for case in CORPUS]
    assert len(ids) >= 30
    assert len(set(ids)) == len(ids)
    assert set(SUBPROCESS_CASES) <= set(ids)
