"""A pipeline's dependency graph as its active ``CFG_`` rows define it, and every reason it cannot run.

The gates (:mod:`~.gates`) judge each dependency when a run or a task starts; they cannot see that the graph
as a whole is broken, so a task that depends on a retired task, or on a task that depends back on it, would
wait at its gate until the wait times out. :func:`load_graph` reads what the gates will read, for one
pipeline, in one statement; :meth:`PipelineGraph.problems` lists what is wrong with it, each problem with the
typed error a claim refuses the pipeline with. ``etl-craft-airflow validate`` prints the list, the claim
raises its first problem, and :func:`airflow_provider_etl_craft.testing.check_dag_against_engine` compares the
graph with a DAG. The rules and their order are those of etl-craft (docs/graph-validation.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_etl_craft.engine.dbapi import Connection
from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
from airflow_provider_etl_craft.errors import (
    DependencyCycleError,
    EtlCraftError,
    GraphError,
    MetadataError,
    SelfDependencyError,
    UnknownTaskError,
)
from airflow_provider_etl_craft.runs.vocabulary import DependencyType, RunCondition

DEPENDENCY_TYPES = tuple(DependencyType)
RUN_CONDITIONS = tuple(RunCondition)
#: How to mend the ``CFG_`` rows, said once at the end of the messages that need it.
_THROUGH = "through a project migration"

#: One pipeline's graph in one statement (tables named ``{schema}NAME``: see ``EngineDialect.query_alone``);
#: parameter: PIPELINE_CODE. Rows, told apart by the first column:
#:
#: * ``PIPELINE``: the pipeline is active (no other column);
#: * ``TASK``: an active task of it (code, RUN_CONDITION, RUN_CONDITION_COUNT), once per active dependency of
#:   the task (joined with its upstream task, that task's pipeline and the pipeline the row names, and three
#:   Y/N flags: the row names this pipeline; the upstream task is in the pipeline the row names; the row
#:   names the task itself), or once with no dependency;
#: * ``PIPELINE_DEPENDENCY``: an active pipeline dependency of this pipeline, or of a pipeline upstream of it
#:   through active dependencies on active pipelines (dependent code, type, upstream code and ACTIVE_FLAG):
#:   enough to find every cycle through this pipeline. The recursion's UNION stops at pipelines seen already.
#:
#: The pipeline's own rows are read through ``IN (SELECT … FROM target/reach)``, not a join with the CTE: SQLite
#: cannot tell how many rows a CTE holds, and once an Engine DB is analysed it then built an automatic index over
#: every configured task (or scanned every pipeline dependency) rather than look up the pipeline's own.
GRAPH_SQL = (
    "WITH RECURSIVE target (PIPELINE_ID) AS ("
    "SELECT PIPELINE_ID FROM {schema}CFG_PIPELINES WHERE PIPELINE_CODE = ? AND ACTIVE_FLAG = 'Y'"
    "), reach (PIPELINE_ID) AS ("
    "SELECT PIPELINE_ID FROM target UNION "
    "SELECT d.DEPENDS_ON_PIPELINE_ID FROM {schema}CFG_PIPELINE_DEPENDENCY d JOIN reach r ON r.PIPELINE_ID = d.PIPELINE_ID "
    "JOIN {schema}CFG_PIPELINES u ON u.PIPELINE_ID = d.DEPENDS_ON_PIPELINE_ID WHERE d.ACTIVE_FLAG = 'Y' AND u.ACTIVE_FLAG = 'Y'"
    ") "
    "SELECT 'PIPELINE', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM target "
    "UNION ALL "
    "SELECT 'TASK', t.TASK_CODE, t.RUN_CONDITION, t.RUN_CONDITION_COUNT, d.DEPENDENCY_TYPE, ut.TASK_CODE, "
    "ut.ACTIVE_FLAG, up.PIPELINE_CODE, up.ACTIVE_FLAG, np.PIPELINE_CODE, "
    "CASE WHEN d.DEPENDS_ON_PIPELINE_ID = t.PIPELINE_ID THEN 'Y' ELSE 'N' END, "
    "CASE WHEN ut.PIPELINE_ID = d.DEPENDS_ON_PIPELINE_ID THEN 'Y' ELSE 'N' END, "
    "CASE WHEN d.DEPENDS_ON_TASK_ID = d.TASK_ID THEN 'Y' ELSE 'N' END "
    "FROM {schema}CFG_TASKS t "
    "LEFT JOIN {schema}CFG_TASK_DEPENDENCY d ON d.TASK_ID = t.TASK_ID AND d.ACTIVE_FLAG = 'Y' "
    "LEFT JOIN {schema}CFG_TASKS ut ON ut.TASK_ID = d.DEPENDS_ON_TASK_ID "
    "LEFT JOIN {schema}CFG_PIPELINES up ON up.PIPELINE_ID = ut.PIPELINE_ID "
    "LEFT JOIN {schema}CFG_PIPELINES np ON np.PIPELINE_ID = d.DEPENDS_ON_PIPELINE_ID "
    "WHERE t.PIPELINE_ID IN (SELECT PIPELINE_ID FROM target) AND t.ACTIVE_FLAG = 'Y' "
    "UNION ALL "
    "SELECT 'PIPELINE_DEPENDENCY', dp.PIPELINE_CODE, NULL, NULL, d.DEPENDENCY_TYPE, NULL, NULL, u.PIPELINE_CODE, "
    "u.ACTIVE_FLAG, NULL, NULL, NULL, NULL "
    "FROM {schema}CFG_PIPELINE_DEPENDENCY d "
    "JOIN {schema}CFG_PIPELINES dp ON dp.PIPELINE_ID = d.PIPELINE_ID "
    "JOIN {schema}CFG_PIPELINES u ON u.PIPELINE_ID = d.DEPENDS_ON_PIPELINE_ID "
    "WHERE d.PIPELINE_ID IN (SELECT PIPELINE_ID FROM reach) AND d.ACTIVE_FLAG = 'Y'"
)
#: Every active pipeline code, for ``validate`` without ``--pipeline``.
ACTIVE_PIPELINES_SQL = (
    "SELECT PIPELINE_CODE FROM {schema}CFG_PIPELINES WHERE ACTIVE_FLAG = 'Y' ORDER BY PIPELINE_CODE"
)
#: Records a problem: its error class and message.
_Add = Callable[[type[EtlCraftError], str], None]


@dataclass(frozen=True)
class GraphProblem:
    """One reason a pipeline cannot run: the typed error a claim raises for it, and what is wrong (in codes)."""

    error: type[EtlCraftError]
    pipeline_code: str
    message: str

    @property
    def status_name(self) -> str:
        return self.error.status_name

    @property
    def exit_code(self) -> int:
        return self.error.exit_code

    def as_error(self) -> EtlCraftError:
        """The error a claim of the pipeline raises for this problem."""
        return self.error(
            f"pipeline {self.pipeline_code}: {self.message} (`etl-craft-airflow validate --pipeline "
            f"{self.pipeline_code}` lists every problem of its graph)"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "pipeline_code": self.pipeline_code,
            "status_name": self.status_name,
            "exit_code": self.exit_code,
            "message": self.message,
        }


@dataclass(frozen=True)
class Task:
    """An active ``CFG_TASKS`` row of the pipeline: its code and run condition."""

    code: str
    run_condition: str | None
    run_condition_count: int | None


@dataclass(frozen=True)
class Dependency:
    """An active ``CFG_TASK_DEPENDENCY`` row of an active task of the pipeline, with its upstream as found.

    ``upstream_code`` is None when the row names no task at all; ``names_own_pipeline`` says the row's
    ``DEPENDS_ON_PIPELINE_ID`` is the task's own pipeline (so the gate judges it on the same run);
    ``names_upstream_pipeline`` says the upstream task belongs to the pipeline the row names.
    """

    task_code: str
    dependency_type: str
    upstream_code: str | None
    upstream_active: bool
    upstream_pipeline: str | None
    upstream_pipeline_active: bool
    named_pipeline: str | None
    names_own_pipeline: bool
    names_upstream_pipeline: bool
    on_itself: bool

    @property
    def on_retired_task_of_own_pipeline(self) -> bool:
        return (
            self.upstream_code is not None
            and self.names_own_pipeline
            and self.names_upstream_pipeline
            and not self.upstream_active
            and not self.on_itself
        )

    @property
    def same_pipeline(self) -> bool:
        """A dependency the Airflow DAG draws as an edge: on an active task of the same pipeline."""
        return (
            self.upstream_code is not None
            and self.names_own_pipeline
            and self.names_upstream_pipeline
            and self.upstream_active
            and not self.on_itself
        )


@dataclass(frozen=True)
class PipelineDependency:
    """An active ``CFG_PIPELINE_DEPENDENCY`` row: ``pipeline_code`` depends on ``upstream_code``."""

    pipeline_code: str
    dependency_type: str
    upstream_code: str
    upstream_active: bool


@dataclass(frozen=True)
class TaskEdge:
    """``task_code`` depends on ``upstream_code``, both active tasks of the pipeline."""

    task_code: str
    upstream_code: str
    dependency_type: str


@dataclass(frozen=True)
class PipelineGraph:
    """What the gates of one active pipeline will read: its tasks, their dependencies, and the pipeline
    dependencies upstream of it."""

    pipeline_code: str
    tasks: Mapping[str, Task]
    dependencies: tuple[Dependency, ...]
    pipeline_dependencies: tuple[PipelineDependency, ...]

    @classmethod
    def from_rows(cls, pipeline_code: str, rows: Iterable[Sequence[Any]]) -> PipelineGraph | None:
        """The graph from :data:`GRAPH_SQL`'s rows; None when they say the pipeline is not active."""
        active, tasks, deps, pipeline_deps = False, {}, [], []
        for row in rows:
            kind = row[0]
            if kind == "PIPELINE":
                active = True
            elif kind == "TASK":
                count = None if row[3] is None else int(row[3])
                tasks[row[1]] = Task(row[1], row[2], count)
                if row[4] is not None:
                    deps.append(
                        Dependency(
                            task_code=row[1],
                            dependency_type=row[4],
                            upstream_code=row[5],
                            upstream_active=row[6] == "Y",
                            upstream_pipeline=row[7],
                            upstream_pipeline_active=row[8] == "Y",
                            named_pipeline=row[9],
                            names_own_pipeline=row[10] == "Y",
                            names_upstream_pipeline=row[11] == "Y",
                            on_itself=row[12] == "Y",
                        )
                    )
            elif kind == "PIPELINE_DEPENDENCY":
                pipeline_deps.append(PipelineDependency(row[1], row[4], row[7], row[8] == "Y"))
        if not active:
            return None
        return cls(
            pipeline_code,
            dict(sorted(tasks.items())),
            tuple(sorted(deps, key=lambda d: (d.task_code, d.upstream_code or "", d.dependency_type))),
            tuple(sorted(pipeline_deps, key=lambda d: (d.pipeline_code, d.upstream_code))),
        )

    @property
    def edges(self) -> tuple[TaskEdge, ...]:
        """The dependencies between active tasks of the pipeline (those a DAG draws), by task code."""
        return tuple(
            TaskEdge(d.task_code, d.upstream_code, d.dependency_type)
            for d in self.dependencies
            if d.same_pipeline and d.upstream_code is not None
        )

    def problems(self) -> list[GraphProblem]:
        """Every reason the pipeline cannot run, in the order etl-craft meets them when it builds the graph:
        dependencies on retired tasks of the pipeline, then each dependency's own faults, run conditions,
        cycles of tasks, then what the pipeline waits for elsewhere (retired upstreams, pipeline cycles)."""
        found: list[GraphProblem] = []

        def add(error: type[EtlCraftError], message: str) -> None:
            found.append(GraphProblem(error, self.pipeline_code, message))

        for dep in self.dependencies:
            if dep.on_retired_task_of_own_pipeline:
                add(
                    MetadataError,
                    f"task {dep.task_code} depends on task {dep.upstream_code}, which is retired "
                    f"(ACTIVE_FLAG='N'), so {dep.task_code} could never start; retire the dependency too "
                    f"(CFG_TASK_DEPENDENCY.ACTIVE_FLAG='N') or reactivate {dep.upstream_code}, {_THROUGH}",
                )
        for dep in self.dependencies:
            self._dependency_faults(dep, add)
        for task in self.tasks.values():
            self._run_condition_faults(task, add)
        for cycle in _cycles(self.tasks, [(e.task_code, e.upstream_code) for e in self.edges]):
            add(
                DependencyCycleError,
                f"task dependencies form a cycle ({' -> '.join(cycle)}, each depending on the next), so none "
                f"of these tasks can start; retire one of these dependencies (CFG_TASK_DEPENDENCY.ACTIVE_FLAG='N') "
                f"{_THROUGH}",
            )
        for dep in self.dependencies:
            if not (dep.upstream_code and not dep.names_own_pipeline and dep.names_upstream_pipeline):
                continue
            retired = (
                f"task {dep.upstream_code}"
                if not dep.upstream_active
                else (f"pipeline {dep.upstream_pipeline}" if not dep.upstream_pipeline_active else None)
            )
            if retired:
                add(
                    MetadataError,
                    f"task {dep.task_code} depends on task {dep.upstream_pipeline}.{dep.upstream_code}, whose "
                    f"{retired} is retired (ACTIVE_FLAG='N') and no longer runs, so once its last run is consumed "
                    f"the dependency is never satisfied again; retire the dependency too, or reactivate it, {_THROUGH}",
                )
        self._pipeline_faults(add)
        return found

    def _dependency_faults(self, dep: Dependency, add: _Add) -> None:
        """What is wrong with one dependency row by itself (the Engine's constraints rule most of it out,
        but rows written with constraints off, or by another tool, reach the gates all the same)."""
        task = dep.task_code
        if dep.dependency_type not in DEPENDENCY_TYPES:
            add(
                GraphError,
                f"task {task} has a dependency of unknown DEPENDENCY_TYPE {dep.dependency_type!r}; use one of "
                f"{', '.join(DEPENDENCY_TYPES)}",
            )
        if dep.upstream_code is None:
            add(
                UnknownTaskError,
                f"task {task} depends on a task that is not in CFG_TASKS at all; correct the dependency's "
                f"DEPENDS_ON_TASK_ID, or retire it, {_THROUGH}",
            )
        elif dep.on_itself:
            add(
                SelfDependencyError,
                f"task {task} depends on itself; retire that dependency (CFG_TASK_DEPENDENCY.ACTIVE_FLAG='N') "
                f"{_THROUGH}",
            )
        elif not dep.names_upstream_pipeline:
            if dep.names_own_pipeline:
                where = (
                    f", which is not a task of pipeline {self.pipeline_code} but of {dep.upstream_pipeline}"
                )
            else:
                where = (
                    f" of pipeline {dep.upstream_pipeline}, but the dependency names pipeline "
                    f"{dep.named_pipeline} (DEPENDS_ON_PIPELINE_ID)"
                )
            add(
                UnknownTaskError,
                f"task {task} depends on task {dep.upstream_code}{where}, so its gate would look for a task "
                f"that never runs there; correct DEPENDS_ON_TASK_ID or DEPENDS_ON_PIPELINE_ID {_THROUGH}",
            )

    def _run_condition_faults(self, task: Task, add: _Add) -> None:
        """A run condition that no set of the task's dependencies can meet, or one written wrong."""
        condition, count = task.run_condition, task.run_condition_count
        total = sum(1 for d in self.dependencies if d.task_code == task.code)
        if condition is not None and condition not in RUN_CONDITIONS:
            add(
                GraphError,
                f"task {task.code} has unknown RUN_CONDITION {condition!r}; use ALL (or NULL), ANY or N",
            )
        elif condition != "N" and count is not None:
            add(
                GraphError,
                f"task {task.code} sets RUN_CONDITION_COUNT={count} with RUN_CONDITION="
                f"{'NULL' if condition is None else repr(condition)}, which ignores it; set RUN_CONDITION='N' "
                "or clear the count",
            )
        elif condition == "N" and (count is None or count < 1):
            add(
                GraphError,
                f"task {task.code} has RUN_CONDITION='N' but RUN_CONDITION_COUNT={count!r}; set it to how many "
                "of its dependencies must be satisfied (1 or more)",
            )
        elif condition == "N" and count is not None and count > total:
            add(
                GraphError,
                f"task {task.code} has RUN_CONDITION='N' with RUN_CONDITION_COUNT={count} but only {total} "
                f"active dependenc{'y' if total == 1 else 'ies'}, so it could never run; lower the count or "
                f"add dependencies {_THROUGH}",
            )

    def _pipeline_faults(self, add: _Add) -> None:
        """Dependencies of this pipeline on retired pipelines, and a cycle of pipeline dependencies through it."""
        for dep in self.pipeline_dependencies:
            if dep.pipeline_code == self.pipeline_code and not dep.upstream_active:
                add(
                    MetadataError,
                    f"depends on pipeline {dep.upstream_code}, which is retired (ACTIVE_FLAG='N') and no longer "
                    "runs, so once its last run is consumed the dependency is never satisfied again; retire the "
                    f"dependency too (CFG_PIPELINE_DEPENDENCY.ACTIVE_FLAG='N'), or reactivate the pipeline, {_THROUGH}",
                )
        upstreams: dict[str, set[str]] = {}
        for dep in self.pipeline_dependencies:
            if dep.upstream_active:
                upstreams.setdefault(dep.pipeline_code, set()).add(dep.upstream_code)
        cycle = _path_back(self.pipeline_code, upstreams)
        if cycle:
            add(
                DependencyCycleError,
                f"pipeline dependencies form a cycle ({' -> '.join(cycle)}, each depending on the next), so none "
                f"of these pipelines can start; retire one of these dependencies "
                f"(CFG_PIPELINE_DEPENDENCY.ACTIVE_FLAG='N') {_THROUGH}",
            )


def load_graph(engine: EngineDialect, conn: Connection, pipeline_code: str) -> PipelineGraph | None:
    """The graph of the active pipeline ``pipeline_code`` (one statement, its own transaction on the
    autocommit ``conn``); None when no active pipeline has that code."""
    return PipelineGraph.from_rows(pipeline_code, engine.query_alone(conn, GRAPH_SQL, (pipeline_code,)))


def refuse_invalid(engine: EngineDialect, conn: Connection, pipeline_code: str) -> None:
    """Raise the first problem of the pipeline's graph as its typed error; nothing when it has none (or the
    pipeline is not active: the caller says so).

    :raises GraphError: (or a subclass: SELF_DEPENDENCY, DEPENDENCY_CYCLE, UNKNOWN_TASK) the graph is invalid.
    :raises MetadataError: a dependency on a retired task or pipeline.
    """
    graph = load_graph(engine, conn, pipeline_code)
    problems = [] if graph is None else graph.problems()
    if problems:
        raise problems[0].as_error()


@dataclass(frozen=True)
class ValidationReport:
    """What ``validate`` checked (active pipelines and their active tasks) and every problem it found."""

    pipelines: int
    tasks: int
    problems: tuple[GraphProblem, ...]

    @property
    def failed(self) -> bool:
        return bool(self.problems)

    def as_json(self) -> dict[str, Any]:
        return {
            "pipelines": self.pipelines,
            "tasks": self.tasks,
            "failed": len(self.problems),
            "problems": [p.as_json() for p in self.problems],
        }


def validate(
    engine: EngineDialect, conn: Connection, pipeline_codes: Sequence[str] | None = None
) -> ValidationReport:
    """Check the graph of each active pipeline (``pipeline_codes``, default every one): one statement each."""
    codes = (
        [r[0] for r in engine.query_alone(conn, ACTIVE_PIPELINES_SQL)]
        if pipeline_codes is None
        else list(pipeline_codes)
    )
    tasks, problems = 0, []
    checked = 0
    for code in codes:
        graph = load_graph(engine, conn, code)
        if graph is None:  # retired since it was listed
            continue
        checked += 1
        tasks += len(graph.tasks)
        problems.extend(graph.problems())
    return ValidationReport(checked, tasks, tuple(problems))


# -- cycles ----------------------------------------------------------------------------------------------


def _cycles(nodes: Iterable[str], edges: Sequence[tuple[str, str]]) -> list[list[str]]:
    """One cycle (closed: first == last) per strongly connected set of more than one node, smallest first.

    Tarjan's algorithm with an explicit stack, so a chain longer than Python's recursion limit is fine.
    """
    out: dict[str, list[str]] = {}
    for a, b in edges:
        out.setdefault(a, []).append(b)
    for targets in out.values():
        targets.sort()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(nodes):
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            succ = out.get(node, [])
            if i < len(succ):
                work.append((node, i + 1))
                nxt = succ[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    cycles = []
    for component in sorted(components):
        members = set(component)
        within = {a: {b for b in out.get(a, []) if b in members} for a in members}
        path = _path_back(component[0], within)
        if path:
            cycles.append(path)
    return cycles


def _path_back(start: str, upstreams: Mapping[str, Iterable[str]]) -> list[str]:
    """The shortest closed path ``start -> … -> start`` along ``upstreams`` (breadth first, codes in sorted
    order so the answer is stable); empty when there is none."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(upstreams.get(node, ())):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    return []
