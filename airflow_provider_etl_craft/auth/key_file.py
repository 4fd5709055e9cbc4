"""``auth_mode: key_file``: TLS client-certificate login (``sslkey``, ``sslcert``, ``sslpassword``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_etl_craft.auth.base import AuthMode
from airflow_provider_etl_craft.paths import checked_path

if TYPE_CHECKING:
    from airflow_provider_etl_craft.config.profile import EngineProfile


class KeyFileAuth(AuthMode):
    """The client key (and certificate) on disk, relative paths beside craft-connector.yml.

    ``secret`` names the key's passphrase when the key is encrypted. The server's ``pg_hba.conf`` must
    map the role to the ``cert`` method over ``hostssl``; libpq refuses keys readable by group or others.
    """

    name = "key_file"
    required_fields = ("user", "key_file")
    optional_fields = ("cert_file", "secret")
    secret_fields = ("secret",)
    path_fields = ("key_file", "cert_file")

    def connect_kwargs(self, profile: EngineProfile) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"user": profile.user}
        for field, param in (("key_file", "sslkey"), ("cert_file", "sslcert")):
            path = profile.fields.get(field)
            if path is None:
                continue
            kwargs[param] = str(
                checked_path(
                    path, f"{profile.origin}: {profile.setting(field)} (relative to craft-connector.yml)"
                )
            )
        if profile.secrets.get("secret"):
            kwargs["sslpassword"] = profile.secrets["secret"]
        return kwargs
