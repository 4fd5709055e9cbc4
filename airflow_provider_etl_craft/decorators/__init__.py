"""TaskFlow decorators of the provider."""

from airflow_provider_etl_craft.decorators.etl_craft_task import etl_craft_task

__all__ = ["etl_craft_task"]
