"""Bench part 9 times a recorded try's phases by wrapping the provider's functions (``bench/task_cost.py``): a
module the try has not loaded is wrapped when the try loads it, so the import stays in the try's own time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from bench.task_cost import _phases, _time_phases
step = "airflow_provider_etl_craft.runs.start"
loaded_before = step in sys.modules
spent = _time_phases()
loaded_by_timers = step in sys.modules
from airflow_provider_etl_craft.runs import start
from airflow_provider_etl_craft.config import connection
print(json.dumps({
    "loaded_before": loaded_before,
    "loaded_by_timers": loaded_by_timers,
    "start_wrapped": hasattr(start.StartAttempt.__call__, "__wrapped__"),
    "profile_wrapped": hasattr(connection.profile_for_conn_id, "__wrapped__"),
    "phases": _phases({"try_engine": 10.0, "profile": 3.0, "dialect": 1.0, "login_start": 0.5, "start": 2.0}),
}))
"""


def test_the_timers_wrap_a_step_module_when_the_try_loads_it_and_not_before() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, check=True, timeout=120
    )
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["loaded_before"] is False and found["loaded_by_timers"] is False
    assert found["start_wrapped"] and found["profile_wrapped"]
    assert found["phases"] == {
        "profile": 3.0,
        "dialect": 1.0,
        "login_start": 0.5,
        "modules": 5.5,
        "login_wait": 0.0,
        "start": 2.0,
        "end": 0.0,
    }
