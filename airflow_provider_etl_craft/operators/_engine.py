"""An operator try's Engine DB: the task process's one connection, reached without ``EngineDBHook``.

Every operator that writes to the Engine DB in a task (the claim, recorded tasks, the finish, a deferred
wait's fingerprint read) gets there the same way: the profile of its Airflow connection, read once per
try as the hook reads it, and the process's one connection to that Engine DB
(:mod:`~airflow_provider_etl_craft.engine.reuse`). The hook is a common-sql ``DbApiHook``, and importing
common-sql (with ``sqlparse``) costs a task process 20-30 ms that none of these steps needs
(docs/performance.md, "In the task process").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_provider_etl_craft.engine.dialects.base import EngineDialect


def try_engine(conn_id: str, profile: str | None, *steps: str) -> EngineDialect:
    """The process's dialect for the Engine DB of Airflow connection ``conn_id`` (``profile``: the Engine
    profile of a file-backed connection), its login started.

    On PostgreSQL the login runs in the background while the modules of ``steps`` (names in
    ``airflow_provider_etl_craft.runs``) load; the first :func:`~airflow_provider_etl_craft.runs.lifecycle.lent_lifecycle`
    takes that session. Call it once per try, and borrow next without talking to Airflow in between
    (:func:`~airflow_provider_etl_craft.engine.reuse.log_in_ahead`).
    """
    from airflow_provider_etl_craft.config.connection import profile_for_conn_id
    from airflow_provider_etl_craft.engine.reuse import engine_for, log_in_ahead

    engine = engine_for(profile_for_conn_id(conn_id, profile))
    log_in_ahead(engine)
    for step in steps:
        importlib.import_module(f"airflow_provider_etl_craft.runs.{step}")
    return engine
