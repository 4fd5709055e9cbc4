"""Which Engine run an Airflow DAG run is: a deterministic key, so claim, tasks and finish agree without XCom."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from msgspec import Struct

from airflow_provider_etl_craft.engine.actor import ActorKind

RUN_KEY_PREFIX = "airflow"
ACTOR_KIND = ActorKind.ORCHESTRATOR
CODE_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")
#: Run ids ``airflow tasks test`` gives the throwaway DAG run it creates when none is named.
TEMPORARY_RUN_PREFIX = "__airflow_temporary_run_"


class RunIdentity(Struct, frozen=True):
    """One Airflow DAG run as the Engine DB sees it.

    ``run_key`` and ``actor`` are both ``airflow:<dag_id>:<run_id>``; ``run_date`` is the logical date, or
    ``run_after`` for runs without one (Airflow 3 allows ``logical_date=None``). ``RUN_DATE`` stores its UTC
    calendar date (a DATE, as in etl-craft; docs/etl-craft-parity.md).
    """

    dag_id: str
    run_id: str
    run_date: datetime | None = None
    #: An Airflow backfill run: recorded with BACKFILL='Y', which dependency gates ignore.
    backfill: bool = False

    @property
    def run_key(self) -> str:
        return f"{RUN_KEY_PREFIX}:{self.dag_id}:{self.run_id}"

    @property
    def temporary(self) -> bool:
        """A throwaway DAG run of ``airflow tasks test``: no claim runs for it, so nothing is recorded."""
        return self.run_id.startswith(TEMPORARY_RUN_PREFIX)

    @property
    def actor(self) -> str:
        return self.run_key

    actor_kind = ACTOR_KIND

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> RunIdentity:
        """Build from an Airflow task context (``dag_run`` carries dag_id, run_id, logical_date, run_after)."""
        dag_run = context["dag_run"]
        run_date = getattr(dag_run, "logical_date", None) or getattr(dag_run, "run_after", None)
        run_type = str(getattr(dag_run, "run_type", "") or "").lower()
        return cls(
            dag_id=dag_run.dag_id,
            run_id=dag_run.run_id,
            run_date=run_date,
            backfill=run_type.endswith("backfill"),
        )

    @staticmethod
    def parse_run_key(run_key: str | None) -> tuple[str, str] | None:
        """``(dag_id, run_id)`` of a key written by this provider; None for runs started elsewhere.

        DAG ids cannot contain ``:``; run ids can (``manual__2026-01-01T00:00:00+00:00``), so split twice only.
        """
        if not run_key:
            return None
        prefix, _, rest = run_key.partition(":")
        dag_id, sep, run_id = rest.partition(":")
        if prefix != RUN_KEY_PREFIX or not sep or not dag_id or not run_id:
            return None
        return dag_id, run_id


def check_code(kind: str, code: str) -> str:
    """:raises ValueError: ``code`` is not a valid etl-craft code (checked at DAG parse time, no I/O)."""
    if not isinstance(code, str) or not CODE_PATTERN.fullmatch(code):
        raise ValueError(
            f"{kind} {code!r} is not a valid etl-craft code: it must start with a letter and contain only "
            "letters, digits and underscores (at most 128 characters)"
        )
    return code
