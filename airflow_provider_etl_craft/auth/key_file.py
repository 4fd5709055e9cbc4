"""``auth_mode: key_file``: TLS client-certificate login (``sslkey``, ``sslcert``, ``sslpassword``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from airflow_provider_etl_craft.auth.base import USER, AuthMode, Field, ProfileView
from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.paths import checked_path


class KeyFileAuth(AuthMode, frozen=True):
    """The client key (and certificate) on disk, relative paths beside craft-connector.yml.

    ``secret`` names the key's passphrase when the key is encrypted. The server's ``pg_hba.conf`` must
    map the role to the ``cert`` method over ``hostssl``; libpq refuses keys readable by group or others.
    """

    def connect_kwargs(self, profile: ProfileView) -> dict[str, Any]:
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

    def local_problem(self, profile: ProfileView) -> Exception | None:
        path = profile.fields.get("key_file")
        if path is None:
            return None
        try:
            _check_key(Path(path), profile.secrets.get("secret"), profile)
        except ConfigurationError as exc:
            return exc
        return None


KEY_FILE = KeyFileAuth(
    "key_file",
    "a TLS client certificate and its key",
    (
        USER,
        Field("key_file", "Client key file", "absolute path of the client key", path=True),
        Field(
            "cert_file",
            "Client certificate file",
            "absolute path of the certificate",
            path=True,
            required=False,
        ),
        Field(
            "secret",
            "Key passphrase",
            "the passphrase of an encrypted key",
            secret=True,
            required=False,
            conn="password",
        ),
    ),
)


def _check_key(path: Path, passphrase: str | None, profile: ProfileView) -> None:
    """Raise for a key libpq refuses: too open, or not loadable with the passphrase (asked after a failed
    connect; libpq says why only in text, this error names the settings to fix).
    """
    fields = ", ".join(profile.setting(key) for key in KEY_FILE.keys if key != USER.key)
    where = f"{profile.origin}: the client key or certificate for {profile.describe()} could not be used"
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    too_open = mode & 0o077 if info.st_uid == os.geteuid() else mode & 0o037 if info.st_uid == 0 else 0
    if too_open:
        raise ConfigurationError(
            f"{where}: private key file {path} has group or world access ({mode:o}), which libpq refuses; chmod 600 "
            f"the file named by {profile.setting('key_file')} (or 640 owned by root)"
        )
    # Here, not at module level: the auth registry is imported by every parse (the provider info).
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    data = path.read_bytes()
    encrypted = (
        b"ENCRYPTED" in data
    )  # PKCS#8 "ENCRYPTED PRIVATE KEY" or a legacy "Proc-Type: 4,ENCRYPTED" header
    if encrypted and not passphrase:
        reason = "it is encrypted and no passphrase is set"
    else:
        try:
            serialization.load_pem_private_key(
                data, password=passphrase.encode() if encrypted and passphrase else None
            )
            return
        except (ValueError, TypeError, UnsupportedAlgorithm):
            reason = "wrong passphrase" if encrypted else "not a PEM private key"
    raise ConfigurationError(
        f"{where}: could not load private key file {path} ({reason}); check {fields} (the passphrase)"
    )
