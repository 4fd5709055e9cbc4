"""``auth_mode: sts``: an AWS RDS IAM authentication token, signed by botocore, as the password.

With ``role_arn`` the token is signed with credentials from STS ``AssumeRole``; otherwise with boto3's
default credential chain (environment, instance or task role, …). ``sslmode=require`` unless the URL sets
``sslmode``. boto3 comes with the ``[aws]`` extra.

Both are kept in this process's memory (:mod:`.cache`): the assumed role's credentials until shortly before
their ``Expiration``; a token (botocore signs it locally, valid 15 minutes) until shortly before it, or the
credentials that signed it, expire. A login refused with a cached token drops both and signs once more.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from msgspec import Struct

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.auth.base import USER, AuthMode, Field, ProfileView
from airflow_provider_etl_craft.auth.cache import ExpiringCache
from airflow_provider_etl_craft.engine.url import PostgresTarget
from airflow_provider_etl_craft.errors import ConfigurationError

SESSION_NAME = "etl-craft-airflow"
#: Seconds an RDS IAM token is valid: botocore's ``generate_db_auth_token`` presigns it for 900 seconds.
TOKEN_LIFETIME = 900.0


class RoleKeys(Struct, frozen=True):
    """Temporary credentials of an assumed role, and when AWS expires them (the secret parts never in its repr)."""

    access_key_id: str
    secret_access_key: str
    session_token: str
    expiration: datetime.datetime

    def __repr__(self) -> str:
        return f"RoleKeys(access_key_id={self.access_key_id!r}, expiration={self.expiration!r})"

    def seconds_left(self) -> float:
        return (self.expiration - datetime.datetime.now(datetime.UTC)).total_seconds()


#: AssumeRole credentials by (region, role ARN, session name).
_ROLES: ExpiringCache[RoleKeys] = ExpiringCache()
#: RDS tokens by (host, port, user, region, role ARN or None).
_TOKENS: ExpiringCache[str] = ExpiringCache()


class StsAuth(AuthMode, frozen=True):
    """Signs an RDS IAM token per profile and process (cached, see the module); TLS is required unless the URL
    says otherwise."""

    def connect_kwargs(self, profile: ProfileView) -> dict[str, Any]:
        target = self._target(profile)
        token = _TOKENS.get(_token_key(profile, target), lambda: rds_token(profile, target))
        return self._kwargs(profile, target, token)

    def renew_kwargs(self, profile: ProfileView, refused: Mapping[str, Any]) -> dict[str, Any] | None:
        target = self._target(profile)

        def sign_anew() -> tuple[str, float]:
            if profile.fields.get("role_arn"):
                _ROLES.discard(_role_key(profile))  # the role's session may have been revoked
            return rds_token(profile, target)

        token = _TOKENS.renew(_token_key(profile, target), refused["password"], sign_anew)
        return None if token is None else self._kwargs(profile, target, token)

    @staticmethod
    def _target(profile: ProfileView) -> PostgresTarget:
        target = profile.target
        assert isinstance(target, PostgresTarget)
        if target.other_hosts:  # libpq sends one password to every host it tries
            raise ConfigurationError(
                f"{profile.origin}: {profile.setting('auth_mode')} is 'sts', whose RDS token is signed for one "
                f"host name, but {profile.setting('jdbc_url')} names {len(target.hosts)} hosts; give one host (the "
                "RDS or Aurora cluster endpoint, which follows a failover)"
            )
        return target

    @staticmethod
    def _kwargs(profile: ProfileView, target: PostgresTarget, token: str) -> dict[str, Any]:
        _compat.mask_secret(token)  # again on every use: a no-op unless the masker was reset since
        kwargs: dict[str, Any] = {"user": profile.user, "password": token}
        if "sslmode" not in target.settings:
            kwargs["sslmode"] = "require"
        return kwargs


STS = StsAuth(
    "sts",
    "an AWS RDS IAM token, cached per process until shortly before it expires",
    (
        USER,
        Field("region", "AWS region", "the RDS region"),
        Field("role_arn", "AWS role ARN", "the role to assume first", required=False),
    ),
)


def _role_key(profile: ProfileView) -> tuple[str, ...]:
    return (profile.fields["region"], profile.fields["role_arn"], SESSION_NAME)


def _token_key(profile: ProfileView, target: PostgresTarget) -> tuple[Any, ...]:
    region, role_arn = profile.fields["region"], profile.fields.get("role_arn")
    return (target.host, target.port, profile.user, region, role_arn)


def rds_token(profile: ProfileView, target: PostgresTarget) -> tuple[str, float]:
    """A new RDS IAM token for ``target``, registered with the secret masker, and its lifetime in seconds
    (15 minutes, less if the assumed role's credentials expire sooner).

    :raises ConfigurationError: boto3 missing, no AWS credentials, AssumeRole refused.
    """
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise ConfigurationError(
            f"{profile.origin}: {profile.setting('auth_mode')} is 'sts', which needs boto3: "
            "pip install 'airflow-provider-etl-craft[aws]'"
        ) from None
    region, role_arn = profile.fields["region"], profile.fields.get("role_arn")
    where = f"{profile.origin}: {profile.setting('auth_mode')} 'sts'"
    lifetime = TOKEN_LIFETIME
    try:
        session = boto3.session.Session(region_name=region)
        if role_arn:
            keys = _ROLES.get(_role_key(profile), lambda: _assume_role(session, role_arn))
            lifetime = min(lifetime, keys.seconds_left())
            session = boto3.session.Session(
                aws_access_key_id=keys.access_key_id,
                aws_secret_access_key=keys.secret_access_key,
                aws_session_token=keys.session_token,
                region_name=region,
            )
        token = session.client("rds").generate_db_auth_token(
            DBHostname=target.host, Port=target.port, DBUsername=profile.user, Region=region
        )
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise ConfigurationError(
            f"{where}: AWS refused ({error.get('Code', 'error')}: {str(error.get('Message', ''))[:200]}); "
            f"check {profile.setting('role_arn')} and the worker's AWS credentials"
        ) from None
    except BotoCoreError as exc:
        raise ConfigurationError(
            f"{where}: could not sign an RDS token ({type(exc).__name__}: {exc}); check the worker's AWS credentials "
            f"and {profile.setting('region')}"
        ) from None
    _compat.mask_secret(token)
    return token, lifetime


def _assume_role(session: Any, role_arn: str) -> tuple[RoleKeys, float]:
    """One STS ``AssumeRole`` call; the credentials' secrets are masked, their lifetime is up to ``Expiration``."""
    answer = session.client("sts").assume_role(RoleArn=role_arn, RoleSessionName=SESSION_NAME)
    creds = answer["Credentials"]
    for value in (creds["SecretAccessKey"], creds["SessionToken"]):
        _compat.mask_secret(value)
    expiration = creds["Expiration"]  # botocore parses it into an aware datetime
    if expiration.tzinfo is None:
        expiration = expiration.replace(tzinfo=datetime.UTC)
    keys = RoleKeys(creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"], expiration)
    return keys, keys.seconds_left()
