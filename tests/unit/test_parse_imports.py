"""A DAG file with recorded tasks imports nothing heavy at parse time (issue 26 item 7).

Every DAG parse, and every task process before its try, imports the DAG file: the provider must not pull
in the Engine DB's drivers, SQL tokenizer, key-file crypto, lock files or the run lifecycle there; they
load when a try runs. Checked in a fresh interpreter (``sys.modules``), against an Airflow home of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DAG_FILE = """
from datetime import datetime

from airflow.sdk import DAG, chain

from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline

with DAG("parse_imports", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    with etl_craft_pipeline("PARSE_P"):

        @etl_craft_task
        def extract() -> int:
            return 1

        chain(extract(), EtlCraftPythonOperator(task_id="load", python_callable=lambda: 1))
"""

#: Modules a parse must not import: drivers, sqlparse (common-sql's hook), key-file crypto, lock files, and the
#: provider's own hook and transitions.
HEAVY = (
    "psycopg2",
    "psycopg",
    "sqlparse",
    "filelock",
    "cryptography.hazmat.primitives.serialization",
    "airflow.providers.common.sql.hooks.sql",
    "airflow_provider_etl_craft.hooks.engine_db",
    "airflow_provider_etl_craft.runs.lifecycle",
    "airflow_provider_etl_craft.runs.transition",
    "airflow_provider_etl_craft.engine.migrations",
    "airflow_provider_etl_craft.config.profile",
)

PROBE = """
import json, runpy, sys
module = runpy.run_path(sys.argv[1])
assert len(module["dag"].tasks) == 4, module["dag"].tasks
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


def test_a_dag_file_with_recorded_tasks_imports_nothing_heavy(tmp_path: Path) -> None:
    dag_file = tmp_path / "parse_imports.py"
    dag_file.write_text(DAG_FILE)
    home = tmp_path / "airflow"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(dag_file), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
