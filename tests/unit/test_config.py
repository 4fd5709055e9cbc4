"""Valid craft-connector.yml files and Airflow connections resolve into the expected Engine profile."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from airflow.models.connection import Connection

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.config import CONFIG_ENV_VAR, load_engine_profile, locate_config
from airflow_provider_etl_craft.config.connection import profile_from_connection
from airflow_provider_etl_craft.config.secrets import twin_name
from airflow_provider_etl_craft.engine.url import PostgresTarget, SqliteTarget
from airflow_provider_etl_craft.errors import ConfigurationError

VARIABLES_CLEARED = (
    CONFIG_ENV_VAR,
    "ETL_CRAFT_PROFILE",
    "ENGINE_PROFILE",
    "ENGINE_URL",
    "ENGINE_SCHEMA",
    "ENGINE_USER",
    "ENGINE_PROD_USER",
    "ENGINE_SECRET",
    "ENGINE_PROD_SECRET",
    "ENGINE_STAGING_SECRET",
    "etl_reader",
    "etl_PROD_reader",
)

PROD_URL = "jdbc:postgresql://db.internal:5432/etl_craft?sslmode=verify-full"
PROD_PG = f"""\
Engine:
  prod:
    jdbc_url: {PROD_URL}
    schema: etl_craft
    user: ENGINE_USER
    auth_mode: password
    secret: ENGINE_SECRET
"""


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES_CLEARED:
        monkeypatch.delenv(name, raising=False)


def new_secret() -> str:
    """A distinctive secret, different in every test (the masker remembers secrets for the session)."""
    return f"TOPSECRET-{uuid.uuid4().hex}"


def write_config(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "craft-connector.yml"
    path.write_text(text, encoding="utf-8")
    return path


def sqlite_profiles(
    *names: str, engine_profile: str | None = None, secrets_profile: str | None = None
) -> str:
    """A file with one SQLite profile per name, and optional Engine.Profile / Secrets.Profile selectors."""
    text = f"Secrets:\n  Profile: {secrets_profile}\n" if secrets_profile else ""
    text += "Engine:\n" + (f"  Profile: {engine_profile}\n" if engine_profile else "")
    for name in names:
        text += f"  {name}:\n    jdbc_url: jdbc:sqlite:engine/{name}.db\n"
    return text


# --- the file as a whole ---------------------------------------------------------------------------


def test_real_etl_craft_file_with_other_sections_is_accepted(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        """\
Secrets:
  Source_type: environment
  Profile: dev
Orchestration:
  scheduler: airflow
  anything_goes: {nested: [1, 2, 3]}
Engine:
  dev:
    jdbc_url: jdbc:sqlite:engine/etl-craft.db
    schema: main
Warehouse:
  dev:
    jdbc_url: jdbc:snowflake://acme.snowflakecomputing.com
    secret: WAREHOUSE_SECRET_THAT_IS_NOT_SET
Cloning:
  enabled: true
Docs_site:
  title: Our pipelines
""",
    )

    profile = load_engine_profile(config)

    assert profile.name == "dev"
    assert profile.dialect_name == "sqlite"
    assert profile.schema == "main"
    assert profile.auth.name == "none"
    assert profile.secrets == {}


# --- profile selection -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("file_text", "env", "explicit", "expected"),
    [
        pytest.param(
            sqlite_profiles("dev", "test", "prod", engine_profile="test", secrets_profile="prod"),
            {},
            "dev",
            "dev",
            id="explicit-argument-beats-everything",
        ),
        pytest.param(
            sqlite_profiles("dev", "test", "prod", engine_profile="test", secrets_profile="prod"),
            {},
            None,
            "test",
            id="engine-profile-beats-secrets-profile",
        ),
        pytest.param(
            sqlite_profiles("dev", "test", "prod", secrets_profile="prod"),
            {},
            None,
            "prod",
            id="secrets-profile-literal",
        ),
        pytest.param(
            sqlite_profiles("dev", "test", "prod", secrets_profile="ETL_CRAFT_PROFILE"),
            {"ETL_CRAFT_PROFILE": "test"},
            None,
            "test",
            id="secrets-profile-variable",
        ),
        pytest.param(
            sqlite_profiles("dev", "test", "prod", engine_profile="ENGINE_PROFILE", secrets_profile="prod"),
            {"ENGINE_PROFILE": "dev"},
            None,
            "dev",
            id="engine-profile-variable",
        ),
        pytest.param(sqlite_profiles("only"), {}, None, "only", id="the-only-profile"),
        pytest.param(
            sqlite_profiles("dev", "ENGINE_PROFILE", engine_profile="ENGINE_PROFILE", secrets_profile="dev"),
            {},
            None,
            "ENGINE_PROFILE",
            id="unset-engine-profile-variable-is-the-profile-name-as-written",
        ),
        pytest.param(
            sqlite_profiles("dev", "prod", engine_profile=" prod ", secrets_profile="dev"),
            {},
            None,
            "prod",
            id="selector-text-is-stripped",
        ),
    ],
)
def test_profile_selection_order(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    file_text: str,
    env: dict[str, str],
    explicit: str | None,
    expected: str,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = write_config(tmp_path, file_text)

    profile = load_engine_profile(config, explicit)

    assert profile.name == expected
    assert profile.setting("jdbc_url") == f"Engine.{expected}.jdbc_url"
    assert profile.target == SqliteTarget(path=(tmp_path / "engine" / f"{expected}.db").resolve())


def test_only_the_active_profile_is_validated(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        """\
Engine:
  Profile: dev
  dev:
    jdbc_url: jdbc:sqlite:engine/etl-craft.db
  prod:
    jdbc_url: jdbc:postgresql://db.internal/etl_craft
    user: ENGINE_USER
    auth_mode: password
    secret: ENGINE_SECRET
""",
    )  # prod has no schema and its secret is unset: nobody asked for prod

    assert load_engine_profile(config).name == "dev"
    with pytest.raises(ConfigurationError, match=r"Engine\.prod\.schema"):
        load_engine_profile(config, "prod")


# --- values and variables --------------------------------------------------------------------------


def test_variables_replace_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = new_secret()
    monkeypatch.setenv("ENGINE_URL", "jdbc:postgresql://pg.example.com:6543/engine_db")
    monkeypatch.setenv("ENGINE_SCHEMA", "etl_craft")
    monkeypatch.setenv("ENGINE_USER", "alice")
    monkeypatch.setenv("ENGINE_SECRET", secret)
    config = write_config(
        tmp_path,
        """\
Engine:
  prod:
    jdbc_url: ENGINE_URL
    schema: ENGINE_SCHEMA
    user: ENGINE_USER
    auth_mode: password
    secret: ENGINE_SECRET
""",
    )

    profile = load_engine_profile(config)

    assert profile.target == PostgresTarget("pg.example.com", 6543, "engine_db", {})
    assert profile.schema == "etl_craft"
    assert profile.user == "alice"
    assert profile.secrets == {"secret": secret}


def test_a_setting_that_names_no_defined_variable_is_a_literal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINE_SECRET", new_secret())
    config = write_config(tmp_path, PROD_PG.replace("user: ENGINE_USER", "user: etl_reader"))

    assert load_engine_profile(config).user == "etl_reader"


def test_profile_twins_win_over_the_plain_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain, twin = new_secret(), new_secret()
    monkeypatch.setenv("ENGINE_SECRET", plain)
    monkeypatch.setenv("ENGINE_PROD_SECRET", twin)
    monkeypatch.setenv("ENGINE_USER", "shared_user")
    monkeypatch.setenv("ENGINE_PROD_USER", "prod_user")
    config = write_config(tmp_path, PROD_PG)

    profile = load_engine_profile(config)

    assert profile.secrets == {"secret": twin}
    assert profile.user == "prod_user"


def test_the_plain_variable_serves_when_the_twin_is_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = new_secret()
    monkeypatch.setenv("ENGINE_SECRET", plain)
    monkeypatch.setenv("ENGINE_STAGING_SECRET", new_secret())  # another profile's twin: not ours
    monkeypatch.setenv("ENGINE_USER", "shared_user")
    config = write_config(tmp_path, PROD_PG)

    profile = load_engine_profile(config)

    assert profile.secrets == {"secret": plain}
    assert profile.user == "shared_user"


@pytest.mark.parametrize(
    ("variable", "profile", "field", "twin"),
    [
        ("ETL_CRAFT_ENGINE_SECRET", "prod", "secret", "ETL_CRAFT_ENGINE_PROD_SECRET"),
        ("ENGINE_SECRET", "prod", "secret", "ENGINE_PROD_SECRET"),
        ("ENGINE_JDBC_URL", "prod", "jdbc_url", "ENGINE_PROD_JDBC_URL"),
        ("ENGINE_KEY_FILE", "uat", "key_file", "ENGINE_UAT_KEY_FILE"),
        ("ENGINE_AUTH_MODE", "sit", "auth_mode", "ENGINE_SIT_AUTH_MODE"),
        ("ENGINE_NAME", "prod", "Name", "ENGINE_PROD_NAME"),
        ("engine_secret", "prod", "secret", "engine_PROD_secret"),
        ("ENGINE_PROD_SECRET", "prod", "secret", "ENGINE_PROD_SECRET"),
        ("engine_prod_secret", "prod", "secret", "engine_prod_secret"),
        ("ENGINE_SECRET", "eu-west", "secret", "ENGINE_EU-WEST_SECRET"),
        ("ENGINE_URL", "prod", "jdbc_url", None),
        ("TOKEN", "prod", "secret", None),
        ("SECRET", "prod", "secret", None),
        ("ENGINE_SECRET", "prod", "user", None),
    ],
)
def test_twin_name_goes_before_the_field_suffix(
    variable: str, profile: str, field: str, twin: str | None
) -> None:
    assert twin_name(variable, profile, field) == twin


# --- secrets sources -------------------------------------------------------------------------------


def test_file_source_reads_a_dotenv_file_beside_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = new_secret()
    project = tmp_path / "project"
    (project / "secrets").mkdir(parents=True)
    (project / "secrets" / "engine.env").write_text(
        "# Engine DB credentials\n"
        "\n"
        f'export ENGINE_SECRET="{secret} with spaces"\n'
        "ENGINE_USER='etl_user'\n"
        "ENGINE_SCHEMA=etl_craft\n"
        "this line has no equals sign and is skipped\n"
        "  # an indented comment\n",
        encoding="utf-8",
    )
    config = write_config(
        project,
        "Secrets:\n  Source_type: file\n  Path: secrets/engine.env\n"
        + PROD_PG.replace("schema: etl_craft", "schema: ENGINE_SCHEMA"),
    )
    monkeypatch.setenv("ENGINE_SECRET", "from-the-environment-not-used")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    profile = load_engine_profile(config)

    assert profile.secrets == {"secret": f"{secret} with spaces"}
    assert profile.user == "etl_user"
    assert profile.schema == "etl_craft"


def test_dotenv_text_after_a_value_is_part_of_the_value(tmp_path: Path) -> None:
    """No trailing comments in a .env file (etl-craft's rule): a quoted value followed by text keeps its quotes."""
    secret = new_secret()
    (tmp_path / "engine.env").write_text(
        f'ENGINE_SECRET="{secret}"  # rotated monthly\nENGINE_USER=etl # ops\n'
    )
    config = write_config(tmp_path, "Secrets:\n  Source_type: file\n  Path: engine.env\n" + PROD_PG)

    profile = load_engine_profile(config)

    assert profile.secrets == {"secret": f'"{secret}"  # rotated monthly'}
    assert profile.user == "etl # ops"


def test_airflow_source_reads_airflow_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = new_secret()
    monkeypatch.setenv("AIRFLOW_VAR_ENGINE_SECRET", secret)
    monkeypatch.setenv("AIRFLOW_VAR_ENGINE_USER", "etl_user")
    config = write_config(tmp_path, "Secrets:\n  Source_type: airflow\n" + PROD_PG)

    profile = load_engine_profile(config)

    assert profile.secrets == {"secret": secret}
    assert profile.user == "etl_user"


# --- relative paths --------------------------------------------------------------------------------


def test_relative_sqlite_path_resolves_beside_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path / "project", sqlite_profiles("dev"))
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)

    profile = load_engine_profile(config)

    assert profile.target == SqliteTarget(path=(tmp_path / "project" / "engine" / "dev.db").resolve())
    assert profile.base_dir == config.resolve().parent


def test_absolute_sqlite_path_is_kept(tmp_path: Path) -> None:
    database = (tmp_path / "data" / "engine.db").resolve()
    config = write_config(tmp_path / "project", f"Engine:\n  dev:\n    jdbc_url: jdbc:sqlite:{database}\n")

    assert load_engine_profile(config).target == SqliteTarget(path=database)


def test_certificate_paths_in_the_url_resolve_beside_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINE_SECRET", new_secret())
    url = "jdbc:postgresql://db.internal/etl_craft?sslmode=verify-full&sslrootcert=certs/ca.pem&sslcrl=/etc/pki/crl.pem"
    config = write_config(tmp_path / "project", PROD_PG.replace(PROD_URL, url))
    monkeypatch.chdir(tmp_path)

    profile = load_engine_profile(config)

    assert isinstance(profile.target, PostgresTarget)
    assert profile.target.settings == {
        "sslmode": "verify-full",
        "sslrootcert": str(config.resolve().parent / "certs" / "ca.pem"),
        "sslcrl": "/etc/pki/crl.pem",
    }


# --- finding the file ------------------------------------------------------------------------------


@pytest.fixture
def three_configs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """An explicit file, one named by $ETL_CRAFT_CONFIG, and one found by searching up from cwd."""
    deep = tmp_path / "searched" / "a" / "b" / "c"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    return {
        "explicit": write_config(tmp_path / "explicit", sqlite_profiles("explicit")),
        "env": write_config(tmp_path / "from_env", sqlite_profiles("from_env")),
        "search": write_config(tmp_path / "searched", sqlite_profiles("searched")),
    }


def test_explicit_path_beats_the_environment_and_the_search(
    three_configs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONFIG_ENV_VAR, str(three_configs["env"]))

    assert load_engine_profile(three_configs["explicit"]).name == "explicit"
    assert locate_config(three_configs["explicit"].parent) == three_configs["explicit"].resolve()


def test_environment_variable_beats_the_search(
    three_configs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONFIG_ENV_VAR, str(three_configs["env"]))

    assert load_engine_profile().name == "from_env"


def test_upward_search_from_the_working_directory(three_configs: dict[str, Path]) -> None:
    assert locate_config() == three_configs["search"].resolve()
    assert load_engine_profile().name == "searched"


def test_no_config_anywhere_is_a_configuration_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / "x" / "y"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)

    with pytest.raises(ConfigurationError, match="no craft-connector.yml found") as caught:
        load_engine_profile()
    assert CONFIG_ENV_VAR in str(caught.value)


def test_explicit_path_that_does_not_exist_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "craft-connector.yml"

    with pytest.raises(ConfigurationError, match="does not exist") as caught:
        load_engine_profile(missing)
    assert str(missing) in str(caught.value)


def test_environment_path_that_does_not_exist_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONFIG_ENV_VAR, str(tmp_path / "nowhere.yml"))

    with pytest.raises(ConfigurationError, match=r"\$ETL_CRAFT_CONFIG points at .*nowhere\.yml"):
        load_engine_profile()


# --- the resolved profile --------------------------------------------------------------------------


def test_repr_and_description_never_contain_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = new_secret()
    monkeypatch.setenv("ENGINE_SECRET", secret)
    monkeypatch.setenv("ENGINE_USER", "etl_user")
    profile = load_engine_profile(write_config(tmp_path, PROD_PG))

    assert profile.secrets["secret"] == secret
    assert secret not in repr(profile)
    assert secret not in str(profile)
    assert secret not in profile.describe()


def test_postgres_schema_folds_to_lower_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_SECRET", new_secret())
    config = write_config(tmp_path, PROD_PG.replace("schema: etl_craft", "schema: ETL_Craft"))

    assert load_engine_profile(config).schema == "etl_craft"


def test_resolved_secret_is_registered_with_the_airflow_masker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = new_secret()
    monkeypatch.setenv("ENGINE_SECRET", secret)
    monkeypatch.setenv("ENGINE_USER", "etl_user")
    assert secret in _compat.redact(f"x {secret} y")  # not masked before loading

    load_engine_profile(write_config(tmp_path, PROD_PG))

    redacted = _compat.redact(f"x {secret} y")
    assert secret not in redacted
    assert redacted.startswith("x ") and redacted.endswith(" y")


def test_yaml_merge_keys_are_read_but_overriding_a_merged_key_is_a_duplicate(tmp_path: Path) -> None:
    """etl-craft checks duplicates after '<<' merges: a merge is fine, overriding a key it brings is not."""
    merged = write_config(
        tmp_path / "merged",
        """\
Engine:
  Profile: test
  dev: &common
    jdbc_url: jdbc:sqlite:engine/dev.db
  test:
    <<: *common
    schema: main
""",
    )
    overridden = write_config(
        tmp_path / "overridden",
        merged.read_text().replace("    schema: main\n", "    jdbc_url: jdbc:sqlite:t.db\n"),
    )

    assert load_engine_profile(merged).target == SqliteTarget(
        path=(tmp_path / "merged/engine/dev.db").resolve()
    )
    with pytest.raises(ConfigurationError, match=r"key 'jdbc_url' appears twice \(lines 4 and 7"):
        load_engine_profile(overridden)


# --- Airflow connections ---------------------------------------------------------------------------


def etl_craft_connection(
    conn_id: str = "etl_craft_test", extra: dict[str, object] | None = None, **fields: object
):
    return Connection(conn_id=conn_id, conn_type="etl_craft", extra=json.dumps(extra or {}), **fields)


def test_file_backed_connection_reads_the_named_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = new_secret()
    monkeypatch.setenv("ENGINE_SECRET", secret)
    monkeypatch.setenv("ENGINE_USER", "etl_user")
    config = write_config(tmp_path, sqlite_profiles("dev") + PROD_PG.removeprefix("Engine:\n"))
    conn = etl_craft_connection(extra={"config_path": str(config), "profile": "prod"})

    profile = profile_from_connection(conn)

    assert profile.name == "prod"
    assert profile.origin == str(config.resolve())
    assert profile.secrets == {"secret": secret}
    assert profile_from_connection(conn, "dev").name == "dev"  # an explicit profile beats the extra


def test_file_backed_connection_refuses_unknown_extras(tmp_path: Path) -> None:
    config = write_config(tmp_path, sqlite_profiles("dev", "prod", engine_profile="dev"))
    conn = etl_craft_connection(extra={"config_path": str(config), "profle": "prod"})

    with pytest.raises(ConfigurationError, match="profle"):
        profile_from_connection(conn)


def test_inline_postgres_connection(tmp_path: Path) -> None:
    secret = new_secret()
    conn = etl_craft_connection(
        "etl_craft_inline",
        extra={"engine_schema": "ETL_Craft", "auth_mode": "password", "sslmode": "verify-full"},
        host="pg.example.com",
        port=6543,
        schema="engine_db",
        login="etl_user",
        password=secret,
    )

    profile = profile_from_connection(conn)

    assert profile.target == PostgresTarget("pg.example.com", 6543, "engine_db", {"sslmode": "verify-full"})
    assert profile.schema == "etl_craft"
    assert profile.auth.name == "password"
    assert profile.user == "etl_user"
    assert profile.secrets == {"secret": secret}
    assert profile.base_dir is None
    assert "etl_craft_inline" in profile.origin
    assert secret not in repr(profile)
    assert secret not in _compat.redact(f"x {secret} y")


def test_inline_postgres_connection_defaults_to_port_5432() -> None:
    conn = etl_craft_connection(
        extra={"engine_schema": "etl_craft", "auth_mode": "password"},
        host="pg.example.com",
        schema="engine_db",
        login="etl_user",
        password=new_secret(),
    )

    assert profile_from_connection(conn).target == PostgresTarget("pg.example.com", 5432, "engine_db", {})


def test_inline_postgres_connection_without_password_names_the_missing_secret() -> None:
    conn = etl_craft_connection(
        "no_password",
        extra={"engine_schema": "etl_craft", "auth_mode": "password"},
        host="pg.example.com",
        schema="engine_db",
        login="etl_user",
    )

    with pytest.raises(ConfigurationError, match=r"no_password.*secret is required by auth_mode 'password'"):
        profile_from_connection(conn)


def test_inline_sqlite_connection_via_jdbc_url(tmp_path: Path) -> None:
    database = (tmp_path / "engine.db").resolve()
    conn = etl_craft_connection(extra={"jdbc_url": f"jdbc:sqlite:{database}"})

    profile = profile_from_connection(conn)

    assert profile.target == SqliteTarget(path=database)
    assert profile.dialect_name == "sqlite"
    assert profile.auth.name == "none"
    assert profile.schema == "main"


def test_inline_connection_refuses_unknown_extras() -> None:
    conn = etl_craft_connection(
        "typo",
        extra={"engine_schema": "etl_craft", "auth_mode": "password", "sslmood": "require"},
        host="pg.example.com",
        schema="engine_db",
        login="etl_user",
        password=new_secret(),
    )

    with pytest.raises(ConfigurationError, match=r"Airflow connection 'typo': unknown extra\(s\) sslmood"):
        profile_from_connection(conn)


def test_inline_connection_with_jdbc_url_does_not_drop_driver_extras() -> None:
    conn = etl_craft_connection(
        extra={
            "jdbc_url": "jdbc:postgresql://pg.example.com/engine_db",
            "engine_schema": "etl_craft",
            "auth_mode": "password",
            "sslmode": "verify-full",
        },
        login="etl_user",
        password=new_secret(),
    )

    try:
        profile = profile_from_connection(conn)
    except ConfigurationError:
        return  # refusing the combination is fine too
    assert isinstance(profile.target, PostgresTarget)
    assert profile.target.settings.get("sslmode") == "verify-full"


# --- parity with etl-craft's reader (docs/etl-craft-parity.md) ----------------------------------------


@pytest.mark.parametrize(
    ("section_name", "profile_name", "url"),
    [
        ("Postgres", None, PROD_URL),
        ("postgres", None, PROD_URL),
        ("PostgreSQL", None, PROD_URL),
        ("POSTGRESQL", None, PROD_URL),
        (None, "Postgres", PROD_URL),
        ("SQLite", "Postgres", PROD_URL),  # the profile's own Name wins over the section's
        ("SQLite", None, "jdbc:sqlite:engine/etl-craft.db"),
        (None, "sqlite", "jdbc:sqlite:engine/etl-craft.db"),
        ("Postgres", "SQLITE", "jdbc:sqlite:engine/etl-craft.db"),
    ],
)
def test_name_at_section_or_profile_level_matching_the_url_is_accepted(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    section_name: str | None,
    profile_name: str | None,
    url: str,
) -> None:
    monkeypatch.setenv("ENGINE_SECRET", new_secret())
    text = PROD_PG.replace(PROD_URL, url)
    if profile_name:
        text = text.replace("  prod:\n", f"  prod:\n    Name: {profile_name}\n")
    if section_name:
        text = text.replace("Engine:\n", f"Engine:\n  Name: {section_name}\n")
    if url.startswith("jdbc:sqlite:"):
        text = text.replace("    auth_mode: password\n", "")

    profile = load_engine_profile(write_config(tmp_path, text))

    assert profile.dialect_name == ("sqlite" if url.startswith("jdbc:sqlite:") else "postgresql")


def test_name_may_be_a_variable_with_a_profile_twin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_SECRET", new_secret())
    monkeypatch.setenv("ENGINE_NAME", "SQLite")
    monkeypatch.setenv("ENGINE_PROD_NAME", "Postgres")
    config = write_config(tmp_path, PROD_PG.replace("Engine:\n", "Engine:\n  Name: ENGINE_NAME\n"))

    assert load_engine_profile(config).dialect_name == "postgresql"


def test_twins_are_looked_up_only_for_names_ending_in_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ENGINE_URL`` does not end in ``_JDBC_URL``: it has no twin, so ``ENGINE_PROD_URL`` is never read."""
    monkeypatch.setenv("ENGINE_SECRET", new_secret())
    monkeypatch.setenv("ENGINE_URL", "jdbc:postgresql://shared.example.com/engine")
    monkeypatch.setenv("ENGINE_PROD_URL", "jdbc:postgresql://prod-only.example.com/engine")
    monkeypatch.setenv("ENGINE_PROD_JDBC_URL", "jdbc:postgresql://twin.example.com/engine")
    monkeypatch.setenv("ENGINE_JDBC_URL", "jdbc:postgresql://plain.example.com/engine")
    by_url = write_config(tmp_path / "url", PROD_PG.replace(PROD_URL, "ENGINE_URL"))
    by_jdbc_url = write_config(tmp_path / "jdbc_url", PROD_PG.replace(PROD_URL, "ENGINE_JDBC_URL"))
    already_twin = write_config(tmp_path / "twin", PROD_PG.replace(PROD_URL, "ENGINE_PROD_JDBC_URL"))

    assert load_engine_profile(by_url).target.describe() == "postgresql://shared.example.com:5432/engine"
    assert load_engine_profile(by_jdbc_url).target.describe() == "postgresql://twin.example.com:5432/engine"
    assert load_engine_profile(already_twin).target.describe() == "postgresql://twin.example.com:5432/engine"


def test_a_defined_empty_twin_wins_over_the_plain_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINE_SECRET", new_secret())
    monkeypatch.setenv("ENGINE_USER", "alice")
    monkeypatch.setenv("ENGINE_PROD_USER", "")

    with pytest.raises(ConfigurationError, match=r"Engine\.prod\.user is required by auth_mode 'password'"):
        load_engine_profile(write_config(tmp_path, PROD_PG))


def test_settings_and_variable_values_are_stripped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_SECRET", new_secret())
    monkeypatch.setenv("ENGINE_USER", "  alice\n")
    config = write_config(tmp_path, PROD_PG.replace("schema: etl_craft", "schema: ' etl_craft '"))

    profile = load_engine_profile(config)

    assert (profile.user, profile.schema) == ("alice", "etl_craft")


@pytest.mark.parametrize("written", ["file", "File", "FILE", "SECRETS_SOURCE"])
def test_source_type_is_any_case_and_may_be_an_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str
) -> None:
    secret = new_secret()
    monkeypatch.setenv("SECRETS_SOURCE", "File")
    monkeypatch.setenv("SECRETS_PATH", "engine.env")
    (tmp_path / "engine.env").write_text(f"ENGINE_SECRET={secret}\nENGINE_USER=etl\n")
    config = write_config(tmp_path, f"Secrets:\n  Source_type: {written}\n  Path: SECRETS_PATH\n" + PROD_PG)

    assert load_engine_profile(config).secrets == {"secret": secret}


def test_secrets_path_expands_the_home_folder_and_folds_dot_dot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = new_secret()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "engine.env").write_text(f"ENGINE_SECRET={secret}\nENGINE_USER=etl\n")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "engine.env").write_text(f"ENGINE_SECRET={secret}\nENGINE_USER=shared\n")
    home = write_config(tmp_path / "a", "Secrets:\n  Source_type: file\n  Path: ~/engine.env\n" + PROD_PG)
    (tmp_path / "b").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "b" / "link")  # a dangling link: '..' is folded as text
    dotdot = write_config(
        tmp_path / "b", "Secrets:\n  Source_type: file\n  Path: link/../../shared/engine.env\n" + PROD_PG
    )

    assert load_engine_profile(home).user == "etl"
    assert load_engine_profile(dotdot).user == "shared"


def test_dotenv_reading_follows_etl_crafts_rules(tmp_path: Path) -> None:
    secret = new_secret()
    (tmp_path / "engine.env").write_text(
        "\ufeffENGINE_USER=first\n"  # a byte-order mark is dropped
        "a line without an equals sign is skipped\n"
        "export   ENGINE_USER = 'second'  \n"
        f'ENGINE_SECRET="{secret}\n'  # an unmatched quote is kept
        "not a variable name=fine\n",
        encoding="utf-8",
    )
    config = write_config(tmp_path, "Secrets:\n  Source_type: file\n  Path: engine.env\n" + PROD_PG)

    profile = load_engine_profile(config)

    assert profile.user == "second"
    assert profile.secrets == {"secret": f'"{secret}'}


def test_only_the_active_profile_is_checked_for_unknown_keys(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        "Engine:\n  Profile: dev\n  dev:\n    jdbc_url: jdbc:sqlite:dev.db\n"
        "  prod:\n    jdbc_url: jdbc:sqlite:prod.db\n    hostname: not-an-engine-key\n",
    )

    assert load_engine_profile(config).name == "dev"
    with pytest.raises(ConfigurationError, match=r"unknown key\(s\) in Engine\.prod: hostname"):
        load_engine_profile(config, "prod")


def test_a_section_setting_the_active_profile_overrides_is_accepted(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, "Engine:\n  schema: ignored\n  dev:\n    jdbc_url: jdbc:sqlite:dev.db\n    schema: main\n"
    )

    assert load_engine_profile(config).schema == "main"


def test_keys_the_mode_does_not_use_are_accepted_and_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = new_secret()
    monkeypatch.setenv("ENGINE_SECRET", secret)
    monkeypatch.setenv("ENGINE_USER", "etl")
    sqlite = write_config(
        tmp_path / "sqlite",
        "Engine:\n  dev:\n    jdbc_url: jdbc:sqlite:dev.db\n    user: somebody\n    secret: 'not a variable'\n"
        "    key_file: nowhere.key\n    auth_mode: none\n",
    )
    pg = write_config(
        tmp_path / "pg", PROD_PG + "    client_id: unused\n    key_file: unused.key\n    issuer: x\n"
    )

    assert load_engine_profile(sqlite).secrets == {}
    profile = load_engine_profile(pg)
    assert (profile.fields, profile.secrets) == ({}, {"secret": secret})


def test_sso_takes_an_optional_client_secret_and_scope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = new_secret()
    monkeypatch.setenv("ENGINE_SECRET", secret)
    config = write_config(
        tmp_path,
        PROD_PG.replace("auth_mode: password", "auth_mode: sso")
        + "    issuer: https://login.example.com\n    client_id: etl\n    scope: openid\n",
    )

    profile = load_engine_profile(config)
    kwargs = profile.auth.connect_kwargs(profile)

    assert kwargs["oauth_client_secret"] == secret
    assert kwargs["oauth_scope"] == "openid"


@pytest.mark.parametrize(
    ("url", "dialect"),
    [("jdbc:SQLite:engine/x.db", "sqlite"), ("JDBC:SQLITE:engine/x.db", "sqlite"),
     ("jdbc:PostgreSQL://db.internal/etl_craft", "postgresql")],
)  # fmt: skip
def test_the_url_prefix_is_any_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, dialect: str
) -> None:
    monkeypatch.setenv("ENGINE_SECRET", new_secret())
    text = PROD_PG.replace(PROD_URL, url)
    if dialect == "sqlite":
        text = text.replace("    auth_mode: password\n", "")

    profile = load_engine_profile(write_config(tmp_path, text))

    assert profile.dialect_name == dialect
    if dialect == "sqlite":
        assert profile.target == SqliteTarget((tmp_path / "engine" / "x.db").resolve())


def test_upward_search_finds_a_project_folder_named_etl_craft(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / "repo" / "dags" / "daily"
    deep.mkdir(parents=True)
    found = write_config(tmp_path / "repo" / "etl-craft", sqlite_profiles("dev"))
    monkeypatch.chdir(deep)

    assert locate_config() == found
    write_config(tmp_path / "repo", sqlite_profiles("other"))
    with pytest.raises(ConfigurationError, match="found both"):
        locate_config()


def test_relative_paths_resolve_beside_the_config_as_found_not_its_link_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = new_secret()
    shared = write_config(
        tmp_path / "shared", "Secrets:\n  Source_type: file\n  Path: engine.env\n" + PROD_PG
    )
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "engine.env").write_text(f"ENGINE_SECRET={secret}\nENGINE_USER=project\n")
    link = tmp_path / "project" / "craft-connector.yml"
    os.symlink(shared, link)

    assert load_engine_profile(link).user == "project"


def test_name_is_checked_before_the_login_settings(tmp_path: Path) -> None:
    """As etl-craft orders its checks: a wrong Name is reported even when auth_mode is missing too."""
    config = write_config(
        tmp_path,
        "Engine:\n  Name: SQLite\n  prod:\n    jdbc_url: jdbc:postgresql://db/etl\n    schema: etl\n",
    )

    with pytest.raises(
        ConfigurationError, match=r"Engine\.Name is 'SQLite', but the jdbc_url is a PostgreSQL URL"
    ):
        load_engine_profile(config)
