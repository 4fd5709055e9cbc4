"""The per-process credential cache (auth/cache.py): refresh points, one fetch per key, renewal, fork."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable

import pytest

from airflow_provider_etl_craft.auth.cache import ExpiringCache, secret_id, usable_for


def counting(
    value: str, lifetime: float, delay: float = 0.0
) -> tuple[Callable[[], tuple[str, float]], list[str]]:
    calls: list[str] = []

    def fetch() -> tuple[str, float]:
        time.sleep(delay)
        calls.append(value)
        return value, lifetime

    return fetch, calls


@pytest.mark.parametrize(
    ("lifetime", "usable"),
    [(3600, 3240), (900, 810), (300, 240), (90, 45), (2, 1), (0, 0), (-5, 0)],
)
def test_refresh_when_less_than_a_minute_or_a_tenth_remains_at_the_latest_halfway(
    lifetime: float, usable: float
) -> None:
    assert usable_for(lifetime) == pytest.approx(usable)


def test_a_value_is_reused_until_its_refresh_point_then_fetched_anew() -> None:
    cache: ExpiringCache[str] = ExpiringCache()
    fetch, calls = counting("token", 0.4)  # usable for 0.2 s
    assert [cache.get("k", fetch) for _ in range(3)] == ["token"] * 3
    assert len(calls) == 1
    time.sleep(0.25)
    assert cache.get("k", fetch) == "token"
    assert len(calls) == 2


def test_a_value_without_lifetime_and_a_failed_fetch_are_not_kept() -> None:
    cache: ExpiringCache[str] = ExpiringCache()
    fetch, calls = counting("once", 0)
    cache.get("k", fetch)
    cache.get("k", fetch)
    assert len(calls) == 2

    def refused() -> tuple[str, float]:
        raise RuntimeError("endpoint refused")

    with pytest.raises(RuntimeError):
        cache.get("other", refused)
    good, calls = counting("later", 60)
    assert cache.get("other", good) == "later" and len(calls) == 1


def test_threads_missing_at_once_cause_one_fetch_per_key() -> None:
    cache: ExpiringCache[str] = ExpiringCache()
    fetch, calls = counting("token", 60, delay=0.2)
    start = threading.Barrier(10)
    got: list[str] = []

    def worker() -> None:
        start.wait()
        got.append(cache.get("k", fetch))

    threads = [threading.Thread(target=worker) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert got == ["token"] * 10
    assert calls == ["token"]


def test_renew_replaces_a_served_value_once_and_gives_up_on_a_fresh_one() -> None:
    cache: ExpiringCache[str] = ExpiringCache()
    first, _ = counting("first", 60)
    second, calls = counting("second", 60)
    assert cache.get("k", first) == "first"  # fetched for this caller
    assert cache.renew("k", "first", second) is None  # a fresh value was refused: no retry
    assert calls == []

    assert cache.get("k", first) == "first"  # fetched again (the refused one was dropped) …
    assert cache.get("k", first) == "first"  # … and now served from the cache
    assert cache.renew("k", "first", second) == "second"
    assert cache.renew("k", "first", second) == "second"  # a racing caller takes the renewed value
    assert calls == ["second"]
    assert cache.get("k", first) == "second"


def test_a_forked_child_starts_empty() -> None:
    cache: ExpiringCache[str] = ExpiringCache()
    parent, _ = counting("parent", 60)
    cache.get("k", parent)

    def child() -> None:
        fetch, _ = counting("child", 60)
        raise SystemExit(0 if cache.get("k", fetch) == "child" else 1)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(30)
    assert process.exitcode == 0
    assert cache.get("k", parent) == "parent"


def test_a_secret_id_tells_secrets_apart_without_showing_them() -> None:
    assert secret_id("hunter2-secret") == secret_id("hunter2-secret")
    assert secret_id("hunter2-secret") != secret_id("hunter3-secret")
    assert "hunter2" not in secret_id("hunter2-secret")
