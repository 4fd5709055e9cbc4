"""``auth_mode: sts``: an RDS IAM token signed by the real botocore signer logs in to the real cluster.

PostgreSQL cannot check an AWS signature, so the test does what RDS would accept: with time frozen the
signature is deterministic, the test computes the token the hook will send and makes it ``etl_sts``'s
password (``pg_hba``: scram over ``hostssl`` only). A successful login therefore proves that the token was
the password and that TLS was used. AssumeRole is stubbed with botocore's Stubber (exact credentials, so the
token can be precomputed) and exercised once through moto. A stubbed client answers one AssumeRole, so the
tests of the per-process cache count the calls.
"""

from __future__ import annotations

import datetime
import json
import logging
import secrets
import string
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from freezegun import freeze_time
from psycopg2 import sql

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.errors import ConfigurationError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from harness.engines import write_config

pytestmark = pytest.mark.postgres

ROLE = "etl_sts"
REGION = "eu-west-1"
ENV_REGION = "us-east-1"  # deliberately different: the profile's region must sign the token
ROLE_ARN = "arn:aws:iam::123456789012:role/etl-craft-engine"
FROZEN = "2026-01-15 12:00:00"
CONN_ID = "etl_craft_sts"
SOURCES = ["profile", "inline"]


@dataclass
class AwsKeys:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


def _key_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(16))


@pytest.fixture
def aws_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AwsKeys:
    """Fake, per-test AWS credentials in the environment, and nothing else boto3 could pick up."""
    import boto3

    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_REGION",
                 "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_STS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    keys = AwsKeys(_key_id("AKIA"), secrets.token_urlsafe(30))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", keys.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", keys.secret_access_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", ENV_REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # boto3.client() must see this test's environment
    return keys


@pytest.fixture
def sts_db(pg_cluster) -> Iterator[str]:
    name = pg_cluster.create_database(owner=ROLE)
    yield name
    pg_cluster.drop_database(name)


@pytest.fixture
def set_sts_password(pg_cluster) -> Iterator[Callable[[str], None]]:
    """Set etl_sts's password (bound parameter); the session's random password is restored afterwards."""
    admin = pg_cluster.admin_connect()

    def set_password(password: str) -> None:
        admin.cursor().execute(sql.SQL("ALTER ROLE {} PASSWORD %s").format(sql.Identifier(ROLE)), (password,))

    try:
        yield set_password
    finally:
        set_password(pg_cluster.passwords[ROLE])
        admin.close()


@pytest.fixture
def make_hook(
    pg_cluster, sts_db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., EngineDBHook]:
    """Factory: an sts hook from craft-connector.yml or from an inline Airflow connection."""

    def make(source: str, *, query: dict[str, str] | None = None, role_arn: str | None = None,
             region: str | None = REGION) -> EngineDBHook:  # fmt: skip
        query = query or {}
        if source == "profile":
            url = f"jdbc:postgresql://{pg_cluster.host}:{pg_cluster.port}/{sts_db}"
            if query:
                url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
            text = (
                "Engine:\n  Profile: prod\n  prod:\n"
                f"    jdbc_url: {url}\n    schema: etl_craft\n    user: {ROLE}\n    auth_mode: sts\n"
                + (f"    region: {region}\n" if region else "")
                + (f"    role_arn: {role_arn}\n" if role_arn else "")
            )
            return EngineDBHook.from_config(write_config(tmp_path, text))
        extra: dict[str, Any] = {"engine_schema": "etl_craft", "auth_mode": "sts", **query}
        if region:
            extra["region"] = region
        if role_arn:
            extra["role_arn"] = role_arn
        conn = {"conn_type": "etl_craft", "host": pg_cluster.host, "port": pg_cluster.port, "schema": sts_db,
                "login": ROLE, "extra": extra}  # fmt: skip
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
        return EngineDBHook(etl_craft_conn_id=CONN_ID)

    return make


def expected_token(pg_cluster, keys: AwsKeys | None = None) -> str:
    """What RDS would accept: the real botocore signer, the environment's (or the given) credentials."""
    import boto3

    if keys is None:
        client = boto3.client("rds", region_name=REGION)
    else:
        client = boto3.session.Session(
            aws_access_key_id=keys.access_key_id,
            aws_secret_access_key=keys.secret_access_key,
            aws_session_token=keys.session_token,
            region_name=REGION,
        ).client("rds")
    return client.generate_db_auth_token(DBHostname=pg_cluster.host, Port=pg_cluster.port, DBUsername=ROLE,
                                         Region=REGION)  # fmt: skip


def token_query(token: str) -> dict[str, str]:
    host, _, query = token.partition("/?")
    return {"host": host, **{k: v[0] for k, v in parse_qs(query).items()}}


def login(hook: EngineDBHook) -> tuple[str, bool]:
    """Connect through the hook (time must be frozen by the caller) and report (current_user, ssl)."""
    with closing(hook.get_conn()) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_user, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        return cur.fetchone()


def stub_assume_role(monkeypatch: pytest.MonkeyPatch, *, answer: AwsKeys | None = None,
                     error: tuple[str, str] | None = None, answers: list[AwsKeys] | None = None,
                     lifetime: datetime.timedelta = datetime.timedelta(hours=1)) -> list[Any]:  # fmt: skip
    """Attach a botocore Stubber to every STS client boto3 creates; returns the stubbers created.

    Each client answers one AssumeRole: with ``answer``, or the next of ``answers``, valid for ``lifetime``
    from the (frozen) time of the call.
    """
    import boto3
    from botocore.stub import ANY, Stubber

    real_client = boto3.session.Session.client
    stubbers: list[Any] = []
    queue = list(answers) if answers else [answer] * 100

    def client(self: Any, service_name: str, *args: Any, **kwargs: Any) -> Any:
        created = real_client(self, service_name, *args, **kwargs)
        if service_name == "sts":
            stubber = Stubber(created)
            params = {"RoleArn": ROLE_ARN, "RoleSessionName": ANY}
            if error:
                stubber.add_client_error("assume_role", service_error_code=error[0], service_message=error[1],
                                         http_status_code=403, expected_params=params)  # fmt: skip
            else:
                keys = queue.pop(0)
                assert keys is not None
                response = {
                    "Credentials": {
                        "AccessKeyId": keys.access_key_id,
                        "SecretAccessKey": keys.secret_access_key,
                        "SessionToken": keys.session_token,
                        "Expiration": datetime.datetime.now(datetime.UTC) + lifetime,
                    },
                    "AssumedRoleUser": {
                        "AssumedRoleId": "AROA3XFRBF535PLBIFPI4:etl-craft-airflow",
                        "Arn": "arn:aws:sts::123456789012:assumed-role/etl-craft-engine/etl-craft-airflow",
                    },
                }
                stubber.add_response("assume_role", response, params)
            stubber.activate()
            stubbers.append(stubber)
        return created

    monkeypatch.setattr(boto3.session.Session, "client", client)
    return stubbers


# --------------------------------------------------------------------------- logins


@pytest.mark.parametrize("source", SOURCES)
def test_the_rds_token_is_the_password_and_tls_is_required(make_hook, pg_cluster, aws_env, set_sts_password,
                                                           source: str) -> None:  # fmt: skip
    hook = make_hook(source)  # jdbc_url / extras without sslmode
    with freeze_time(FROZEN):
        token = expected_token(pg_cluster)
        set_sts_password(token)
        assert token in _compat.redact(f"x {token} y")  # not masked before connecting

        kwargs = hook.engine.connect_kwargs()
        assert kwargs["password"] == token
        assert kwargs["sslmode"] == "require"
        assert login(hook) == (ROLE, True)

    fields = token_query(token)
    assert fields["host"] == f"{pg_cluster.host}:{pg_cluster.port}"
    assert fields["Action"] == "connect" and fields["DBUser"] == ROLE
    assert fields["X-Amz-Credential"] == f"{aws_env.access_key_id}/20260115/{REGION}/rds-db/aws4_request"
    assert "X-Amz-Security-Token" not in fields
    assert token not in _compat.redact(f"x {token} y")
    assert token not in hook.get_uri()


@pytest.mark.parametrize("source", SOURCES)
def test_the_urls_sslmode_wins_over_the_default(make_hook, pg_cluster, aws_env, set_sts_password,
                                                source: str) -> None:  # fmt: skip
    hook = make_hook(source, query={"sslmode": "disable"})
    with freeze_time(FROZEN):
        token = expected_token(pg_cluster)
        set_sts_password(token)
        assert hook.engine.connect_kwargs()["sslmode"] == "disable"
        with pytest.raises(ConfigurationError, match="refused the login") as caught:
            hook.get_conn()  # etl_sts may log in over hostssl only
    assert "pg_hba.conf" in str(caught.value)
    assert token not in str(caught.value)


def test_a_stricter_sslmode_in_the_url_is_kept(make_hook, pg_cluster, aws_env, set_sts_password) -> None:
    hook = make_hook("profile", query={"sslmode": "verify-full", "sslrootcert": str(pg_cluster.ca_cert)})
    with freeze_time(FROZEN):
        set_sts_password(expected_token(pg_cluster))
        assert hook.engine.connect_kwargs()["sslmode"] == "verify-full"
        assert login(hook) == (ROLE, True)


# --------------------------------------------------------------------------- role_arn


@pytest.mark.parametrize("source", SOURCES)
def test_role_arn_signs_with_the_assumed_roles_credentials(make_hook, pg_cluster, aws_env, set_sts_password,
                                                           monkeypatch, source: str) -> None:  # fmt: skip
    assumed = AwsKeys(_key_id("ASIA"), secrets.token_urlsafe(30), secrets.token_urlsafe(90))
    stubbers = stub_assume_role(monkeypatch, answer=assumed)
    hook = make_hook(source, role_arn=ROLE_ARN)
    with freeze_time(FROZEN):
        token = expected_token(pg_cluster, assumed)
        set_sts_password(token)
        for value in (token, assumed.secret_access_key, assumed.session_token):
            assert value in _compat.redact(f"x {value} y")  # not masked before connecting

        assert login(hook) == (ROLE, True)

    assert len(stubbers) == 1
    stubbers[0].assert_no_pending_responses()
    fields = token_query(token)
    assert fields["X-Amz-Credential"].startswith(f"{assumed.access_key_id}/")
    assert not fields["X-Amz-Credential"].startswith(aws_env.access_key_id)
    assert fields["X-Amz-Security-Token"] == assumed.session_token
    for value in (token, assumed.secret_access_key, assumed.session_token):
        assert value not in _compat.redact(f"x {value} y")


def test_role_arn_through_moto_sts(make_hook, aws_env) -> None:
    """The AssumeRole request as moto's STS implementation parses it; its credentials sign the token."""
    from moto import mock_aws

    hook = make_hook("profile", role_arn=ROLE_ARN)
    with mock_aws():
        environment_key = aws_env.access_key_id
        token = hook.engine.connect_kwargs()["password"]
    fields = token_query(token)
    assumed_key = fields["X-Amz-Credential"].split("/")[0]
    assert assumed_key.startswith("ASIA")
    assert assumed_key not in (environment_key, "FOOBARKEY")  # neither ours nor moto's environment keys
    assert fields["X-Amz-Credential"].endswith(f"/{REGION}/rds-db/aws4_request")
    assert fields["X-Amz-Security-Token"]
    assert fields["X-Amz-Security-Token"] not in _compat.redact(fields["X-Amz-Security-Token"])
    assert token not in _compat.redact(f"x {token} y")


@pytest.mark.parametrize("source", SOURCES)
def test_an_assume_role_refusal_names_the_aws_error_code(
    make_hook, aws_env, monkeypatch, source: str
) -> None:
    stubbers = stub_assume_role(monkeypatch, error=("AccessDenied", "User: arn:aws:iam::123456789012:user/ci is "
                                                    "not authorized to perform: sts:AssumeRole"))  # fmt: skip
    with pytest.raises(ConfigurationError) as caught:
        make_hook(source, role_arn=ROLE_ARN).get_conn()
    message = str(caught.value)
    assert "AccessDenied" in message
    assert "role_arn" in message
    assert aws_env.secret_access_key not in message
    assert len(stubbers) == 1


# --------------------------------------------------------------------------- configuration errors


def test_without_boto3_the_error_names_the_aws_extra(make_hook, aws_env, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(ConfigurationError) as caught:
        make_hook("profile").get_conn()
    assert "pip install 'airflow-provider-etl-craft[aws]'" in str(caught.value)
    assert "Engine.prod.auth_mode" in str(caught.value)


def test_without_aws_credentials_the_error_is_a_configuration_error(make_hook, aws_env, monkeypatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ConfigurationError, match="could not sign an RDS token") as caught:
        make_hook("profile").get_conn()
    assert "NoCredentialsError" in str(caught.value)


@pytest.mark.parametrize("source", SOURCES)
def test_a_missing_region_is_named(make_hook, aws_env, source: str) -> None:
    with pytest.raises(ConfigurationError, match=r"region is required by auth_mode 'sts'") as caught:
        make_hook(source, region=None).get_conn()
    assert ("Engine.prod.region" if source == "profile" else f"connection '{CONN_ID}'.region") in str(
        caught.value
    )


# --------------------------------------------------------------------------- the per-process cache


def _not_botocores(caplog: pytest.LogCaptureFixture) -> str:
    """The captured log without botocore's own DEBUG lines (they show the request it signs, session token
    included, which Airflow's masker hides: the session token is masked before signing)."""
    return "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("botocore"))


def _assumed() -> AwsKeys:
    return AwsKeys(_key_id("ASIA"), secrets.token_urlsafe(30), secrets.token_urlsafe(90))


@pytest.mark.parametrize("source", SOURCES)
def test_the_role_and_the_token_are_reused_until_their_refresh_points(
    make_hook, pg_cluster, aws_env, set_sts_password, monkeypatch, source: str
) -> None:
    first, second = _assumed(), _assumed()
    stubbers = stub_assume_role(monkeypatch, answers=[first, second])  # each valid for 1 h
    hook = make_hook(source, role_arn=ROLE_ARN)
    with freeze_time(FROZEN) as frozen:
        set_sts_password(expected_token(pg_cluster, first))
        for _ in range(3):
            assert login(hook) == (ROLE, True)
        assert len(stubbers) == 1

        frozen.move_to("2026-01-15 12:10:00")  # a token is used for 810 s (15 min less 90 s)
        assert login(hook) == (ROLE, True)  # the password is still the 12:00 token: it was reused

        frozen.move_to("2026-01-15 12:14:00")  # signed anew, with the cached role credentials
        set_sts_password(expected_token(pg_cluster, first))
        assert login(hook) == (ROLE, True)
        assert len(stubbers) == 1

        frozen.move_to("2026-01-15 12:55:00")  # role credentials are used for 54 min (1 h less 6 min)
        set_sts_password(expected_token(pg_cluster, second))
        assert login(hook) == (ROLE, True)
        assert len(stubbers) == 2
    for stubber in stubbers:
        stubber.assert_no_pending_responses()


def test_threads_racing_for_a_token_cause_one_assume_role(
    make_hook, pg_cluster, aws_env, set_sts_password, monkeypatch
) -> None:
    assumed = _assumed()
    stubbers = stub_assume_role(monkeypatch, answers=[assumed])  # a second AssumeRole would fail
    hook = make_hook("profile", role_arn=ROLE_ARN)
    hook.engine  # noqa: B018 (resolved once, before the threads)
    start = threading.Barrier(6)
    results: list[tuple[str, bool]] = []
    with freeze_time(FROZEN):
        set_sts_password(expected_token(pg_cluster, assumed))

        def connect() -> None:
            start.wait()
            results.append(login(hook))

        threads = [threading.Thread(target=connect) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert results == [(ROLE, True)] * 6
    assert len(stubbers) == 1


@pytest.mark.parametrize("source", SOURCES)
def test_a_cached_token_refused_at_login_assumes_the_role_anew_once(
    make_hook, pg_cluster, aws_env, set_sts_password, monkeypatch, caplog, source: str
) -> None:
    caplog.set_level(logging.DEBUG)
    first, second = _assumed(), _assumed()
    stubbers = stub_assume_role(monkeypatch, answers=[first, second])
    hook = make_hook(source, role_arn=ROLE_ARN)
    with freeze_time(FROZEN) as frozen:
        old = expected_token(pg_cluster, first)
        set_sts_password(old)
        assert login(hook) == (ROLE, True)

        frozen.move_to("2026-01-15 12:01:00")  # the role's session is revoked: only new credentials work
        new = expected_token(pg_cluster, second)
        set_sts_password(new)
        assert login(hook) == (ROLE, True)
        assert len(stubbers) == 2
        assert login(hook) == (ROLE, True)
        assert len(stubbers) == 2
    ours = _not_botocores(caplog)
    for value in (old, new, second.secret_access_key, second.session_token):
        assert value not in ours
        assert value not in _compat.redact(
            caplog.text
        )  # botocore's DEBUG lines, as Airflow's masker shows them


def test_a_second_refusal_is_the_configuration_error_without_a_loop(
    make_hook, pg_cluster, aws_env, set_sts_password, monkeypatch, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    first, second, third = _assumed(), _assumed(), _assumed()
    stubbers = stub_assume_role(monkeypatch, answers=[first, second, third])
    hook = make_hook("profile", role_arn=ROLE_ARN)
    with freeze_time(FROZEN):
        old = expected_token(pg_cluster, first)
        set_sts_password(old)
        assert login(hook) == (ROLE, True)
        set_sts_password(secrets.token_urlsafe(32))
        with pytest.raises(ConfigurationError, match="refused the login") as caught:
            hook.get_conn()
        renewed = expected_token(pg_cluster, second)
    assert len(stubbers) == 2  # the cached token, then one renewal: no loop
    ours = _not_botocores(caplog)
    for value in (old, renewed, first.session_token, second.session_token):
        assert value not in str(caught.value)
        assert value not in ours
        assert value not in _compat.redact(caplog.text)


def test_a_fresh_token_refused_at_login_is_not_renewed(make_hook, pg_cluster, aws_env, monkeypatch) -> None:
    stubbers = stub_assume_role(monkeypatch, answers=[_assumed(), _assumed()])
    with freeze_time(FROZEN), pytest.raises(ConfigurationError, match="refused the login"):
        make_hook("profile", role_arn=ROLE_ARN).get_conn()  # the role's password is no token
    assert len(stubbers) == 1
