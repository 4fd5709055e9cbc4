"""Pure values of the run lifecycle: task counts, storable text, the run identity and code checks (no I/O)."""

from __future__ import annotations

from collections import OrderedDict
from datetime import UTC, datetime, timedelta, timezone
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest

from airflow_provider_etl_craft.errors import TaskFailedError
from airflow_provider_etl_craft.runs.counts import MAX_ERROR_CHARS, TaskCounts, clean_text
from airflow_provider_etl_craft.runs.identity import RunIdentity, check_code

# -- TaskCounts.from_result --------------------------------------------------------------------------------


def test_an_int_is_rows_written() -> None:
    assert TaskCounts.from_result(42) == TaskCounts(rows_written=42)
    assert TaskCounts.from_result(0) == TaskCounts(rows_written=0)
    assert TaskCounts.from_result(42).values() == (None, None, None, None, None, 42)


@pytest.mark.parametrize("value", [None, "12", 3.0, [1, 2], (1,), object(), b"7", True, False])
def test_none_and_other_shapes_record_no_counts(value: Any) -> None:
    # bool is not taken for an int (True would otherwise mean "1 row written").
    assert TaskCounts.from_result(value) == TaskCounts()
    assert TaskCounts.from_result(value).values() == (None,) * 6


def test_a_mapping_is_read_case_insensitively_and_other_keys_are_ignored() -> None:
    result = {"SOURCE_COUNT": 100, "Target_Count": 90, "insert_count": 5, "Update_Count": 4, "DELETE_COUNT": 1,
              "rows_WRITTEN": 12, "table": "orders", "elapsed": 1.5, 7: "x"}  # fmt: skip
    assert TaskCounts.from_result(result) == TaskCounts(100, 90, 5, 4, 1, 12)
    assert TaskCounts.from_result(result).values() == (100, 90, 5, 4, 1, 12)


def test_any_mapping_type_is_accepted() -> None:
    assert TaskCounts.from_result(MappingProxyType({"rows_written": 3})) == TaskCounts(rows_written=3)
    assert TaskCounts.from_result(OrderedDict(insert_count=2)) == TaskCounts(insert_count=2, rows_written=2)


def test_rows_written_is_derived_from_the_given_insert_update_delete_counts() -> None:
    assert TaskCounts.from_result({"insert_count": 3, "update_count": 2, "delete_count": 1}).rows_written == 6
    assert TaskCounts.from_result({"update_count": 7, "source_count": 100}) == TaskCounts(
        source_count=100, update_count=7, rows_written=7
    )
    assert TaskCounts.from_result({"delete_count": 0}) == TaskCounts(delete_count=0, rows_written=0)
    # Explicit rows_written wins over the sum; None values count as absent.
    assert TaskCounts.from_result({"insert_count": 3, "rows_written": 10}).rows_written == 10
    assert TaskCounts.from_result({"insert_count": 3, "rows_written": None}).rows_written == 3
    assert TaskCounts.from_result({"insert_count": None, "update_count": None}) == TaskCounts()
    # Source and target counts alone are not rows written.
    assert TaskCounts.from_result({"source_count": 5, "target_count": 5}).rows_written is None
    assert TaskCounts.from_result({}) == TaskCounts()


def test_a_task_counts_value_is_taken_as_it_is_with_rows_written_derived() -> None:
    counts = TaskCounts(source_count=1, rows_written=9)
    assert TaskCounts.from_result(counts) is counts
    assert TaskCounts.from_result(TaskCounts(insert_count=2, update_count=3)) == TaskCounts(
        insert_count=2, update_count=3, rows_written=5
    )
    assert TaskCounts.from_result(TaskCounts()) == TaskCounts()


def test_task_counts_is_frozen() -> None:
    with pytest.raises(AttributeError, match="immutable"):
        TaskCounts().rows_written = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (-1, "rows_written=-1"),
        ({"insert_count": -5}, "insert_count=-5"),
        ({"SOURCE_COUNT": "12"}, "source_count='12'"),
        ({"rows_written": 1.5}, "rows_written=1.5"),
        ({"update_count": True}, "update_count=True"),
        ({"delete_count": False}, "delete_count=False"),
        ({"target_count": [1]}, "target_count=[1]"),
    ],
)
def test_bad_count_values_fail_the_task_naming_the_key(value: Any, named: str) -> None:
    with pytest.raises(TaskFailedError, match="counts must be non-negative integers") as caught:
        TaskCounts.from_result(value)
    assert named in str(caught.value)
    assert TaskFailedError.exit_code == 1 and TaskFailedError.retryable


@pytest.mark.parametrize("bad", [{"rows_written": -3}, {"insert_count": "x"}, {"delete_count": True},
                                 {"update_count": 1.5}])  # fmt: skip
def test_a_task_counts_value_with_bad_fields_is_refused_like_a_mapping(bad: dict[str, Any]) -> None:
    with pytest.raises(TaskFailedError, match="counts must be non-negative integers"):
        TaskCounts.from_result(TaskCounts(**bad))


@pytest.mark.parametrize("value", [2**63, {"rows_written": 2**63}, {"insert_count": 2**64}])
def test_counts_beyond_64_bits_are_refused(value: Any) -> None:
    with pytest.raises(TaskFailedError):
        TaskCounts.from_result(value)


def test_the_largest_64_bit_count_is_accepted() -> None:
    assert TaskCounts.from_result(2**63 - 1).rows_written == 2**63 - 1


# -- clean_text ---------------------------------------------------------------------------------------------


def test_clean_text_keeps_ordinary_text() -> None:
    assert clean_text("ValueError: bad row 7 — ünïcödé ✓ 漢字") == "ValueError: bad row 7 — ünïcödé ✓ 漢字"
    assert clean_text("") == ""
    assert clean_text("line 1\nline 2\ttab") == "line 1\nline 2\ttab"


def test_clean_text_replaces_nul_bytes() -> None:
    assert clean_text("a\x00b\x00") == "a\\0b\\0"
    assert "\x00" not in clean_text("\x00" * 10)


def test_clean_text_replaces_invalid_surrogates() -> None:
    undecodable = b"caf\xe9".decode("utf-8", "surrogateescape")
    assert undecodable == "caf\udce9"
    assert clean_text(undecodable) == "caf?"
    assert clean_text("x\ud800y\udfffz") == "x?y?z"
    # A valid pair written as two surrogates is not valid UTF-8 either.
    assert clean_text("\ud83d\ude00") == "??"
    clean_text(undecodable).encode("utf-8")  # storable


def test_clean_text_trims_long_text_and_says_how_much() -> None:
    assert MAX_ERROR_CHARS == 4000
    text = "".join(chr(ord("a") + i % 26) for i in range(10_000))
    cleaned = clean_text(text)
    assert cleaned == text[:4000] + "… [6000 more characters trimmed]"
    assert clean_text("x" * 4000) == "x" * 4000  # exactly the limit: untouched
    assert clean_text("x" * 4001) == "x" * 4000 + "… [1 more characters trimmed]"
    assert clean_text("abcdef", limit=4) == "abcd… [2 more characters trimmed]"


def test_clean_text_trims_after_cleaning() -> None:
    # NUL becomes two characters before the length is measured.
    assert clean_text("\x00\x00\x00", limit=4) == "\\0\\0… [2 more characters trimmed]"


# -- RunIdentity ---------------------------------------------------------------------------------------------


def test_run_key_and_actor_are_the_airflow_run() -> None:
    identity = RunIdentity("sales_dag", "manual__2026-01-02T06:00:00+00:00")
    assert identity.run_key == "airflow:sales_dag:manual__2026-01-02T06:00:00+00:00"
    assert identity.actor == identity.run_key
    assert identity.actor_kind == "ORCHESTRATOR" and RunIdentity.actor_kind == "ORCHESTRATOR"
    assert (identity.run_date, identity.backfill) == (None, False)
    with pytest.raises(AttributeError, match="immutable"):
        identity.run_id = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("dag_id", "run_id"),
    [
        ("sales_dag", "scheduled__2026-01-02T06:00:00+00:00"),
        ("sales_dag", "a:b:c::d"),
        ("d'; DROP TABLE CFG_TASKS; --", "manual__x'); --"),
        ("dag.with.dots-and-dashes", "r"),
    ],
)
def test_parse_run_key_round_trips_run_ids_with_colons(dag_id: str, run_id: str) -> None:
    assert RunIdentity.parse_run_key(RunIdentity(dag_id, run_id).run_key) == (dag_id, run_id)


@pytest.mark.parametrize(
    "key",
    [
        None,
        "",
        "airflow",
        "airflow:",
        "airflow:dag",
        "airflow:dag:",
        "airflow::run",
        "cli:dag:run",
        "AIRFLOW:dag:run",
        "schedule:2026-01-02",
        "airflowx:dag:run",
        ":dag:run",
    ],
)
def test_parse_run_key_returns_none_for_keys_not_written_by_the_provider(key: str | None) -> None:
    assert RunIdentity.parse_run_key(key) is None


def dag_run(**attrs: Any) -> dict[str, Any]:
    base = {"dag_id": "sales_dag", "run_id": "manual__2026-01-02T06:00:00+00:00", "logical_date": None,
            "run_after": None, "run_type": "manual"}  # fmt: skip
    return {"dag_run": SimpleNamespace(**{**base, **attrs}), "ti": object()}


def test_from_context_uses_the_logical_date() -> None:
    logical = datetime(2026, 1, 2, 6, tzinfo=UTC)
    identity = RunIdentity.from_context(dag_run(logical_date=logical, run_after=logical + timedelta(hours=1)))
    assert identity == RunIdentity("sales_dag", "manual__2026-01-02T06:00:00+00:00", logical, False)
    assert identity.run_key == "airflow:sales_dag:manual__2026-01-02T06:00:00+00:00"


def test_from_context_falls_back_to_run_after_without_a_logical_date() -> None:
    after = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone(timedelta(hours=2)))
    assert RunIdentity.from_context(dag_run(logical_date=None, run_after=after)).run_date == after
    # A DagRun object without the attribute at all (older Airflow) behaves the same.
    bare = SimpleNamespace(dag_id="d", run_id="r", run_after=after)
    assert RunIdentity.from_context({"dag_run": bare}) == RunIdentity("d", "r", after, False)
    assert RunIdentity.from_context({"dag_run": SimpleNamespace(dag_id="d", run_id="r")}).run_date is None


@pytest.mark.parametrize(
    ("run_type", "backfill"),
    [
        ("backfill", True),
        ("BACKFILL", True),
        ("DagRunType.BACKFILL_JOB", False),
        ("manual", False),
        ("scheduled", False),
        ("asset_triggered", False),
        (None, False),
        ("", False),
    ],
)
def test_from_context_detects_backfill_runs(run_type: str | None, backfill: bool) -> None:
    assert RunIdentity.from_context(dag_run(run_type=run_type)).backfill is backfill


def test_from_context_detects_airflow_backfill_run_types() -> None:
    from airflow.utils.types import DagRunType

    assert RunIdentity.from_context(dag_run(run_type=DagRunType.BACKFILL_JOB)).backfill is True
    for kind in DagRunType:
        if kind is not DagRunType.BACKFILL_JOB:
            assert RunIdentity.from_context(dag_run(run_type=kind)).backfill is False, kind


# -- check_code ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["A", "SALES", "daily_sales_2", "a" + "b" * 127, "X_"])
def test_check_code_accepts_valid_codes(code: str) -> None:
    assert check_code("pipeline_code", code) == code


@pytest.mark.parametrize(
    "code",
    [
        "",
        "1SALES",
        "_SALES",
        "SALES-DAILY",
        "SALES DAILY",
        "a" * 129,
        "SALES;",
        "S'; DROP TABLE X; --",
        "ÜBER",
        "sales.daily",
        None,
        12,
        b"SALES",
    ],
)
def test_check_code_refuses_invalid_codes_naming_the_argument(code: Any) -> None:
    with pytest.raises(
        ValueError, match=r"task_code .* is not a valid etl-craft code: it must start with a letter"
    ):
        check_code("task_code", code)


@pytest.mark.parametrize("code", ["SALES\n", "A\n"])
def test_check_code_refuses_a_trailing_newline(code: str) -> None:
    with pytest.raises(ValueError):
        check_code("pipeline_code", code)
