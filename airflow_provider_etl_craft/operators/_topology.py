"""Which machine runs a task: a SQLite Engine DB is one file on one machine, so only same-machine executors.

A SQLite Engine DB works when every task that records into it runs where the file is: ``LocalExecutor``.
(``dag.test()`` runs tasks in-process, but is judged by the same ``[core] executor`` setting.) Celery, Kubernetes, Edge and the cloud executors run
tasks on other machines, where the file is absent or another copy: the run's rows would split across
databases. The claim refuses that combination before it writes anything.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_etl_craft.errors import ConfigurationError

#: Executors that run every task on the machine the scheduler runs on.
SAME_MACHINE_EXECUTORS = frozenset({"LocalExecutor"})


def executor_class_name(entry: str) -> str:
    """``LocalExecutor`` from ``LocalExecutor``, ``my_alias:pkg.mod.CeleryExecutor`` or ``pkg.mod.Cls``."""
    return entry.strip().rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def task_executor(task: Any) -> str:
    """The executor that runs ``task``: its own ``executor=``, else the first in ``[core] executor``."""
    from airflow_provider_etl_craft._compat import conf

    own = getattr(task, "executor", None)
    if own:
        return executor_class_name(own)
    configured = conf.get("core", "executor", fallback="LocalExecutor") or "LocalExecutor"
    return executor_class_name(configured.split(",")[0])


def require_same_machine(engine_name: str, task: Any, where: str) -> None:
    """Refuse a SQLite Engine DB under an executor that runs tasks on other machines (CONFIGURATION)."""
    if engine_name != "sqlite":
        return
    executor = task_executor(task)
    if executor in SAME_MACHINE_EXECUTORS:
        return
    raise ConfigurationError(
        f"{where}: the Engine DB is a SQLite file, but {executor} runs tasks on other machines, which would not "
        "see that file (or would each see their own copy); use a PostgreSQL Engine DB with this executor, or "
        f"run the DAG with {' or '.join(sorted(SAME_MACHINE_EXECUTORS))}"
    )
