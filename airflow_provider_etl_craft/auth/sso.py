"""``auth_mode: sso``: libpq's own OAuth login (``oauth_issuer``, ``oauth_client_id``), libpq ≥ 18.

libpq 18 runs the OAuth device flow itself when the server asks for it; that is interactive, so this mode
suits a person at a terminal (the CLI) more than a worker. psycopg2 wheels bundle an older libpq, so the
connection is opened with psycopg 3 (``pip install 'airflow-provider-etl-craft[sso]'``).
"""

from __future__ import annotations

from typing import Any

from airflow_provider_etl_craft.auth.base import USER, AuthMode, Field, ProfileView
from airflow_provider_etl_craft.errors import ConfigurationError

MIN_LIBPQ = 180000


class SsoAuth(AuthMode, frozen=True):
    """libpq signs in with the issuer itself; the mode passes the issuer, the client id and, when the profile
    gives them (as etl-craft does), the client secret and the scope on."""

    def connect_kwargs(self, profile: ProfileView) -> dict[str, Any]:
        kwargs = {
            "user": profile.user,
            "oauth_issuer": profile.fields["issuer"],
            "oauth_client_id": profile.fields["client_id"],
        }
        if profile.secrets.get("secret"):
            kwargs["oauth_client_secret"] = profile.secrets["secret"]
        if profile.fields.get("scope"):
            kwargs["oauth_scope"] = profile.fields["scope"]
        return kwargs


SSO = SsoAuth(
    "sso",
    "libpq's own OAuth device flow (libpq ≥ 18; interactive)",
    (
        USER,
        Field("issuer", "OAuth issuer", "the issuer URL libpq discovers"),
        Field("client_id", "OAuth client id", "the client id"),
        Field("scope", "OAuth scope", "the scope to request", required=False),
        Field(
            "secret",
            "Client secret",
            "the client secret, for an issuer that wants one",
            secret=True,
            required=False,
            conn="password",
        ),
    ),
    driver="psycopg",
)


def libpq_version_text(version: int) -> str:
    """libpq's integer version as text: 180006 → 18.6, 170011 → 17.11."""
    return f"{version // 10000}.{version % 10000}"


def check_libpq(version: int, setting: str, where: str = "psycopg 3") -> None:
    """:raises ConfigurationError: ``version`` (libpq's integer version) is older than 18."""
    if version < MIN_LIBPQ:
        raise ConfigurationError(
            f"{setting} is 'sso', which needs libpq 18 or newer (its OAuth support); {where} uses libpq "
            f"{libpq_version_text(version)}; install a psycopg 3 binary built with libpq 18 "
            "(pip install 'airflow-provider-etl-craft[sso]')"
        )
