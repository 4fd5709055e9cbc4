"""The provider's connect defaults (TCP keepalives, docs/failover-errors.md) under the URL's own settings, and
the failover error's ``case`` kept across a pickle (Airflow may ship an exception between processes)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from airflow_provider_etl_craft.config import load_engine_profile
from airflow_provider_etl_craft.engine.dialects import dialect_for
from airflow_provider_etl_craft.engine.dialects.postgresql import KEEPALIVE_DEFAULTS
from airflow_provider_etl_craft.errors import EngineUnreachableError
from harness.engines import write_config


def connect_kwargs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, query: str) -> dict[str, str]:
    monkeypatch.setenv("DEFAULTS_SECRET", "s3cret-defaults")
    path = write_config(
        tmp_path,
        f"Engine:\n  prod:\n    jdbc_url: jdbc:postgresql://pg.internal:5432/engine?{query}\n    schema: etl\n"
        "    user: etl_user\n    auth_mode: password\n    secret: DEFAULTS_SECRET\n",
    )
    return dialect_for(load_engine_profile(path)).connect_kwargs()  # type: ignore[attr-defined,no-any-return]


def test_keepalives_are_on_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kwargs = connect_kwargs(tmp_path, monkeypatch, "sslmode=require")
    assert {k: kwargs[k] for k in KEEPALIVE_DEFAULTS} == {
        "keepalives": "1",
        "keepalives_idle": "30",
        "keepalives_interval": "10",
        "keepalives_count": "3",
        "tcp_user_timeout": "60000",
    }


def test_the_urls_own_keepalive_settings_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kwargs = connect_kwargs(tmp_path, monkeypatch, "keepalives=0&keepalives_idle=5&tcp_user_timeout=0")
    assert (kwargs["keepalives"], kwargs["keepalives_idle"], kwargs["tcp_user_timeout"]) == ("0", "5", "0")
    assert kwargs["keepalives_count"] == "3"


def test_the_case_of_a_failover_error_survives_a_pickle() -> None:
    error = pickle.loads(pickle.dumps(EngineUnreachableError("the proxy closed", case="peer_closed")))
    assert (str(error), error.case, error.retryable) == ("the proxy closed", "peer_closed", True)
    assert EngineUnreachableError("no case").case is None
