"""Registry of PostgreSQL auth modes (``auth_mode`` in a profile)."""

from __future__ import annotations

from airflow_provider_etl_craft.auth.base import AuthMode
from airflow_provider_etl_craft.auth.key_file import KeyFileAuth
from airflow_provider_etl_craft.auth.oauth import OAuthAuth
from airflow_provider_etl_craft.auth.password import PasswordAuth
from airflow_provider_etl_craft.auth.sso import SsoAuth
from airflow_provider_etl_craft.auth.sts import StsAuth
from airflow_provider_etl_craft.auth.token import TokenAuth

AUTH_MODES: dict[str, type[AuthMode]] = {
    mode.name: mode for mode in (PasswordAuth, TokenAuth, KeyFileAuth, OAuthAuth, SsoAuth, StsAuth)
}

__all__ = ["AUTH_MODES", "AuthMode"]
