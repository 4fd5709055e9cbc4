"""``auth_mode: sts``: an AWS RDS IAM authentication token, signed by botocore, as the password.

With ``role_arn`` the token is signed with credentials from STS ``AssumeRole``; otherwise with boto3's
default credential chain (environment, instance or task role, …). ``sslmode=require`` unless the URL sets
``sslmode``. boto3 comes with the ``[aws]`` extra.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.auth.base import USER, AuthMode, Field, ProfileView
from airflow_provider_etl_craft.engine.url import PostgresTarget
from airflow_provider_etl_craft.errors import ConfigurationError

SESSION_NAME = "etl-craft-airflow"


class StsAuth(AuthMode):
    """Signs a fresh RDS IAM token for every connection; TLS is required unless the URL says otherwise."""

    def connect_kwargs(self, profile: ProfileView) -> dict[str, Any]:
        target = profile.target
        assert isinstance(target, PostgresTarget)
        kwargs: dict[str, Any] = {"user": profile.user, "password": rds_token(profile, target)}
        if "sslmode" not in target.settings:
            kwargs["sslmode"] = "require"
        return kwargs


STS = StsAuth(
    "sts",
    "an AWS RDS IAM token, signed per connection",
    (
        USER,
        Field("region", "AWS region", "the RDS region"),
        Field("role_arn", "AWS role ARN", "the role to assume first", required=False),
    ),
)


def rds_token(profile: ProfileView, target: PostgresTarget) -> str:
    """A fresh RDS IAM token for ``target`` (valid 15 minutes), registered with the secret masker.

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
    try:
        session = boto3.session.Session(region_name=region)
        if role_arn:
            answer = session.client("sts").assume_role(RoleArn=role_arn, RoleSessionName=SESSION_NAME)
            creds = answer["Credentials"]
            for value in (creds["SecretAccessKey"], creds["SessionToken"]):
                _compat.mask_secret(value)
            session = boto3.session.Session(
                aws_access_key_id=creds["AccessKeyId"],
                aws_secret_access_key=creds["SecretAccessKey"],
                aws_session_token=creds["SessionToken"],
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
    return token
