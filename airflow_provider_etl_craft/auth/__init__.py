"""Registry of PostgreSQL auth modes (``auth_mode`` in a profile)."""

from __future__ import annotations

from airflow_provider_etl_craft.auth.base import AuthMode
from airflow_provider_etl_craft.auth.password import PasswordAuth

AUTH_MODES: dict[str, type[AuthMode]] = {mode.name: mode for mode in (PasswordAuth,)}
#: Modes the specification names that this release does not implement yet.
PLANNED_MODES = ("token", "key_file", "oauth", "sso", "sts")

__all__ = ["AUTH_MODES", "PLANNED_MODES", "AuthMode"]
