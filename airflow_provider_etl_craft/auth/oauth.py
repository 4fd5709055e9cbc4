"""``auth_mode: oauth``: an OAuth 2.0 client-credentials access token, kept in the process until shortly before
it expires (:mod:`.cache`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.auth.base import USER, AuthMode, Field, ProfileView
from airflow_provider_etl_craft.auth.cache import ExpiringCache, secret_id
from airflow_provider_etl_craft.errors import ConfigurationError, EngineUnreachableError

#: Seconds to wait for the token endpoint.
TOKEN_TIMEOUT = 30.0
#: Seconds a token is taken to be valid when the answer has no ``expires_in`` (RFC 6749 makes it optional).
DEFAULT_LIFETIME = 300.0

#: Access tokens by (token URL, client id, scope, an id of the client secret, never the secret).
_TOKENS: ExpiringCache[str] = ExpiringCache()


class OAuthAuth(AuthMode, frozen=True):
    """``token_url`` receives a form POST (``grant_type=client_credentials``, ``client_id``,
    ``client_secret``, optional ``scope``); the ``access_token`` of its JSON answer is the password.

    The endpoint must be ``https`` (plain ``http`` only on a loopback address, for local testing). Every
    token is registered with Airflow's secret masker; no error message carries the client secret or a token.
    A token is reused by the process's connections until shortly before its ``expires_in`` runs out
    (:data:`DEFAULT_LIFETIME` without one); a login refused with a reused token fetches a new one, once.
    """

    def connect_kwargs(self, profile: ProfileView) -> dict[str, Any]:
        token = _TOKENS.get(_key(profile), lambda: fetch_token(profile))
        _compat.mask_secret(token)  # again on every use: a no-op unless the masker was reset since
        return {"user": profile.user, "password": token}

    def renew_kwargs(self, profile: ProfileView, refused: Mapping[str, Any]) -> dict[str, Any] | None:
        token = _TOKENS.renew(_key(profile), refused["password"], lambda: fetch_token(profile))
        if token is None:
            return None
        _compat.mask_secret(token)
        return {"user": profile.user, "password": token}


OAUTH = OAuthAuth(
    "oauth",
    "an OAuth 2 client-credentials token, cached per process until shortly before it expires",
    (
        USER,
        Field("client_id", "OAuth client id", "the client id"),
        Field("secret", "Client secret", "the client secret", secret=True, conn="password"),
        Field("token_url", "OAuth token URL", "the https token endpoint"),
        Field("scope", "OAuth scope", "the scope to request", required=False),
    ),
)


def _key(profile: ProfileView) -> tuple[str | None, ...]:
    fields = profile.fields
    return (
        fields["token_url"],
        fields["client_id"],
        fields.get("scope"),
        secret_id(profile.secrets["secret"]),
    )


def fetch_token(profile: ProfileView) -> tuple[str, float]:
    """One client-credentials token request: the token, masked before it is returned, and its lifetime in
    seconds (``expires_in``; :data:`DEFAULT_LIFETIME` without one, 0 when it is not a positive number).

    :raises ConfigurationError: the endpoint refused, or its answer has no usable ``access_token``.
    :raises EngineUnreachableError: the endpoint did not answer (a retry may succeed).
    """
    import httpx

    url = profile.fields["token_url"]
    where = f"{profile.origin}: {profile.setting('token_url')} ({_shown(url)})"
    _check_url(url, where)
    secret = profile.secrets["secret"]
    form = {
        "grant_type": "client_credentials",
        "client_id": profile.fields["client_id"],
        "client_secret": secret,
    }
    if profile.fields.get("scope"):
        form["scope"] = profile.fields["scope"]
    try:
        response = httpx.post(url, data=form, headers={"Accept": "application/json"}, timeout=TOKEN_TIMEOUT)
    except httpx.HTTPError as exc:
        raise EngineUnreachableError(
            f"{where}: the token endpoint did not answer ({type(exc).__name__}); check token_url and the network "
            "(a retry may succeed)"
        ) from None
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200:
        detail = _error_detail(body, secret)
        raise ConfigurationError(
            f"{where}: the token endpoint refused the client credentials: HTTP {response.status_code}{detail}; "
            f"check {profile.setting('client_id')}, the client secret ({profile.setting('secret')}) and scope"
        )
    if not isinstance(body, dict):
        kind = _scrub(
            response.headers.get("content-type", "no content type").split(";")[0].strip()[:100], secret
        )
        raise ConfigurationError(
            f"{where}: the token endpoint answered HTTP 200 without a JSON object ({kind})"
        )
    token = body.get("access_token")
    if not isinstance(token, str) or not token:
        keys = ", ".join(sorted(_scrub(str(k)[:50], secret) for k in body)) or "none"
        raise ConfigurationError(
            f"{where}: the token endpoint's answer has no access_token (keys: {keys}); is token_url the token "
            "endpoint of the identity provider?"
        )
    _compat.mask_secret(token)
    return token, _lifetime(body)


def _lifetime(body: dict[str, Any]) -> float:
    if "expires_in" not in body:
        return DEFAULT_LIFETIME
    value = body["expires_in"]
    if isinstance(value, str):  # some providers send it as a JSON string
        try:
            value = float(value)
        except ValueError:
            return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return 0.0  # unusable: the token is used once, not cached
    return float(value)


def _check_url(url: str, where: str) -> None:
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise ConfigurationError(
            f"{where}: put no credentials in token_url; the client secret comes from secret"
        )
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname and _loopback(parts.hostname):
        return
    raise ConfigurationError(
        f"{where}: token_url must be an https:// URL (http:// only on a loopback address), since the client secret "
        "is sent to it"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _shown(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}{parts.path}"


def _scrub(text: str, secret: str) -> str:
    """Text from the endpoint's answer, withheld when it carries the client secret."""
    return "(withheld: it contains the client secret)" if secret and secret in text else text


def _error_detail(body: Any, secret: str) -> str:
    """The OAuth ``error``/``error_description`` of a refusal, without anything that echoes the secret."""
    if not isinstance(body, dict):
        return ""
    parts = [str(body[k])[:200] for k in ("error", "error_description") if isinstance(body.get(k), str)]
    text = ": ".join(parts)
    if not text or (secret and secret in text):
        return ""
    return f" ({text})"
