"""craft-connector.yml: locate, load strictly, pick the Engine profile and resolve its variables."""

from __future__ import annotations

from airflow_provider_etl_craft.config.locate import CONFIG_ENV_VAR, CONFIG_FILE_NAME, locate_config
from airflow_provider_etl_craft.config.profile import EngineProfile, load_engine_profile

__all__ = ["CONFIG_ENV_VAR", "CONFIG_FILE_NAME", "EngineProfile", "load_engine_profile", "locate_config"]
