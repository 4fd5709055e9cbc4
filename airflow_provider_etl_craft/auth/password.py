"""``auth_mode: password`` and ``auth_mode: token``: the resolved ``secret`` is sent as the password.

Both have one shape (a user and a secret); they differ only in what the secret is, so one class serves both.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_etl_craft.auth.base import USER, AuthMode, Field, ProfileView


class SecretAsPassword(AuthMode, frozen=True):
    """A mode whose only credential is ``secret``, sent unchanged as the password."""

    def connect_kwargs(self, profile: ProfileView) -> dict[str, Any]:
        return {"user": profile.user, "password": profile.secrets["secret"]}


def _secret_as_password(name: str, summary: str, label: str, description: str) -> SecretAsPassword:
    secret = Field("secret", label, description, secret=True, conn="password")
    return SecretAsPassword(name, summary, (USER, secret))


PASSWORD = _secret_as_password(
    "password", "the secret is the role's password", "Password", "the role's password"
)
TOKEN = _secret_as_password(
    "token",
    "a stored bearer token (PgBouncer, a proxy) sent as the password",
    "Token",
    "a stored bearer token, sent as the password",
)
