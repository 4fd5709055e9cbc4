"""``auth_mode: token``: a stored bearer token (named by ``secret``) is sent as the password."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_etl_craft.auth.base import AuthMode

if TYPE_CHECKING:
    from airflow_provider_etl_craft.config.profile import EngineProfile


class TokenAuth(AuthMode):
    name = "token"
    required_fields = ("user", "secret")
    secret_fields = ("secret",)

    def connect_kwargs(self, profile: EngineProfile) -> dict[str, Any]:
        return {"user": profile.user, "password": profile.secrets["secret"]}
