"""A recorded task's try starts and ends its attempt on one Engine DB session (issue 26 item 7).

The task process borrows one connection for the start and gives it back idle, in autocommit, then borrows it
again for the end (:mod:`airflow_provider_etl_craft.engine.reuse`). Seen from the server: while the work
runs, the only other session of the Engine role in the database is the one the start used, and after the run
that same backend's last statement is the end of the attempt.
"""

from __future__ import annotations

import json
import os
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
    # While the work ran: one Engine session, the start's, idle.
    assert len(during) == 1, during
    (pid,) = during
    assert "AUD_TASK_ATTEMPTS" in during[pid].upper()
    # After the run: the same backend, and its last statement ended the attempt.
    assert pid in after, (during, after)
    assert "UPDATE AUD_TASK_ATTEMPTS SET STATUS" in after[pid].upper(), after[pid]
    assert os.getpid() != pid
