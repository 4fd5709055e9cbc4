"""``python -m bench --quick --only history,purge`` end to end on each dialect: parts 7 and 8 run on small sizes
and leave figures of the documented shape in the results file (no figure is judged here: performance is
``make bench``'s business)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import main as bench_main
from harness.postgres import PostgresUnavailable, find_bindir
from tests.fixtures.fix_pg import _unavailable


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_the_quick_history_and_purge_parts_run_end_to_end(dialect: str, tmp_path: Path) -> None:
    if dialect == "postgresql":
        try:
            find_bindir()
        except PostgresUnavailable as exc:
            raise _unavailable(str(exc)) from None
    out = tmp_path / "results.json"
    argv = ["--quick", "--only", "history,purge", "--history-dialects", dialect, "--out", str(out)]
    assert bench_main([*argv, "--history-repeats", "2", "--cli-repeats", "1", "--purge-baseline", "0.5"]) == 0
    results = json.loads(out.read_text())

    history = results["history"][dialect]
    # 10 pipelines x 20 runs; 5,000 attempts in all, exactly as asked.
    assert history["generated"]["counts"] == {"runs": 200, "task_runs": 20 * (5 + 9 * 20), "attempts": 5000}
    assert history["run"]["empty"]["n"] == history["run"]["history"]["n"] == 2
    assert history["run"]["ratio"] > 0
    assert set(history["ops"]) == {"claim", "start_task", "finish_task", "finish_run"}
    assert set(history["cli"]) == {"status", "history", "pipelines"}
    assert all(v["ratio"] > 0 and v["history"]["n"] == 1 for v in history["cli"].values())

    purge = results["purge"][dialect]
    # 20 runs a pipeline over three years: 18 of each are older than 90 days, none of them protected.
    assert purge["counts"]["RUNS_DELETED"] == 180
    assert purge["counts"]["ATTEMPTS_DELETED"] == purge["before"]["attempts"] - purge["after"]["attempts"]
    assert purge["runs_per_s"] > 0 and purge["attempts_per_s"] > 0
    assert purge["claims_alone"]["n"] > 0 and purge["claims_beside_process"] > 0
    assert purge["claims_during"]["n"] == 0 or purge["claims_during"]["max_ms"] > 0

    targets = {t["target"]: t for t in results["targets"]}
    name = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}[dialect]
    assert f"a full run with 5,000 attempts of history <= 1.25x on an empty Engine DB ({name})" in targets
    assert f"a claim beside a running purge waits < 1 s ({name})" in targets
    assert "7. History" in results["report"] and "8. Purge" in results["report"]
