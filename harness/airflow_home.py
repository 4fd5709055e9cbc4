"""A throwaway ``AIRFLOW_HOME`` for a process that runs Airflow in itself, and the ``airflow`` command.

Airflow reads ``AIRFLOW_HOME`` and its ``AIRFLOW__…`` settings when it is first imported, so
:func:`make_throwaway_home` must run before that: the test suite's plugin ``tests/fixtures/fix_airflow.py``
calls it on import; the benchmark's real-scheduler part (``bench/scheduler.py``) calls it for its own process.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def make_throwaway_home() -> Path:
    """Make a fresh AIRFLOW_HOME (SQLite metadata DB, empty DAGs folder, no examples) and point this process
    (and the processes it starts) at it; the caller removes the folder when done."""
    home = Path(tempfile.mkdtemp(prefix="etl-craft-airflow-home-"))
    (home / "dags").mkdir()
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(home / "dags")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{home / 'airflow.db'}"
    os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
    os.environ.pop("ETL_CRAFT_CONFIG", None)
    os.environ.pop("ETL_CRAFT_MIGRATIONS_DIR", None)
    return home


def airflow_cli() -> list[str]:
    """The ``airflow`` console script of the running interpreter's environment."""
    return [str(Path(sys.executable).with_name("airflow"))]
