"""Task groups of the provider."""

from airflow_provider_etl_craft.task_groups.pipeline import etl_craft_pipeline

__all__ = ["etl_craft_pipeline"]
