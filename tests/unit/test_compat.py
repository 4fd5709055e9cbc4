"""Every Airflow name the provider uses resolves on the Airflow line under test (CI runs this on 3.0 to 3.3)."""

from __future__ import annotations

import importlib

import pytest

from airflow_provider_etl_craft import _compat

pytestmark = pytest.mark.smoke


@pytest.mark.parametrize("name", sorted(_compat.WHERE))
def test_every_name_in_the_table_resolves_on_this_line(name: str) -> None:
    found = _compat.resolve(name)
    assert name == "conf" or found.__name__ == name


def test_the_module_exposes_the_table_as_attributes() -> None:
    from airflow_provider_etl_craft._compat import BaseOperator, TaskGroup

    assert (BaseOperator, TaskGroup) == (_compat.resolve("BaseOperator"), _compat.resolve("TaskGroup"))


def test_control_flow_exceptions_are_the_classes_this_lines_task_runner_raises() -> None:
    # From 3.2 the Task SDK owns the exceptions; the core module may re-export them. Either way the class the
    # provider catches must be the one Airflow's own sensors and deferral machinery raise.
    for name in ("AirflowSkipException", "AirflowRescheduleException", "TaskDeferred"):
        sdk = importlib.import_module("airflow.sdk.exceptions")
        expected = getattr(sdk, name, None) or getattr(importlib.import_module("airflow.exceptions"), name)
        assert _compat.airflow_exception(name) is expected


def test_the_secret_masker_redacts_what_it_was_given() -> None:
    _compat.mask_secret("s3cr3t-compat-value")
    assert "s3cr3t-compat-value" not in str(_compat.redact("token=s3cr3t-compat-value"))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        _compat.NoSuchAirflowName  # noqa: B018


def test_stats_is_airflows_own_stats_object_on_this_line() -> None:
    """The provider's metrics go through the ``Stats`` of one of this line's homes (docs/metrics.md)."""
    homes = []
    for home in _compat.STATS_HOMES[:2]:  # 3.2+
        try:
            homes.append(importlib.import_module(home).Stats)
        except ImportError:
            continue
    if not homes:  # 3.0, 3.1 (on 3.2+ airflow.stats is a deprecated re-export)
        homes.append(importlib.import_module(_compat.STATS_HOMES[2]).Stats)
    stats = _compat.stats()
    assert any(stats is found for found in homes)
    assert _compat.stats() is stats  # looked up once per process
    # Metrics are off in this process: a no-op that must not raise.
    stats.incr("etl_craft.test_compat", tags={"case": "compat"})
