"""EnginePurgeOperator: a maintenance DAG deletes Engine DB history older than a retention period."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow_provider_etl_craft._compat import BaseOperator
from airflow_provider_etl_craft.engine.actor import ActorKind
from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.operators._outcome import airflow_outcome
from airflow_provider_etl_craft.operators._renamed import renamed
from airflow_provider_etl_craft.settings import setting


class EnginePurgeOperator(BaseOperator):
    """Delete finished runs that ended more than ``older_than`` ago, with their task runs, attempts, gate
    decisions, consumption rows, pauses and interventions, as ``etl-craft-airflow purge`` does
    (docs/retention.md).

    What a gate or a claim still reads is always kept. Each batch is one short transaction, so pipelines keep
    claiming meanwhile; a retry of a killed task continues where it stopped. Another purge still running,
    an unknown ``pipeline`` or a bad ``older_than`` fail the task without retries.

    :param older_than: the retention period: a :class:`~datetime.timedelta`, or text such as ``"90d"``
        (templated).
    :param etl_craft_conn_id: Airflow connection of type ``etl_craft``.
    :param etl_craft_profile: Engine profile to use from a file-backed connection (``profile=`` before 0.2,
        deprecated).
    :param pipeline: only runs of this PIPELINE_CODE (templated).
    :param batch_size: at most this many runs per batch (one transaction each, sized to take about 0.25 s).
    :param archive_dir: write each batch's rows there first, as JSON Lines with a sha256 manifest (templated).
    :param dry_run: count what would go, change nothing.
    :return: the purge's document: ``purge_id``, ``cutoff``, ``counts`` per table, ``batches``, … (XCom).
    """

    template_fields: Sequence[str] = ("older_than", "pipeline", "archive_dir")
    ui_color = "#f3ece2"

    def __init__(
        self,
        *,
        older_than: timedelta | str,
        etl_craft_conn_id: str | None = None,
        etl_craft_profile: str | None = None,
        pipeline: str | None = None,
        batch_size: int | None = None,
        archive_dir: str | None = None,
        dry_run: bool = False,
        profile: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.older_than = older_than
        self.etl_craft_conn_id = etl_craft_conn_id or setting("default_conn_id")
        self.etl_craft_profile = renamed(
            type(self).__name__, ("etl_craft_profile", etl_craft_profile), ("profile", profile)
        )
        self.pipeline = pipeline
        self.batch_size = batch_size
        self.archive_dir = archive_dir
        self.count_only = dry_run  # BaseOperator.dry_run is a method

    @cached_property
    def hook(self) -> EngineDBHook:
        return EngineDBHook(etl_craft_conn_id=self.etl_craft_conn_id, profile=self.etl_craft_profile)

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_provider_etl_craft.runs import commands
        from airflow_provider_etl_craft.runs.purge import parse_age

        with airflow_outcome():
            try:
                age = (
                    self.older_than
                    if isinstance(self.older_than, timedelta)
                    else parse_age(str(self.older_than))
                )
            except ValueError as exc:
                raise ConfigurationError(f"EnginePurgeOperator older_than {exc}") from None
            with commands.classified(self.hook):
                doc = commands.purge(
                    self.hook,
                    age,
                    pipeline=self.pipeline or None,
                    batch_size=self.batch_size,
                    archive_dir=self.archive_dir or None,
                    dry_run=self.count_only,
                    by=f"airflow:{self.dag_id}.{self.task_id}",
                    kind=ActorKind.SCHEDULE,
                )
        verb = "would delete" if doc["dry_run"] else f"purge {doc['purge_id']} deleted"
        self.log.info("%s runs that ended before %s: %s", verb, doc["cutoff"], doc["counts"])
        if doc["archive"]:
            self.log.info("archive: %s", doc["archive"])
        return doc
