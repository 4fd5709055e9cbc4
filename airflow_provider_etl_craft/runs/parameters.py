"""A task's configured parameters (``CFG_TASK_PARAMETERS``), looked up by one of its task runs.

Kept apart from :mod:`~.queries` (the CLI's and the UI's reads) because a recorded try reads one itself: the
task's declared target (``TARGET_OBJECT``), for its OpenLineage output dataset (docs/lineage.md).
"""

from __future__ import annotations

from typing import Any

#: The active value of parameter ``?`` (first) of the task whose run is ``?`` (second).
TASK_PARAMETER_SQL = (
    "SELECT p.PARAMETER_VALUE FROM {schema}AUD_TASK_RUN_LOG tr JOIN {schema}CFG_TASK_PARAMETERS p "
    "ON p.TASK_ID = tr.TASK_ID AND p.PARAMETER_NAME = ? AND p.ACTIVE_FLAG = 'Y' WHERE tr.TASK_RUN_ID = ?"
)
#: The ``CFG_TASK_PARAMETERS`` name of the warehouse table a task writes (``schema.table``), as etl-craft keeps it.
TARGET_OBJECT = "TARGET_OBJECT"


def task_parameter(engine: Any, conn: Any, task_run_id: int, name: str) -> str | None:
    """The active value ``name`` of the task whose run is ``task_run_id``: one statement on autocommit
    ``conn`` (``engine.query_alone``); None when the task has none or its value is NULL."""
    rows = engine.query_alone(conn, TASK_PARAMETER_SQL, (name, task_run_id))
    return None if not rows or rows[0][0] is None else str(rows[0][0])
