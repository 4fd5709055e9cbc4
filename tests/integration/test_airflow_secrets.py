"""``Secrets.Source_type: airflow``: Engine secrets served by Airflow Variables and its secrets backends.

(a) ``AIRFLOW_VAR_<NAME>`` in the environment, in this process; (b) Airflow's local-filesystem secrets
backend, in a subprocess (Airflow builds its list of secrets backends once per process). Both log in to the
real cluster as ``etl_password``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path

import pytest
from psycopg2 import sql

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from harness.engines import write_config

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]

SUBPROCESS_SCRIPT = textwrap.dedent(
    """
    import sys
    from contextlib import closing

    from airflow_provider_etl_craft.errors import ConfigurationError
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

    try:
        hook = EngineDBHook.from_config(sys.argv[1])
        with closing(hook.get_conn()) as conn, conn.cursor() as cur:
            cur.execute("SELECT current_user")
            print("current_user=" + cur.fetchone()[0])
    except ConfigurationError as exc:
        print(f"error: {exc}")
        sys.exit(exc.exit_code)
    """
)


def airflow_profile(db, *, user: str = "etl_password", secret: str = "ENGINE_SECRET") -> str:
    cluster = db.cluster
    return (
        "Secrets:\n  Source_type: airflow\n  Profile: prod\n"
        "Engine:\n  prod:\n"
        f"    jdbc_url: jdbc:postgresql://{cluster.host}:{cluster.port}/{db.name}?sslmode=require\n"
        f"    schema: {db.schema}\n"
        f"    user: {user}\n"
        "    auth_mode: password\n"
        f"    secret: {secret}\n"
        # another environment's profile: its variables need not exist anywhere
        "  dev:\n    jdbc_url: jdbc:postgresql://db.dev.internal/etl_craft\n    schema: etl_craft\n"
        "    user: DEV_USER\n    auth_mode: password\n    secret: DEV_ENGINE_SECRET\n"
    )


def current_user(hook: EngineDBHook) -> str:
    with closing(hook.get_conn()) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_user")
        return cur.fetchone()[0]


@pytest.fixture
def no_airflow_vars(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No AIRFLOW_VAR_ENGINE… / ETL… leftovers from the outside environment, nor plain ENGINE_… ones."""
    for name in list(os.environ):
        if name.startswith(("AIRFLOW_VAR_", "ENGINE_")):
            monkeypatch.delenv(name)
    return monkeypatch


# --------------------------------------------------------------------------- (a) AIRFLOW_VAR_<NAME>


def test_the_secret_comes_from_an_airflow_variable_in_the_environment(
    pg_database, tmp_path, no_airflow_vars
) -> None:
    no_airflow_vars.setenv("AIRFLOW_VAR_ENGINE_SECRET", pg_database.password)
    hook = EngineDBHook.from_config(write_config(tmp_path, airflow_profile(pg_database)))
    assert current_user(hook) == "etl_password"
    assert hook.engine_profile.secrets == {"secret": pg_database.password}


def test_the_airflow_source_is_not_the_process_environment(pg_database, tmp_path, no_airflow_vars) -> None:
    """A plain ENGINE_SECRET environment variable is not an Airflow Variable: the airflow source ignores it."""
    no_airflow_vars.setenv("ENGINE_SECRET", pg_database.password)
    with pytest.raises(ConfigurationError, match="not set in the airflow secrets source"):
        EngineDBHook.from_config(write_config(tmp_path, airflow_profile(pg_database))).get_conn()


def test_the_profile_twin_wins_through_the_airflow_source(pg_database, tmp_path, no_airflow_vars) -> None:
    wrong = secrets.token_urlsafe(24)
    no_airflow_vars.setenv("AIRFLOW_VAR_ENGINE_SECRET", wrong)
    no_airflow_vars.setenv("AIRFLOW_VAR_ENGINE_PROD_SECRET", pg_database.password)
    no_airflow_vars.setenv("AIRFLOW_VAR_ENGINE_USER", "etl_token")
    no_airflow_vars.setenv("AIRFLOW_VAR_ENGINE_PROD_USER", "etl_password")
    config = write_config(tmp_path, airflow_profile(pg_database, user="ENGINE_USER"))

    hook = EngineDBHook.from_config(config)
    assert hook.engine_profile.user == "etl_password"
    assert current_user(hook) == "etl_password"


def test_without_the_twin_the_plain_variable_is_used(pg_database, tmp_path, no_airflow_vars) -> None:
    no_airflow_vars.setenv("AIRFLOW_VAR_ENGINE_USER", "etl_password")
    no_airflow_vars.setenv("AIRFLOW_VAR_ENGINE_SECRET", pg_database.password)
    hook = EngineDBHook.from_config(write_config(tmp_path, airflow_profile(pg_database, user="ENGINE_USER")))
    assert current_user(hook) == "etl_password"


def test_the_profile_selector_variable_is_read_through_airflow(
    pg_database, tmp_path, no_airflow_vars
) -> None:
    """Secrets.Profile may name a variable; with the airflow source an Airflow Variable selects the profile."""
    no_airflow_vars.setenv("AIRFLOW_VAR_ETL_CRAFT_PROFILE", "prod")
    no_airflow_vars.setenv("AIRFLOW_VAR_ENGINE_SECRET", pg_database.password)
    text = airflow_profile(pg_database).replace("Profile: prod", "Profile: ETL_CRAFT_PROFILE")
    hook = EngineDBHook.from_config(write_config(tmp_path, text))
    assert hook.engine_profile.name == "prod"
    assert current_user(hook) == "etl_password"


def test_an_unset_variable_names_the_setting_and_the_variable_but_no_value(pg_database, tmp_path,
                                                                           no_airflow_vars) -> None:  # fmt: skip
    near_miss = secrets.token_urlsafe(24)
    no_airflow_vars.setenv("AIRFLOW_VAR_ENGINE_SECRETS", near_miss)  # a close name holding a value
    no_airflow_vars.setenv("ENGINE_SECRET", pg_database.password)  # in the environment, not in Airflow
    with pytest.raises(ConfigurationError) as caught:
        EngineDBHook.from_config(write_config(tmp_path, airflow_profile(pg_database))).get_conn()
    message = str(caught.value)
    assert "Engine.prod.secret" in message
    assert "ENGINE_SECRET" in message and "ENGINE_PROD_SECRET" in message
    assert "airflow secrets source" in message
    assert near_miss not in message and pg_database.password not in message
    assert caught.value.exit_code == 3


def test_an_empty_variable_is_refused(pg_database, tmp_path, no_airflow_vars) -> None:
    no_airflow_vars.setenv("AIRFLOW_VAR_ENGINE_SECRET", "")
    with pytest.raises(ConfigurationError, match=r"Engine\.prod\.secret names variable ENGINE_SECRET, which is set "
                                                  r"but empty in the airflow secrets source"):  # fmt: skip
        EngineDBHook.from_config(write_config(tmp_path, airflow_profile(pg_database))).get_conn()


def test_a_secret_from_airflow_is_registered_with_the_masker(pg_database, tmp_path, no_airflow_vars) -> None:
    # A password never used before in this session, so the masker cannot already know it.
    fresh = secrets.token_urlsafe(24)
    set_password = sql.SQL("ALTER ROLE {} PASSWORD %s").format(sql.Identifier(pg_database.user))
    with closing(pg_database.cluster.admin_connect()) as admin:
        admin.cursor().execute(set_password, (fresh,))
        try:
            # ENGINE_LOGIN holds no "secret"/"password" word, so Airflow itself would not mask it: the provider must.
            no_airflow_vars.setenv("AIRFLOW_VAR_ENGINE_LOGIN", fresh)
            hook = EngineDBHook.from_config(
                write_config(tmp_path, airflow_profile(pg_database, secret="ENGINE_LOGIN"))
            )
            assert fresh in _compat.redact(f"x {fresh} y")  # not masked before loading

            assert current_user(hook) == "etl_password"
            assert fresh not in _compat.redact(f"x {fresh} y")
        finally:
            admin.cursor().execute(set_password, (pg_database.password,))


# --------------------------------------------------------------------------- (b) a secrets backend


def run_with_local_filesystem_backend(config: Path, variables: dict[str, str], tmp_path: Path):
    variables_file = tmp_path / "variables.json"
    variables_file.write_text(json.dumps(variables), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_VAR_", "ENGINE_", "ETL_CRAFT_"))}
    env["AIRFLOW__SECRETS__BACKEND"] = "airflow.secrets.local_filesystem.LocalFilesystemBackend"
    env["AIRFLOW__SECRETS__BACKEND_KWARGS"] = json.dumps({"variables_file_path": str(variables_file)})
    return subprocess.run([sys.executable, "-c", SUBPROCESS_SCRIPT, str(config)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


@pytest.mark.parametrize("twin", [False, True], ids=["plain", "twin"])
def test_a_secrets_backend_serves_the_secret(pg_database, tmp_path, twin: bool) -> None:
    """LocalFilesystemBackend stands for Vault / AWS Secrets Manager / GCP Secret Manager."""
    if twin:  # for profile prod, ENGINE_PROD_… wins over ENGINE_…
        variables = {"ENGINE_SECRET": secrets.token_urlsafe(24), "ENGINE_PROD_SECRET": pg_database.password,
                     "ENGINE_USER": "etl_token", "ENGINE_PROD_USER": "etl_password"}  # fmt: skip
    else:
        variables = {"ENGINE_SECRET": pg_database.password, "ENGINE_USER": "etl_password"}
    config = write_config(tmp_path, airflow_profile(pg_database, user="ENGINE_USER"))
    done = run_with_local_filesystem_backend(config, variables, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "current_user=etl_password" in done.stdout.splitlines()
    assert pg_database.password not in done.stdout + done.stderr


def test_a_variable_the_backend_does_not_hold_is_named(pg_database, tmp_path) -> None:
    config = write_config(tmp_path, airflow_profile(pg_database))
    done = run_with_local_filesystem_backend(config, {"ENGINE_SECRETS": pg_database.password}, tmp_path)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Engine.prod.secret names variable ENGINE_SECRET" in done.stdout
    assert "not set in the airflow secrets source" in done.stdout
    assert pg_database.password not in done.stdout + done.stderr
