"""The values the run lifecycle reads and returns: Engine rows it decides on, handles and outcomes.

Each row type declares its columns once (``COLUMNS``, table aliases as in the lifecycle's SQL) and maps a
fetched row with ``from_db``; the statements that read them splice the column list in.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

from msgspec import Struct

from airflow_provider_etl_craft.engine.dialects.base import EngineDialect
from airflow_provider_etl_craft.runs.vocabulary import ClaimAction, RunStatus

ALERT_HANDLER = "EMAIL_ALERT"
#: TASK_LOG of an attempt that ended because its task skipped (how a mapped task run tells it from a kill).
SKIP_NOTE = "skipped: "


class Pipeline(Struct, frozen=True):
    """A ``CFG_PIPELINES`` row: the active one of a code, else its newest retired one."""

    #: The row of a pipeline code (active first, else the newest retired); parameter: PIPELINE_CODE.
    BY_CODE: ClassVar[str] = (
        "SELECT PIPELINE_ID, PIPELINE_CODE, PIPELINE_NAME, ACTIVE_FLAG, SLA_IN_HOURS FROM CFG_PIPELINES "
        "WHERE PIPELINE_CODE = ? ORDER BY CASE WHEN ACTIVE_FLAG = 'Y' THEN 0 ELSE 1 END, PIPELINE_ID DESC LIMIT 1"
    )

    pipeline_id: int
    pipeline_code: str
    pipeline_name: str | None
    active_flag: str
    sla_in_hours: float | None

    @classmethod
    def from_db(cls, row: Sequence[Any]) -> Pipeline:
        sla = row[4]
        return cls(
            pipeline_id=int(row[0]),
            pipeline_code=row[1],
            pipeline_name=row[2],
            active_flag=row[3],
            sla_in_hours=None if sla is None else float(sla),
        )


class RunRow(Struct, frozen=True):
    """The columns of an ``AUD_PIPELINES_RUN_LOG`` row the lifecycle decides on."""

    #: The columns :meth:`from_db` reads, in order, for statements that alias the run table ``r``.
    COLUMNS: ClassVar[str] = (
        "r.PIPELINE_RUN_ID, r.PIPELINE_ID, r.STATUS, r.RUN_KEY, r.START_DATE, r.END_DATE, r.REPAIR_PENDING, "
        "r.OUTPUT_REVISION"
    )
    #: How many columns :data:`COLUMNS` names: a row's first ``WIDTH`` values are the run's.
    WIDTH: ClassVar[int] = COLUMNS.count(",") + 1

    pipeline_run_id: int
    pipeline_id: int
    status: RunStatus
    run_key: str | None
    start_date: datetime | None
    end_date: datetime | None
    repair_pending: str
    output_revision: int

    @classmethod
    def from_db(cls, engine: EngineDialect, row: Sequence[Any]) -> RunRow:
        t = engine.from_db_time
        return cls(
            pipeline_run_id=int(row[0]),
            pipeline_id=int(row[1]),
            status=RunStatus(row[2]),
            run_key=row[3],
            start_date=t(row[4]),
            end_date=t(row[5]),
            repair_pending=row[6],
            output_revision=int(row[7]),
        )

    def describe(self) -> str:
        since = f" since {self.start_date:%Y-%m-%d %H:%M:%S}Z" if self.start_date else ""
        return (
            f"run {self.pipeline_run_id} ({self.run_key or 'started outside Airflow'}, {self.status}{since})"
        )


class Pause(Struct, frozen=True):
    """An open ``AUD_PIPELINE_PAUSES`` row (``RESUMED_AT IS NULL``): claims skip the pipeline's DAG runs."""

    #: The pipeline's open pause (the schema allows one); parameter: PIPELINE_ID.
    OPEN: ClassVar[str] = (
        "SELECT PIPELINE_PAUSE_ID, PAUSED_AT, PAUSED_BY, PAUSED_BY_KIND, REASON FROM AUD_PIPELINE_PAUSES "
        "WHERE PIPELINE_ID = ? AND RESUMED_AT IS NULL"
    )
    #: Every open pause, its PIPELINE_ID first (then the columns of :data:`OPEN`).
    ALL_OPEN: ClassVar[str] = (
        "SELECT PIPELINE_ID, PIPELINE_PAUSE_ID, PAUSED_AT, PAUSED_BY, PAUSED_BY_KIND, REASON FROM AUD_PIPELINE_PAUSES "
        "WHERE RESUMED_AT IS NULL"
    )

    pause_id: int
    paused_at: datetime | None
    paused_by: str | None
    paused_by_kind: str | None
    reason: str | None

    @classmethod
    def from_db(cls, engine: EngineDialect, row: Sequence[Any]) -> Pause:
        return cls(
            pause_id=int(row[0]),
            paused_at=engine.from_db_time(row[1]),
            paused_by=row[2],
            paused_by_kind=row[3],
            reason=row[4],
        )

    def describe(self, code: str) -> str:
        since = f" since {self.paused_at:%Y-%m-%d %H:%M:%S}Z" if self.paused_at else ""
        return f"pipeline {code} is paused by {self.paused_by or 'someone'}{since}: {self.reason or 'no reason given'}"


class AttemptHandle(Struct, frozen=True, kw_only=True):
    """The live attempt a task try writes to; ``owner_id`` proves it is still this try's row at the end."""

    pipeline_run_id: int
    task_run_id: int
    attempt_id: int
    attempt_number: int
    owner_id: str
    task_code: str
    #: Whether a success consumes upstream runs (SATISFIED cross-pipeline task-dependency decisions).
    consumes: bool = False
    #: The Airflow map index of a mapped task's instance (None: an unmapped task).
    map_index: int | None = None
    #: Who opened it (the run's actor): ending or parking it writes as the same actor.
    actor: str | None = None


class ClaimOutcome(Struct, frozen=True):
    """What a claim did.

    ``action``: CREATED, RESUMED (retry of the claim), REOPENED (a cleared DAG run), BLOCKED (another run of
    the pipeline is IN-PROGRESS: ``blocking``), WAITING (a pipeline dependency's upstream is IN-PROGRESS;
    nothing written) or SKIPPED (the pipeline is paused, or its dependencies are not satisfied: the run
    is recorded SKIPPED). ``reason`` explains WAITING and SKIPPED.

    A claim *reports* WAITING and SKIPPED as actions, where a task's start *raises* ``GateWaiting`` /
    ``GateSkipped`` (:mod:`~.gates`): the claim's caller (``ClaimPipelineRunOperator``, the CLI) branches on every
    action alike (BLOCKED and WAITING poke again or defer, SKIPPED skips the claim task), while a start's
    caller gets an attempt handle back, so a start that opens none can only leave by an exception. Raising from
    the claim would change what its callers see; the two forms stay, each documented here and in ``gates``.
    """

    action: ClaimAction
    pipeline_run_id: int | None = None
    blocking: RunRow | None = None
    reason: str | None = None
    #: CREATED/REOPENED/RESUMED: task codes that need a lenient trigger rule (see ``Gates.lenient_tasks``).
    lenient_tasks: tuple[str, ...] = ()


class FinishOutcome(Struct, frozen=True):
    pipeline_run_id: int
    status: RunStatus
    already_ended: bool = False
    skipped: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    sla_status: str | None = None
    #: Seconds from the run's START_DATE to the END_DATE this finish wrote, where the finish knows it without one
    #: more statement (its transaction form); None otherwise (see ``finish.run_duration``). Not compared.
    duration: float | None = None

    def _compared(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__struct_fields__ if name != "duration")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FinishOutcome):
            return NotImplemented
        return self._compared() == other._compared()

    def __hash__(self) -> int:
        return hash(self._compared())


def map_key(map_index: int | None) -> int:
    """``COALESCE(MAP_INDEX, -1)``: the schema's key for "this map index, or the unmapped task"."""
    return -1 if map_index is None else map_index
