"""A real Airflow 3 deployment for the tests: api-server, scheduler, dag-processor and triggerer processes.

One deployment runs per pytest session (fixture ``deployment`` in ``tests/deployment/conftest.py``), and one
in the benchmark's real-scheduler part (``bench/scheduler.py``). It has
its own AIRFLOW_HOME and DAGs folder under ``/tmp/etl-craft-deployment-*``, ``LocalExecutor`` (plus
``CeleryExecutor`` with a Redis broker on a free port, when the celery provider and ``redis-server`` are
there: tasks that ask for it run on the workers of ``tests/deployment/machines.py``), and its metadata DB on the session's
throwaway PostgreSQL cluster. Three Engine DBs are exposed to every Airflow
process as env connections: ``etl_craft_pg`` (a PostgreSQL database on the same cluster) and
``etl_craft_sqlite`` (a SQLite file), both initialised and migrated, and ``etl_craft_default``
(``deployment.default``, the one the example DAGs use: another PostgreSQL database, left without tables
so that the example init DAG finds a fresh Engine DB, with the example project's ``migrations/`` beside
its ``craft-connector.yml``), plus ``etl_craft_warehouse`` (the example pipeline's SQLite warehouse).

A test seeds its own pipeline, writes its own DAG file, triggers it through the REST API and reads the
outcome from the metadata DB and the Engine DB; every wait is a bounded poll::

    def test_something(deployment):
        engine = deployment.pg                                   # or deployment.sqlite
        engine.add_pipeline("DEP_SOMETHING", ["STEP"])           # a pipeline code of its own
        deployment.write_dag("dep_something", render(RETRY_DAG, dag_id="dep_something",
                                                     pipeline="DEP_SOMETHING", conn_id=engine.conn_id))
        deployment.wait_parsed("dep_something")
        run_id = deployment.trigger("dep_something")              # no logical date, as Airflow 3 does
        assert deployment.wait_run("dep_something", run_id) == "success"
        assert engine.task_runs(engine.runs("DEP_SOMETHING")[0]["PIPELINE_RUN_ID"]) == {...}

When a test fails, its report gets the tail of every component's log and of the task logs of the DAGs it
wrote; ``ETL_CRAFT_DEPLOYMENT_KEEP=1`` leaves the whole folder behind.

The web tier (``tests/web``) starts a lean flavour with ``AirflowDeployment.start_web(cluster, root)``: the
same folder layout, metadata DB and Engine DBs (with their connections), but only ``airflow db migrate``
and the api-server (no broker, scheduler, dag-processor or triggerer), and Airflow's simple auth manager
with real users (``WEB_USERS``: admin with role ADMIN, viewer with role VIEWER) instead of everyone being
admin. ``deployment.token("viewer")`` is a JWT of that user from ``POST /auth/token``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

import httpx
import psutil
import psycopg2

from airflow_provider_etl_craft.example_dags import demo
from harness.airflow_home import airflow_cli
from harness.engines import EngineSetup, engine_rows, pg_profile_yaml, write_config
from harness.postgres import PgCluster, PgDatabase
from harness.statsd import StatsdListener

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
#: The web flavour's only component.
WEB_COMPONENTS = ("api-server",)
#: Users of the web flavour's simple auth manager: name -> (role, password). The passwords file is written
#: before the api-server starts, so Airflow generates none.
WEB_USERS: dict[str, tuple[str, str]] = {"admin": ("admin", "admin"), "viewer": ("viewer", "viewer")}
#: Executors of the deployment: LocalExecutor by default; a task with ``executor="CeleryExecutor"`` goes to
#: the Celery workers of ``tests/deployment/machines.py`` (other machines), through the Redis broker.
EXECUTORS = "LocalExecutor,CeleryExecutor"
#: Seconds without a task heartbeat before the scheduler fails (and retries) the task instance.
HEARTBEAT_TIMEOUT = 20
#: Name of the env var holding the PostgreSQL Engine DB's password (in the test process and every component).
PG_SECRET_VAR = "ETL_CRAFT_DEPLOYMENT_ENGINE_SECRET"
ENDED_RUN = ("success", "failed")
#: ``[etl_craft] lineage_target_namespace`` of every component (the lineage tier's declared targets).
LINEAGE_TARGET_NAMESPACE = "postgres://warehouse:5432"
_STARTUP_TIMEOUT = 240.0
_STOP_GRACE = 15.0
_LOG_TAIL_LINES = 60
_POLL = 0.5
#: The example project's migrations (its CFG_ rows), laid beside etl_craft_default's craft-connector.yml.
EXAMPLE_MIGRATIONS = Path(demo.__file__).parent / "project" / "migrations"


def celery_unavailable() -> str | None:
    """Why this environment cannot run the CeleryExecutor part of the deployment (None: it can)."""
    if importlib.util.find_spec("airflow.providers.celery") is None:
        return "apache-airflow-providers-celery is not installed (it comes with the [dev] extra)"
    if not shutil.which("redis-server"):
        return "redis-server is not installed (apt-get install redis-server)"
    return None


class DeploymentError(AssertionError):
    """The deployment did not do what a test waited for (a failed test's report carries the logs)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: dag-processor lines logged every second (the bundle refresh), left out of failure reports.
_NOISE = re.compile(r"Refreshing bundle|Searching for files in|Found \d+ files for bundle")


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join([line for line in text if not _NOISE.search(line)][-lines:])


def _task_log(path: Path, lines: int = 40) -> str:
    """A task log (JSON lines) as ``time level event`` lines, with the error of a failed try."""
    out = []
    for raw in _tail(path, lines).splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            out.append(raw)
            continue
        line = f"{str(entry.get('timestamp', ''))[11:23]} {entry.get('level', '')} {entry.get('event', '')}"
        for error in entry.get("error_detail") or []:
            frames = error.get("frames") or [{}]
            where = f"{frames[-1].get('filename')}:{frames[-1].get('lineno')}"
            line += f"\n    {error.get('exc_type')}: {error.get('exc_value')} (at {where})"
        out.append(line)
    return "\n".join(out)


def pipeline_sql(code: str, tasks: Iterable[str], handler: str = "PYTHON") -> list[str]:
    """Plain INSERTs (valid on both dialects) for one active pipeline and its active tasks."""
    statements = [
        "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE, CREATED_BY) "
        f"VALUES ('{code}', 'Deployment {code}', 24, 'FULL', 'deployment-test')"
    ]
    statements += [
        "INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY) "
        f"SELECT '{task}', 'ETL', PIPELINE_ID, '{handler}', 'deployment-test' FROM CFG_PIPELINES "
        f"WHERE PIPELINE_CODE = '{code}' AND ACTIVE_FLAG = 'Y'"
        for task in tasks
    ]
    return statements


@dataclass
class Engine:
    """One Engine DB of the deployment, read and written from the test process."""

    setup: EngineSetup
    conn_id: str

    @property
    def dialect(self) -> str:
        return self.setup.dialect

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` (``?`` placeholders, rewritten for the dialect) on a fresh connection."""
        return engine_rows(self.setup.hook(), sql, params)

    def add_pipeline(self, code: str, tasks: Sequence[str]) -> None:
        """Insert an active CFG_PIPELINES row and its CFG_TASKS (each test uses its own pipeline code)."""
        hook = self.setup.hook()
        with closing(hook.get_conn()) as conn, hook.engine.transaction(conn) as cur:
            for statement in pipeline_sql(code, tasks):
                cur.execute(statement)

    def add_task_parameter(self, code: str, task: str, name: str, value: str) -> None:
        """Insert an active CFG_TASK_PARAMETERS row of ``task`` of pipeline ``code`` (values bound)."""
        hook = self.setup.hook()
        sql = ("INSERT INTO CFG_TASK_PARAMETERS (TASK_ID, PARAMETER_NAME, PARAMETER_VALUE, CREATED_BY) "
               "SELECT t.TASK_ID, ?, ?, 'deployment-test' FROM CFG_TASKS t JOIN CFG_PIPELINES p "
               "ON p.PIPELINE_ID = t.PIPELINE_ID WHERE p.PIPELINE_CODE = ? AND t.TASK_CODE = ?")  # fmt: skip
        with closing(hook.get_conn()) as conn:
            hook.engine.execute(conn, sql, (name, value, code, task))

    def runs(self, code: str) -> list[dict[str, Any]]:
        cols = (
            "PIPELINE_RUN_ID",
            "STATUS",
            "RUN_KEY",
            "RUN_DATE",
            "TRIGGER_KIND",
            "OUTPUT_REVISION",
            "REPAIR_PENDING",
        )
        sql = (f"SELECT {', '.join('r.' + c for c in cols)} FROM AUD_PIPELINES_RUN_LOG r "
               "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = ? "
               "ORDER BY r.PIPELINE_RUN_ID")  # fmt: skip
        return [dict(zip(cols, row, strict=True)) for row in self.rows(sql, code)]

    def in_progress(self, code: str) -> int:
        ((count,),) = self.rows(
            "SELECT COUNT(*) FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID "
            "WHERE p.PIPELINE_CODE = ? AND r.STATUS = 'IN-PROGRESS'",
            code,
        )
        return int(count)

    def task_runs(self, pipeline_run_id: int) -> dict[str, tuple[Any, ...]]:
        """``{TASK_CODE: (STATUS, ATTEMPT_COUNT, ROWS_WRITTEN)}`` of one Engine run."""
        rows = self.rows(
            "SELECT t.TASK_CODE, tr.STATUS, tr.ATTEMPT_COUNT, tr.ROWS_WRITTEN FROM AUD_TASK_RUN_LOG tr "
            "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID WHERE tr.PIPELINE_RUN_ID = ?",
            pipeline_run_id,
        )
        return {r[0]: tuple(r[1:]) for r in rows}

    def attempts(self, pipeline_run_id: int, task_code: str) -> list[tuple[int, str]]:
        """``[(ATTEMPT_NUMBER, STATUS), …]`` of one task of one Engine run."""
        rows = self.rows(
            "SELECT a.ATTEMPT_NUMBER, a.STATUS FROM AUD_TASK_ATTEMPTS a "
            "JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
            "WHERE tr.PIPELINE_RUN_ID = ? AND t.TASK_CODE = ? ORDER BY a.ATTEMPT_NUMBER",
            pipeline_run_id,
            task_code,
        )
        return [(int(n), str(s)) for n, s in rows]

    def attempt_rows(self, pipeline_run_id: int, task_code: str) -> list[tuple[Any, ...]]:
        """``[(MAP_INDEX, ATTEMPT_NUMBER, STATUS, ROWS_WRITTEN, ERROR_MESSAGE, TASK_LOG), …]`` of one task of one run."""
        return self.rows(
            "SELECT a.MAP_INDEX, a.ATTEMPT_NUMBER, a.STATUS, a.ROWS_WRITTEN, a.ERROR_MESSAGE, a.TASK_LOG "
            "FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "
            "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID WHERE tr.PIPELINE_RUN_ID = ? AND t.TASK_CODE = ? "
            "ORDER BY COALESCE(a.MAP_INDEX, -1), a.ATTEMPT_NUMBER",
            pipeline_run_id,
            task_code,
        )

    def task_run_row(self, pipeline_run_id: int, task_code: str) -> tuple[Any, ...]:
        """``(STATUS, ATTEMPT_COUNT, ROWS_WRITTEN, ERROR_MESSAGE, TASK_LOG)`` of one task of one run."""
        (row,) = self.rows(
            "SELECT tr.STATUS, tr.ATTEMPT_COUNT, tr.ROWS_WRITTEN, tr.ERROR_MESSAGE, tr.TASK_LOG FROM AUD_TASK_RUN_LOG tr "
            "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID WHERE tr.PIPELINE_RUN_ID = ? AND t.TASK_CODE = ?",
            pipeline_run_id,
            task_code,
        )
        return row

    def keyed_attempts(self, run_key: str) -> list[tuple[Any, ...]]:
        """``[(TASK_CODE, MAP_INDEX, ATTEMPT_NUMBER, STATUS, TASK_LOG), …]`` of the Engine run with this key, if any
        yet (``airflow:<dag_id>:<run_id>``): what a test samples while the DAG run goes on."""
        return self.rows(
            "SELECT t.TASK_CODE, a.MAP_INDEX, a.ATTEMPT_NUMBER, a.STATUS, a.TASK_LOG FROM AUD_TASK_ATTEMPTS a "
            "JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID "
            "JOIN AUD_PIPELINES_RUN_LOG r ON r.PIPELINE_RUN_ID = tr.PIPELINE_RUN_ID WHERE r.RUN_KEY = ? "
            "ORDER BY a.ATTEMPT_ID",
            run_key,
        )

    def interventions(self, pipeline_run_id: int) -> list[tuple[Any, ...]]:
        """``[(ACTION, FROM_STATUS, TO_STATUS, REQUESTED_BY_KIND), …]`` recorded on one Engine run."""
        return self.rows(
            "SELECT ACTION, FROM_STATUS, TO_STATUS, REQUESTED_BY_KIND FROM AUD_RUN_INTERVENTIONS "
            "WHERE PIPELINE_RUN_ID = ? ORDER BY INTERVENTION_ID",
            pipeline_run_id,
        )


@dataclass
class AirflowDeployment:
    """The running deployment and the helpers tests drive it with."""

    cluster: PgCluster
    root: Path
    port: int = 0
    env: dict[str, str] = field(default_factory=dict, repr=False)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    databases: list[str] = field(default_factory=list)
    engines: dict[str, Engine] = field(default_factory=dict)
    #: Processes a test found outside the components' trees (a killed task's): teardown makes sure they are
    #: gone. psutil.Process objects, so a pid reused by another process since is never signalled.
    extra_procs: list[psutil.Process] = field(default_factory=list)
    #: DAG ids written since the current test began (their task logs go into a failure report).
    test_dag_ids: list[str] = field(default_factory=list)
    #: The Redis broker's port on 127.0.0.1 (0: no CeleryExecutor; see ``celery_unavailable``).
    broker_port: int = 0
    #: The Airflow processes this deployment runs (``COMPONENTS``; ``WEB_COMPONENTS`` for the web flavour).
    components: tuple[str, ...] = COMPONENTS
    #: Simple auth manager users, name -> (role, password); empty: everyone is admin (``ALL_ADMINS``).
    users: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)
    _token: str | None = field(default=None, repr=False)
    _tokens: dict[str, str] = field(default_factory=dict, repr=False)
    _meta: PgDatabase | None = field(default=None, repr=False)
    #: The session's StatsD server: every Airflow process's ``[metrics]`` sends to it, tags InfluxDB-style
    #: (bound before any component starts; see ``harness/statsd.py``).
    statsd: StatsdListener | None = field(default=None, repr=False)

    # -- layout ----------------------------------------------------------------------------------------

    @property
    def home(self) -> Path:
        return self.root / "airflow-home"

    @property
    def dags(self) -> Path:
        return self.home / "dags"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> Path:
        """The example pipeline's SQLite warehouse (connection ``etl_craft_warehouse``)."""
        return self.root / "warehouse" / "warehouse.db"

    @property
    def pg(self) -> Engine:
        return self.engines["pg"]

    @property
    def sqlite(self) -> Engine:
        return self.engines["sqlite"]

    @property
    def default(self) -> Engine:
        """``etl_craft_default``, the example DAGs' Engine DB (no tables until a test or the init DAG makes them)."""
        return self.engines["default"]

    @property
    def lineage_events(self) -> Path:
        """The OpenLineage file transport's file: one JSON event a line, from every component."""
        return self.root / "openlineage-events.jsonl"

    def component_log(self, name: str) -> Path:
        return self.root / "component-logs" / f"{name}.log"

    # -- setup and teardown ------------------------------------------------------------------------------

    #: The web flavour's connection of another type than etl_craft (see ``foreign_conn_password``).
    foreign_conn_id: ClassVar[str] = "warehouse_admin"

    @property
    def foreign_conn_password(self) -> str:
        """The password of ``foreign_conn_id``: derived from the run's folder, so unique per session."""
        return f"foreign-secret-{self.root.name}"

    @property
    def passwords_file(self) -> Path:
        """The simple auth manager's passwords (JSON), written by the web flavour before the api-server starts."""
        return self.home / "simple_auth_manager_passwords.json"

    @classmethod
    def start(cls, cluster: PgCluster, root: Path) -> AirflowDeployment:
        """The whole deployment: api-server, scheduler, dag-processor, triggerer (everyone admin)."""
        return cls(cluster, root)._start()

    @classmethod
    def start_web(
        cls, cluster: PgCluster, root: Path, users: dict[str, tuple[str, str]] | None = None
    ) -> AirflowDeployment:
        """The lean web flavour: ``airflow db migrate`` and the api-server only, with simple auth manager
        ``users`` (default ``WEB_USERS``)."""
        return cls(cluster, root, components=WEB_COMPONENTS, users=dict(users or WEB_USERS))._start()

    def _start(self) -> AirflowDeployment:
        try:
            self._prepare()
            if "scheduler" in self.components:
                self._start_broker()
            self._migrate()
            self._launch()
            self._wait_ready()
        except Exception as exc:
            report = self.report()
            self.stop()
            raise DeploymentError(f"the Airflow deployment did not start: {exc}\n{report}") from exc
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare(self) -> None:
        for folder in (self.dags, self.logs, self.root / "component-logs", self.warehouse.parent):
            folder.mkdir(parents=True, exist_ok=True)
        # Metadata DB: a fresh database owned by a password login role of the cluster.
        password_role = "etl_password"
        meta_name = self.cluster.create_database(owner=password_role, schema=None)
        self.databases.append(meta_name)
        self._meta = PgDatabase(self.cluster, meta_name, schema="public", user=password_role)
        password = quote(self._meta.password, safe="")
        meta_url = (f"postgresql+psycopg2://{password_role}:{password}@{self.cluster.host}:{self.cluster.port}/"
                    f"{meta_name}")  # fmt: skip

        # Engine DBs: PostgreSQL (a pg_database-like database) and a SQLite file.
        engine_db = PgDatabase(self.cluster, self.cluster.create_database())
        self.databases.append(engine_db.name)
        pg_config = write_config(
            self.root / "engine-pg", pg_profile_yaml(engine_db, secret_var=PG_SECRET_VAR)
        )
        # etl_craft_default: a database of its own, without tables (the example init DAG creates them), and
        # the example project's migrations beside its craft-connector.yml, as the example project lays out.
        default_db = PgDatabase(self.cluster, self.cluster.create_database())
        self.databases.append(default_db.name)
        default_config = write_config(
            self.root / "engine-default", pg_profile_yaml(default_db, secret_var=PG_SECRET_VAR)
        )
        shutil.copytree(EXAMPLE_MIGRATIONS, default_config.parent / "migrations")
        sqlite_text = "Engine:\n  test:\n    jdbc_url: jdbc:sqlite:engine/etl-craft.db\n    schema: main\n"
        sqlite_config = write_config(self.root / "engine-sqlite", sqlite_text)
        secret_env = {PG_SECRET_VAR: engine_db.password}
        os.environ.update(secret_env)  # the test process reads the Engine DB too (removed by stop())
        self.engines = {
            "pg": Engine(EngineSetup("postgresql", pg_config, secret_env, engine_db), "etl_craft_pg"),
            "sqlite": Engine(EngineSetup("sqlite", sqlite_config), "etl_craft_sqlite"),
            "default": Engine(
                EngineSetup("postgresql", default_config, secret_env, default_db), "etl_craft_default"
            ),
        }
        for name in ("pg", "sqlite"):
            self.engines[name].setup.hook().migrate()  # init-db plus the packaged migrations

        def file_conn(config: Path) -> str:
            return json.dumps({"conn_type": "etl_craft", "extra": {"config_path": str(config)}})

        self.port = _free_port()
        api = self.base_url
        self.statsd = StatsdListener()
        # PYTHONDONTWRITEBYTECODE is dropped: a deployment installs the provider from its wheel, with
        # bytecode, so every task process here reads the provider's modules compiled, as there, and does not
        # compile them from source at each try (docs/performance.md).
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_", "ETL_CRAFT_CONFIG",
                                     "ETL_CRAFT_MIGRATIONS_DIR", "PYTHONDONTWRITEBYTECODE"))}  # fmt: skip
        self.env = {
            **base,
            **secret_env,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": meta_url,
            "AIRFLOW__API__BASE_URL": api,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": "etl-craft-deployment-tests-secret-key",
            "AIRFLOW__API_AUTH__JWT_SECRET": "etl-craft-deployment-tests-jwt-secret-0123456789",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            # How often the scheduler fails deferred tasks whose trigger timed out (default 15 s).
            "AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL": "1",
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "1",
            "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "2",
            "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "0",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_STORAGE_PATH": str(self.root / "bundles"),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(_free_port()),
            # Where the OpenLineage integration is installed (the lineage tier), every component's events go
            # to one file; without it Airflow ignores the section.
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(self.lineage_events), "append": True}
            ),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "etl-craft-deployment",
            # The warehouse a task's declared target (its TARGET_OBJECT) names a table of, in lineage events.
            "AIRFLOW__ETL_CRAFT__LINEAGE_TARGET_NAMESPACE": LINEAGE_TARGET_NAMESPACE,
            **self.statsd.env(),
            "AIRFLOW_CONN_ETL_CRAFT_PG": file_conn(pg_config),
            "AIRFLOW_CONN_ETL_CRAFT_SQLITE": file_conn(sqlite_config),
            "AIRFLOW_CONN_ETL_CRAFT_DEFAULT": file_conn(default_config),
            "AIRFLOW_CONN_ETL_CRAFT_WAREHOUSE": json.dumps(
                {"conn_type": "sqlite", "host": str(self.warehouse)}
            ),
        }
        if self.users:
            self.passwords_file.write_text(
                json.dumps({name: password for name, (_, password) in self.users.items()}) + "\n"
            )
            self.env.update({
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                    f"{name}:{role}" for name, (role, _) in self.users.items()
                ),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords_file),
                # A connection of another type, with a password the plugin's API must never use or show.
                f"AIRFLOW_CONN_{self.foreign_conn_id.upper()}": json.dumps({
                    "conn_type": "postgres", "host": "127.0.0.1", "login": "someone",
                    "password": self.foreign_conn_password,
                }),
            })  # fmt: skip

    @property
    def meta_url(self) -> str:
        """The metadata DB's SQLAlchemy URL (with its password)."""
        return self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]

    def broker_url(self, host: str = "127.0.0.1", port: int | None = None, db: int = 0) -> str:
        return f"redis://{host}:{port or self.broker_port}/{db}"

    def _start_broker(self) -> None:
        """Redis on a free loopback port, and the CeleryExecutor beside LocalExecutor (when available)."""
        if celery_unavailable():
            return
        self.broker_port = _free_port()
        workdir = self.root / "redis"
        workdir.mkdir()
        with self.component_log("redis").open("wb") as out:
            self.procs["redis"] = subprocess.Popen(
                ["redis-server", "--bind", "127.0.0.1", "--port", str(self.broker_port), "--save", "",
                 "--appendonly", "no", "--dir", str(workdir)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

        def answers() -> bool:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.broker_port), 1) as s,
            ):
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
            return False

        self.wait_until(answers, 30, "the Redis broker to answer")
        self.env.update({
            "AIRFLOW__CORE__EXECUTOR": EXECUTORS,
            "AIRFLOW__CELERY__BROKER_URL": self.broker_url(),
            "AIRFLOW__CELERY__RESULT_BACKEND": self.broker_url(db=1),
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
        })  # fmt: skip

    def _migrate(self) -> None:
        log = self.component_log("db-migrate")
        with log.open("wb") as out:
            done = subprocess.run([*airflow_cli(), "db", "migrate"], env=self.env, cwd=self.root,
                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=_STARTUP_TIMEOUT, check=False)  # fmt: skip
        if done.returncode != 0:
            raise DeploymentError(f"`airflow db migrate` failed ({done.returncode}):\n{_tail(log)}")

    def _launch(self) -> None:
        for name in self.components:
            self._launch_one(name)

    def _launch_one(self, name: str) -> None:
        args = (
            ["api-server", "--host", "127.0.0.1", "--port", str(self.port)]
            if name == "api-server"
            else [name]
        )
        out = self.component_log(name).open("ab")
        try:
            self.procs[name] = subprocess.Popen([*airflow_cli(), *args], env=self.env, cwd=self.root, stdout=out,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)  # fmt: skip
        finally:
            out.close()

    def kill_and_restart(self, name: str) -> None:
        """SIGKILL one component and everything below it (as a lost machine would), start it again, and wait
        until the deployment is healthy."""
        parent = psutil.Process(self.procs[name].pid)
        victims = [parent, *parent.children(recursive=True)]
        for p in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(victims, timeout=10)
        self.procs[name].wait(timeout=10)
        self._launch_one(name)
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until the API answers and the scheduler, dag-processor and triggerer heartbeat (those that run)."""
        # The health endpoint's parts: metadatabase, scheduler, triggerer, dag_processor.
        parts = ["metadatabase", *(c.replace("-", "_") for c in self.components if c != "api-server")]

        def ready() -> bool:
            try:
                health = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).json()
            except (httpx.HTTPError, ValueError):
                return False
            return all((health.get(part) or {}).get("status") == "healthy" for part in parts)

        self.wait_until(ready, _STARTUP_TIMEOUT, "the deployment to become healthy")

    def stop(self) -> None:
        """SIGTERM every component and everything below it, SIGKILL what is left; drop the databases."""
        victims: dict[int, psutil.Process] = {}
        for proc in self.procs.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                parent = psutil.Process(proc.pid)
                for p in [parent, *parent.children(recursive=True)]:
                    victims[p.pid] = p
        for p in self.extra_procs:
            victims.setdefault(p.pid, p)
        for p in victims.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(list(victims.values()), timeout=_STOP_GRACE)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=10)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        os.environ.pop(PG_SECRET_VAR, None)
        if self.statsd is not None:
            self.statsd.close()
        for name in self.databases:
            with contextlib.suppress(psycopg2.Error):
                self.cluster.drop_database(name)

    # -- waiting ---------------------------------------------------------------------------------------

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise DeploymentError(
                    f"{name} exited with {proc.returncode} (its log: {self.component_log(name)})"
                )

    def wait_until(self, predicate: Callable[[], Any], timeout: float, what: str,
                   probe: Callable[[], None] | None = None) -> Any:  # fmt: skip
        """Poll ``predicate`` (and ``probe``, a sampler) until it returns a truthy value; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            if probe is not None:
                probe()
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise DeploymentError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(_POLL)

    # -- the metadata DB -------------------------------------------------------------------------------

    def meta(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` (psycopg2 ``%s`` placeholders) on the Airflow metadata DB."""
        assert self._meta is not None
        conn = self._meta.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        cols = ("state", "run_type", "logical_date", "run_after", "start_date", "end_date")
        rows = self.meta(
            f"SELECT {', '.join(cols)} FROM dag_run WHERE dag_id = %s AND run_id = %s", dag_id, run_id
        )
        if not rows:
            raise DeploymentError(f"no DAG run {run_id} of {dag_id}")
        return dict(zip(cols, rows[0], strict=True))

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        """``{task_id: state}`` of one DAG run (task ids of a group carry its prefix: ``pipe.claim``)."""
        rows = self.meta(
            "SELECT task_id, state FROM task_instance WHERE dag_id = %s AND run_id = %s", dag_id, run_id
        )
        return dict(rows)

    def try_numbers(self, dag_id: str, run_id: str) -> dict[str, int]:
        rows = self.meta("SELECT task_id, try_number FROM task_instance WHERE dag_id = %s AND run_id = %s",
                         dag_id, run_id)  # fmt: skip
        return {task_id: int(n) for task_id, n in rows}

    def reschedules(self, dag_id: str, run_id: str, task_id: str) -> int:
        """How many times the task instance was rescheduled (``up_for_reschedule``): task_reschedule rows."""
        ((count,),) = self.meta(
            "SELECT COUNT(*) FROM task_reschedule r JOIN task_instance ti ON ti.id = r.ti_id "
            "WHERE ti.dag_id = %s AND ti.run_id = %s AND ti.task_id = %s",
            dag_id,
            run_id,
            task_id,
        )
        return int(count)

    def executor_event_race(self, dag_id: str, run_id: str, task_id: str) -> bool:
        """Whether the scheduler failed the task instance on a late executor event (apache/airflow#71172).

        A reschedule-mode sensor's poke ends ``up_for_reschedule``; if the executor's success event for that
        poke reaches the scheduler only after the next poke was scheduled or queued, Airflow 3.3 fails the
        task instance ("finished with state success, but the task instance's state attribute is queued").
        """
        who = f"<TaskInstance: {dag_id}.{task_id} {run_id} ["
        text = self.component_log("scheduler").read_text(errors="replace")
        return any(
            who in line and "finished with state success, but the task instance's state attribute is" in line
            for line in text.splitlines()
        )

    # -- driving Airflow -------------------------------------------------------------------------------

    def write_dag(self, dag_id: str, source: str) -> Path:
        """Write a DAG file ``<dag_id>.py`` into the DAGs folder (atomically: never parsed half-written)."""
        path = self.dags / f"{dag_id}.py"
        tmp = self.root / f".{dag_id}.py.tmp"
        tmp.write_text(source, encoding="utf-8")
        os.replace(tmp, path)
        self.test_dag_ids.append(dag_id)
        return path

    def wait_parsed(self, dag_id: str, timeout: float = 90) -> None:
        """Until the dag-processor has serialized the DAG, active and unpaused; fail fast on an import error.

        The dag-processor only parses files that mention both ``airflow`` and ``dag`` (safe mode).
        """
        filename = str(self.dags / f"{dag_id}.py")

        def parsed() -> bool:
            errors = self.meta("SELECT stacktrace FROM import_error WHERE filename IN (%s, %s)", filename,
                               f"{dag_id}.py")  # fmt: skip
            if errors:
                raise DeploymentError(f"DAG file of {dag_id} failed to import:\n{errors[0][0]}")
            rows = self.meta(
                "SELECT d.is_paused, d.is_stale FROM dag d JOIN serialized_dag s ON s.dag_id = d.dag_id "
                "WHERE d.dag_id = %s",
                dag_id,
            )
            return bool(rows) and rows[0] == (False, False)

        self.wait_until(parsed, timeout, f"DAG {dag_id} to be parsed")

    def token(self, user: str) -> str:
        """A JWT of one simple auth manager user (web flavour), from ``POST /auth/token``."""
        _, password = self.users[user]
        response = httpx.post(f"{self.base_url}/auth/token", json={"username": user, "password": password},
                              timeout=30)  # fmt: skip
        if response.status_code >= 300:
            raise DeploymentError(f"POST /auth/token as {user} -> {response.status_code}: {response.text}")
        return str(response.json()["access_token"])

    def client(self, user: str | None, timeout: float = 60) -> httpx.Client:
        """An ``httpx.Client`` on the api-server as ``user`` (a bearer token of the web flavour's simple auth
        manager; ``None``: unauthenticated). Close it (``with deployment.client("viewer") as api: ...``)."""
        headers = {}
        if user is not None:
            if user not in self._tokens:
                self._tokens[user] = self.token(user)
            headers["Authorization"] = f"Bearer {self._tokens[user]}"
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def _api(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        if self._token is None and self.users:
            admin = next(name for name, (role, _) in self.users.items() if role.lower() == "admin")
            self._token = self.token(admin)
        elif self._token is None:
            response = httpx.get(f"{self.base_url}/auth/token", timeout=30)
            response.raise_for_status()
            self._token = response.json()["access_token"]
        response = httpx.request(method, f"{self.base_url}{path}", json=body, timeout=60,
                                 headers={"Authorization": f"Bearer {self._token}"})  # fmt: skip
        if response.status_code >= 300:
            raise DeploymentError(f"{method} {path} -> {response.status_code}: {response.text}")
        return response.json()

    def add_connection(self, conn_id: str, conn_type: str, extra: dict[str, Any], **fields: Any) -> None:
        """Create an Airflow connection in the metadata DB through the REST API (as the UI's form does)."""
        self._api("POST", "/api/v2/connections",
                  {"connection_id": conn_id, "conn_type": conn_type, "extra": json.dumps(extra), **fields})  # fmt: skip

    def trigger(
        self, dag_id: str, logical_date: datetime | None = None, conf: dict[str, Any] | None = None
    ) -> str:
        """Trigger a DAG run through the REST API (no logical date unless given, as Airflow 3 does); its run id."""
        body = {"logical_date": logical_date.isoformat() if logical_date else None, "conf": conf or {}}
        return str(self._api("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)["dag_run_id"])

    def extra_links(self, dag_id: str, run_id: str, task_id: str) -> dict[str, str]:
        """A task instance's extra links as the UI gets them: ``{name: url}``."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/links"
        return dict(self._api("GET", path)["extra_links"])

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 120,
                 probe: Callable[[], None] | None = None) -> str:  # fmt: skip
        """Until the DAG run ends; its state (``success`` or ``failed``)."""

        def ended() -> str | None:
            state = self.dag_run(dag_id, run_id)["state"]
            return state if state in ENDED_RUN else None

        return str(self.wait_until(ended, timeout, f"DAG run {run_id} of {dag_id} to end", probe))

    def set_task_state(self, dag_id: str, run_id: str, task_id: str, state: str) -> None:
        """Mark a task instance ``success`` / ``failed`` / ``skipped`` by hand, as the UI does (REST API v2 PATCH)."""
        self._api(
            "PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}", {"new_state": state}
        )

    def clear(self, dag_id: str, run_id: str) -> None:
        """Clear the whole DAG run (every task), as the UI's *Clear* does; returns once it is queued again."""
        self._api("POST", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/clear", {"dry_run": False})
        self.wait_until(lambda: self.dag_run(dag_id, run_id)["state"] not in ENDED_RUN, 30,
                        f"DAG run {run_id} of {dag_id} to be cleared")  # fmt: skip

    # -- failure reports -------------------------------------------------------------------------------

    def task_logs(self, dag_ids: Iterable[str]) -> list[Path]:
        found: list[Path] = []
        for dag_id in dict.fromkeys(dag_ids):
            found += sorted((self.logs / f"dag_id={dag_id}").glob("**/*.log"))
        return found

    def report(self, dag_ids: Iterable[str] | None = None) -> str:
        """The tail of each component's log and of the task logs of ``dag_ids`` (default: this test's DAGs)."""
        parts = []
        for name in ("db-migrate", *self.components, "redis"):
            path = self.component_log(name)
            if path.exists():
                parts.append(f"----- airflow {name} ({path}) -----\n{_tail(path)}")
        for path in self.task_logs(self.test_dag_ids if dag_ids is None else dag_ids):
            parts.append(f"----- task log {path.relative_to(self.logs)} -----\n{_task_log(path)}")
        return "\n".join(parts)
