"""EngineInitDbOperator: a DAG prepares its own Engine DB (init-db, optionally the migrations too)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow_provider_etl_craft._compat import BaseOperator
from airflow_provider_etl_craft.engine.schema import MIGRATE_LOCK_TIMEOUT
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.operators._outcome import airflow_outcome
from airflow_provider_etl_craft.operators._renamed import renamed
from airflow_provider_etl_craft.settings import setting


class EngineInitDbOperator(BaseOperator):
    """Run init-db (and, with ``apply_migrations``, migrate) against the Engine DB.

    Safe on every run and retry: an Engine DB already at the packaged version is left unchanged, and
    concurrent runs serialise on the ``migrate`` lock. A partial or foreign schema, or an edited applied
    migration, fails the task without retries.

    :param etl_craft_conn_id: Airflow connection of type ``etl_craft``.
    :param etl_craft_profile: Engine profile to use from a file-backed connection (``profile=`` before 0.2,
        deprecated).
    :param apply_migrations: also apply packaged and project migrations (``migrate``).
    :param migrations_dir: project migrations folder (templated); default ``$ETL_CRAFT_MIGRATIONS_DIR`` or
        ``migrations/`` beside craft-connector.yml.
    :param etl_craft_lock_timeout: seconds to wait for the ``migrate`` lock (default 300; ``lock_timeout=``
        before 0.2, deprecated).
    :return: ``{"created": bool, "version": str, "applied": [labels]}`` (pushed to XCom).
    """

    template_fields: Sequence[str] = ("migrations_dir",)
    ui_color = "#e8f1fb"

    def __init__(
        self,
        *,
        etl_craft_conn_id: str | None = None,
        etl_craft_profile: str | None = None,
        apply_migrations: bool = False,
        migrations_dir: str | None = None,
        etl_craft_lock_timeout: float | None = None,
        profile: str | None = None,
        lock_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        where = type(self).__name__
        self.etl_craft_conn_id = etl_craft_conn_id or setting("default_conn_id")
        self.etl_craft_profile = renamed(
            where, ("etl_craft_profile", etl_craft_profile), ("profile", profile)
        )
        self.apply_migrations = apply_migrations
        self.migrations_dir = migrations_dir
        timeout = renamed(
            where, ("etl_craft_lock_timeout", etl_craft_lock_timeout), ("lock_timeout", lock_timeout)
        )
        self.etl_craft_lock_timeout = MIGRATE_LOCK_TIMEOUT if timeout is None else timeout

    @cached_property
    def hook(self) -> EngineDBHook:
        return EngineDBHook(etl_craft_conn_id=self.etl_craft_conn_id, profile=self.etl_craft_profile)

    def execute(self, context: Any) -> dict[str, Any]:
        with airflow_outcome():
            if self.apply_migrations:
                result = self.hook.migrate(self.migrations_dir, self.etl_craft_lock_timeout)
                init, applied = result.init, result.applied
            else:
                init, applied = self.hook.init_db(self.etl_craft_lock_timeout), []
        self.log.info("%s", init.message)
        for label in applied:
            self.log.info("applied migration %s", label)
        if self.apply_migrations and not applied:
            self.log.info("no pending migrations")
        return {"created": init.created, "version": init.version, "applied": applied}
