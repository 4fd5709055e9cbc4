"""``auth_mode: oauth`` against a real client-credentials token endpoint on loopback and the real cluster.

The token endpoint is an ``http.server`` on 127.0.0.1 (plain http is allowed only on loopback). It checks
the form the provider posts and answers with the ``etl_oauth`` role's scram password as ``access_token``, so
a successful login proves that the token reached PostgreSQL as the password. It can be switched to
refuse (401, echoing the client secret like a careless identity provider), to answer without
``access_token`` or with an HTML page; it counts the requests, so the tests of the per-process token cache
count at the server.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from psycopg2 import sql

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.errors import ConfigurationError, EngineUnreachableError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from harness.engines import write_config

pytestmark = pytest.mark.postgres

ROLE = "etl_oauth"
CLIENT_ID = "etl-craft-test-client"
SCOPE = "engine.login"
SECRET_VAR = "OAUTH_CLIENT_SECRET"
CONN_ID = "etl_craft_oauth"
SOURCES = ["profile", "inline"]


# --------------------------------------------------------------------------- the token endpoint


@dataclass
class TokenEndpoint:
    """State of the loopback token endpoint: what it expects, how it answers, what it received."""

    url: str
    client_secret: str
    access_token: str
    #: ok | unauthorized | no_token | html | no_token_echo | html_echo
    mode: str = "ok"
    #: The ``expires_in`` of a token answer; ``None``: the answer has none.
    expires_in: int | None = 300
    #: Seconds to wait before answering (so that racing clients overlap).
    delay: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.requests)

    def answer(self, path: str, content_type: str, body: bytes) -> tuple[int, str, bytes]:
        form = {
            k: v[0] if len(v) == 1 else v for k, v in parse_qs(body.decode(), keep_blank_values=True).items()
        }
        self.requests.append({"path": path, "content_type": content_type, "form": form})
        time.sleep(self.delay)
        problems = []
        if path != "/token":
            problems.append(f"path {path}")
        if content_type.split(";")[0].strip().lower() != "application/x-www-form-urlencoded":
            problems.append(f"content type {content_type!r}")
        expected = {"grant_type": "client_credentials", "client_id": CLIENT_ID,
                    "client_secret": self.client_secret, "scope": SCOPE}  # fmt: skip
        for key, value in expected.items():
            if form.get(key) != value:
                problems.append(f"{key} is {'missing' if key not in form else 'wrong'}")
        if set(form) - set(expected):
            problems.append(f"unexpected fields {sorted(set(form) - set(expected))}")
        if problems:
            self.problems.extend(problems)
            return _json(400, {"error": "invalid_request", "error_description": "; ".join(problems)})
        if self.mode == "unauthorized":  # a hostile/careless server that echoes the secret back
            return _json(
                401, {"error": "invalid_client", "error_description": f"bad secret {self.client_secret}"}
            )
        if self.mode == "no_token":
            return _json(200, {"token_type": "Bearer", "expires_in": 300})
        if self.mode == "no_token_echo":  # echoes the secret in a key of an answer without access_token
            return _json(200, {"token_type": "Bearer", f"unknown client secret {self.client_secret}": True})
        if self.mode == "html_echo":  # echoes the secret in the Content-Type of a non-JSON answer
            return 200, f"text/html; client={self.client_secret}", b"<html><body>Sign in</body></html>"
        if self.mode == "html":
            return 200, "text/html; charset=utf-8", b"<html><body><h1>Sign in</h1></body></html>"
        answer: dict[str, Any] = {"access_token": self.access_token, "token_type": "Bearer"}
        if self.expires_in is not None:
            answer["expires_in"] = self.expires_in
        return _json(200, answer)


def _json(status: int, body: dict[str, Any]) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body).encode()


def _handler(endpoint: TokenEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, content_type, payload = endpoint.answer(
                self.path, self.headers.get("Content-Type", ""), body
            )
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (base class signature)
            pass

    return Handler


@pytest.fixture
def endpoint(pg_cluster) -> Iterator[TokenEndpoint]:
    """A token endpoint on 127.0.0.1 that hands out the etl_oauth password; a fresh client secret per test."""
    state = TokenEndpoint(
        url="", client_secret=secrets.token_urlsafe(24), access_token=pg_cluster.passwords[ROLE]
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}/token"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# --------------------------------------------------------------------------- hooks on it


@pytest.fixture
def oauth_db(pg_cluster) -> Iterator[str]:
    name = pg_cluster.create_database(owner=ROLE)
    yield name
    pg_cluster.drop_database(name)


@pytest.fixture
def make_hook(pg_cluster, oauth_db, endpoint, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> Callable[..., EngineDBHook]:  # fmt: skip
    """Factory: a hook on the oauth profile — from craft-connector.yml or from an inline Airflow connection."""
    monkeypatch.delenv("OAUTH_PROD_CLIENT_SECRET", raising=False)  # the profile twin must not interfere

    def make(source: str, token_url: str | None = None) -> EngineDBHook:
        token_url = token_url or endpoint.url
        if source == "profile":
            monkeypatch.setenv(SECRET_VAR, endpoint.client_secret)
            text = (
                "Secrets:\n  Source_type: environment\n"
                "Engine:\n  Profile: prod\n  prod:\n"
                f"    jdbc_url: jdbc:postgresql://{pg_cluster.host}:{pg_cluster.port}/{oauth_db}\n"
                "    schema: etl_craft\n"
                f"    user: {ROLE}\n"
                "    auth_mode: oauth\n"
                f"    client_id: {CLIENT_ID}\n"
                f"    secret: {SECRET_VAR}\n"
                f"    token_url: '{token_url}'\n"
                f"    scope: {SCOPE}\n"
            )
            return EngineDBHook.from_config(write_config(tmp_path, text))
        conn = {
            "conn_type": "etl_craft", "host": pg_cluster.host, "port": pg_cluster.port, "schema": oauth_db,
            "login": ROLE, "password": endpoint.client_secret,
            "extra": {"engine_schema": "etl_craft", "auth_mode": "oauth", "client_id": CLIENT_ID,
                      "token_url": token_url, "scope": SCOPE},
        }  # fmt: skip
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
        return EngineDBHook(etl_craft_conn_id=CONN_ID)

    return make


def _scalar(hook: EngineDBHook, query: str) -> Any:
    with closing(hook.get_conn()) as conn:  # through the dialect: it sets the Engine schema per statement
        return hook.engine.query(conn, query)[0][0]


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- logins


@pytest.mark.parametrize("source", SOURCES)
def test_the_access_token_logs_in_as_etl_oauth_and_init_db_works(make_hook, endpoint, source: str) -> None:
    hook = make_hook(source)

    assert _scalar(hook, "SELECT current_user") == ROLE
    assert hook.init_db().created
    assert (
        _scalar(hook, "SELECT MAX(VERSION) FROM SCHEMA_MIGRATIONS WHERE SOURCE = 'ENGINE'")
        == "0007_config_indexes.sql"
    )

    assert endpoint.problems == []
    assert endpoint.count == 1  # every connection of init-db and the queries used the one token
    first = endpoint.requests[0]
    assert first["path"] == "/token"
    assert first["content_type"].startswith("application/x-www-form-urlencoded")
    assert first["form"] == {"grant_type": "client_credentials", "client_id": CLIENT_ID,
                             "client_secret": endpoint.client_secret, "scope": SCOPE}  # fmt: skip


@pytest.mark.parametrize("source", SOURCES)
def test_the_connections_of_a_process_share_one_token(make_hook, endpoint, source: str) -> None:
    hook = make_hook(source)
    hook.engine_profile  # noqa: B018 (resolve the profile first: that alone must not fetch a token)
    assert endpoint.count == 0

    connections = [hook.get_conn() for _ in range(5)]
    try:
        assert endpoint.count == 1
        assert len({conn.get_backend_pid() for conn in connections}) == 5
    finally:
        for conn in connections:
            conn.close()
    assert _scalar(make_hook(source), "SELECT current_user") == ROLE  # a new hook on the same profile too
    assert endpoint.count == 1 and endpoint.problems == []


@pytest.mark.parametrize("source", SOURCES)
def test_redact_hides_the_client_secret_and_the_access_token(
    make_hook, endpoint, pg_cluster, source: str
) -> None:
    # A token never used before in this session, so the masker cannot already know it.
    token = secrets.token_urlsafe(32)
    admin = pg_cluster.admin_connect()
    try:
        admin.cursor().execute(sql.SQL("ALTER ROLE {} PASSWORD %s").format(sql.Identifier(ROLE)), (token,))
        endpoint.access_token = token
        hook = make_hook(source)
        for value in (endpoint.client_secret, token):
            assert value in _compat.redact(f"x {value} y")  # not masked before connecting

        assert _scalar(hook, "SELECT current_user") == ROLE

        for value in (endpoint.client_secret, token):
            redacted = _compat.redact(f"x {value} y")
            assert value not in redacted
            assert redacted.startswith("x ") and redacted.endswith(" y")
        assert endpoint.client_secret not in hook.get_uri() and token not in hook.get_uri()
    finally:
        admin.cursor().execute(
            sql.SQL("ALTER ROLE {} PASSWORD %s").format(sql.Identifier(ROLE)), (pg_cluster.passwords[ROLE],)
        )
        admin.close()


def test_a_token_the_server_does_not_accept_is_a_login_error(make_hook, endpoint) -> None:
    endpoint.access_token = secrets.token_urlsafe(32)  # not etl_oauth's password
    hook = make_hook("profile")
    with pytest.raises(ConfigurationError, match="refused the login") as caught:
        hook.get_conn()
    assert endpoint.access_token not in str(caught.value)
    assert endpoint.client_secret not in str(caught.value)
    assert endpoint.count == 1  # a token fetched for this login and refused: no second one


# --------------------------------------------------------------------------- token endpoint failures


@pytest.mark.parametrize("source", SOURCES)
def test_a_401_is_a_configuration_error_without_the_echoed_client_secret(
    make_hook, endpoint, source: str
) -> None:
    endpoint.mode = "unauthorized"
    hook = make_hook(source)
    with pytest.raises(ConfigurationError) as caught:
        hook.get_conn()
    message = str(caught.value)
    assert not isinstance(caught.value, EngineUnreachableError)  # a refusal is not worth a retry
    assert "HTTP 401" in message
    assert endpoint.client_secret not in message
    assert "bad secret" not in message  # the echoing description is dropped as a whole
    assert "client_id" in message and "secret" in message  # it says what to check
    assert endpoint.count == 1 and endpoint.problems == []


def test_an_answer_without_access_token_is_a_clear_error(make_hook, endpoint) -> None:
    endpoint.mode = "no_token"
    with pytest.raises(ConfigurationError, match="no access_token") as caught:
        make_hook("profile").get_conn()
    message = str(caught.value)
    assert "expires_in, token_type" in message  # names what the answer did hold
    assert "Engine.prod.token_url" in message
    assert endpoint.client_secret not in message


def test_a_non_json_answer_is_a_clear_error(make_hook, endpoint) -> None:
    endpoint.mode = "html"
    with pytest.raises(ConfigurationError, match="without a JSON object") as caught:
        make_hook("profile").get_conn()
    message = str(caught.value)
    assert "text/html" in message
    assert "<html>" not in message
    assert endpoint.client_secret not in message


@pytest.mark.parametrize("mode", ["no_token_echo", "html_echo"])
def test_an_echoing_endpoint_cannot_smuggle_the_secret_into_other_errors(
    make_hook, endpoint, mode: str
) -> None:
    endpoint.mode = mode
    with pytest.raises(ConfigurationError) as caught:
        make_hook("profile").get_conn()
    assert endpoint.client_secret not in str(caught.value)


@pytest.mark.parametrize("source", SOURCES)
def test_an_endpoint_that_is_down_is_unreachable_and_retryable(make_hook, endpoint, source: str) -> None:
    hook = make_hook(source, token_url=f"http://127.0.0.1:{_closed_port()}/token")
    with pytest.raises(EngineUnreachableError, match="token endpoint did not answer") as caught:
        hook.get_conn()
    assert caught.value.retryable
    assert endpoint.client_secret not in str(caught.value)


@pytest.mark.parametrize(
    ("token_url", "expected"),
    [
        ("http://auth.example.com/token", "must be an https:// URL"),
        ("http://10.20.30.40:8080/token", "must be an https:// URL"),
        ("http://localhost.attacker.example/token", "must be an https:// URL"),
        ("http://127.0.0.1.attacker.example/token", "must be an https:// URL"),
        ("http://client:hunter2-in-url@127.0.0.1:{port}/token", "no credentials in token_url"),
        ("https://client:hunter2-in-url@auth.example.com/token", "no credentials in token_url"),
    ],
)
@pytest.mark.parametrize("source", SOURCES)
def test_unsafe_token_urls_are_refused_before_any_request(
    make_hook, endpoint, monkeypatch: pytest.MonkeyPatch, token_url: str, expected: str, source: str
) -> None:
    import httpx

    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(httpx, "post", lambda *a, **k: sent.append(a) or pytest.fail("a request was sent"))
    port = endpoint.url.split(":")[2].split("/")[0]
    hook = make_hook(source, token_url=token_url.format(port=port))
    with pytest.raises(ConfigurationError, match=expected) as caught:
        hook.get_conn()
    assert sent == [] and endpoint.count == 0
    message = str(caught.value)
    assert "hunter2-in-url" not in message
    assert endpoint.client_secret not in message


# --------------------------------------------------------------------------- the per-process token cache


@pytest.fixture
def set_role_password(pg_cluster) -> Iterator[Callable[[str], None]]:
    """Rotate etl_oauth's password (bound parameter); the session's password is restored afterwards."""
    admin = pg_cluster.admin_connect()

    def set_password(password: str) -> None:
        admin.cursor().execute(sql.SQL("ALTER ROLE {} PASSWORD %s").format(sql.Identifier(ROLE)), (password,))

    try:
        yield set_password
    finally:
        set_password(pg_cluster.passwords[ROLE])
        admin.close()


def test_threads_racing_for_a_token_cause_one_request(make_hook, endpoint) -> None:
    endpoint.delay = 0.3  # every thread misses the cache before the first answer arrives
    hook = make_hook("profile")
    hook.engine  # noqa: B018 (resolved once, before the threads)
    start = threading.Barrier(8)
    users: list[str] = []

    def connect() -> None:
        start.wait()
        users.append(_scalar(hook, "SELECT current_user"))

    threads = [threading.Thread(target=connect) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert users == [ROLE] * 8
    assert endpoint.count == 1


def test_a_token_is_fetched_anew_after_its_refresh_point(make_hook, endpoint) -> None:
    endpoint.expires_in = 2  # refreshed halfway: after 1 s
    hook = make_hook("profile")
    assert _scalar(hook, "SELECT current_user") == ROLE
    assert _scalar(hook, "SELECT current_user") == ROLE
    assert endpoint.count == 1
    time.sleep(1.1)
    assert _scalar(hook, "SELECT current_user") == ROLE
    assert endpoint.count == 2
    assert _scalar(hook, "SELECT current_user") == ROLE
    assert endpoint.count == 2


def test_without_expires_in_the_token_is_kept_for_the_default_lifetime(make_hook, endpoint) -> None:
    endpoint.expires_in = None
    hook = make_hook("profile")
    for _ in range(3):
        assert _scalar(hook, "SELECT current_user") == ROLE
    assert endpoint.count == 1


@pytest.mark.parametrize("source", SOURCES)
def test_a_cached_token_refused_at_login_is_fetched_anew_once(
    make_hook, endpoint, set_role_password, caplog, source: str
) -> None:
    caplog.set_level(logging.DEBUG)
    hook = make_hook(source)
    first = endpoint.access_token
    assert _scalar(hook, "SELECT current_user") == ROLE
    assert endpoint.count == 1

    endpoint.access_token = secrets.token_urlsafe(32)  # the identity provider rotates the role's token
    set_role_password(endpoint.access_token)
    assert _scalar(hook, "SELECT current_user") == ROLE  # the cached token is refused, a new one works
    assert endpoint.count == 2
    assert _scalar(hook, "SELECT current_user") == ROLE
    assert endpoint.count == 2  # the new token is the cached one now

    for value in (first, endpoint.access_token, endpoint.client_secret):
        assert value not in caplog.text
        assert value not in _compat.redact(f"x {value} y")


def test_a_second_refusal_is_the_configuration_error_without_a_loop(
    make_hook, endpoint, set_role_password, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    hook = make_hook("profile")
    assert _scalar(hook, "SELECT current_user") == ROLE
    set_role_password(secrets.token_urlsafe(32))  # no token of the endpoint's logs in any more

    with pytest.raises(ConfigurationError, match="refused the login") as caught:
        hook.get_conn()
    assert not isinstance(caught.value, EngineUnreachableError)
    assert endpoint.count == 2  # the cached token, then one fresh one: no more
    for value in (endpoint.access_token, endpoint.client_secret):
        assert value not in str(caught.value)
        assert value not in caplog.text


def _connect_twice(hook: EngineDBHook) -> None:
    for _ in range(2):
        assert _scalar(hook, "SELECT current_user") == ROLE


def test_each_process_fetches_its_own_token(make_hook, endpoint) -> None:
    hook = make_hook("profile")
    _connect_twice(hook)
    assert endpoint.count == 1

    # Forked children start with an empty cache (not the parent's token) and keep their own.
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=_connect_twice, args=(hook,)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0, 0]
    assert endpoint.count == 3
    _connect_twice(hook)
    assert endpoint.count == 3  # the parent's token is still cached
