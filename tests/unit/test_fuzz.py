"""Property-based tests (Hypothesis) over the inputs users type (issue 14): for any generated config file, URL,
connection or command line, the result is success or a provider error with a documented exit status, and no
secret value set in the environment appears in any message or output.

Nothing here opens a network connection: generated PostgreSQL profiles are only resolved, and the CLI runs
against a SQLite Engine DB. Runs are derandomized (the same examples every run) so CI is repeatable; locally,
``ETL_CRAFT_FUZZ_EXAMPLES=5000 ETL_CRAFT_FUZZ_RANDOM=1`` searches further.
"""

from __future__ import annotations

import io
import json
import os
import string
from pathlib import Path

import pytest
import yaml
from airflow.models.connection import Connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_etl_craft.cli.main import main
from airflow_provider_etl_craft.config import load_engine_profile
from airflow_provider_etl_craft.config.connection import profile_from_connection
from airflow_provider_etl_craft.config.load import profile_keys
from airflow_provider_etl_craft.engine.url import parse_jdbc_url
from airflow_provider_etl_craft.errors import EtlCraftError

#: Exit statuses docs/errors.md and docs/cli.md document.
DOCUMENTED = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 20}
#: The secret every example may reach; it must never be printed or put in an error.
SECRET = "Fz-s3cr3t-9f2c41d7"
EXAMPLES = int(os.environ.get("ETL_CRAFT_FUZZ_EXAMPLES", "300"))
RANDOM = os.environ.get("ETL_CRAFT_FUZZ_RANDOM") == "1"  # new examples every run (local searching)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip

words = st.text(alphabet=string.ascii_letters + string.digits + "_-.:/@?&=%[]#~ ${}", max_size=40)
anything = st.text(max_size=60)  # any Unicode, surrogates and NUL included
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), words, anything)
#: Every profile key the registry knows, section keys in the wrong place, and keys nothing takes.
KEYS = [*sorted(profile_keys()), "Profile", "Source_type", "Path", "audience", "bogus"]
URL_PARTS = ["jdbc:postgresql://", "jdbc:sqlite:", "postgresql://", "[::1", "]", ":", "5432", "65536", "/", "db",
             "?", "sslmode=require", "&", "options=-c x=1", "password=x", "#f", "@", "127.0.0.1", "%00", "~/"]  # fmt: skip
urls = st.one_of(anything, st.lists(st.sampled_from(URL_PARTS), max_size=8).map("".join))
values = st.one_of(scalars, urls, st.just("${ENGINE_SECRET}"), st.just("ENGINE_SECRET"))
profiles = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)
documents = st.one_of(
    st.fixed_dictionaries({"Engine": st.dictionaries(st.sampled_from(["dev", "prod", "Profile"]), profiles, max_size=2)},
                          optional={"Secrets": profiles}),
    st.dictionaries(st.sampled_from(["Engine", "Secrets", "Other"]), st.one_of(profiles, scalars), max_size=3),
)  # fmt: skip


@pytest.fixture(autouse=True)
def engine_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_SECRET", SECRET)
    monkeypatch.delenv("ETL_CRAFT_CONFIG", raising=False)


def assert_provider_error(exc: EtlCraftError) -> None:
    assert exc.exit_code in DOCUMENTED, exc
    assert SECRET not in str(exc)


@FUZZ
@given(document=documents)
def test_any_config_document_resolves_or_is_a_configuration_error(document: dict, tmp_path: Path) -> None:
    path = tmp_path / "craft-connector.yml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8", errors="surrogatepass")
    try:
        profile = load_engine_profile(path)
    except EtlCraftError as exc:
        assert_provider_error(exc)
    else:
        assert SECRET not in repr(profile) and SECRET not in profile.describe()


@FUZZ
@given(text=st.one_of(anything, st.text(alphabet=string.printable, max_size=120)))
def test_any_config_text_resolves_or_is_a_configuration_error(text: str, tmp_path: Path) -> None:
    path = tmp_path / "craft-connector.yml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        load_engine_profile(path)
    except EtlCraftError as exc:
        assert_provider_error(exc)


@FUZZ
@given(url=urls)
def test_any_jdbc_url_parses_or_is_a_configuration_error(url: str, tmp_path: Path) -> None:
    try:
        parse_jdbc_url(url, "Engine.t.jdbc_url", tmp_path)
    except EtlCraftError as exc:
        assert_provider_error(exc)


@FUZZ
@given(
    host=st.one_of(st.none(), words, anything),
    port=st.one_of(st.none(), st.integers(-5, 70000)),
    schema=st.one_of(st.none(), words),
    login=st.one_of(st.none(), words),
    extra=st.dictionaries(st.sampled_from([*KEYS, "engine_schema", "config_path", "sslmode", "options", "profile"]),
                          values, max_size=5),
)  # fmt: skip
def test_any_airflow_connection_resolves_or_is_a_configuration_error(
    host, port, schema, login, extra
) -> None:
    conn = Connection(conn_id="etl_craft_fuzz", conn_type="etl_craft", host=host, port=port, schema=schema,
                      login=login, password=SECRET, extra=json.dumps(extra))  # fmt: skip
    try:
        profile = profile_from_connection(conn)
    except EtlCraftError as exc:
        assert_provider_error(exc)
    else:
        assert SECRET not in repr(profile) and SECRET not in profile.describe()


COMMANDS = ["init-db", "migrate", "check", "status", "history", "pause", "resume"]
OPTIONS = ["--pipeline", "--reason", "--by", "--lock-timeout", "--limit", "--format", "--profile", "--verbose",
           "--migrations-dir", "--run-key", "json", "table", "0", "-1", "nan", "inf", "1e999", "t", "P1", SECRET]  # fmt: skip
argvs = st.tuples(
    st.sampled_from(COMMANDS), st.lists(st.one_of(st.sampled_from(OPTIONS), anything, words), max_size=6)
).map(lambda parts: [parts[0], *parts[1]])


@pytest.fixture(scope="module")
def sqlite_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz-cli")
    config = folder / "craft-connector.yml"
    config.write_text(
        "Engine:\n  t:\n    jdbc_url: jdbc:sqlite:engine.db\n    schema: main\n", encoding="utf-8"
    )
    assert main(["migrate", "--config", str(config)], io.StringIO(), io.StringIO()) == 0
    return config


@FUZZ
@given(argv=argvs)
def test_any_command_line_exits_with_a_documented_status_and_no_traceback(
    argv: list[str], sqlite_config: Path
) -> None:
    out, err = io.StringIO(), io.StringIO()
    try:
        status = main([*argv, "--config", str(sqlite_config)], out, err)
    except SystemExit as exc:  # argparse's usage errors (and --help)
        status = int(exc.code or 0)
    text = out.getvalue() + err.getvalue()
    assert status in DOCUMENTED, (argv, text)
    assert "Traceback" not in text and "unexpected internal error" not in text, (argv, text)
    if SECRET not in argv:  # a value the user typed may be echoed; the environment's secret never is
        assert SECRET not in text, (argv, text)
