"""The run lifecycle (SPEC §9): the one front operators and the CLI call.

Every state change is one Engine DB transaction (or one statement), and the schema's unique indexes (one
IN-PROGRESS run per pipeline, one task-run row per task and run, one live attempt per task run) are the
last word on races: a lost race surfaces as :class:`StaleTransitionError`, never as a duplicate row. Each
transition lives in its own module: :mod:`~.claim` (claim, abandonment), :mod:`~.pauses`, :mod:`~.start`
(opening an attempt), :mod:`~.attempts` (parking and ending one), :mod:`~.finish`; this class holds no
logic of its own and no Airflow imports.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
from airflow_provider_etl_craft.runs.attempts import EndAttempt, ParkAttempt
from airflow_provider_etl_craft.runs.claim import Abandon, Claim
from airflow_provider_etl_craft.runs.counts import TaskCounts
from airflow_provider_etl_craft.runs.finish import FinishRun
from airflow_provider_etl_craft.runs.gates import Gates, UpstreamStates
from airflow_provider_etl_craft.runs.identity import RunIdentity
from airflow_provider_etl_craft.runs.pauses import EndPause, OpenPause
from airflow_provider_etl_craft.runs.records import (
    AttemptHandle,
    ClaimOutcome,
    FinishOutcome,
    Pause,
    RunRow,
)
from airflow_provider_etl_craft.runs.start import StartAttempt, Try
from airflow_provider_etl_craft.runs.transition import Transition
from airflow_provider_etl_craft.settings import OPTIONS

#: Seconds to wait for the ``pipeline:<code>`` lock before a retryable LOCK_TIMEOUT (``[etl_craft] lock_timeout``).
DEFAULT_LOCK_TIMEOUT = float(OPTIONS["lock_timeout"].default)

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "AttemptHandle",
    "ClaimOutcome",
    "FinishOutcome",
    "Pause",
    "RunLifecycle",
    "RunRow",
]


_T = TypeVar("_T", bound=Transition)


class RunLifecycle:
    """Engine-side bookkeeping of pipeline runs on one open connection (autocommit; transactions explicit).

    :param engine: the dialect of the Engine DB.
    :param conn: a connection from ``engine.connect()``; the caller closes it.
    :param lock_timeout: seconds to wait for ``pipeline:<code>`` locks.
    """

    def __init__(
        self, engine: EngineDialect, conn: Any, lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> None:
        self.engine = engine
        self.conn = conn
        self.lock_timeout = lock_timeout
        self.gates = Gates(engine)

    def _on(self, transition: type[_T]) -> _T:
        return transition(self.engine, self.conn, self.lock_timeout, self.gates)

    def claim(
        self,
        pipeline_code: str,
        identity: RunIdentity,
        task_codes: Collection[str] | None = None,
        where: str = "the DAG",
    ) -> ClaimOutcome:
        """Claim the Engine run of ``identity`` under the ``pipeline:<code>`` lock.

        Resumes the keyed run if IN-PROGRESS, reports BLOCKED while another run of the pipeline is
        IN-PROGRESS, reopens the keyed run if it ended (REOPEN intervention, REPAIR_PENDING='Y'), else
        inserts a new IN-PROGRESS run.

        :param task_codes: when given, must equal the pipeline's active task codes (METADATA otherwise).
        :raises MetadataError: the pipeline is not active, or the task codes differ.
        :raises LockTimeoutError: the pipeline lock was busy for ``lock_timeout`` seconds.
        :raises EngineDBError: the Engine tables are missing, partial or not migrated to this release.
        """
        return self._on(Claim)(pipeline_code, identity, task_codes, where)

    def close_abandoned(
        self, pipeline_code: str, pipeline_run_id: int, identity: RunIdentity, reason: str
    ) -> bool:
        """Close an IN-PROGRESS run whose driver is gone as CANCELLED (CANCEL intervention; attempts LOST).

        :return: False when the run was no longer IN-PROGRESS (someone else closed it first).
        """
        return self._on(Abandon)(pipeline_code, pipeline_run_id, identity, reason)

    def pause(self, pipeline_code: str, reason: str, by: str, by_kind: str = "HUMAN") -> int:
        """Open a pause of the pipeline (``AUD_PIPELINE_PAUSES``); returns its id.

        While it is open, claims skip their DAG runs and running runs start no new task.

        :raises MetadataError: the pipeline is not active.
        :raises RunStateError: the pipeline is paused already (one open pause per pipeline).
        """
        return self._on(OpenPause)(pipeline_code, reason, by, by_kind)

    def resume(self, pipeline_code: str, reason: str, by: str, by_kind: str = "HUMAN") -> Pause:
        """Close the pipeline's open pause; returns it.

        :raises RunStateError: the pipeline is not paused.
        """
        return self._on(EndPause)(pipeline_code, reason, by, by_kind)

    def start_task(
        self,
        pipeline_code: str,
        task_code: str,
        identity: RunIdentity,
        try_number: int,
        log_path: str | None = None,
        upstream_states: UpstreamStates | None = None,
        claim_skipped: Callable[[], bool] | None = None,
        map_index: int | None = None,
        resume: bool = False,
    ) -> AttemptHandle:
        """Open attempt ``try_number`` of ``task_code`` in the keyed run (one transaction).

        Finds or creates the task's single ``AUD_TASK_RUN_LOG`` row; a live attempt of an earlier try
        (its worker died, Airflow moved on) is closed LOST first; a second live attempt of the same try
        is refused. A run that already ended (a task cleared in Airflow) is reopened first. The task's
        dependencies and run condition are judged first (SPEC §10).

        :param upstream_states: Airflow's state of same-pipeline upstream tasks, by task code, for those
            that have no row in the run yet (without it such an upstream is waited for).
        :param claim_skipped: whether this DAG run's claim skipped (a paused pipeline, unsatisfied
            dependencies); a task that runs anyway (``all_done``) then skips instead of reopening the run.
        :param map_index: the instance of a mapped task (None: unmapped); attempts are per map index.
        :param resume: the try comes back after a reschedule or a deferral: its attempt, parked QUEUED by
            :meth:`park_task`, is taken over instead of a new one opened (nothing is judged again).
        :raises GateWaiting: the pipeline is paused, or an upstream is still IN-PROGRESS (nothing written).
        :raises GateSkipped: the dependencies are not satisfied: the attempt was recorded CANCELLED and the
            task run SKIPPED, with the decisions.
        :raises MetadataError: the pipeline or task is not active.
        :raises RunStateError: no run with this key (the claim did not run).
        :raises StaleTransitionError: this try already has an attempt (a duplicate delivery).
        """
        attempt = Try(pipeline_code, task_code, identity, try_number, log_path, map_index, upstream_states)
        return self._on(StartAttempt)(attempt, claim_skipped, resume)

    def park_task(self, handle: AttemptHandle, note: str) -> None:
        """Park the live attempt QUEUED while Airflow reschedules or defers this try (no worker runs it).

        The attempt stays live, so nothing else can open one for this try; the try's next poke or its
        resumed method takes it over (``start_task(resume=True)``), and ATTEMPT_COUNT does not move.

        :raises StaleTransitionError: the attempt is no longer this try's (closed by a later try or finish).
        """
        self._on(ParkAttempt)(handle, note)

    def finish_task(
        self,
        handle: AttemptHandle,
        status: str,
        counts: TaskCounts | None = None,
        error: str | None = None,
        map_count: int | None = None,
    ) -> None:
        """End the attempt and copy it to its task run, in one transaction.

        ``status`` is SUCCESS, FAILED, TIMED_OUT (the task run FAILED), CANCELLED, or SKIPPED (the attempt
        CANCELLED and the task run SKIPPED, ``error`` being the reason, kept in TASK_LOG). A mapped
        instance's end settles its task run over every map index (:mod:`~.mapped`); ``map_count`` is how
        many instances Airflow expanded.

        :raises StaleTransitionError: the attempt is no longer this try's live attempt (closed as LOST by a
            later try or by the finish task).
        """
        self._on(EndAttempt)(handle, status, counts, error, map_count)

    def finish_run(
        self,
        pipeline_code: str,
        identity: RunIdentity,
        airflow_states: Mapping[str, str | None],
        map_states: Mapping[str, Mapping[int, str | None]] | None = None,
        not_deciding: Collection[str] = (),
    ) -> FinishOutcome:
        """End the keyed run (SPEC §9 *Finish*), under the pipeline lock, in one transaction.

        Finish runs once every task of the pipeline is done in Airflow (a teardown, ``all_done``), so no
        attempt Airflow still runs, reschedules or defers can be closed here.

        :param airflow_states: Airflow's state of each of the DAG's tasks of this pipeline, by task code;
            a code without a task-run row is recorded SKIPPED (FAILED when Airflow says it failed, SUCCESS
            with a MARK intervention when it was marked success by hand).
        :param map_states: for mapped tasks, Airflow's state of each map index, by task code.
        :param not_deciding: task codes whose failure does not fail the run, as Airflow's own rule for the
            DAG run says (teardown tasks without ``on_failure_fail_dagrun``), like ``EMAIL_ALERT`` tasks.
        :raises RunStateError: no run with this key.
        """
        return self._on(FinishRun)(pipeline_code, identity, airflow_states, map_states, not_deciding)
