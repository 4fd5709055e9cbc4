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

import pytest

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

#: The same shape with Airflow's own operators: what a parse loads without the provider. Airflow 3.0 itself
#: imports psycopg2 (through sqlalchemy_utils, from its task runner) and cryptography's serialization at
#: parse; a module counts against the provider only if the plain file's parse does not load it too.
PLAIN_DAG_FILE = """
from datetime import datetime

from airflow.sdk import DAG, chain, task
from airflow.providers.standard.operators.python import PythonOperator

with DAG("parse_imports", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:

    @task
    def extract() -> int:
        return 1

    chain(PythonOperator(task_id="claim", python_callable=lambda: 1), extract(),
          PythonOperator(task_id="load", python_callable=lambda: 1), PythonOperator(task_id="finish", python_callable=lambda: 1))
"""

PROBE = """
import json, runpy, sys
module = runpy.run_path(sys.argv[1])
assert len(module["dag"].tasks) == 4, module["dag"].tasks
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


#: Counts Airflow's asset-URI normalizer lookups while parsing, then reads the finish's outlets and serializes.
ASSET_PROBE = """
import json, runpy, sys
import airflow.sdk.definitions.asset as assets
from airflow.serialization import serialized_objects

lookups = []
normalizer = assets._get_uri_normalizer
assets._get_uri_normalizer = lambda scheme: lookups.append(scheme) or normalizer(scheme)
dag = runpy.run_path(sys.argv[1])["dag"]
parsed = list(lookups)
(finish,) = [t for t in dag.tasks if type(t).__name__ == "FinishPipelineRunOperator"]
uris = [outlet.uri for outlet in finish.outlets]
serializer = getattr(serialized_objects, "DagSerialization", None) or serialized_objects.SerializedDAG
text = json.dumps(serializer.to_dict(dag))
print(json.dumps({"parse": parsed, "all": lookups, "uris": uris, "serialized": "etl-craft://" in text}))
"""


def _probe(tmp_path: Path, probe: str, *args: str, source: str = DAG_FILE) -> str:
    """Run ``probe`` on a DAG file of ``source`` in a fresh interpreter with an Airflow home of its own; its
    last line."""
    dag_file = tmp_path / "parse_imports.py"
    dag_file.write_text(source)
    home = tmp_path / "airflow"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", probe, str(dag_file), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_dag_file_with_recorded_tasks_imports_nothing_heavy(tmp_path: Path) -> None:
    recorded = set(json.loads(_probe(tmp_path, PROBE, json.dumps(HEAVY))))
    plain = set(json.loads(_probe(tmp_path, PROBE, json.dumps(HEAVY), source=PLAIN_DAG_FILE)))
    assert not any(m.startswith("airflow_provider_etl_craft") for m in plain)  # the baseline is Airflow's own
    assert sorted(recorded - plain) == []


@pytest.mark.smoke
def test_the_finish_makes_its_pipeline_asset_when_its_outlets_are_read(tmp_path: Path) -> None:
    """Not at parse: a task process that only parses the DAG file never pays Airflow's lookup of an asset-URI
    normalizer, which imports every installed provider's handlers (docs/performance.md). The DAG processor's
    serialization and the finish's own try read the outlets, and get the Asset."""
    seen = json.loads(_probe(tmp_path, ASSET_PROBE))
    assert seen == {
        "parse": [],
        "all": ["etl-craft"],
        "uris": ["etl-craft://etl_craft_default/PARSE_P"],
        "serialized": True,
    }


@pytest.mark.smoke
def test_a_finish_keeps_its_own_outlets_before_the_pipeline_asset() -> None:
    """``outlets=`` given to the finish come first; ``emit_asset=False`` adds none; assigning replaces them all."""
    import copy

    from airflow.sdk import Asset

    from airflow_provider_etl_craft.operators.pipeline_run import FinishPipelineRunOperator

    mine = Asset("file:///warehouse/orders")
    finish = FinishPipelineRunOperator(task_id="finish", pipeline_code="SALES", outlets=[mine])
    limit = sys.getrecursionlimit()
    try:
        twin = copy.deepcopy(finish)
    finally:
        sys.setrecursionlimit(limit)  # Airflow's operator __deepcopy__ raises it for the whole process
    assert [o.uri for o in finish.outlets] == [
        "file:///warehouse/orders",
        "etl-craft://etl_craft_default/SALES",
    ]
    assert finish.outlets is finish.outlets  # one list: Airflow's add_outlets extends it
    assert [o.uri for o in twin.outlets] == [o.uri for o in finish.outlets]
    quiet = FinishPipelineRunOperator(task_id="quiet", pipeline_code="SALES", emit_asset=False, outlets=mine)
    assert quiet.outlets == [mine]
    twin.outlets = [mine]
    assert twin.outlets == [mine]
