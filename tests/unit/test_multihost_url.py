"""Multi-host PostgreSQL URLs: PgJDBC's ``host1:port1,host2:port2`` form, ``targetServerType`` and
``loadBalanceHosts`` in libpq's terms (libpq's own spellings too), the refusal of settings that may land on a
standby, bad host lists, and descriptions that name every host and no credential."""

from __future__ import annotations

from pathlib import Path

import psycopg2
import pytest

from airflow_provider_etl_craft.config import load_engine_profile
from airflow_provider_etl_craft.engine.dialects import dialect_for
from airflow_provider_etl_craft.engine.url import PostgresTarget, parse_jdbc_url
from airflow_provider_etl_craft.errors import ConfigurationError
from harness.engines import write_config

SETTING = "Engine.prod.jdbc_url"
TWO = "jdbc:postgresql://pg-a.internal:5432,pg-b.internal:5433/engine"
#: The refusal's reason and fix, as every refused target says them.
WRITES = "the provider writes to the Engine DB on every step"
FIX = "targetServerType=primary"


def parse(url: str) -> PostgresTarget:
    target = parse_jdbc_url(url, SETTING, None)
    assert isinstance(target, PostgresTarget)
    return target


def refused(url: str) -> str:
    with pytest.raises(ConfigurationError) as info:
        parse_jdbc_url(url, SETTING, None)
    message = str(info.value)
    assert message.startswith(f"{SETTING}: "), message
    return message


# -- the host list --------------------------------------------------------------------------------------------


def test_two_hosts_with_primary_pass_both_to_libpq_as_lists() -> None:
    target = parse(f"{TWO}?targetServerType=primary")
    assert target.hosts == (("pg-a.internal", 5432), ("pg-b.internal", 5433))
    assert target.driver_hosts() == {"host": "pg-a.internal,pg-b.internal", "port": "5432,5433"}
    assert target.settings == {"target_session_attrs": "read-write"}
    assert target.describe() == "postgresql://pg-a.internal:5432,pg-b.internal:5433/engine"


def test_hosts_without_a_port_take_5432_and_ipv6_addresses_go_in_brackets() -> None:
    target = parse("jdbc:postgresql://[::1]:6432,PG-A,[2001:DB8::7]/engine?target_session_attrs=read-write")
    assert target.hosts == (("::1", 6432), ("pg-a", 5432), ("2001:db8::7", 5432))
    assert target.driver_hosts() == {"host": "::1,pg-a,2001:db8::7", "port": "6432,5432,5432"}
    assert target.describe() == "postgresql://[::1]:6432,pg-a:5432,[2001:db8::7]:5432/engine"


def test_one_host_without_a_target_is_as_before() -> None:
    assert parse("jdbc:postgresql://pg.internal/engine?sslmode=require") == PostgresTarget(
        "pg.internal", 5432, "engine", {"sslmode": "require"}
    )
    assert parse("jdbc:postgresql://[::1]/engine").describe() == "postgresql://[::1]:5432/engine"


@pytest.mark.parametrize(
    ("netloc", "said"),
    [
        ("h1,,h2", "host 2 of 3 is empty"),
        ("h1,h2,", "host 3 of 3 is empty"),
        (",h1", "host 1 of 2 is empty"),
        ("h1,h2:99999", "host 2 of 2 ('h2:99999'): the port is not a number between 1 and 65535"),
        ("h1:0,h2", "host 1 of 2 ('h1:0'): the port is not a number between 1 and 65535"),
        ("h1,h2:5x", "host 2 of 2 ('h2:5x'): the port is not a number"),
        ("[::1,h2", "host 1 of 2 ('[::1'): the host is not a valid bracketed IPv6 address"),
        ("h1,[::1]5432", "host 2 of 2 ('[::1]5432'): the host is not a valid bracketed IPv6 address"),
        ("h1,[pg.internal]", "host 2 of 2 ('[pg.internal]'): the host is not a valid bracketed IPv6 address"),
        ("h1,::1", "host 2 of 2 ('::1'): the host is not a valid bracketed IPv6 address; write an IPv6 address in "
                   "brackets"),
        ("h1,:5432", "host 2 of 2 (':5432') has no host name"),
    ],
)  # fmt: skip
def test_a_bad_host_list_names_the_setting_and_the_entry(netloc: str, said: str) -> None:
    assert said in refused(f"jdbc:postgresql://{netloc}/engine?targetServerType=primary")


def test_credentials_before_a_host_list_are_refused() -> None:
    assert "credentials in the URL are refused" in refused("jdbc:postgresql://u:pw@h1,h2/engine")


# -- targetServerType and target_session_attrs ------------------------------------------------------------------


@pytest.mark.parametrize("value", ["primary", "master", "Primary"])
def test_pgjdbc_primary_is_libpq_read_write(value: str) -> None:
    assert parse(f"{TWO}?targetServerType={value}").settings == {"target_session_attrs": "read-write"}


@pytest.mark.parametrize("value", ["read-write", "primary"])
def test_libpq_spellings_of_the_primary_are_taken_as_written(value: str) -> None:
    assert parse(f"{TWO}?target_session_attrs={value}").settings == {"target_session_attrs": value}


def test_any_is_taken_with_one_host_and_refused_with_several() -> None:
    assert parse("jdbc:postgresql://h1/engine?targetServerType=any").settings == {
        "target_session_attrs": "any"
    }
    message = refused(f"{TWO}?targetServerType=any")
    assert "with 2 hosts and targetServerType=any, libpq may connect to a standby" in message
    assert WRITES in message and FIX in message


def test_several_hosts_without_a_target_are_refused() -> None:
    message = refused(TWO)
    assert "with 2 hosts and no target server type" in message and WRITES in message and FIX in message


@pytest.mark.parametrize(
    "query",
    [
        "targetServerType=secondary",
        "targetServerType=slave",
        "targetServerType=preferSecondary",
        "target_session_attrs=standby",
        "target_session_attrs=prefer-standby",
        "target_session_attrs=read-only",
    ],
)
@pytest.mark.parametrize("hosts", ["h1", "h1,h2"])
def test_a_target_that_asks_for_a_standby_is_refused(query: str, hosts: str) -> None:
    message = refused(f"jdbc:postgresql://{hosts}/engine?{query}")
    assert f"{query} asks for (or falls back to) a standby" in message
    assert WRITES in message and FIX in message


def test_prefer_primary_is_refused_as_it_falls_back_to_a_standby() -> None:
    message = refused(f"{TWO}?targetServerType=preferPrimary")
    assert "targetServerType=preferPrimary falls back to a standby" in message
    assert WRITES in message and FIX in message


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("targetServerType=leader", "targetServerType 'leader' is not one of any, primary, secondary"),
        (
            "target_session_attrs=Read-Write",
            "target_session_attrs 'Read-Write' is not one of any, prefer-standby",
        ),
        ("loadBalanceHosts=yes", "loadBalanceHosts must be true or false, not 'yes'"),
        ("load_balance_hosts=shuffle", "load_balance_hosts 'shuffle' is not one of disable, random"),
    ],
)
def test_unknown_values_are_refused_with_the_known_ones(query: str, said: str) -> None:
    assert said in refused(f"{TWO}?{query}")


@pytest.mark.parametrize(
    ("query", "attrs"),
    [
        ("targetServerType=primary&target_session_attrs=read-write", "read-write"),
        ("targetServerType=primary&target_session_attrs=primary", "read-write"),
        ("target_session_attrs=primary&targetServerType=master", "primary"),
    ],
)
def test_both_spellings_that_agree_are_taken(query: str, attrs: str) -> None:
    assert parse(f"{TWO}?{query}").settings == {"target_session_attrs": attrs}


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("targetServerType=primary&target_session_attrs=any", "targetServerType and target_session_attrs disagree "
                                                              "(read-write against any"),
        ("targetServerType=primary&loadBalanceHosts=true&load_balance_hosts=disable",
         "loadBalanceHosts and load_balance_hosts disagree (random against disable"),
    ],
)  # fmt: skip
def test_both_spellings_that_disagree_are_refused(query: str, said: str) -> None:
    assert said in refused(f"{TWO}?{query}")


@pytest.mark.parametrize(("value", "libpq"), [("true", "random"), ("false", "disable"), ("TRUE", "random")])
def test_load_balance_hosts_in_libpq_terms(value: str, libpq: str) -> None:
    target = parse(f"{TWO}?targetServerType=primary&loadBalanceHosts={value}")
    assert target.settings == {"target_session_attrs": "read-write", "load_balance_hosts": libpq}


# -- the driver and the descriptions -----------------------------------------------------------------------------


def profile_file(tmp_path: Path, url: str) -> Path:
    return write_config(
        tmp_path,
        f"Engine:\n  prod:\n    jdbc_url: {url}\n    schema: etl\n    user: etl_user\n    auth_mode: password\n"
        "    secret: MULTI_SECRET\n",
    )


def test_the_driver_gets_host_and_port_lists_and_descriptions_name_every_host_and_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MULTI_SECRET", "s3cret-multi-host-value")
    url = "jdbc:postgresql://pg-a:5432,[::1]:5433/engine?targetServerType=primary&loadBalanceHosts=true"
    profile = load_engine_profile(profile_file(tmp_path, url))
    dialect = dialect_for(profile)
    kwargs = dialect.connect_kwargs()  # type: ignore[attr-defined]
    assert (kwargs["host"], kwargs["port"], kwargs["dbname"]) == ("pg-a,::1", "5432,5433", "engine")
    assert (kwargs["target_session_attrs"], kwargs["load_balance_hosts"]) == ("read-write", "random")
    assert "targetServerType" not in kwargs and "loadBalanceHosts" not in kwargs
    shown = " ".join([dialect.describe(), profile.describe(), repr(profile), profile.target.describe()])
    assert "postgresql://pg-a:5432,[::1]:5433/engine" in dialect.describe()
    assert "s3cret-multi-host-value" not in shown


def test_load_balancing_with_a_libpq_older_than_16_is_refused_naming_both_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg2's own libpq is what decides; an older build is simulated by its version attribute."""
    monkeypatch.setenv("MULTI_SECRET", "x")
    monkeypatch.setattr(psycopg2, "__libpq_version__", 150008)
    url = f"{TWO}?targetServerType=primary&loadBalanceHosts=true"
    dialect = dialect_for(load_engine_profile(profile_file(tmp_path, url)))
    with pytest.raises(ConfigurationError) as info:
        dialect.login()
    assert "load_balance_hosts=random, which needs libpq 16.0 or newer" in str(info.value)
    assert "uses libpq 15.8" in str(info.value) and "Engine.prod.jdbc_url" in str(info.value)


def test_sts_takes_one_host_as_its_token_is_signed_for_one_host_name(tmp_path: Path) -> None:
    write_config(
        tmp_path,
        f"Engine:\n  prod:\n    jdbc_url: {TWO}?targetServerType=primary\n    schema: etl\n    user: etl_iam\n"
        "    auth_mode: sts\n    region: eu-west-1\n",
    )
    dialect = dialect_for(load_engine_profile(tmp_path / "craft-connector.yml"))
    with pytest.raises(ConfigurationError) as info:
        dialect.connect_kwargs()  # type: ignore[attr-defined]
    assert "names 2 hosts; give one host (the RDS or Aurora cluster endpoint" in str(info.value)
