"""``make demo``: run the example DAG end to end with ``dag.test()`` on a fresh SQLite Engine DB, then print it.

Everything lives under ``./.demo`` (or ``$ETL_CRAFT_DEMO_DIR``): a throwaway AIRFLOW_HOME and a copy of the
example project (craft-connector.yml, migrations/). Airflow is configured through the environment before
it is first imported.
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
    return config


def migrate_airflow_db() -> None:
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: `airflow db migrate` failed:\n{done.stderr[-3000:]}")


def report(config: Path) -> str:
    """The Engine DB's tables with their row counts, then the CFG_ rows the migration added."""
    from airflow_provider_etl_craft.cli.tables import format_table
    from airflow_provider_etl_craft.engine.schema import ENGINE_TABLES
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

    hook = EngineDBHook.from_config(config)
    with closing(hook.get_conn()) as conn:
        q = hook.engine.query
        counts = [(t, q(conn, f"SELECT COUNT(*) FROM {t}")[0][0]) for t in sorted(ENGINE_TABLES)]  # noqa: S608 - fixed names
        parts = [f"Engine DB: {hook.engine.describe()}", format_table(["TABLE", "ROWS"], counts)]
        for title, sql in (
            ("CFG_PIPELINES", "SELECT PIPELINE_ID, PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, SLA_IN_HOURS, ACTIVE_FLAG FROM CFG_PIPELINES"),
            ("CFG_TASKS", "SELECT TASK_ID, PIPELINE_ID, TASK_CODE, TASK_TYPE, HANDLER, RUN_CONDITION, ACTIVE_FLAG FROM CFG_TASKS"),
            ("CFG_TASK_DEPENDENCY", "SELECT TASK_DEPENDENCY_ID, TASK_ID, DEPENDS_ON_PIPELINE_ID, DEPENDS_ON_TASK_ID, DEPENDENCY_TYPE FROM CFG_TASK_DEPENDENCY"),
            ("CFG_TASK_PARAMETERS", "SELECT TASK_PARAMETER_ID, TASK_ID, PARAMETER_NAME, PARAMETER_VALUE FROM CFG_TASK_PARAMETERS"),
            ("SCHEMA_MIGRATIONS", "SELECT SOURCE, VERSION, CHECKSUM, APPLIED_AT FROM SCHEMA_MIGRATIONS"),
        ):  # fmt: skip
            cur = conn.execute(sql)
            headers = [d[0] for d in cur.description]
            parts.append(f"\n{title}\n" + format_table(headers, cur.fetchall(), max_width=24))
    return "\n".join(parts)


def main() -> int:
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # Airflow's own, not the demo's
    workdir = Path(os.environ.get("ETL_CRAFT_DEMO_DIR", ".demo")).resolve()
    config = prepare(workdir)
    print(f"demo folder: {workdir}")
    migrate_airflow_db()
    from airflow_provider_etl_craft.example_dags.example_etl_craft_init import dag

    run = dag.test()
    print(f"DAG {dag.dag_id}: {run.state}")
    print(report(config))
    return 0 if str(run.state) in ("success", "DagRunState.SUCCESS") else 1


if __name__ == "__main__":
    sys.exit(main())
