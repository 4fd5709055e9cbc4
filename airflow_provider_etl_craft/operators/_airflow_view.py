"""What the lifecycle asks Airflow itself, through the task SDK's supervisor (no metadata-DB access)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: DAG-run states after which a run will not drive its Engine run any more.
ENDED_DAG_RUN = frozenset({"success", "failed"})
NOT_FOUND = "not found"


def dag_run_state(context: Mapping[str, Any], dag_id: str, run_id: str) -> str | None:
    """The state of another DAG run: ``success``, ``failed``, ``running``, ``queued``, ``not found``.

    None when Airflow could not be asked (the caller then keeps waiting rather than guess).
    """
    ti = context["ti"]
    try:
        return str(_state_value(ti.get_dagrun_state(dag_id=dag_id, run_id=run_id)))
    except Exception as exc:  # noqa: BLE001 - the SDK raises its own runtime error wrapping the API answer
        if _status_code(exc) == 404:
            return NOT_FOUND
        return None


def task_states(context: Mapping[str, Any], task_ids: Iterable[str]) -> dict[str, str | None]:
    """Airflow's state of ``task_ids`` in the current DAG run (None: no state yet)."""
    return task_and_map_states(context, task_ids)[0]


def task_and_map_states(
    context: Mapping[str, Any], task_ids: Iterable[str], mapped: Iterable[str] = ()
) -> tuple[dict[str, str | None], dict[str, dict[int, str | None]]]:
    """Airflow's state of ``task_ids`` in the current DAG run, and of each map index of the ``mapped`` ones.

    Airflow reports a map index as ``<task_id>_<index>``; a mapped task that was not expanded (yet, or to
    zero instances) has only its plain state.
    """
    ids = list(task_ids)
    if not ids:
        return {}, {}
    ti = context["ti"]
    found = ti.get_task_states(dag_id=ti.dag_id, task_ids=ids, run_ids=[ti.run_id])
    per_task = found.get(ti.run_id, found) if isinstance(found, Mapping) else {}
    states = {task_id: _state_value(per_task.get(task_id)) for task_id in ids}
    maps: dict[str, dict[int, str | None]] = {task_id: {} for task_id in mapped}
    for key, state in per_task.items():
        owner, _, index = str(key).rpartition("_")
        if owner in maps and index.isdigit():
            maps[owner][int(index)] = _state_value(state)
    return states, maps


def _state_value(state: Any) -> str | None:
    if state is None:
        return None
    return str(getattr(state, "value", state))


def _status_code(exc: BaseException) -> int | None:
    error = getattr(exc, "error", None)
    detail = getattr(error, "detail", None)
    if isinstance(detail, Mapping):
        code = detail.get("status_code")
        return int(code) if isinstance(code, int) else None
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)
