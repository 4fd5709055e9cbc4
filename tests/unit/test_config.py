"""Valid craft-connector.yml files and Airflow connections resolve into the expected Engine profile."""

from __future__ import annotations

import json
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
Warehouse:
  dev:
    jdbc_url: jdbc:snowflake://acme.snowflakecomputing.com
    secret: WAREHOUSE_SECRET_THAT_IS_NOT_SET
Cloning:
  enabled: true
Docs_site:
  title: Our pipelines
Engine:
  dev:
    jdbc_url: jdbc:sqlite:engine/etl-craft.db
    schema: main
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
            {},
            None,
            "prod",
            id="unset-engine-profile-variable-falls-back-to-secrets-profile",
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
            sqlite_profiles("only", secrets_profile="ETL_CRAFT_PROFILE"),
            {},
            None,
            "only",
            id="unset-selector-variable-and-one-profile",
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
    ("variable", "profile", "twin"),
    [
        ("ENGINE_SECRET", "prod", "ENGINE_PROD_SECRET"),
        ("ENGINE_DB_SECRET", "prod", "ENGINE_PROD_DB_SECRET"),
        ("TOKEN", "prod", "TOKEN_PROD"),
        ("ENGINE_SECRET", "eu-west", "ENGINE_EU_WEST_SECRET"),
    ],
)
def test_twin_name(variable: str, profile: str, twin: str) -> None:
    assert twin_name(variable, profile) == twin


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
        "ENGINE_SCHEMA=etl_craft   # trailing comment\n"
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


def test_dotenv_quoted_value_followed_by_a_comment(tmp_path: Path) -> None:
    secret = new_secret()
    (tmp_path / "engine.env").write_text(f'ENGINE_SECRET="{secret}"  # rotated monthly\nENGINE_USER=etl\n')
    config = write_config(tmp_path, "Secrets:\n  Source_type: file\n  Path: engine.env\n" + PROD_PG)

    assert load_engine_profile(config).secrets == {"secret": secret}


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


def test_yaml_merge_key_overrides_are_not_duplicates(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        """\
Engine:
  Profile: test
  dev: &common
    jdbc_url: jdbc:sqlite:engine/dev.db
    schema: main
  test:
    <<: *common
    jdbc_url: jdbc:sqlite:engine/test.db
""",
    )

    assert load_engine_profile(config).target == SqliteTarget(
        path=(tmp_path / "engine" / "test.db").resolve()
    )


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
