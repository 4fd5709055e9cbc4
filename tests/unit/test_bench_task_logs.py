"""Bench part 5 reads each task process's phases from its task log (Airflow's JSON lines)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.scheduler import task_process_ms


def _log(tmp_path: Path, events: list[tuple[str, str, dict[str, object]]]) -> Path:
    path = tmp_path / "attempt=1.log"
    lines = [
        json.dumps({"timestamp": f"2026-12-07T13:26:{at}Z", "event": event, **extra})
        for at, event, extra in events
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_task_log_gives_the_parse_the_execute_and_the_whole_process(tmp_path: Path) -> None:
    path = _log(tmp_path, [
        ("04.729095", "::group::Pre Execute", {}),
        ("04.758557", "Filling up the DagBag from /dags/x.py", {}),
        ("04.877302", "Worker startup parse complete", {"dag_file_parse_ms": 118, "bundle_prepare_ms": 4}),
        ("04.909639", "::endgroup::", {}),
        ("04.944691", "etl-craft: T05 attempt 1 (ATTEMPT_ID 65) in pipeline run 4", {}),
        ("04.957996", "::group::Post Execute", {}),
        ("05.018380", "::endgroup::", {}),
    ])  # fmt: skip
    times = task_process_ms(path)
    assert times is not None
    assert times["parse"] == 118.0
    assert round(times["execute"], 3) == 48.357  # 04.909639 -> 04.957996
    assert round(times["process"], 3) == 289.285  # 04.729095 -> 05.018380


def test_a_log_without_airflows_marks_gives_nothing(tmp_path: Path) -> None:
    assert (
        task_process_ms(_log(tmp_path, [("04.0", "::group::Pre Execute", {}), ("05.0", "::endgroup::", {})]))
        is None
    )
    assert task_process_ms(tmp_path / "missing.log") is None
