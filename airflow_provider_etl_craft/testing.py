"""Helpers for tests and CI: run a pipeline DAG locally, and check a DAG against the Engine's graph.

:func:`check_dag_against_engine` (and :func:`assert_dag_matches_engine`) compare a DAG's recorded tasks and
the edges between them with the active ``CFG_TASKS`` and ``CFG_TASK_DEPENDENCY`` rows, so drift between
the two is found in CI rather than by a claim refused at run time (docs/graph-validation.md).

Run a pipeline DAG locally with ``dag.test()`` on every supported Airflow line:

Airflow 3.0's ``dag.test()`` does not write the DAG to the metadata database before it runs it, so the
DAG's assets are never activated and any task with an outlet fails before it starts with
``AirflowInactiveAssetInInletOrOutletException``; a pipeline's finish task has one by default
(``emit_asset=True``). From 3.1 ``dag.test()`` syncs the DAG itself. :func:`run_dag_test` does on 3.0
what the dag-processor (and later ``dag.test()``) does, then calls ``dag.test()``; on newer lines it is
``dag.test()`` unchanged. ``make demo`` and the test suite run DAGs through it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from contextlib import closing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
    from airflow_provider_etl_craft.runs.graph import PipelineGraph

#: The DAG bundle Airflow's default configuration puts the DAGs folder in.
DAGS_FOLDER_BUNDLE = "dags-folder"


def dag_test_syncs_the_dag() -> bool:
    """Whether this Airflow's ``dag.test()`` writes the DAG (and activates its assets) itself: 3.1 and later."""
    from airflow import __version__
    from packaging.version import Version

    return Version(__version__).release[:2] >= (3, 1)


def write_dag_to_db(dag: Any, bundle_name: str = DAGS_FOLDER_BUNDLE) -> None:
    """Record ``dag`` and its assets in the metadata DB, as the dag-processor does (Airflow 3.0 API)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.models.dag import DAG as SchedulerDAG
    from airflow.serialization.serialized_objects import SerializedDAG
    from airflow.utils.session import create_session

    # Airflow 3.0's API (only 3.0 calls this); the 3.3 types the lint checks against moved both methods.
    serialized = SerializedDAG.serialize_dag(dag)  # type: ignore[attr-defined]
    scheduler_dag = SerializedDAG.deserialize_dag(serialized)  # type: ignore[attr-defined]
    DagBundlesManager().sync_bundles_to_db()
    with create_session() as session:
        SchedulerDAG.bulk_write_to_db(bundle_name, None, [scheduler_dag], session=session)


def run_dag_test(dag: Any, **kwargs: Any) -> Any:
    """``dag.test(**kwargs)``, after writing the DAG to the metadata DB where this Airflow line needs it."""
    if not dag_test_syncs_the_dag():
        write_dag_to_db(dag)
    return dag.test(**kwargs)


# -- a DAG against the Engine's graph -------------------------------------------------------------------


@dataclass
class _DagPipeline:
    """What a DAG holds of one pipeline: its recorded tasks by task code, and where its Engine DB is."""

    tasks: dict[str, str] = field(default_factory=dict)  # task code -> task_id
    duplicates: list[str] = field(default_factory=list)
    conn_id: str | None = None
    profile: str | None = None


def _dag_pipelines(dag: Any) -> tuple[dict[str, _DagPipeline], list[str]]:
    """The pipelines a DAG claims or records tasks of, and the recorded tasks that name no pipeline."""
    from airflow_provider_etl_craft.operators.task_run import recorded_task

    found: dict[str, _DagPipeline] = {}
    orphans: list[str] = []
    for task in dag.tasks:
        if getattr(task, "etl_craft_claims_pipeline", False):
            entry = found.setdefault(task.pipeline_code, _DagPipeline())
            entry.conn_id = entry.conn_id or task.etl_craft_conn_id
            entry.profile = entry.profile or task.etl_craft_profile
            continue
        record = recorded_task(task)
        if record is None:
            continue
        pipeline, code = record
        if pipeline is None or code is None:
            orphans.append(task.task_id)
            continue
        entry = found.setdefault(pipeline, _DagPipeline())
        if code in entry.tasks:
            entry.duplicates.append(f"{entry.tasks[code]} and {task.task_id} both record task code {code}")
        else:
            entry.tasks[code] = task.task_id
        kwargs = getattr(task, "partial_kwargs", None) or {}
        conn_id = getattr(task, "etl_craft_conn_id", None) or kwargs.get("etl_craft_conn_id")
        profile = getattr(task, "etl_craft_profile", None) or kwargs.get("etl_craft_profile")
        entry.conn_id = entry.conn_id or conn_id
        entry.profile = entry.profile or profile
    return found, orphans


def _dag_edges(dag: Any, recorded: Collection[str]) -> set[tuple[str, str]]:
    """``(task_id, upstream task_id)`` for each pair of recorded tasks the DAG orders directly: the upstream
    reaches the task through tasks that record nothing (a claim, a plain operator, a branch), if any."""
    edges = set()
    for upstream in recorded:
        seen: set[str] = set()
        todo = list(dag.get_task(upstream).downstream_task_ids)
        while todo:
            task_id = todo.pop()
            if task_id in seen:
                continue
            seen.add(task_id)
            if task_id in recorded:
                edges.add((task_id, upstream))
            elif not _records(dag.get_task(task_id)):
                todo.extend(dag.get_task(task_id).downstream_task_ids)
    return edges


def _records(task: Any) -> bool:
    from airflow_provider_etl_craft.operators.task_run import recorded_task

    return recorded_task(task) is not None


def _compare(
    dag: Any, code: str, entry: _DagPipeline, *, graph: PipelineGraph | None, problems: bool
) -> list[str]:
    """The differences between one pipeline's recorded tasks in ``dag`` and its graph in the Engine."""
    where, out = f"pipeline {code}", []
    out += [
        f"{where}: DAG {dag.dag_id}: tasks {d}; give one of them another task_code=" for d in entry.duplicates
    ]
    if graph is None:
        return [
            *out,
            f"{where}: DAG {dag.dag_id} runs it, but it is not an active pipeline in CFG_PIPELINES of the Engine DB",
        ]
    active = set(graph.tasks)
    for task_code, task_id in sorted(entry.tasks.items()):
        if task_code not in active:
            out.append(
                f"{where}: DAG {dag.dag_id} task {task_id} records task code {task_code}, which has no active row "
                "in CFG_TASKS"
            )
    for task_code in sorted(active - set(entry.tasks)):
        out.append(f"{where}: active task {task_code} of CFG_TASKS has no recorded task in DAG {dag.dag_id}")
    both = {c: t for c, t in entry.tasks.items() if c in active}
    by_id = {t: c for c, t in both.items()}
    in_dag = {(by_id[a], by_id[b]) for a, b in _dag_edges(dag, set(by_id))}
    in_engine = {
        (e.task_code, e.upstream_code) for e in graph.edges if e.task_code in both and e.upstream_code in both
    }
    for task_code, upstream in sorted(in_engine - in_dag):
        out.append(
            f"{where}: CFG_TASK_DEPENDENCY says {task_code} depends on {upstream}, but in DAG {dag.dag_id} "
            f"{both[upstream]} is not directly upstream of {both[task_code]}"
        )
    for task_code, upstream in sorted(in_dag - in_engine):
        out.append(
            f"{where}: in DAG {dag.dag_id} {both[upstream]} runs before {both[task_code]}, but CFG_TASK_DEPENDENCY "
            f"has no active dependency of {task_code} on {upstream}"
        )
    if problems:
        out += [f"{where}: [{p.status_name}] {p.message}" for p in graph.problems()]
    return out


def check_dag_against_engine(
    dag: Any,
    hook: EngineDBHook | None = None,
    *,
    pipeline_codes: Iterable[str] | None = None,
    graph_problems: bool = True,
) -> list[str]:
    """Every difference between ``dag``'s pipelines and their graphs in the Engine DB, as readable lines.

    For each pipeline the DAG claims or records tasks of (or only ``pipeline_codes``): a recorded task whose
    task code has no active ``CFG_TASKS`` row, an active task the DAG does not record, and each dependency
    between two of its tasks that one side has and the other lacks (a DAG edge may pass through tasks that
    record nothing; dependencies on other pipelines are judged by gates, not drawn, and are not compared).
    With ``graph_problems`` the problems ``etl-craft-airflow validate`` reports are listed too, since a
    claim of the pipeline would be refused for them. Builds nothing and runs nothing; reads the Engine DB.

    :param hook: the Engine DB to compare with; default: the connection (and profile) the DAG's claim or
        recorded tasks name, else ``[etl_craft] default_conn_id``.
    :return: empty when the DAG and the Engine agree.
    """
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
    from airflow_provider_etl_craft.runs.graph import load_graph
    from airflow_provider_etl_craft.settings import setting

    pipelines, orphans = _dag_pipelines(dag)
    wanted = None if pipeline_codes is None else set(pipeline_codes)
    out = [f"DAG {dag.dag_id} task {t} records to no pipeline: pass pipeline_code=" for t in sorted(orphans)]
    for code in sorted(pipelines if wanted is None else wanted):
        entry = pipelines.get(code, _DagPipeline())
        engine_hook = hook or EngineDBHook(
            etl_craft_conn_id=entry.conn_id or setting("default_conn_id"), profile=entry.profile
        )
        engine = engine_hook.engine
        with closing(engine_hook.get_conn()) as conn, engine.classified(conn):
            graph = load_graph(engine, conn, code)
        out += _compare(dag, code, entry, graph=graph, problems=graph_problems)
    return out


def assert_dag_matches_engine(dag: Any, hook: EngineDBHook | None = None, **kwargs: Any) -> None:
    """Fail (``AssertionError``, one line per difference) unless :func:`check_dag_against_engine` finds none."""
    differences = check_dag_against_engine(dag, hook, **kwargs)
    if differences:
        raise AssertionError(
            f"DAG {dag.dag_id} and the Engine DB disagree:\n" + "\n".join(f"- {d}" for d in differences)
        )
