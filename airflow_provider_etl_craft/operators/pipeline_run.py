"""Claim and finish an etl-craft pipeline run around a DAG run's tasks (docs/lifecycle.md)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_etl_craft import _compat, metrics
from airflow_provider_etl_craft._compat import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    Asset,
    BaseOperator,
    BaseSensorOperator,
    PokeReturnValue,
)
from airflow_provider_etl_craft.lineage.memo import Claimed, DagRunRef, EngineDb, Finished
from airflow_provider_etl_craft.operators import _airflow_view, _wait
from airflow_provider_etl_craft.operators._lineage import LineageMixin
from airflow_provider_etl_craft.operators._outcome import airflow_outcome
from airflow_provider_etl_craft.operators._renamed import renamed
from airflow_provider_etl_craft.operators._topology import require_same_machine
from airflow_provider_etl_craft.operators.task_run import airflow_states_by_code, is_mapped, pipeline_tasks
from airflow_provider_etl_craft.runs.identity import RunIdentity, check_code
from airflow_provider_etl_craft.runs.records import RunRow
from airflow_provider_etl_craft.runs.vocabulary import ClaimAction, RunStatus
from airflow_provider_etl_craft.settings import setting

if TYPE_CHECKING:
    from airflow_provider_etl_craft._compat import BaseOperatorLink
    from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
    from airflow_provider_etl_craft.operators._engine import Ahead
    from airflow_provider_etl_craft.runs.lifecycle import RunLifecycle

#: Retries a claim has at least, whatever the DAG's: a claim's retry is idempotent (it resumes its own run),
#: and Airflow can fail a sensor that is up for reschedule on a late executor event (apache/airflow#71172).
DEFAULT_CLAIM_MIN_RETRIES = 3
DEFAULT_CLAIM_RETRY_DELAY = timedelta(seconds=10)
#: Where a finish keeps its outlets, and whether its pipeline Asset is still to be appended to them.
_OUTLETS, _PENDING_ASSET = "_etl_craft_outlets", "_etl_craft_asset_pending"
#: Claim actions that leave this DAG run's run IN-PROGRESS.
_GOT_RUN = (ClaimAction.CREATED, ClaimAction.RESUMED, ClaimAction.REOPENED)


def pipeline_asset(pipeline_code: str, etl_craft_conn_id: str | None = None) -> Asset:
    """The Airflow Asset a SUCCESS run of ``pipeline_code`` updates: ``etl-craft://<conn id>/<PIPELINE_CODE>``.

    Schedule a downstream pipeline DAG on it (``schedule=[pipeline_asset("DAILY_SALES")]``); the Engine
    gate still judges the dependency when that DAG run claims. The connection id names the Engine DB (its
    schema is only known once connected, and DAG files must not connect at parse time).
    """
    conn_id = etl_craft_conn_id or setting("default_conn_id")
    return Asset(f"etl-craft://{conn_id}/{check_code('pipeline_code', pipeline_code)}")


class _EngineRunLinks:
    """The claim's and the finish's ``operator_extra_links``: "Engine run" (docs/ui.md), made on first read.

    A descriptor, read on the class as on an operator: Airflow reads the links when it serializes the DAG and when
    a claim's or a finish's try ends. Every task process of a pipeline DAG parses the claim and the finish, and a
    recorded task's never reads their links, so it never loads the link's module and Airflow's operator-link
    class under it (docs/performance.md).
    """

    def __get__(self, instance: object, owner: type | None = None) -> tuple[BaseOperatorLink, ...]:
        return _engine_run_links()


@functools.cache
def _engine_run_links() -> tuple[BaseOperatorLink, ...]:
    from airflow_provider_etl_craft.plugins.links import EngineRunLink

    return (EngineRunLink(),)


class _PipelineOperatorMixin(LineageMixin):
    operator_extra_links = _EngineRunLinks()
    pipeline_code: str
    etl_craft_conn_id: str
    etl_craft_profile: str | None
    etl_craft_lock_timeout: float

    def _engine_db(
        self,
        etl_craft_conn_id: str | None,
        profile: tuple[str | None, str | None],
        lock_timeout: tuple[float | None, float | None],
    ) -> None:
        """Set the Engine DB arguments; ``profile`` and ``lock_timeout`` are (new name's, old name's) values."""
        where = type(self).__name__
        self.etl_craft_conn_id = etl_craft_conn_id or setting("default_conn_id")
        self.etl_craft_profile = renamed(where, ("etl_craft_profile", profile[0]), ("profile", profile[1]))
        timeout = renamed(
            where, ("etl_craft_lock_timeout", lock_timeout[0]), ("lock_timeout", lock_timeout[1])
        )
        self.etl_craft_lock_timeout = setting("lock_timeout") if timeout is None else timeout

    #: The run lifecycle's step this operator's tries take (a module of ``airflow_provider_etl_craft.runs``).
    _etl_craft_step: str
    #: The Engine DB work this try began when Airflow prepared it (:meth:`prepare_for_execution`).
    _etl_craft_ahead: Ahead | None = None

    def _engine(self, step: str) -> EngineDialect:
        """This try's Engine DB (the process's one connection, its login started; docs/performance.md): the
        module of the run lifecycle's ``step`` loads meanwhile."""
        from airflow_provider_etl_craft.operators._engine import try_engine

        ahead, self._etl_craft_ahead = self._etl_craft_ahead, None
        return try_engine(self.etl_craft_conn_id, self.etl_craft_profile, step, ahead=ahead)

    def prepare_for_execution(self) -> Any:
        """Airflow's task runner calls this first when it runs the task: the try's Engine DB work begins here
        (:func:`~airflow_provider_etl_craft.operators._engine.engine_ahead`), carried by the copy it runs."""
        from airflow_provider_etl_craft.operators._engine import engine_ahead

        prepared = super().prepare_for_execution()
        prepared._etl_craft_ahead = engine_ahead(
            self.etl_craft_conn_id, self.etl_craft_profile, self._etl_craft_step
        )
        return prepared

    def _lifecycle(self, engine: EngineDialect) -> AbstractContextManager[RunLifecycle]:
        from airflow_provider_etl_craft.runs.lifecycle import lent_lifecycle

        return lent_lifecycle(engine, self.etl_craft_lock_timeout)


class ClaimPipelineRunOperator(_PipelineOperatorMixin, BaseSensorOperator):
    """Claim this DAG run's Engine run of ``pipeline_code``; push its ``PIPELINE_RUN_ID``.

    Under the ``pipeline:<code>`` lock: the pipeline must be active and (with ``check_task_codes``) its
    active ``CFG_TASKS`` must be exactly the DAG's recorded tasks of the pipeline. A claim retried by
    Airflow resumes its own IN-PROGRESS run; a cleared DAG run reopens its ended run (REOPEN intervention).
    While another run of the pipeline is IN-PROGRESS the claim waits in ``reschedule`` mode, so no worker
    slot is held, for up to ``timeout``; when that run's own Airflow DAG run has already ended (or no longer
    exists), the run is closed as abandoned (CANCELLED, with a CANCEL intervention) and the claim proceeds.
    Runs started outside Airflow are never closed from here: the claim waits for them. A paused pipeline,
    or pipeline dependencies that are not satisfied (docs/gates.md), record the run SKIPPED and skip the DAG
    run; an upstream pipeline still IN-PROGRESS makes the claim wait the same way.

    :param pipeline_code: ``CFG_PIPELINES.PIPELINE_CODE``.
    :param etl_craft_conn_id: Airflow connection of the Engine DB.
    :param etl_craft_profile: Engine profile of a file-backed connection (``profile=`` before 0.2, deprecated).
    :param etl_craft_lock_timeout: seconds to wait for the pipeline lock (then a retryable LOCK_TIMEOUT;
        default ``[etl_craft] lock_timeout``; ``lock_timeout=`` before 0.2, deprecated).
    :param check_task_codes: compare the DAG's task codes with the pipeline's active tasks.
    :param close_abandoned: close blocking runs whose Airflow DAG run has ended.
    :param min_retries: the claim's own retries, independent of the DAG's ``default_args`` (a ``retries=``
        given to the claim itself may raise them; ``retry_delay`` defaults to 10 s). Waiting never uses a
        try, and a retried claim only resumes its own run.
    :param deferrable: wait deferred instead of rescheduled (default: Airflow's ``[operators]
        default_deferrable``): the triggerer wakes the claim within a second of the blocking run's end (a
        PostgreSQL notice; SQLite: its data version) rather than after ``poke_interval``, which becomes the
        interval of a look made anyway (for a blocking run whose DAG run ended without finishing it).
        In reschedule mode ``poke_interval`` is at least ``[etl_craft] wait_hand_back_delay``; a deferred
        claim is never handed back sooner than that after it deferred (docs/deferred-waits.md).
    """

    _etl_craft_step = "claim"

    template_fields: Sequence[str] = ()
    ui_color = "#fdf1d6"
    #: Marks the claim task, which recorded tasks ask about when their run was skipped at claim.
    etl_craft_claims_pipeline = True

    def __init__(
        self,
        *,
        pipeline_code: str,
        etl_craft_conn_id: str | None = None,
        etl_craft_profile: str | None = None,
        etl_craft_lock_timeout: float | None = None,
        check_task_codes: bool = True,
        close_abandoned: bool = True,
        mode: str | None = None,
        poke_interval: timedelta | float | None = None,
        timeout: timedelta | float | None = None,
        min_retries: int = DEFAULT_CLAIM_MIN_RETRIES,
        deferrable: bool | None = None,
        profile: str | None = None,
        lock_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs["retries"] = max(int(kwargs.get("retries") or 0), min_retries)
        kwargs.setdefault("retry_delay", DEFAULT_CLAIM_RETRY_DELAY)
        mode = mode or setting("wait_mode")
        interval = setting("claim_poke_interval") if poke_interval is None else poke_interval
        if isinstance(interval, timedelta):
            interval = interval.total_seconds()
        if mode == "reschedule":  # never due before Airflow can have taken in the poke that asked for it
            interval = _wait.reschedule_interval(interval)
        super().__init__(
            mode=mode,
            poke_interval=interval,
            timeout=setting("claim_timeout") if timeout is None else timeout,
            **kwargs,
        )
        self.pipeline_code = check_code("pipeline_code", pipeline_code)
        self._engine_db(
            etl_craft_conn_id, (etl_craft_profile, profile), (etl_craft_lock_timeout, lock_timeout)
        )
        self.check_task_codes = check_task_codes
        self.close_abandoned = close_abandoned
        self.deferrable = _wait.default_deferrable() if deferrable is None else deferrable
        self._blocking: RunRow | None = None
        self._waiting: str | None = None
        #: The deadline a deferred wait carried back, and when this claim first looked (for its claim wait).
        self._carried_deadline: str | None = None
        self._first_look: datetime | None = None
        #: The run this claim got or skipped: its OpenLineage facet reads it (docs/lineage.md).
        self._etl_craft_claimed: Claimed | None = None
        #: This try's Engine DB (:meth:`_claim_engine`); None until the try's first look.
        self._try_engine: EngineDialect | None = None

    def execute(self, context: Any) -> Any:
        self._try_engine = None  # a new try reads its profile again
        if self.deferrable:
            return self._look_or_defer(context, None)
        try:
            return super().execute(context)
        except AirflowSensorTimeout as exc:
            raise self._timed_out() from exc

    def execute_complete(
        self, context: Any, event: dict[str, Any] | None = None, deadline: str | None = None
    ) -> Any:
        """Back from the trigger: look again (and defer again while the claim must still wait)."""
        event = event or {}
        deadline = deadline or event.get("deadline")
        self._carried_deadline = deadline
        self._try_engine = None  # a resumed try is a try of its own
        return self._look_or_defer(context, deadline, expired=event.get("status") == "timeout")

    def _look_or_defer(self, context: Any, deadline: str | None, *, expired: bool = False) -> Any:
        def look() -> _wait.Look[Any]:
            result = self.poke(context)
            return _wait.Look(done=result.is_done, value=result.xcom_value)

        wait = _wait.Wait(
            engine_db=(self.etl_craft_conn_id, self.etl_craft_profile),
            pipeline_code=self.pipeline_code,
            recheck_after=float(self.poke_interval),
            method_name="execute_complete",
            claim=True,
        )
        return _wait.look_or_defer(
            self,
            look,
            wait,
            timeout=float(self.timeout),
            carried=deadline,
            expired=expired,
            timed_out=lambda _looked: self._timed_out(),
            engine=self._claim_engine,
        )

    def _claim_engine(self) -> EngineDialect:
        """This try's Engine DB: its profile read at the try's first look and kept for the looks and the
        fingerprint read after it (a claim poking in one process keeps it for its whole try)."""
        if self._try_engine is None:
            self._try_engine = self._engine("claim")
        return self._try_engine

    def _timed_out(self) -> Exception:
        """The sensor timeout, saying what the claim waited for."""
        if self._waiting:
            return AirflowSensorTimeout(
                f"{self._waiting}; still IN-PROGRESS after {self.timeout:.0f}s, so this DAG run could not claim "
                "its run; let that upstream run finish (or close it), then clear this task"
            )
        blocking = self._blocking.describe() if self._blocking else "another run"
        return AirflowSensorTimeout(
            f"pipeline {self.pipeline_code}: {blocking} was still IN-PROGRESS after {self.timeout:.0f}s, "
            "so this DAG run could not claim its run; let that run finish (or close it), then clear this task"
        )

    def _claim_began(self, context: Any) -> datetime:
        """When this claim first looked: the deadline a deferred wait carries back, less the timeout; the
        first reschedule's date; else now (the first look of this process)."""
        if self._carried_deadline:
            return datetime.fromisoformat(self._carried_deadline) - timedelta(seconds=float(self.timeout))
        if self.mode == "reschedule":
            first = _compat.first_reschedule_date(context)
            if first is not None:
                return first
        return datetime.now(UTC)

    def _looked(self, action: str) -> None:
        """Count this look's outcome; one that got the run also sends the claim's wait."""
        metrics.claim(self.pipeline_code, action)
        if action in _GOT_RUN and self._first_look is not None:
            waited = (datetime.now(UTC) - self._first_look).total_seconds()
            metrics.claim_wait(self.pipeline_code, action, waited)

    def poke(self, context: Any) -> PokeReturnValue:
        if self._first_look is None and metrics.enabled():  # a reschedule's date costs a call to Airflow
            try:
                self._first_look = self._claim_began(context)
            except Exception:  # a metric's input must never fail the claim
                self._first_look = datetime.now(UTC)
        identity = RunIdentity.from_context(context)
        codes = None
        if self.check_task_codes:
            try:
                codes = list(pipeline_tasks(self.dag, self.pipeline_code))
            except ValueError as exc:
                raise AirflowFailException(f"[METADATA] {exc}") from None
        with airflow_outcome():
            engine = self._claim_engine()
            require_same_machine(engine.name, self, f"DAG {identity.dag_id}, task {self.task_id}")
        with airflow_outcome(), self._lifecycle(engine) as lifecycle:
            for _ in range(3):
                outcome = lifecycle.claim(self.pipeline_code, identity, codes, where=f"DAG {identity.dag_id}")
                self._looked(outcome.action)
                self._remember_claim(lifecycle, outcome, identity, dag_run=DagRunRef.of(context))
                if outcome.action == ClaimAction.SKIPPED:
                    self.log.info(
                        "etl-craft: run %s of pipeline %s recorded SKIPPED: %s",
                        outcome.pipeline_run_id,
                        self.pipeline_code,
                        outcome.reason,
                    )
                    raise AirflowSkipException(f"pipeline {self.pipeline_code} skipped: {outcome.reason}")
                if outcome.action == ClaimAction.WAITING:
                    self._waiting = outcome.reason
                    self.log.info("etl-craft: %s", outcome.reason)
                    return PokeReturnValue(is_done=False)
                if outcome.action != ClaimAction.BLOCKED:
                    self._blocking = self._waiting = None
                    self._warn_strict_trigger_rules(outcome.lenient_tasks)
                    self.log.info(
                        "etl-craft: %s run %d of pipeline %s (%s)",
                        outcome.action.lower(),
                        outcome.pipeline_run_id,
                        self.pipeline_code,
                        identity.run_key,
                    )
                    return PokeReturnValue(is_done=True, xcom_value=outcome.pipeline_run_id)
                assert outcome.blocking is not None
                self._blocking, self._waiting = outcome.blocking, None
                if not self._close_if_abandoned(context, lifecycle, identity, outcome.blocking):
                    self.log.info(
                        "etl-craft: waiting for %s of pipeline %s",
                        outcome.blocking.describe(),
                        self.pipeline_code,
                    )
                    return PokeReturnValue(is_done=False)
        return PokeReturnValue(is_done=False)

    def _remember_claim(
        self, lifecycle: Any, outcome: Any, identity: RunIdentity, *, dag_run: DagRunRef | None
    ) -> None:
        """Keep what a claim that got or skipped its run recorded, for its lineage (docs/lineage.md)."""
        if outcome.action not in (*_GOT_RUN, ClaimAction.SKIPPED):
            return
        skipped = outcome.action == ClaimAction.SKIPPED
        self._etl_craft_claimed = Claimed(
            engine_db=EngineDb.of(lifecycle.engine),
            action=str(outcome.action),
            pipeline_run_id=outcome.pipeline_run_id,
            run_key=identity.run_key,
            status=str(RunStatus.SKIPPED if skipped else RunStatus.IN_PROGRESS),
            dag_run=dag_run,
        )

    def _warn_strict_trigger_rules(self, lenient: Sequence[str]) -> None:
        """Warn about gated tasks Airflow would never start when an upstream fails (trigger rule all_success)."""
        tasks = pipeline_tasks(self.dag, self.pipeline_code)
        strict = [
            f"{code} ({tasks[code]})"
            for code in lenient
            if code in tasks and self.dag.get_task(tasks[code]).trigger_rule == "all_success"
        ]
        if strict:
            self.log.warning(
                "etl-craft: %s of pipeline %s may run after an upstream failed or was skipped (FAILURE/ALWAYS "
                "dependency or ANY/N run condition), but keep trigger_rule='all_success', so Airflow will not start "
                "them then; give them trigger_rule='all_done' and let the Engine gate decide",
                ", ".join(strict),
                self.pipeline_code,
            )

    def _close_if_abandoned(
        self, context: Any, lifecycle: RunLifecycle, identity: RunIdentity, blocking: RunRow
    ) -> bool:
        """Close ``blocking`` when Airflow says its DAG run is over; True when the claim may try again."""
        owner = RunIdentity.parse_run_key(blocking.run_key)
        if not self.close_abandoned or owner is None:
            return False
        state = _airflow_view.dag_run_state(context, *owner)
        if state is None or (state not in _airflow_view.ENDED_DAG_RUN and state != _airflow_view.NOT_FOUND):
            return False
        reason = (
            f"its Airflow DAG run {owner[1]} of {owner[0]} is {state} but never finished the Engine run; "
            f"closed by {identity.run_key}"
        )
        closed = lifecycle.close_abandoned(self.pipeline_code, blocking.pipeline_run_id, identity, reason)
        if closed:
            self.log.warning("etl-craft: closed %s as abandoned: %s", blocking.describe(), reason)
        return True


class FinishPipelineRunOperator(_PipelineOperatorMixin, BaseOperator):
    """End this DAG run's Engine run of ``pipeline_code`` (``trigger_rule='all_done'``).

    The DAG's recorded tasks of the pipeline that Airflow never ran are recorded SKIPPED (FAILED when
    Airflow says they failed before recording); attempts left live by a killed worker are closed LOST and
    their task runs FAILED. The run ends FAILED when a data task failed or was cancelled (an
    ``EMAIL_ALERT`` task's failure does not decide it), SKIPPED when every task was skipped, else SUCCESS;
    ``SLA_STATUS`` is set once from ``SLA_IN_HOURS``. A teardown task of yours that fails decides nothing
    unless it has ``on_failure_fail_dagrun=True``, as for the DAG run. A FAILED run fails this task without retries, so the
    DAG run shows the truth; a SKIPPED run skips it. Running it again on an ended run changes nothing.
    With ``emit_asset`` (default) the task's outlet is :func:`pipeline_asset`, so only a SUCCESS run
    (the only outcome in which this task succeeds) emits an Asset event.

    :param etl_craft_conn_id: Airflow connection of the Engine DB.
    :param etl_craft_profile: Engine profile of a file-backed connection (``profile=`` before 0.2, deprecated).
    :param etl_craft_lock_timeout: seconds to wait for the pipeline lock (default ``[etl_craft] lock_timeout``;
        ``lock_timeout=`` before 0.2, deprecated).
    :return: ``{"pipeline_run_id": int, "status": str}`` (pushed to XCom).
    """

    _etl_craft_step = "finish"

    ui_color = "#fdf1d6"

    def __init__(
        self,
        *,
        pipeline_code: str,
        etl_craft_conn_id: str | None = None,
        etl_craft_profile: str | None = None,
        etl_craft_lock_timeout: float | None = None,
        trigger_rule: str = "all_done",
        emit_asset: bool = True,
        profile: str | None = None,
        lock_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(trigger_rule=trigger_rule, **kwargs)
        self.pipeline_code = check_code("pipeline_code", pipeline_code)
        self._engine_db(
            etl_craft_conn_id, (etl_craft_profile, profile), (etl_craft_lock_timeout, lock_timeout)
        )
        # Set after BaseOperator's own ``outlets`` assignment, which clears it.
        self.__dict__[_PENDING_ASSET] = emit_asset
        #: The run this finish ended: its OpenLineage facet reads it (docs/lineage.md).
        self._etl_craft_finished: Finished | None = None

    @property
    def outlets(self) -> list[Any]:
        """The task's outlets; with ``emit_asset``, :func:`pipeline_asset` last, made when first read.

        Airflow reads outlets where they matter (the DAG processor serializing the DAG, this task's own
        try, ``dag.test()``); every other task process that parses the DAG file never does. The first
        ``Asset`` with a URI scheme in a process has Airflow look up every installed provider's asset-URI
        handlers (4-8 ms in a LocalExecutor task process, 40-80 ms in a fresh interpreter), so only the
        finish's own try pays it (docs/performance.md).
        """
        outlets: list[Any] = self.__dict__.setdefault(_OUTLETS, [])
        if self.__dict__.get(_PENDING_ASSET):
            self.__dict__[_PENDING_ASSET] = False
            outlets.append(pipeline_asset(self.pipeline_code, self.etl_craft_conn_id))
        return outlets

    @outlets.setter
    def outlets(self, value: list[Any]) -> None:
        """Replace every outlet, the pipeline's Asset included (as for any operator)."""
        self.__dict__[_OUTLETS] = value
        self.__dict__[_PENDING_ASSET] = False

    def execute(self, context: Any) -> dict[str, Any]:
        identity = RunIdentity.from_context(context)
        try:
            tasks = pipeline_tasks(self.dag, self.pipeline_code)
        except ValueError as exc:
            raise AirflowFailException(f"[METADATA] {exc}") from None
        mapped = {code: tid for code, tid in tasks.items() if is_mapped(self.dag.get_task(tid))}
        found, found_maps = _airflow_view.task_and_map_states(context, tasks.values(), mapped.values())
        states = airflow_states_by_code(tasks, found)
        map_states = {code: found_maps[tid] for code, tid in mapped.items()}
        # Airflow does not fail a DAG run for a teardown task that fails, unless it says so.
        lenient = [
            code
            for code, tid in tasks.items()
            if self.dag.get_task(tid).is_teardown and not self.dag.get_task(tid).on_failure_fail_dagrun
        ]
        with airflow_outcome(), self._lifecycle(self._engine("finish")) as lifecycle:
            outcome = lifecycle.finish_run(
                self.pipeline_code, identity, states, map_states, not_deciding=lenient
            )
            self._etl_craft_finished = Finished(
                engine=lifecycle.engine,
                pipeline_run_id=outcome.pipeline_run_id,
                run_key=identity.run_key,
                status=str(outcome.status),
                sla_status=None if outcome.sla_status is None else str(outcome.sla_status),
                dag_run=DagRunRef.of(context),
            )
            duration = outcome.duration
            if duration is None and not outcome.already_ended and metrics.enabled():
                from airflow_provider_etl_craft.runs.finish import run_duration

                duration = run_duration(lifecycle.engine, lifecycle.conn, outcome.pipeline_run_id)
        if not outcome.already_ended:
            metrics.run_finished(self.pipeline_code, outcome.status, duration, outcome.sla_status)
            for code in outcome.lost:
                metrics.attempt(self.pipeline_code, code, "LOST")
        summary = f"pipeline {self.pipeline_code} run {outcome.pipeline_run_id} ended {outcome.status}"
        if outcome.already_ended:
            summary += " (already; nothing changed)"
        details = [
            f"{label}: {', '.join(codes)}"
            for label, codes in (
                ("failed", outcome.failed),
                ("lost", outcome.lost),
                ("skipped", outcome.skipped),
            )
            if codes
        ]
        if outcome.sla_status:
            details.append(f"SLA {outcome.sla_status}")
        message = summary + (f" ({'; '.join(details)})" if details else "")
        if outcome.status == RunStatus.FAILED:
            raise AirflowFailException(f"[FAILURE] {message}")
        self.log.info("etl-craft: %s", message)
        if outcome.status == RunStatus.SKIPPED:
            raise AirflowSkipException(message)
        return {"pipeline_run_id": outcome.pipeline_run_id, "status": outcome.status}
