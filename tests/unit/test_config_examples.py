"""etl-craft's documented craft-connector.yml examples, rewritten here, resolve as etl-craft resolves them.

Each test writes the Engine and Secrets sections an example documents (with an Orchestration or Warehouse
section where the example has one, which the provider leaves alone) and checks every profile it declares.
etl-craft's examples predate its rule that every Engine profile names a ``schema``; the PostgreSQL ones get a
``schema`` line here (without it both readers refuse the profile, see the last test).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_etl_craft.config import load_engine_profile
from airflow_provider_etl_craft.engine.url import PostgresTarget, SqliteTarget
from airflow_provider_etl_craft.errors import ConfigurationError

TIERS = ("dev", "sit", "uat", "prod")
OTHER_SECTIONS = "Orchestration:\n  Mode: local\n  Task_timeout_seconds: 21600\n"
WAREHOUSE = "Warehouse:\n  Name: Postgres\n  Table_format: native\n  dev:\n    jdbc_url: WAREHOUSE_JDBC_URL\n"
VARIABLES = (
    "ETL_CRAFT_PROFILE", "ETL_CRAFT_AUTH", "ENGINE_JDBC_URL", "ENGINE_USER", "ENGINE_AUTH_MODE", "ENGINE_SECRET",
    "ENGINE_KEY_FILE", "ENGINE_CERT_FILE", "ENGINE_CLIENT_ID", "ENGINE_TOKEN_URL", "ENGINE_ISSUER",
    "ENGINE_ROLE_ARN", *(f"ENGINE_{tier.upper()}_SECRET" for tier in TIERS),
)  # fmt: skip


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def write(folder: Path, text: str, name: str = "craft-connector.yml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    return folder / name


def tiers(profile: str) -> str:
    """The same profile block under each of dev, sit, uat and prod."""
    return "".join(f"  {tier}:\n{profile}" for tier in TIERS)


PG_BY_VARIABLES = (
    "    jdbc_url: ENGINE_JDBC_URL\n    schema: etl_craft\n    user: ENGINE_USER\n"
    "    auth_mode: ENGINE_AUTH_MODE\n    secret: ENGINE_SECRET\n"
)


@pytest.mark.parametrize("tier", TIERS)
def test_engine_sqlite_example_one_file_per_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tier: str
) -> None:
    """Name: SQLite at the section level, a SQLite file per tier, the tier chosen by ETL_CRAFT_PROFILE."""
    blocks = "".join(f"  {t}:\n    jdbc_url: jdbc:sqlite:etl-craft-engine-{t}.db\n" for t in TIERS)
    config = write(
        tmp_path,
        "Secrets:\n  Source_type: environment\n  Profile: ETL_CRAFT_PROFILE\n"
        + OTHER_SECTIONS
        + "Engine:\n  Name: SQLite\n"
        + blocks
        + WAREHOUSE,
    )
    monkeypatch.setenv("ETL_CRAFT_PROFILE", tier)

    profile = load_engine_profile(config)

    assert profile.name == tier
    assert profile.target == SqliteTarget((tmp_path / f"etl-craft-engine-{tier}.db").resolve())
    assert (profile.schema, profile.auth.name) == ("main", "none")


@pytest.mark.parametrize("tier", TIERS)
def test_engine_postgres_and_secrets_environment_examples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tier: str
) -> None:
    """Name: Postgres at the section level; every setting a variable; ENGINE_PROD_SECRET wins for prod."""
    config = write(
        tmp_path,
        "Secrets:\n  Source_type: environment\n  Profile: ETL_CRAFT_PROFILE\n"
        + OTHER_SECTIONS
        + "Engine:\n  Name: Postgres\n"
        + tiers(PG_BY_VARIABLES + "    key_file: ENGINE_KEY_FILE\n")
        + WAREHOUSE,
    )
    monkeypatch.setenv("ETL_CRAFT_PROFILE", tier)
    monkeypatch.setenv("ENGINE_JDBC_URL", "jdbc:postgresql://engine-db:5432/etl_craft")
    monkeypatch.setenv("ENGINE_USER", "etl")
    monkeypatch.setenv("ENGINE_AUTH_MODE", "password")
    monkeypatch.setenv("ENGINE_SECRET", "shared-secret")
    monkeypatch.setenv("ENGINE_PROD_SECRET", "prod-secret")

    profile = load_engine_profile(config)

    assert profile.target == PostgresTarget("engine-db", 5432, "etl_craft", {})
    assert (profile.user, profile.auth.name, profile.schema) == ("etl", "password", "etl_craft")
    assert profile.secrets == {"secret": "prod-secret" if tier == "prod" else "shared-secret"}
    assert profile.fields == {}  # key_file is written but password takes none: ignored


def test_engine_postgres_example_with_key_file_auth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(
        tmp_path,
        "Secrets:\n  Source_type: environment\n  Profile: ETL_CRAFT_PROFILE\n"
        + "Engine:\n  Name: Postgres\n"
        + tiers(PG_BY_VARIABLES + "    key_file: ENGINE_KEY_FILE\n"),
    )
    monkeypatch.setenv("ETL_CRAFT_PROFILE", "uat")
    monkeypatch.setenv("ENGINE_JDBC_URL", "jdbc:postgresql://engine-db:5432/etl_craft?sslmode=require")
    monkeypatch.setenv("ENGINE_USER", "etl")
    monkeypatch.setenv("ENGINE_AUTH_MODE", "key_file")
    monkeypatch.setenv("ENGINE_SECRET", "passphrase")
    monkeypatch.setenv("ENGINE_KEY_FILE", "tls/client.key")

    profile = load_engine_profile(config)

    assert profile.auth.name == "key_file"
    assert profile.fields == {"key_file": str(tmp_path / "tls" / "client.key")}
    assert profile.secrets == {"secret": "passphrase"}
    assert isinstance(profile.target, PostgresTarget) and profile.target.settings == {"sslmode": "require"}


@pytest.mark.parametrize("tier", ["dev", "prod"])
def test_secrets_file_example_reads_the_profile_and_settings_from_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tier: str
) -> None:
    """Source_type file: Secrets.Profile and every setting are looked up in the .env file, not the environment."""
    write(
        tmp_path,
        f"ETL_CRAFT_PROFILE={tier}\nENGINE_JDBC_URL=jdbc:postgresql://engine-db:5432/etl_craft\n"
        "ENGINE_USER=etl\nENGINE_AUTH_MODE=password\nENGINE_SECRET=from-the-file\n"
        "ENGINE_PROD_SECRET=prod-from-the-file\n",
        "secrets-file.env",
    )
    config = write(
        tmp_path,
        "Secrets:\n  Source_type: file\n  Path: secrets-file.env\n  Profile: ETL_CRAFT_PROFILE\n"
        + OTHER_SECTIONS
        + "Engine:\n  Name: Postgres\n"
        + tiers(PG_BY_VARIABLES)
        + WAREHOUSE,
    )
    monkeypatch.setenv("ETL_CRAFT_PROFILE", "sit")  # the environment is not the source
    monkeypatch.setenv("ENGINE_SECRET", "from-the-environment")

    profile = load_engine_profile(config)

    assert profile.name == tier
    assert profile.secrets == {"secret": "prod-from-the-file" if tier == "prod" else "from-the-file"}


AUTH_PROFILES = {
    "password": "    auth_mode: password\n    secret: ENGINE_SECRET\n",
    "key_file": "    auth_mode: key_file\n    key_file: ENGINE_KEY_FILE\n    cert_file: ENGINE_CERT_FILE\n"
    "    secret: ENGINE_SECRET\n",
    "token": "    auth_mode: token\n    secret: ENGINE_SECRET\n",
    "oauth": "    auth_mode: oauth\n    client_id: ENGINE_CLIENT_ID\n    secret: ENGINE_SECRET\n"
    "    token_url: ENGINE_TOKEN_URL\n    scope: https://ossrdbms-aad.database.windows.net/.default\n",
    "sso": "    auth_mode: sso\n    issuer: ENGINE_ISSUER\n    client_id: ENGINE_CLIENT_ID\n",
    "sts": "    auth_mode: sts\n    region: us-east-1\n    role_arn: ENGINE_ROLE_ARN\n",
}
AUTH_FIELDS = {
    "password": {},
    "key_file": {"key_file": "/keys/client.key", "cert_file": "/keys/client.crt"},
    "token": {},
    "oauth": {"client_id": "etl-client", "token_url": "https://login.example.com/token",
              "scope": "https://ossrdbms-aad.database.windows.net/.default"},
    "sso": {"issuer": "https://login.example.com", "client_id": "etl-client"},
    "sts": {"region": "us-east-1", "role_arn": "arn:aws:iam::123456789012:role/etl"},
}  # fmt: skip


@pytest.mark.parametrize("mode", sorted(AUTH_PROFILES))
def test_auth_postgres_example_one_profile_per_auth_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Profiles named after their auth mode, chosen by ETL_CRAFT_AUTH through Secrets.Profile."""
    blocks = "".join(
        f"  {name}:\n    jdbc_url: ENGINE_JDBC_URL\n    schema: etl_craft\n    user: ENGINE_USER\n{body}"
        for name, body in AUTH_PROFILES.items()
    )
    config = write(
        tmp_path,
        "Secrets:\n  Source_type: environment\n  Profile: ETL_CRAFT_AUTH\n"
        + OTHER_SECTIONS
        + "Engine:\n  Name: Postgres\n"
        + blocks,
    )
    for name, value in {
        "ETL_CRAFT_AUTH": mode, "ENGINE_JDBC_URL": "jdbc:postgresql://engine-db:5432/etl_craft",
        "ENGINE_USER": "etl", "ENGINE_SECRET": "s3cret", "ENGINE_KEY_FILE": "/keys/client.key",
        "ENGINE_CERT_FILE": "/keys/client.crt", "ENGINE_CLIENT_ID": "etl-client",
        "ENGINE_TOKEN_URL": "https://login.example.com/token", "ENGINE_ISSUER": "https://login.example.com",
        "ENGINE_ROLE_ARN": "arn:aws:iam::123456789012:role/etl",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)

    profile = load_engine_profile(config)

    assert (profile.name, profile.auth.name, profile.user) == (mode, mode, "etl")
    assert dict(profile.fields) == AUTH_FIELDS[mode]
    assert profile.secrets == ({} if mode in ("sso", "sts") else {"secret": "s3cret"})


def test_minimal_local_example(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "Secrets:\n  Source_type: environment\n  Profile: dev\n"
        + OTHER_SECTIONS
        + "Engine:\n  dev:\n    jdbc_url: jdbc:sqlite:etl-craft-engine.db\n"
        + "Warehouse:\n  Name: DuckDB\n  dev:\n    jdbc_url: jdbc:duckdb:warehouse.duckdb\n",
    )

    profile = load_engine_profile(config)

    assert (profile.name, profile.dialect_name) == ("dev", "sqlite")
    assert profile.target == SqliteTarget((tmp_path / "etl-craft-engine.db").resolve())


@pytest.mark.parametrize("tier", TIERS)
def test_commented_example_file_with_name_inside_profiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tier: str
) -> None:
    """dev is SQLite without Name; sit, uat and prod say Name: Postgres inside the profile."""
    pg = "    Name: Postgres\n" + PG_BY_VARIABLES + "    key_file: ENGINE_KEY_FILE\n"
    config = write(
        tmp_path,
        "Secrets:\n  Source_type: environment\n  Profile: dev\n"
        + OTHER_SECTIONS
        + "Engine:\n  dev:\n    jdbc_url: jdbc:sqlite:etl-craft-engine.db\n"
        + "".join(f"  {t}:\n{pg}" for t in TIERS[1:])
        + "Warehouse:\n  dev:\n    Name: DuckDB\n    jdbc_url: jdbc:duckdb:warehouse.duckdb\n"
        + "Cloning:\n  dev:\n    Enabled: false\n    Scope: cfg\n",
    )
    monkeypatch.setenv("ENGINE_JDBC_URL", "jdbc:postgresql://engine-db:5432/etl_craft")
    monkeypatch.setenv("ENGINE_USER", "etl")
    monkeypatch.setenv("ENGINE_AUTH_MODE", "password")
    monkeypatch.setenv("ENGINE_SECRET", "s3cret")

    profile = load_engine_profile(config, None if tier == "dev" else tier)

    assert profile.name == tier
    assert profile.dialect_name == ("sqlite" if tier == "dev" else "postgresql")


def test_engine_db_page_schema_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Engine DB page's schema fragment: the target and schema as written; completed with a login it loads."""
    fragment = "Engine:\n  prod:\n    jdbc_url: jdbc:postgresql://db:5432/etl_craft\n    schema: etl_craft\n"
    monkeypatch.setenv("ENGINE_SECRET", "s3cret")
    complete = write(
        tmp_path / "complete",
        fragment + "    user: etl\n    auth_mode: password\n    secret: ENGINE_SECRET\n",
    )

    profile = load_engine_profile(complete)

    assert profile.target == PostgresTarget("db", 5432, "etl_craft", {})
    assert profile.schema == "etl_craft"
    with pytest.raises(ConfigurationError, match=r"Engine\.prod\.auth_mode is required for PostgreSQL"):
        load_engine_profile(write(tmp_path / "fragment", fragment))


def test_postgres_example_without_a_schema_is_refused_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(
        tmp_path,
        "Secrets:\n  Source_type: environment\n  Profile: dev\n"
        + "Engine:\n  Name: Postgres\n"
        + tiers(PG_BY_VARIABLES.replace("    schema: etl_craft\n", "")),
    )
    monkeypatch.setenv("ENGINE_JDBC_URL", "jdbc:postgresql://engine-db:5432/etl_craft")

    with pytest.raises(ConfigurationError, match=r"Engine\.dev\.schema is required for PostgreSQL"):
        load_engine_profile(config)
