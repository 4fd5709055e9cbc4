"""``auth_mode: password``: the secret is sent as the role's password."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_etl_craft.auth.base import AuthMode

if TYPE_CHECKING:
    from airflow_provider_etl_craft.config.profile import EngineProfile


class PasswordAuth(AuthMode):
    name = "password"
    required_fields = ("user", "secret")
    secret_fields = ("secret",)

    def connect_kwargs(self, profile: EngineProfile) -> dict[str, Any]:
        return {"user": profile.user, "password": profile.secrets["secret"]}
