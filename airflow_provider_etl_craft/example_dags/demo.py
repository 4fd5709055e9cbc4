"""``make demo``: prepare a fresh SQLite Engine DB, run the DAILY_SALES pipeline DAG with ``dag.test()``, print it.

Everything lives under ``./.demo`` (or ``$ETL_CRAFT_DEMO_DIR``): a throwaway AIRFLOW_HOME and a copy of the
example project (craft-connector.yml, migrations/, the SQLite warehouse). Airflow is configured through
the environment before it is first imported. Two DAGs run: ``example_etl_craft_init`` (init-db and the
project migration that adds the pipeline's CFG_ rows), then ``example_etl_craft_daily_sales``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from contextlib import closing
from pathlib import Path

from airflow_provider_etl_craft.testing import run_dag_test

EXAMPLE_PROJECT = Path(__file__).with_name("project")


def prepare(workdir: Path) -> Path:
    """Lay out a fresh example project and Airflow home under ``workdir``; return the config path."""
    project = workdir / "project"
    shutil.rmtree(project, ignore_errors=True)
    shutil.copytree(EXAMPLE_PROJECT, project)
    home = workdir / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        AIRFLOW_HOME=str(home),
        # dag.test() syncs the DAGs folder to the metadata DB first: point it at the example DAGs.
        AIRFLOW__CORE__DAGS_FOLDER=str(Path(__file__).parent),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        AIRFLOW__LOGGING__LOGGING_LEVEL="WARNING",
    )
    config = project / "craft-connector.yml"
    conn = {"conn_type": "etl_craft", "extra": {"config_path": str(config)}}
    os.environ["AIRFLOW_CONN_ETL_CRAFT_DEFAULT"] = json.dumps(conn)
    warehouse = project / "warehouse" / "warehouse.db"
    warehouse.parent.mkdir(parents=True, exist_ok=True)
    os.environ["AIRFLOW_CONN_ETL_CRAFT_WAREHOUSE"] = json.dumps(
        {"conn_type": "sqlite", "host": str(warehouse)}
    )
    return config


def migrate_airflow_db() -> None:
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: `airflow db migrate` failed:\n{done.stderr[-3000:]}")


def report(config: Path) -> str:
    """What the run wrote: the Engine run, its task runs and attempts, then every table's row count."""
    from airflow_provider_etl_craft.cli.tables import format_table
    from airflow_provider_etl_craft.engine.schema import ENGINE_TABLES
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

    hook = EngineDBHook.from_config(config)
    parts = [f"Engine DB: {hook.engine.describe()}"]
    with closing(hook.engine.connect()) as conn:
        for title, sql in (
            (
                "AUD_PIPELINES_RUN_LOG",
                "SELECT PIPELINE_RUN_ID, STATUS, RUN_KEY, START_DATE, END_DATE, SLA_STATUS, TRIGGER_KIND, OUTPUT_REVISION FROM AUD_PIPELINES_RUN_LOG ORDER BY PIPELINE_RUN_ID",
            ),
            (
                "AUD_TASK_RUN_LOG",
                "SELECT tr.TASK_RUN_ID, tr.PIPELINE_RUN_ID, t.TASK_CODE, tr.STATUS, tr.ATTEMPT_COUNT, tr.SOURCE_COUNT, tr.INSERT_COUNT, tr.ROWS_WRITTEN, tr.TASK_LOG FROM AUD_TASK_RUN_LOG tr JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID ORDER BY tr.TASK_RUN_ID",
            ),
            (
                "AUD_TASK_ATTEMPTS",
                "SELECT a.ATTEMPT_ID, a.TASK_RUN_ID, t.TASK_CODE, a.ATTEMPT_NUMBER, a.STATUS, a.STARTED_AT, a.ENDED_AT, a.HOST, a.PID, a.ROWS_WRITTEN FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID ORDER BY a.ATTEMPT_ID",
            ),
            (
                "AUD_GATE_DECISIONS",
                "SELECT g.DECISION_ID, g.PIPELINE_RUN_ID, g.ATTEMPT_ID, t.TASK_CODE, g.RESULT, g.REASON FROM AUD_GATE_DECISIONS g JOIN AUD_TASK_ATTEMPTS a ON a.ATTEMPT_ID = g.ATTEMPT_ID JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID ORDER BY g.DECISION_ID",
            ),
        ):
            with closing(conn.cursor()) as cur:
                cur.execute(sql)
                headers = [d[0] for d in cur.description or ()]
                parts.append(f"\n{title}\n" + format_table(headers, cur.fetchall(), max_width=80))
        q = hook.engine.query
        counts = [(t, q(conn, f"SELECT COUNT(*) FROM {t}")[0][0]) for t in sorted(ENGINE_TABLES)]  # noqa: S608 - fixed names
        parts.append("\nrows per table\n" + format_table(["TABLE", "ROWS"], counts))
    return "\n".join(parts)


def main() -> int:
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # Airflow's own, not the demo's
    workdir = Path(os.environ.get("ETL_CRAFT_DEMO_DIR", ".demo")).resolve()
    config = prepare(workdir)
    print(f"demo folder: {workdir}")
    migrate_airflow_db()
    from airflow_provider_etl_craft.example_dags.example_etl_craft_daily_sales import dag as pipeline_dag
    from airflow_provider_etl_craft.example_dags.example_etl_craft_init import dag as init_dag

    for dag in (init_dag, pipeline_dag):
        run = run_dag_test(dag)
        print(f"DAG {dag.dag_id}: {run.state}")
        if str(run.state) not in ("success", "DagRunState.SUCCESS"):
            print(report(config))
            return 1
    print(report(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
