"""A task process reaches the Engine DB on one session: a recorded try's start and end share it (issue 26 item 7).

Every step of a task borrows the process's one connection and gives it back idle, in autocommit
(:mod:`airflow_provider_etl_craft.engine.reuse`): the claim, the start of an attempt, its end, the finish.
``dag.test()`` runs every task in this one process, so the whole DAG run is one Engine session. Seen from the
server: while the work runs, the Engine role's only other session in the database is the one the claim and
the start used; after the run it is still the only one, and its last statement is the finish's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from airflow_provider_etl_craft.testing import run_dag_test
from harness.engines import EngineSetup
from tests.e2e.pipeline_dags import load_dag, write_dag
from tests.e2e.test_pipeline_lifecycle import Pipeline

pytestmark = pytest.mark.e2e

MIGRATION = (
    "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) "
    "VALUES ('ONE_SESSION_P', 'one session', 'FULL', 't');\n"
    "INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY) SELECT 'WORK', 'ETL', "
    "PIPELINE_ID, 'PYTHON', 't' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'ONE_SESSION_P';\n"
)

#: The Engine role's other sessions in this database: backend pid and its last statement.
SESSIONS = (
    "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() AND usename = current_user "
    "AND pid <> pg_backend_pid()"
)

DAG = f'''
import json, os
from datetime import datetime
from pathlib import Path

import psycopg2

from airflow_provider_etl_craft._compat import DAG
from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline

with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={{"retries": 0}}) as dag:
    with etl_craft_pipeline("ONE_SESSION_P", claim_kwargs={{"poke_interval": 1, "timeout": 60}}):

        @etl_craft_task(task_id="work")
        def work() -> int:
            probe = json.loads(os.environ["E2E_SESSION_PROBE"])
            with psycopg2.connect(password=os.environ["ENGINE_SECRET"], **probe) as conn, conn.cursor() as cur:
                cur.execute("""{SESSIONS}""")
                Path(os.environ["E2E_PROBE_DIR"], "during.json").write_text(json.dumps(cur.fetchall()))
            conn.close()
            return 1

        work()
'''


@pytest.fixture
def pipeline(
    make_engine, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Pipeline]:
    engine: EngineSetup = make_engine("postgresql")
    db = engine.database
    probe = {"host": db.cluster.host, "port": db.cluster.port, "dbname": db.name, "user": db.user}  # type: ignore[attr-defined]
    monkeypatch.setenv("E2E_SESSION_PROBE", json.dumps(probe))
    yield Pipeline(engine, airflow_db, tmp_path, monkeypatch, migration=MIGRATION)


def test_start_and_end_of_an_attempt_share_one_engine_session(pipeline: Pipeline) -> None:
    run = run_dag_test(load_dag(write_dag(pipeline.dags, DAG, "e2e_one_session")))
    assert str(run.state).endswith("success")
    assert pipeline.task_runs(pipeline.runs()[0][0]) == {"WORK": ("SUCCESS", 1, 1, None)}

    during = dict(json.loads((pipeline.probes / "during.json").read_text()))
    with closing(pipeline.engine.database.connect()) as conn, conn.cursor() as cur:  # type: ignore[attr-defined]
        cur.execute(SESSIONS)
        after = dict(cur.fetchall())
    # While the work ran: one Engine session, the one the claim and the start used, idle.
    assert len(during) == 1, during
    (pid,) = during
    assert "AUD_TASK_ATTEMPTS" in during[pid].upper()
    # After the run: still that one session (the end and the finish borrowed it), last used by the finish.
    assert list(after) == [pid], (during, after)
    assert "ETL_CRAFT_FINISH(" in after[pid].upper(), after[pid]
    assert os.getpid() != pid


SQLITE_DAG = """
from datetime import datetime

from airflow_provider_etl_craft._compat import DAG
from airflow_provider_etl_craft.decorators import etl_craft_task
from airflow_provider_etl_craft.task_groups import etl_craft_pipeline

with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 0}) as dag:
    with etl_craft_pipeline("ONE_SESSION_P", claim_kwargs={"poke_interval": 1, "timeout": 60}):

        @etl_craft_task(task_id="work")
        def work() -> int:
            return 1

        work()
"""

#: Runs the DAG file with dag.test() in a fresh interpreter; prints which of the modules named are loaded then.
TRIES_PROBE = """
import json, sys
from pathlib import Path
from airflow_provider_etl_craft.testing import run_dag_test
from tests.e2e.pipeline_dags import load_dag

run = run_dag_test(load_dag(Path(sys.argv[1])))
assert str(run.state).endswith("success"), run.state
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


@pytest.fixture
def sqlite_pipeline(
    make_engine, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Pipeline]:
    yield Pipeline(make_engine("sqlite"), airflow_db, tmp_path, monkeypatch, migration=MIGRATION)


def test_the_claim_the_tasks_and_the_finish_never_import_the_hook(
    sqlite_pipeline: Pipeline, tmp_path: Path
) -> None:
    """No try constructs EngineDBHook, so none imports common-sql and sqlparse (docs/performance.md).

    The DAG file sits in a DAGs folder of its own: ``dag.test()`` also parses the other files of its folder,
    and other tests' DAG files import the hook themselves."""
    dags = tmp_path / "dags"
    dags.mkdir()
    dag_file = write_dag(dags, SQLITE_DAG, "e2e_no_hook")
    heavy = [
        "airflow_provider_etl_craft.hooks.engine_db",
        "airflow.providers.common.sql.hooks.sql",
        "sqlparse",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH")])),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
    }
    done = subprocess.run([sys.executable, "-c", TRIES_PROBE, str(dag_file), json.dumps(heavy)],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    [(run_id, status, *_)] = sqlite_pipeline.runs()
    assert status == "SUCCESS"
    assert sqlite_pipeline.task_runs(run_id) == {"WORK": ("SUCCESS", 1, 1, None)}
