"""The provider metadata Airflow reads (entry point ``apache_airflow_provider``), in every process it starts.

It imports nothing of the provider's but the version and :mod:`._provider_info_derived`, the literals that
``make provider-info`` writes from :mod:`.provider_info_source` (the connection form, the ``[etl_craft]``
options): docs/performance.md.
"""

from __future__ import annotations

import copy
from typing import Any

from airflow_provider_etl_craft import __version__
from airflow_provider_etl_craft import _provider_info_derived as derived


def get_provider_info() -> dict[str, Any]:
    """The provider dict, a new one per call; validated against Airflow's provider_info.schema.json by the tests."""
    return {
        "package-name": "airflow-provider-etl-craft",
        "name": "etl-craft",
        "description": "Drive etl-craft pipelines from Airflow and keep their Engine DB (CFG_/AUD_ tables).",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "etl-craft",
                "external-doc-url": "https://pypi.org/project/airflow-provider-etl-craft/",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "etl-craft",
                "python-modules": ["airflow_provider_etl_craft.hooks.engine_db"],
            }
        ],
        "operators": [
            {
                "integration-name": "etl-craft",
                "python-modules": [
                    "airflow_provider_etl_craft.operators.init_db",
                    "airflow_provider_etl_craft.operators.purge",
                    "airflow_provider_etl_craft.operators.pipeline_run",
                    "airflow_provider_etl_craft.operators.task_run",
                ],
            }
        ],
        "triggers": [
            {
                "integration-name": "etl-craft",
                "python-modules": ["airflow_provider_etl_craft.triggers.engine_change"],
            }
        ],
        "task-decorators": [
            {
                "name": "etl_craft",
                "class-name": "airflow_provider_etl_craft.decorators.etl_craft_task.etl_craft_task",
            }
        ],
        "connection-types": [
            {
                "connection-type": "etl_craft",
                "hook-class-name": "airflow_provider_etl_craft.hooks.engine_db.EngineDBHook",
                "hook-name": "etl-craft Engine DB",
                "conn-fields": copy.deepcopy(derived.CONN_FIELDS),
                "ui-field-behaviour": copy.deepcopy(derived.UI_FIELD_BEHAVIOUR),
            }
        ],
        "extra-links": ["airflow_provider_etl_craft.plugins.links.EngineRunLink"],
        "plugins": [
            {"name": "etl_craft", "plugin-class": "airflow_provider_etl_craft.plugins.plugin.EtlCraftPlugin"}
        ],
        "config": copy.deepcopy(derived.CONFIG),
    }
