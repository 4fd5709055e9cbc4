"""Pause a pipeline and end its pause (``AUD_PIPELINE_PAUSES``; docs/gates.md, *Pauses*)."""

from __future__ import annotations

from airflow_provider_etl_craft.engine.actor import ActorKind, acting_as
from airflow_provider_etl_craft.errors import RunStateError, StaleTransitionError
from airflow_provider_etl_craft.runs.counts import clean_text
from airflow_provider_etl_craft.runs.records import Pause
from airflow_provider_etl_craft.runs.transition import Transition


class OpenPause(Transition):
    """Open the pipeline's pause; while it is open, claims skip and running runs start no new task."""

    def __call__(self, pipeline_code: str, reason: str, by: str, by_kind: str = ActorKind.HUMAN) -> int:
        """Open a pause of the pipeline (``AUD_PIPELINE_PAUSES``); returns its id.

        While it is open, claims skip their DAG runs and running runs start no new task.

        :raises MetadataError: the pipeline is not active.
        :raises RunStateError: the pipeline is paused already (one open pause per pipeline).
        """
        with acting_as(clean_text(by), by_kind), self.engine.transaction(self.conn) as cur:
            pipeline_id = self.active_pipeline(cur, pipeline_code)
            current = self.open_pause(cur, pipeline_id)
            if current is not None:
                raise RunStateError(
                    f"{current.describe(pipeline_code)}; resume it first (etl-craft-airflow resume)"
                )
            try:
                pause_id = self.returning(
                    cur,
                    "INSERT INTO AUD_PIPELINE_PAUSES (PIPELINE_ID, PAUSED_AT, PAUSED_BY, PAUSED_BY_KIND, REASON) "
                    "VALUES (?, ?, ?, ?, ?) RETURNING PIPELINE_PAUSE_ID",
                    (pipeline_id, self.now()[1], clean_text(by), by_kind, clean_text(reason)),
                )
            except self.engine.integrity_error() as exc:
                raise self.conflict(exc, f"pausing {pipeline_code}") from None
        return int(pause_id)


class EndPause(Transition):
    """Close the pipeline's open pause."""

    def __call__(self, pipeline_code: str, reason: str, by: str, by_kind: str = ActorKind.HUMAN) -> Pause:
        """Close the pipeline's open pause; returns it.

        :raises RunStateError: the pipeline is not paused.
        """
        with acting_as(clean_text(by), by_kind), self.engine.transaction(self.conn) as cur:
            pipeline_id = self.active_pipeline(cur, pipeline_code)
            current = self.open_pause(cur, pipeline_id)
            if current is None:
                raise RunStateError(f"pipeline {pipeline_code} is not paused; nothing to resume")
            updated = self.exec(
                cur,
                "UPDATE AUD_PIPELINE_PAUSES SET RESUMED_AT = ?, RESUMED_BY = ?, RESUMED_BY_KIND = ?, "
                "RESUME_REASON = ? WHERE PIPELINE_PAUSE_ID = ? AND RESUMED_AT IS NULL",
                (self.now()[1], clean_text(by), by_kind, clean_text(reason), current.pause_id),
            ).rowcount
            if updated != 1:
                raise StaleTransitionError(f"pause {current.pause_id} of {pipeline_code} changed; retry")
            self.announce(cur, pipeline_id)
        return current
