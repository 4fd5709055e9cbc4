"""The run lifecycle's vocabulary, declared once: the statuses the ``AUD_`` tables store (their CHECK constraints
list the same values: ``tests/unit/test_vocabulary.py`` compares them) and the outcomes transitions report.

Every member is a ``str`` (:class:`enum.StrEnum`): it compares equal to the text a row holds, formats as that
text, and binds as that text through sqlite3, psycopg2 and psycopg 3, so rows read back as plain ``str`` and
members mix freely. SQL written as Python text takes its value lists from here with :func:`sql_list`.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class RunStatus(StrEnum):
    """``AUD_PIPELINES_RUN_LOG.STATUS`` (docs/lifecycle.md, *Runs*).

    QUEUED is in the schema for etl-craft, which queues runs before it starts them; the provider's claim
    inserts a run IN-PROGRESS (or SKIPPED) and never writes QUEUED.
    """

    QUEUED = "QUEUED"
    IN_PROGRESS = "IN-PROGRESS"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    CANCELLED = "CANCELLED"


class TaskRunStatus(StrEnum):
    """``AUD_TASK_RUN_LOG.STATUS``: a task's one row in a run (it has no TIMED_OUT: a timed-out try fails it)."""

    IN_PROGRESS = "IN-PROGRESS"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    CANCELLED = "CANCELLED"


class AttemptStatus(StrEnum):
    """``AUD_TASK_ATTEMPTS.STATUS`` (docs/lifecycle.md, *Attempts*).

    CLAIMED belongs to etl-craft's attempt lifecycle: the Engine schema is etl-craft's (its CHECK constraint and
    the live-attempt unique index of ``sql/*/schema.sql`` list CLAIMED), and an Engine DB may be shared with
    etl-craft (docs/etl-craft-parity.md). The provider never writes CLAIMED (Airflow's worker has already
    started when an attempt opens, so it is written RUNNING), but counts it live wherever it reads one, so such
    an attempt is never taken for ended. It stays in the schema for that compatibility.
    """

    QUEUED = "QUEUED"
    CLAIMED = "CLAIMED"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"
    LOST = "LOST"


class AttemptEnd(StrEnum):
    """How a caller ends an attempt (``RunLifecycle.finish_task``); :data:`ATTEMPT_ENDS` maps each to the
    attempt's and the task run's status. SKIPPED is no attempt status: a skip is a CANCELLED attempt."""

    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"
    SKIPPED = "SKIPPED"


class ClaimAction(StrEnum):
    """``ClaimOutcome.action``: what a claim did (see :class:`~.records.ClaimOutcome`)."""

    CREATED = "CREATED"
    RESUMED = "RESUMED"
    REOPENED = "REOPENED"
    BLOCKED = "BLOCKED"
    WAITING = "WAITING"
    SKIPPED = "SKIPPED"


class OneCallAnswer(StrEnum):
    """The first column of a server-side transition function's row besides the transition's own outcome
    (``ETL_CRAFT_CLAIM`` answers a :class:`ClaimAction` otherwise): see sql/postgresql/migrations/0003_*.sql."""

    #: Nothing written, no lock taken: the Engine schema is not current (the transaction form explains).
    SCHEMA_NOT_CURRENT = "SCHEMA"
    #: Nothing written: the case needs the transaction form.
    DECIDE_IN_TRANSACTION = "FULL"
    #: ``ETL_CRAFT_FINISH`` ended the run.
    FINISHED = "FINISHED"
    #: ``ETL_CRAFT_FINISH`` found the run ended already; nothing written.
    ENDED = "ENDED"


class InterventionAction(StrEnum):
    """``AUD_RUN_INTERVENTIONS.ACTION``: a change made outside the normal flow (the run lifecycle writes MARK,
    CANCEL and REOPEN; the others are etl-craft's)."""

    MARK = "MARK"
    NEW_RUN = "NEW_RUN"
    CANCEL = "CANCEL"
    REOPEN = "REOPEN"
    RESET = "RESET"
    GATE_BYPASS = "GATE_BYPASS"
    IGNORE_DEPENDENCIES = "IGNORE_DEPENDENCIES"
    RERUN = "RERUN"


class GateResult(StrEnum):
    """A gate's verdict on an edge or a whole gate (docs/gates.md); ``AUD_GATE_DECISIONS.RESULT`` stores the
    decided ones. WAIT is never stored (nothing is written while a gate waits); BYPASSED is etl-craft's."""

    SATISFIED = "SATISFIED"
    UNSATISFIED = "UNSATISFIED"
    BYPASSED = "BYPASSED"
    WAIT = "WAIT"


class DependencyType(StrEnum):
    """``CFG_TASK_DEPENDENCY`` / ``CFG_PIPELINE_DEPENDENCY.DEPENDENCY_TYPE``: what an upstream must have done
    for its edge to be satisfied (the truth table of docs/gates.md)."""

    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    ALWAYS = "ALWAYS"
    HAS_DATA = "HAS_DATA"


class RunCondition(StrEnum):
    """``CFG_TASKS.RUN_CONDITION``: how many of a task's edges must be satisfied (NULL reads as ALL)."""

    ALL = "ALL"
    ANY = "ANY"
    N = "N"


class PurgeStatus(StrEnum):
    """``AUD_ENGINE_PURGES.STATUS``: a purge's row (docs/retention.md); DRY_RUN is only reported, never stored."""

    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"
    DRY_RUN = "DRY_RUN"


class SlaStatus(StrEnum):
    """``AUD_PIPELINES_RUN_LOG.SLA_STATUS`` of a run whose pipeline has an SLA."""

    MET = "MET"
    BREACHED = "BREACHED"


#: Attempt statuses that hold a worker's lease (one such attempt per task run and map index), in the order of
#: the live-attempt unique index's predicate.
LIVE_ATTEMPT = (AttemptStatus.QUEUED, AttemptStatus.CLAIMED, AttemptStatus.RUNNING)
#: Task-run statuses that make a run FAILED when held by a data task (not an EMAIL_ALERT one).
FAILING_TASK = (TaskRunStatus.FAILED, TaskRunStatus.CANCELLED)
#: Run statuses of an ended run.
ENDED_RUN = (RunStatus.SUCCESS, RunStatus.FAILED, RunStatus.SKIPPED, RunStatus.CANCELLED)
#: How an attempt can end → (the attempt's status, its task run's status). The task-run table has no
#: TIMED_OUT; a skip (``AirflowSkipException``, a gate) is a CANCELLED attempt of a SKIPPED task run.
ATTEMPT_ENDS: dict[AttemptEnd, tuple[AttemptStatus, TaskRunStatus]] = {
    AttemptEnd.SUCCESS: (AttemptStatus.SUCCESS, TaskRunStatus.SUCCESS),
    AttemptEnd.FAILED: (AttemptStatus.FAILED, TaskRunStatus.FAILED),
    AttemptEnd.TIMED_OUT: (AttemptStatus.TIMED_OUT, TaskRunStatus.FAILED),
    AttemptEnd.CANCELLED: (AttemptStatus.CANCELLED, TaskRunStatus.CANCELLED),
    AttemptEnd.SKIPPED: (AttemptStatus.CANCELLED, TaskRunStatus.SKIPPED),
}


def sql_list(values: Iterable[StrEnum]) -> str:
    """``('A', 'B')``: a SQL value list of members, for SQL written as Python text (members never hold quotes)."""
    return "(" + ", ".join(f"'{v.value}'" for v in values) + ")"


#: :data:`LIVE_ATTEMPT` as a SQL value list (``STATUS IN {LIVE_SQL}``).
LIVE_SQL = sql_list(LIVE_ATTEMPT)
#: :data:`ENDED_RUN` as a SQL value list.
ENDED_RUN_SQL = sql_list(ENDED_RUN)
