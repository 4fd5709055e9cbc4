"""Recorded task runs: one mechanism (:class:`RecordedTaskMixin`) with three faces.

* :class:`EtlCraftPythonOperator` runs a Python callable;
* ``@etl_craft_task`` (``airflow_provider_etl_craft.decorators``) is the TaskFlow face;
* :func:`recorded` wraps any existing operator class, e.g. ``recorded(SQLExecuteQueryOperator)``.

Each Airflow try opens one ``AUD_TASK_ATTEMPTS`` row (attempt number = try number) on the task's single
``AUD_TASK_RUN_LOG`` row of the keyed run, runs the work, then records SUCCESS with counts or FAILED with
the error (attempt and summary in one transaction) and re-raises, so Airflow's retries apply unchanged.
Start and end borrow the task process's one Engine DB connection (:mod:`~airflow_provider_etl_craft.engine.reuse`):
idle in autocommit while the work runs, no transaction or session setting kept. Nothing heavy is imported
at DAG parse: the hook, the transitions and the drivers load when a try runs (docs/performance.md).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar

from airflow.providers.standard.operators.python import PythonOperator

from airflow_provider_etl_craft import _compat, metrics
from airflow_provider_etl_craft._compat import AirflowSkipException, BaseOperator
from airflow_provider_etl_craft.errors import EtlCraftError
from airflow_provider_etl_craft.lineage.memo import Ended, EngineDb
from airflow_provider_etl_craft.operators import _airflow_view, _lineage, _wait
from airflow_provider_etl_craft.operators._lineage import LineageMixin
from airflow_provider_etl_craft.operators._outcome import airflow_outcome
from airflow_provider_etl_craft.runs.counts import TaskCounts
from airflow_provider_etl_craft.runs.identity import RunIdentity, check_code
from airflow_provider_etl_craft.runs.records import AttemptHandle
from airflow_provider_etl_craft.runs.vocabulary import ATTEMPT_ENDS, AttemptEnd
from airflow_provider_etl_craft.settings import setting

log = logging.getLogger(__name__)

OperatorT = TypeVar("OperatorT", bound=type[BaseOperator])
#: The method a try deferred at its gate resumes in (handled by the mixin, whatever the operator).
GATE_RESUME = "_etl_craft_gate_resumed"
CountsFunc = Callable[[Any], Any]
#: The steps of a recorded try (modules of ``airflow_provider_etl_craft.runs``), loaded while its login runs.
TRY_STEPS = ("attempts", "start")

if TYPE_CHECKING:
    from airflow_provider_etl_craft._compat import BaseOperatorLink
    from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
    from airflow_provider_etl_craft.operators._engine import Ahead
    from airflow_provider_etl_craft.runs.lifecycle import RunLifecycle


def recorded_task_links(own: Collection[BaseOperatorLink] = ()) -> tuple[BaseOperatorLink, ...]:
    """A recorded operator class's extra links: its own, plus "Engine run"
    (:class:`~airflow_provider_etl_craft.plugins.links.EngineRunLink`) when ``[etl_craft] recorded_task_link`` is set.

    Off by default: Airflow 3 computes a link when a try ends and stores it as an XCom through its API (about
    17 ms per task in the deployment tier, and an ``xcom`` row per try), and the page is that of the DAG run,
    the same for every task, which the claim's and the finish's links and the DAG run's Engine run tab open
    already (docs/ui.md). Read when the class is made (an operator class is part of the serialized DAG); the
    link's module, and Airflow's operator-link class under it, load only when it is on.
    """
    if not setting("recorded_task_link"):
        return tuple(own)
    from airflow_provider_etl_craft.plugins.links import EngineRunLink

    return (*own, EngineRunLink())


class RecordedTaskMixin(LineageMixin):  # type-checked as an operator, through LineageMixin's base
    """Adds Engine DB recording to an operator's ``execute`` and ``on_kill``. Put it first in the bases.

    :param pipeline_code: the pipeline this task belongs to (inherited inside ``etl_craft_pipeline``).
    :param task_code: its ``CFG_TASKS.TASK_CODE``; default: the task_id given here, upper-cased
        (``load_orders`` → ``LOAD_ORDERS``), without any task-group prefix. A mapped task (``.expand()``)
        is one etl-craft task: each map index's tries are attempts of its one task run (``MAP_INDEX``).
    :param etl_craft_conn_id: Airflow connection of the Engine DB (inherited, else ``etl_craft_default``).
    :param etl_craft_profile: Engine profile of a file-backed connection.
    :param counts: turns the operator's return value into counts (anything :meth:`TaskCounts.from_result`
        accepts); default: the return value itself is read as counts.
    :param etl_craft_lock_timeout: seconds to wait for the pipeline lock when a cleared task reopens its run.
    :param etl_craft_gate_timeout: how long the task may wait for an IN-PROGRESS upstream or a paused
        pipeline before it fails (the wait is a reschedule: no worker slot is held meanwhile).
    :param etl_craft_gate_poke_interval: how long each reschedule waits before the gate is judged again
        (deferred: the interval of a look made anyway, for what only Airflow knows).
    :param etl_craft_deferrable: wait for the gate deferred instead of rescheduled (default: Airflow's
        ``[operators] default_deferrable``): the triggerer wakes the task within a second of the upstream's
        end or the pause's resume (a PostgreSQL notice; SQLite: its data version).

    Before the work runs, the task's dependencies and run condition are judged (docs/gates.md): unsatisfied
    → the task run is recorded SKIPPED and the task skips; an upstream still IN-PROGRESS, or a paused
    pipeline → the task reschedules itself.

    Airflow's OpenLineage integration, where installed, reports each try with what it recorded (docs/lineage.md).
    """

    #: Marks tasks the claim and finish operators count as the pipeline's tasks.
    etl_craft_records_task = True

    def __init__(
        self,
        *,
        pipeline_code: str | None = None,
        task_code: str | None = None,
        etl_craft_conn_id: str | None = None,
        etl_craft_profile: str | None = None,
        counts: CountsFunc | None = None,
        etl_craft_lock_timeout: float | None = None,
        etl_craft_gate_timeout: timedelta | float | None = None,
        etl_craft_gate_poke_interval: timedelta | float | None = None,
        etl_craft_deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        raw_task_id = kwargs.get("task_id")
        code = (
            task_code
            if task_code is not None
            else (default_task_code(str(raw_task_id)) if raw_task_id else None)
        )
        code = check_code("task_code", code) if code is not None else None
        if pipeline_code is not None:
            check_code("pipeline_code", pipeline_code)
        super().__init__(**kwargs)  # BaseOperator accepts attributes only once it is initialised
        self.pipeline_code = pipeline_code
        self.task_code = code
        self.etl_craft_conn_id = etl_craft_conn_id
        self.etl_craft_profile = etl_craft_profile
        self.etl_craft_counts = counts
        # None: the [etl_craft] default, read where a try needs it (the properties below), not at each parse.
        self._etl_craft_given_lock_timeout = etl_craft_lock_timeout
        self._etl_craft_given_gate_timeout = (
            None if etl_craft_gate_timeout is None else _seconds(etl_craft_gate_timeout)
        )
        self._etl_craft_given_gate_poke_interval = (
            None if etl_craft_gate_poke_interval is None else _seconds(etl_craft_gate_poke_interval)
        )
        # None: Airflow's [operators] default_deferrable when the task runs (etl_craft_pipeline may set it).
        self.etl_craft_deferrable = etl_craft_deferrable
        self._etl_craft_attempt: AttemptHandle | None = None
        self._etl_craft_killed = False
        self._etl_craft_engine: EngineDialect | None = None
        #: The Engine DB work this try began when Airflow prepared it (:meth:`prepare_for_execution`).
        self._etl_craft_ahead: Ahead | None = None
        #: What this try recorded, and in which DAG run: its OpenLineage facet (docs/lineage.md) reads them.
        self._etl_craft_ended: Ended | None = None
        self._etl_craft_run_key: str | None = None

    # The defaults are read when a try uses them: a DAG parse builds every task of the file, and Airflow's
    # configuration lookup is the costliest part of building a recorded task (docs/performance.md).
    @property
    def etl_craft_lock_timeout(self) -> float:
        """Seconds to wait for the pipeline lock: the argument, else ``[etl_craft] lock_timeout``."""
        given = self._etl_craft_given_lock_timeout
        return float(setting("lock_timeout") if given is None else given)

    @property
    def etl_craft_gate_timeout(self) -> float:
        """Seconds the gate may wait: the argument, else ``[etl_craft] gate_timeout``."""
        given = self._etl_craft_given_gate_timeout
        return float(setting("gate_timeout") if given is None else given)

    @property
    def etl_craft_gate_poke_interval(self) -> float:
        """Seconds between two looks of a waiting gate: the argument, else ``[etl_craft] gate_poke_interval``."""
        given = self._etl_craft_given_gate_poke_interval
        return float(setting("gate_poke_interval") if given is None else given)

    def _etl_craft_try_engine(self) -> EngineDialect:
        """This try's Engine DB on the process's connection (the profile read once per try, as the hook reads
        it, but without the hook: common-sql stays unimported).

        A try's first use takes what :meth:`prepare_for_execution` began (the modules, and on Airflow 3.2+ the
        profile and the login), else begins it here (docs/performance.md, "In the task process")."""
        from airflow_provider_etl_craft.operators._engine import try_engine

        if self._etl_craft_engine is None:
            ahead, self._etl_craft_ahead = self._etl_craft_ahead, None
            self._etl_craft_engine = try_engine(*self._etl_craft_engine_key(), *TRY_STEPS, ahead=ahead)
        return self._etl_craft_engine

    def _etl_craft_engine_key(self) -> tuple[str, str | None]:
        return self.etl_craft_conn_id or setting("default_conn_id"), self.etl_craft_profile

    def prepare_for_execution(self) -> Any:
        """Airflow's task runner calls this first when it runs the task, then renders its templates and stores
        them through Airflow's API: the try's Engine DB work begins here, in a thread, to run while the runner
        waits (:func:`~airflow_provider_etl_craft.operators._engine.engine_ahead`)."""
        prepared = super().prepare_for_execution()
        if self.pipeline_code and self.task_code:
            from airflow_provider_etl_craft.operators._engine import engine_ahead

            prepared._etl_craft_ahead = engine_ahead(*self._etl_craft_engine_key(), *TRY_STEPS)
        return prepared

    def _etl_craft_lifecycle(self) -> AbstractContextManager[RunLifecycle]:
        """The run lifecycle on this try's Engine DB (:meth:`_etl_craft_try_engine`)."""
        from airflow_provider_etl_craft.runs.lifecycle import lent_lifecycle

        return lent_lifecycle(self._etl_craft_try_engine(), self.etl_craft_lock_timeout)

    def execute(self, context: Any) -> Any:
        # A try that comes back after reschedules (a sensor's poke) takes over the attempt it parked.
        resume = int(context.get("task_reschedule_count") or 0) > 0
        return self._etl_craft_record(
            context, lambda: super(RecordedTaskMixin, self).execute(context), resume=resume
        )

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Any) -> Any:
        """A deferred try resumes (``execute_complete`` or the deferral's ``method_name``) in its attempt; one
        deferred at its gate judges the gate again (no attempt was opened yet)."""
        if next_method == GATE_RESUME:
            kwargs = next_kwargs or {}
            event = kwargs.get("event") or {}
            return self._etl_craft_record(
                context,
                lambda: super(RecordedTaskMixin, self).execute(context),
                resume=int(context.get("task_reschedule_count") or 0) > 0,
                gate_deadline=kwargs.get("deadline") or event.get("deadline"),
                gate_event=event,
            )
        return self._etl_craft_record(
            context,
            lambda: super(RecordedTaskMixin, self).resume_execution(next_method, next_kwargs, context),
            resume=True,
        )

    def _etl_craft_record(
        self,
        context: Any,
        work: Callable[[], Any],
        *,
        resume: bool,
        gate_deadline: str | None = None,
        gate_event: Mapping[str, Any] | None = None,
    ) -> Any:
        """Open (or take over) this try's attempt, run ``work``, record how it ended; Airflow sees ``work``'s outcome.

        ``gate_deadline`` and ``gate_event`` come back from a deferred gate wait (:meth:`_etl_craft_start`).
        """
        if not self.pipeline_code or not self.task_code:
            raise _compat.fail_exception()(
                f"[CONFIGURATION] task {self.task_id} records to no pipeline: pass pipeline_code= (and task_code= "
                "if its task_id is not the code) or create it inside etl_craft_pipeline(...)"
            )
        identity = RunIdentity.from_context(context)
        self._etl_craft_ended, self._etl_craft_run_key = None, identity.run_key
        if identity.temporary:
            self.log.info(
                "etl-craft: %s runs unrecorded: %s is a temporary DAG run (airflow tasks test), which "
                "has no Engine run; nothing is written to the Engine DB",
                self.task_code,
                identity.run_id,
            )
            return work()
        handle = self._etl_craft_start(
            context,
            identity,
            resume=resume,
            gate_deadline=gate_deadline,
            gate_expired=(gate_event or {}).get("status") == "timeout",
        )
        return self._etl_craft_run(context, handle, work)

    def _etl_craft_start(
        self,
        context: Any,
        identity: RunIdentity,
        *,
        resume: bool,
        gate_deadline: str | None,
        gate_expired: bool,
    ) -> AttemptHandle:
        """Open (or take over) this try's attempt once the gate lets it: a gate that skips skips the task, one
        that waits reschedules it or defers it (:func:`~airflow_provider_etl_craft.operators._wait.look_or_defer`).
        """
        self._etl_craft_engine = None  # resolved again for each try
        with airflow_outcome():  # begun ahead (prepare_for_execution): taken before the try's own imports
            self._etl_craft_try_engine()
        from airflow_provider_etl_craft.runs.gates import GateSkipped, GateWaiting

        pipeline_code, task_code = self.pipeline_code or "", self.task_code or ""
        ti = context["ti"]
        deferrable = (
            _wait.default_deferrable() if self.etl_craft_deferrable is None else self.etl_craft_deferrable
        )

        def look() -> _wait.Look[AttemptHandle]:
            try:
                with airflow_outcome(), self._etl_craft_lifecycle() as lifecycle:
                    handle = lifecycle.start_task(
                        pipeline_code,
                        task_code,
                        identity,
                        int(ti.try_number),
                        upstream_states=self._etl_craft_upstream_states(context),
                        claim_skipped=lambda: self._etl_craft_claim_skipped(context),
                        map_index=_map_index(ti),
                        resume=resume,
                    )
                return _wait.Look(done=True, value=handle)
            except GateSkipped as skipped:
                self.log.info("etl-craft: %s", skipped.reason)
                raise AirflowSkipException(skipped.reason) from None
            except GateWaiting as waiting:
                if not deferrable:
                    self._etl_craft_wait(context, waiting.reason)
                return _wait.Look(done=False, reason=waiting.reason)

        handle = _wait.look_or_defer(
            self,
            look,
            self._etl_craft_gate_wait(),
            timeout=self.etl_craft_gate_timeout,
            carried=gate_deadline,
            expired=gate_expired,
            timed_out=lambda looked: self._etl_craft_gate_timeout(
                looked.reason or "", self.etl_craft_gate_timeout
            ),
            engine=self._etl_craft_try_engine,
        )
        assert handle is not None  # a look that is done carries the attempt
        return handle

    def _etl_craft_gate_wait(self) -> _wait.Wait:
        """What a deferred gate wait watches: its pipeline's runs and pauses."""
        return _wait.Wait(
            engine_db=(self.etl_craft_conn_id or setting("default_conn_id"), self.etl_craft_profile),
            pipeline_code=self.pipeline_code or "",
            recheck_after=self.etl_craft_gate_poke_interval,
            method_name=GATE_RESUME,
        )

    def _etl_craft_run(self, context: Any, handle: AttemptHandle, work: Callable[[], Any]) -> Any:
        """Run ``work`` in the open attempt and record its end: SUCCESS with its counts, else what it raised."""
        self._etl_craft_attempt = handle
        map_index = _map_index(context["ti"])
        self.log.info(
            "etl-craft: %s attempt %d%s (ATTEMPT_ID %d) in pipeline run %d",
            self.task_code,
            handle.attempt_number,
            "" if map_index is None else f" of map index {map_index}",
            handle.attempt_id,
            handle.pipeline_run_id,
        )
        try:
            result = work()
            counts = TaskCounts.from_result(
                self.etl_craft_counts(result) if self.etl_craft_counts else result
            )
        except BaseException as exc:
            if self._etl_craft_attempt is not None:  # else on_kill has recorded it CANCELLED already
                self._etl_craft_record_exception(handle, exc, context)
            raise
        with airflow_outcome():
            self._record_end(handle, AttemptEnd.SUCCESS, counts=counts, context=context)
        self.log.info("etl-craft: %s SUCCESS %s", self.task_code, _format_counts(counts))
        return result

    def _etl_craft_record_exception(self, handle: AttemptHandle, exc: BaseException, context: Any) -> None:
        """Record what an exception from the work means: Airflow's control-flow signals are not failures."""
        signal = _control_flow(exc)
        if signal == "PARK":
            self._etl_craft_attempt = None
            try:
                with self._etl_craft_lifecycle() as lifecycle:
                    lifecycle.park_task(handle, _park_note(exc))
                metrics.attempt(self.pipeline_code or "", self.task_code or "", "PARKED")
            except EtlCraftError as err:
                metrics.engine_error(err.status_name, err.retryable)
                self.log.error("etl-craft: could not park %s's attempt: %s", self.task_code, err)
        elif signal == AttemptEnd.SUCCESS:  # a branch or short-circuit operator skipping its downstream tasks
            self._record_end(handle, AttemptEnd.SUCCESS, context=context, quiet=True)
        elif signal == AttemptEnd.SKIPPED:
            self._record_end(
                handle, AttemptEnd.SKIPPED, error=str(exc) or type(exc).__name__, context=context, quiet=True
            )
        else:
            status = AttemptEnd.CANCELLED if self._etl_craft_killed else _end_status(exc)
            self._record_end(handle, status, error=_describe(exc), context=context, quiet=True)

    def _etl_craft_upstream_states(self, context: Any) -> Callable[[Sequence[str]], Mapping[str, str | None]]:
        """Airflow's state of same-pipeline upstream tasks (by task code) in this DAG run."""

        def states(codes: Sequence[str]) -> Mapping[str, str | None]:
            task_ids = pipeline_tasks(self.dag, self.pipeline_code or "")
            wanted = {code: task_ids[code] for code in codes if code in task_ids}
            found = _airflow_view.task_states(context, wanted.values())
            return {code: found.get(task_id) for code, task_id in wanted.items()}

        return states

    def _etl_craft_claim_skipped(self, context: Any) -> bool:
        """Whether the claim task of this pipeline skipped in this DAG run (asked only when the run has ended)."""
        claims = [
            t.task_id
            for t in self.dag.tasks
            if getattr(t, "etl_craft_claims_pipeline", False)
            and getattr(t, "pipeline_code", None) == self.pipeline_code
        ]
        return any(state == "skipped" for state in _airflow_view.task_states(context, claims).values())

    def _etl_craft_wait(self, context: Any, reason: str) -> NoReturn:
        """Reschedule (no worker slot held) until the gate timeout, then fail naming what was waited for."""
        now = datetime.now(UTC)
        first = _compat.first_reschedule_date(context) or now
        waited = (now - first).total_seconds()
        if waited >= self.etl_craft_gate_timeout:
            raise self._etl_craft_gate_timeout(reason, waited)
        interval = _wait.reschedule_interval(self.etl_craft_gate_poke_interval)
        self.log.info("etl-craft: %s; looking again in %.0fs", reason, interval)
        raise _compat.airflow_exception("AirflowRescheduleException")(now + timedelta(seconds=interval))

    def _etl_craft_gate_timeout(self, reason: str, waited: float) -> Exception:
        return _compat.fail_exception()(
            f"[GATE_TIMEOUT] {reason}; still not decided after {waited:.0f}s (etl_craft_gate_timeout="
            f"{self.etl_craft_gate_timeout:.0f}s): let the upstream run end (or resume the pipeline), then clear "
            "this task"
        )

    def _record_end(
        self,
        handle: AttemptHandle,
        status: AttemptEnd,
        *,
        counts: TaskCounts | None = None,
        error: str | None = None,
        quiet: bool = False,
        context: Any = None,
    ) -> None:
        """Record the end of the attempt; ``quiet`` when the work's own error must not be hidden by ours."""
        self._etl_craft_attempt = None
        try:
            map_count = None if handle.map_index is None or context is None else _map_count(context)
            with self._etl_craft_lifecycle() as lifecycle:
                lifecycle.finish_task(handle, status, counts, error, map_count=map_count)
                target = _declared_target(lifecycle, handle) if _lineage.listening() else None
            self._etl_craft_ended = _ended(lifecycle.engine, handle, status, counts, target)
            metrics.attempt(self.pipeline_code or "", self.task_code or "", status)
        except EtlCraftError as exc:
            if not quiet:
                raise
            metrics.engine_error(exc.status_name, exc.retryable)
            self.log.error("etl-craft: could not record %s for %s: %s", status, self.task_code, exc)

    def on_kill(self) -> None:
        """Record the live attempt CANCELLED, then let the operator clean up its own work."""
        self._etl_craft_killed = True
        handle = self._etl_craft_attempt
        if handle is not None:
            self._record_end(
                handle,
                AttemptEnd.CANCELLED,
                error="cancelled: Airflow killed the task (on_kill)",
                quiet=True,
            )
        super().on_kill()


def _declared_target(lifecycle: Any, handle: AttemptHandle) -> str | None:
    """The task's active ``TARGET_OBJECT``, for its OpenLineage output dataset: one read on the try's own
    connection, made only where the listener runs (it would otherwise connect from each fork of its own).
    None when the task declares none; a failed read is logged and never fails the try."""
    from airflow_provider_etl_craft.runs.parameters import TARGET_OBJECT, task_parameter

    try:
        value = task_parameter(lifecycle.engine, lifecycle.conn, handle.task_run_id, TARGET_OBJECT)
    except Exception as exc:  # noqa: BLE001 - lineage never fails a task: the event goes out without it
        log.warning("etl-craft: no %s for the OpenLineage event of task run %s: %s", TARGET_OBJECT,
                    handle.task_run_id, exc)  # fmt: skip
        return None
    return value.strip() if value and value.strip() else None


def _ended(
    engine: EngineDialect,
    handle: AttemptHandle,
    status: AttemptEnd,
    counts: TaskCounts | None,
    target_object: str | None = None,
) -> Ended:
    """The attempt's end as written: its status, its task run's (unmapped), its counts; the declared target."""
    attempt_status, run_status = ATTEMPT_ENDS[AttemptEnd(status)]
    return Ended(
        engine_db=EngineDb.of(engine),
        pipeline_run_id=handle.pipeline_run_id,
        task_run_id=handle.task_run_id,
        attempt_number=handle.attempt_number,
        map_index=handle.map_index,
        attempt_status=str(attempt_status),
        task_run_status=None if handle.map_index is not None else str(run_status),
        counts=(counts or TaskCounts()).values(),
        target_object=target_object,
    )


def _seconds(value: timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


#: Exceptions that end an attempt TIMED_OUT: execution_timeout, a sensor's timeout, a trigger's timeout.
_TIMEOUTS = ("AirflowTaskTimeout", "AirflowSensorTimeout", "TaskDeferralTimeout")


def _end_status(exc: BaseException) -> AttemptEnd:
    """TIMED_OUT for Airflow's timeouts, else FAILED."""
    timeouts = tuple(_compat.airflow_exception(name) for name in _TIMEOUTS)
    return AttemptEnd.TIMED_OUT if isinstance(exc, timeouts) else AttemptEnd.FAILED


def _control_flow(exc: BaseException) -> AttemptEnd | Literal["PARK"] | None:
    """What an Airflow control-flow exception means for the attempt (None: the work failed).

    PARK: the try goes on later (a reschedule, a deferral); SUCCESS: the task succeeded and skipped its
    downstream tasks (branch, short-circuit); SKIPPED: the task skipped itself (also a sensor's soft fail).
    """
    if isinstance(
        exc,
        _compat.airflow_exception("TaskDeferred") | _compat.airflow_exception("AirflowRescheduleException"),
    ):
        return "PARK"
    if isinstance(exc, _compat.airflow_exception("DownstreamTasksSkipped")):
        return AttemptEnd.SUCCESS
    if isinstance(exc, AirflowSkipException):
        return AttemptEnd.SKIPPED
    return None


def _park_note(exc: BaseException) -> str:
    """TASK_LOG of a parked attempt: what it waits for."""
    when = getattr(exc, "reschedule_date", None)
    if when is not None:
        return f"rescheduled by Airflow: the next poke is due at {when:%Y-%m-%dT%H:%M:%S}Z"
    trigger = type(getattr(exc, "trigger", None)).__name__
    return f"deferred by Airflow to {trigger}; resumes in {getattr(exc, 'method_name', 'execute_complete')}"


def _map_index(ti: Any) -> int | None:
    """The instance of a mapped task (None for an unmapped task, whose Airflow map index is -1)."""
    index = getattr(ti, "map_index", -1)
    return None if index is None or int(index) < 0 else int(index)


def _map_count(context: Any) -> int | None:
    """How many instances Airflow expanded this mapped task into (None when Airflow cannot say)."""
    ti = context["ti"]
    try:
        return int(ti.get_ti_count(dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id]))
    except Exception:  # noqa: BLE001 - the supervisor's error types differ by Airflow line; settle without it
        return None


def _describe(exc: BaseException) -> str:
    """The error as stored: type and message, with registered secrets masked."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return str(_compat.redact(text))


def _format_counts(counts: TaskCounts) -> str:
    names = ("source", "target", "insert", "update", "delete", "rows_written")
    shown = [f"{n}={v}" for n, v in zip(names, counts.values(), strict=True) if v is not None]
    return ", ".join(shown) if shown else "(no counts)"


_RECORDED: dict[type, type] = {}


def with_recording_arguments(init: Callable[..., None]) -> Callable[..., None]:
    """Show :class:`RecordedTaskMixin`'s keyword arguments in ``init``'s signature.

    Airflow's operator metaclass reads each ``__init__`` signature of an operator class to apply
    ``default_args`` and to validate ``.partial()`` / ``.expand()`` arguments, so a recorded operator must
    declare ``pipeline_code``, ``counts``, … there, or mapping it refuses them.
    """
    own = inspect.signature(init)
    params = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in params}
    params += [
        p
        for p in inspect.signature(RecordedTaskMixin.__init__).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in names
    ]
    params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    # A function takes __signature__ (inspect reads it); Callable's type does not declare the attribute.
    init.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
    return init


@with_recording_arguments
def _init(self: Any, **kwargs: Any) -> None:
    # Defined in the class body so Airflow's operator metaclass wraps it (default_args, init checks).
    RecordedTaskMixin.__init__(self, **kwargs)


def recorded(operator_class: OperatorT) -> OperatorT:
    """A subclass of ``operator_class`` whose runs are recorded in the Engine DB.

    ``recorded(SQLExecuteQueryOperator)(task_id="load_orders", conn_id="warehouse", sql=…, counts=…)`` takes
    the operator's own arguments plus :class:`RecordedTaskMixin`'s. The same class is returned for the same
    operator class, so DAG files may call this at module level freely.
    """
    if not (isinstance(operator_class, type) and issubclass(operator_class, BaseOperator)):
        raise TypeError(f"recorded() takes an operator class, not {operator_class!r}")
    if issubclass(operator_class, RecordedTaskMixin):
        return operator_class
    cls = _RECORDED.get(operator_class)
    if cls is None:
        cls = type(
            f"Recorded{operator_class.__name__}",
            (RecordedTaskMixin, operator_class),
            {
                "__module__": __name__,
                "__init__": _init,
                "operator_extra_links": recorded_task_links(operator_class.operator_extra_links),
                "__doc__": f"{operator_class.__name__}, recorded in the etl-craft Engine DB.",
            },
        )
        _RECORDED[operator_class] = cls
    return cls  # type: ignore[return-value]  # type() made a subclass of operator_class, unseen by mypy


class EtlCraftPythonOperator(RecordedTaskMixin, PythonOperator):
    """Run a Python callable as an etl-craft task; its return value gives the counts (see :class:`TaskCounts`)."""

    ui_color = "#dff3e4"
    operator_extra_links = recorded_task_links(PythonOperator.operator_extra_links)

    @with_recording_arguments
    def __init__(self, **kwargs: Any) -> None:  # here so Airflow's operator metaclass wraps it
        super().__init__(**kwargs)


def default_task_code(task_id: str) -> str:
    """``load_orders`` → ``LOAD_ORDERS``; a task-group prefix (``daily_sales.load_orders``) is not part of it."""
    return task_id.rsplit(".", 1)[-1].upper()


def recorded_task(task: Any) -> tuple[str | None, str | None] | None:
    """``(pipeline_code, task_code)`` of a recorded task, plain or mapped (``.partial().expand()``); else None.

    A mapped task keeps its operator's arguments in ``partial_kwargs`` until Airflow expands it.
    """
    if getattr(task, "is_mapped", False):  # a MappedOperator
        if not issubclass(task.operator_class, RecordedTaskMixin):
            return None
        kwargs = task.partial_kwargs
        return kwargs.get("pipeline_code"), kwargs.get("task_code") or default_task_code(task.task_id)
    if getattr(task, "etl_craft_records_task", False):
        return task.pipeline_code, task.task_code
    return None


def is_mapped(task: Any) -> bool:
    """Whether Airflow runs ``task`` as map indexes: mapped itself, or inside a mapped task group."""
    if getattr(task, "is_mapped", False):
        return True
    closest = getattr(task, "get_closest_mapped_task_group", None)
    return closest is not None and closest() is not None


def pipeline_tasks(dag: Any, pipeline_code: str) -> dict[str, str]:
    """The DAG's recorded tasks of ``pipeline_code`` (mapped ones included, once): ``{task_code: task_id}``.

    :raises ValueError: two tasks of the pipeline share a task code.
    """
    found: dict[str, str] = {}
    for task in getattr(dag, "tasks", ()):
        record = recorded_task(task)
        if record is None or record[0] != pipeline_code or record[1] is None:
            continue
        code = record[1]
        if code in found:
            raise ValueError(
                f"tasks {found[code]} and {task.task_id} of DAG {dag.dag_id} both record task code "
                f"{code} of pipeline {pipeline_code}; give one of them another task_code="
            )
        found[code] = task.task_id
    return found


def airflow_states_by_code(
    tasks: Mapping[str, str], states: Mapping[str, str | None]
) -> dict[str, str | None]:
    """Re-key Airflow task states from task_id to task code."""
    return {code: states.get(task_id) for code, task_id in tasks.items()}
