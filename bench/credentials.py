"""Part 4: credential calls per pipeline run for ``auth_mode: sts`` and ``auth_mode: oauth`` (PostgreSQL).

Every step of a pipeline run opens its own connection, as the operators do, and every connection asks its
auth mode for a password. The provider keeps tokens and assumed-role keys in a per-process cache
(:mod:`airflow_provider_etl_craft.auth.cache`), so a process should call its identity provider at most once
per expiry window, however many connections it opens. This part counts those calls where they arrive:

* one loopback HTTP server (127.0.0.1, a free port) plays both identity providers and counts each request
  by the process that sent it:

  - the OAuth 2.0 token endpoint: a client-credentials form POST to ``/token/<variant>/<worker>`` (each
    worker's profile names its own path, so the server can tell the processes apart; a process's cache
    key holds its one URL, so this changes nothing for the cache). It checks the form and answers with
    the ``etl_oauth`` role's scram password as ``access_token``: every login proves the token was used.
    Two variants: ``oauth`` answers ``expires_in`` 300 s (the cache uses a token for 240 s), and
    ``oauth-short`` answers 2 s (used for 1 s), so that a run spans several expiry windows;
  - STS: ``AssumeRole`` (the query protocol botocore speaks, ``AWS_ENDPOINT_URL_STS`` points it here),
    answering fresh keys valid for one hour; the worker is known by the fake access key id of its
    environment credentials (``AKIABENCHW<nn>…``), which signs the request.

* ``sts`` also signs an RDS IAM token per process (botocore signs it locally, valid 15 minutes, used for
  13.5). Those signings are counted in the process, by a wrapper around botocore's signer. PostgreSQL cannot
  check an AWS signature, so the ``bench_sts`` role logs in with ``trust`` over ``hostssl`` from 127.0.0.1
  (a line the bench adds to its throwaway cluster's ``pg_hba.conf``): the token is sent, not verified
  (the test suite verifies it with time frozen; a benchmark cannot freeze time).

For each number of processes (1 and 2), fresh spawned processes (empty caches) start at the same instant
and each runs ``runs`` pipeline runs of ``tasks`` tasks of its own pipeline, in each variant in turn, a
connection per step (``2 + 2 × tasks`` connections per run). Reported per variant: calls at the server per
pipeline run, per process (the most any one process made), per connection, and the expiry windows each
process's runs spanned; the target is at most one call per process per expiry window.

Nothing here sends traffic anywhere but 127.0.0.1: each worker checks that its STS client's endpoint is
the loopback server before it connects, and stops otherwise.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import queue
import re
import secrets
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

#: The variants, in the order each worker runs them: (name, auth mode, token lifetime the server answers).
VARIANTS = (("sts", "sts", None), ("oauth", "oauth", 300), ("oauth-short", "oauth", 2))
OAUTH_ROLE = "etl_oauth"
STS_ROLE = "bench_sts"
CLIENT_ID = "etl-craft-bench"
SECRET_VAR = "ETL_CRAFT_BENCH_OAUTH_SECRET"
REGION = "eu-west-1"
ROLE_ARN = "arn:aws:iam::123456789012:role/etl-craft-bench"
#: Seconds the assumed role's keys are valid (the server's ``Expiration``).
ROLE_LIFETIME = 3600.0
KEY_PREFIX = "AKIABENCHW"
LOCK_TIMEOUT = 60.0
READY_TIMEOUT = 180.0
DONE_TIMEOUT = 600.0
DAG_ID = "bench_credentials"


def pipeline_code(worker: int) -> str:
    return f"BENCH_K{worker:02d}"


def worker_key_id(worker: int) -> str:
    return f"{KEY_PREFIX}{worker:02d}{'X' * 8}"


# --------------------------------------------------------------------------- the identity providers


class IdentityServer:
    """The loopback OAuth token endpoint and STS, counting requests by (variant, worker)."""

    def __init__(self, access_token: str, client_secret: str) -> None:
        self.access_token = access_token
        self.client_secret = client_secret
        self.counts: Counter[tuple[str, str]] = Counter()
        self.problems: list[str] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="bench-identity-server", daemon=True)  # fmt: skip
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def snapshot(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return Counter(self.counts)

    def _count(self, variant: str, worker: str, problem: str | None = None) -> None:
        with self._lock:
            self.counts[(variant, worker)] += 1
            if problem:
                self.problems.append(f"{variant} {worker}: {problem}")

    def answer(self, path: str, headers: Any, body: bytes) -> tuple[int, str, bytes]:
        form = {k: v[0] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}
        if path.startswith("/token/"):
            return self._token(path, form)
        if form.get("Action") == "AssumeRole":
            return self._assume_role(headers.get("Authorization", ""), form)
        self._count("unknown", path, f"unexpected request {path} {sorted(form)}")
        return 404, "text/plain", b"not found"

    def _token(self, path: str, form: dict[str, str]) -> tuple[int, str, bytes]:
        _, _, variant, worker = (path.split("?")[0].split("/") + ["", ""])[:4]
        expected = {
            "grant_type": "client_credentials",
            "client_id": CLIENT_ID,
            "client_secret": self.client_secret,
        }
        wrong = sorted(k for k, v in expected.items() if form.get(k) != v)
        self._count(variant, worker, f"wrong or missing {wrong}" if wrong else None)
        if wrong:
            return 400, "application/json", b'{"error": "invalid_request"}'
        lifetime = {name: life for name, _, life in VARIANTS}.get(variant) or 300
        body = f'{{"access_token": "{self.access_token}", "token_type": "Bearer", "expires_in": {lifetime}}}'
        return 200, "application/json", body.encode()

    def _assume_role(self, authorization: str, form: dict[str, str]) -> tuple[int, str, bytes]:
        found = re.search(rf"Credential=({KEY_PREFIX}\d\d|[A-Z0-9]+)", authorization)
        key = found.group(1) if found else "unsigned"
        worker = f"w{key[len(KEY_PREFIX) :]}" if key.startswith(KEY_PREFIX) else key
        problem = None if form.get("RoleArn") == ROLE_ARN else f"RoleArn {form.get('RoleArn')!r}"
        self._count("sts", worker, problem)
        expiration = (datetime.now(UTC) + timedelta(seconds=ROLE_LIFETIME)).strftime("%Y-%m-%dT%H:%M:%SZ")
        xml = (
            '<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult>'
            f"<Credentials><AccessKeyId>ASIA{secrets.token_hex(8).upper()}</AccessKeyId>"
            f"<SecretAccessKey>{secrets.token_urlsafe(30)}</SecretAccessKey>"
            f"<SessionToken>{secrets.token_urlsafe(90)}</SessionToken><Expiration>{expiration}</Expiration>"
            "</Credentials><AssumedRoleUser><AssumedRoleId>AROABENCH:etl-craft-airflow</AssumedRoleId>"
            f"<Arn>{ROLE_ARN}/etl-craft-airflow</Arn></AssumedRoleUser></AssumeRoleResult>"
            f"<ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId></ResponseMetadata></AssumeRoleResponse>"
        )
        return 200, "text/xml", xml.encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, content_type, payload = server.answer(self.path, self.headers, body)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (base class signature)
                pass

        return Handler


# --------------------------------------------------------------------------- environment and profiles


def aws_environment(server_url: str, folder: Path) -> dict[str, str]:
    """Fake AWS settings that point STS at the loopback server and let boto3 find nothing else."""
    no_proxy = ",".join(filter(None, ["127.0.0.1,localhost", os.environ.get("NO_PROXY")]))
    return {
        "AWS_ACCESS_KEY_ID": f"{KEY_PREFIX}PA{'X' * 8}",  # each worker sets its own
        "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_STS": server_url,
        "AWS_ENDPOINT_URL": server_url,  # any other AWS call goes to the loopback server too, never out
        "AWS_CONFIG_FILE": str(folder / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
    }


#: AWS variables that would make boto3 look elsewhere; removed in the workers and while the parent sets up.
AWS_UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_REGION",
             "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
             "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")  # fmt: skip


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` set (and :data:`AWS_UNSET` removed) in ``os.environ`` while the block runs."""
    saved = {k: os.environ.get(k) for k in (*values, *AWS_UNSET)}
    for name in AWS_UNSET:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _profile(
    variant: str, mode: str, host: str, port: int, database: str, server_url: str, worker: str
) -> str:
    head = f"Engine:\n  Profile: bench\n  bench:\n    jdbc_url: jdbc:postgresql://{host}:{port}/{database}\n"
    head += "    schema: etl_craft\n"
    if mode == "sts":
        return (
            head
            + f"    user: {STS_ROLE}\n    auth_mode: sts\n    region: {REGION}\n    role_arn: {ROLE_ARN}\n"
        )
    return ("Secrets:\n  Source_type: environment\n" + head + f"    user: {OAUTH_ROLE}\n    auth_mode: oauth\n"
            f"    client_id: {CLIENT_ID}\n    secret: {SECRET_VAR}\n"
            f"    token_url: '{server_url}/token/{variant}/{worker}'\n")  # fmt: skip


def _allow_sts_role(pg: Any) -> None:
    """Create ``bench_sts`` and let it log in over TLS from 127.0.0.1 without a password check."""
    from psycopg2 import sql

    from harness.postgres import _write

    cluster = pg.cluster
    with closing(cluster.admin_connect()) as admin, admin.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (STS_ROLE,))
        if cur.fetchone() is None:
            cur.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(STS_ROLE)))
    hba_path = cluster.datadir / "pg_hba.conf"
    lines = hba_path.read_text().splitlines()
    line = f"hostssl all  {STS_ROLE}  127.0.0.1/32  trust"
    if line not in lines:
        lines.insert(next(i for i, text in enumerate(lines) if text.startswith("host ")), line)
        _write(hba_path, "\n".join(lines) + "\n", 0o600, cluster.server_user)
        with closing(cluster.admin_connect()) as admin, admin.cursor() as cur:
            cur.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)  # the postmaster reloads asynchronously


# --------------------------------------------------------------------------- the worker process


def worker_main(index: int, configs: dict[str, str], env: dict[str, str], runs: int, codes: tuple[str, ...],
                go: Any, outbox: Any) -> None:  # fmt: skip
    """Run ``runs`` pipeline runs per variant (a connection per step) once ``go`` is set; report what happened."""
    try:
        for name in AWS_UNSET:
            os.environ.pop(name, None)
        os.environ.update(env)
        os.environ["AWS_ACCESS_KEY_ID"] = worker_key_id(index)
        signed = _count_rds_signing()
        _check_loopback_sts(env["AWS_ENDPOINT_URL_STS"])
        from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

        hooks = {variant: EngineDBHook.from_config(Path(path)) for variant, path in configs.items()}
        outbox.put(("ready", index, None))
        if not go.wait(READY_TIMEOUT):
            raise RuntimeError("no start signal")
        result = {}
        for variant, hook in hooks.items():
            before = signed[0]
            result[variant] = _runs(hook, index, runs, codes)
            result[variant]["rds_tokens_signed"] = signed[0] - before
        outbox.put(("done", index, result))
    except BaseException:  # reported to the parent
        outbox.put(("error", index, traceback.format_exc()))


def _count_rds_signing() -> list[int]:
    """Count botocore's RDS token signings in this process (the clients created from now on)."""
    import botocore.signers

    signed = [0]
    original = botocore.signers.generate_db_auth_token

    def counting(*args: Any, **kwargs: Any) -> Any:
        signed[0] += 1
        return original(*args, **kwargs)

    botocore.signers.generate_db_auth_token = counting
    return signed


def _check_loopback_sts(expected: str) -> None:
    """Stop unless boto3's STS client goes to the loopback server (never to AWS)."""
    import boto3

    endpoint = boto3.session.Session(region_name=REGION).client("sts").meta.endpoint_url
    if not endpoint.startswith(expected):
        raise RuntimeError(
            f"the STS client would call {endpoint}, not the loopback server {expected}: stopped"
        )


def _runs(hook: Any, index: int, runs: int, codes: tuple[str, ...]) -> dict[str, Any]:
    from bench.bookkeeping import new_identity, run_pipeline

    @contextmanager
    def lifecycle_for(op: str) -> Iterator[Any]:
        with hook.lifecycle(LOCK_TIMEOUT) as lc:
            yield lc

    errors: Counter[str] = Counter()
    first: dict[str, str] = {}
    completed = 0
    started = time.monotonic()
    for _ in range(runs):
        try:
            run_pipeline(lifecycle_for, pipeline_code(index), codes, new_identity(DAG_ID, f"w{index:02d}"))
            completed += 1
        except Exception as exc:  # every failure is reported, by type
            errors[type(exc).__name__] += 1
            first.setdefault(type(exc).__name__, str(exc).splitlines()[0][:300] if str(exc) else "")
    return {"completed": completed, "seconds": time.monotonic() - started,
            "errors": {"total": sum(errors.values()), "by_type": dict(errors), "first": first}}  # fmt: skip


# --------------------------------------------------------------------------- the parent side


def _spawn_round(procs: int, configs: list[dict[str, str]], env: dict[str, str], runs: int,
                 codes: tuple[str, ...]) -> dict[int, dict[str, Any]]:  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    outbox: Any = ctx.Queue()
    go = ctx.Event()
    processes = [ctx.Process(target=worker_main, args=(i, configs[i], env, runs, codes, go, outbox),
                             name=f"bench-credentials-{i}", daemon=True) for i in range(procs)]  # fmt: skip
    for process in processes:
        process.start()
    try:
        _collect(outbox, processes, "ready", READY_TIMEOUT)
        go.set()  # the same instant for every worker
        return _collect(outbox, processes, "done", DONE_TIMEOUT)
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)


def _collect(outbox: Any, processes: list[Any], what: str, timeout: float) -> dict[int, Any]:
    pending, got = set(range(len(processes))), {}
    deadline = time.monotonic() + timeout
    while pending:
        try:
            kind, index, value = outbox.get(timeout=1.0)
        except queue.Empty:
            dead = [p.name for i, p in enumerate(processes) if i in pending and not p.is_alive()]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"workers stopped answering while waiting for '{what}' (dead: {dead})"
                ) from None
            continue
        if kind == "error":
            raise RuntimeError(f"credentials worker {index} failed:\n{value}")
        if kind != what:
            raise RuntimeError(f"credentials worker {index} said {kind!r}, expected {what!r}")
        pending.discard(index)
        got[index] = value
    return got


def _windows(variant: str, seconds: float) -> dict[str, Any]:
    """The cache's expiry window of ``variant``'s credential, and how many of them ``seconds`` spans."""
    from airflow_provider_etl_craft.auth.cache import usable_for
    from airflow_provider_etl_craft.auth.sts import TOKEN_LIFETIME

    lifetime = {"sts": ROLE_LIFETIME, "oauth": 300.0, "oauth-short": 2.0}[variant]
    window = usable_for(lifetime)
    out = {"lifetime_s": lifetime, "window_s": window, "windows": max(1, math.ceil(seconds / window))}
    if variant == "sts":
        token_window = usable_for(TOKEN_LIFETIME)
        out.update(token_lifetime_s=TOKEN_LIFETIME, token_window_s=token_window,
                   token_windows=max(1, math.ceil(seconds / token_window)))  # fmt: skip
    return out


def measure(pg: Any, folder: Path, procs_list: tuple[int, ...], runs: int, codes: tuple[str, ...],
            log: Any = print) -> dict[str, Any]:  # fmt: skip
    """Credential calls per pipeline run and per process, for each variant and number of processes."""
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
    from bench.engines import seed_pipelines
    from harness.engines import write_config

    cluster, workers = pg.cluster, max(procs_list)
    client_secret = secrets.token_urlsafe(24)
    server = IdentityServer(cluster.passwords[OAUTH_ROLE], client_secret)
    env = {**aws_environment(server.url, folder), SECRET_VAR: client_secret}
    try:
        _allow_sts_role(pg)
        databases = {"sts": cluster.create_database(owner=STS_ROLE),
                     "oauth": cluster.create_database(owner=OAUTH_ROLE)}  # fmt: skip

        def config(variant: str, mode: str, worker: str) -> str:
            text = _profile(variant, mode, cluster.host, cluster.port, databases[mode], server.url, worker)
            return str(write_config(folder / variant / worker, text))

        configs = [{variant: config(variant, mode, f"w{i:02d}") for variant, mode, _ in VARIANTS}
                   for i in range(workers)]  # fmt: skip
        with environment(env):  # the parent's own calls (init-db, seeding) are counted under "parent"
            for mode in ("sts", "oauth"):
                hook = EngineDBHook.from_config(Path(config(mode, mode, "parent")))
                hook.init_db()
                seed_pipelines(hook, [(pipeline_code(i), codes) for i in range(workers)])
        connections_per_run = 2 + 2 * len(codes)
        rows = []
        for procs in procs_list:
            before = server.snapshot()
            started = time.perf_counter()
            done = _spawn_round(procs, configs, env, runs, codes)
            took = time.perf_counter() - started
            calls = server.snapshot() - before
            for variant, _, _ in VARIANTS:
                rows.append(_row(variant, procs, runs, connections_per_run, done, calls))
                row = rows[-1]
                log(f"  {procs} process{'es' if procs > 1 else ''}, {variant}: {row['calls']} {row['call_name']} for "
                    f"{row['runs']} runs ({row['calls_per_run']:.2f} per run, at most {row['max_calls_per_process']} "
                    f"per process over {row['max_windows']} expiry window(s)), {row['errors']['total']} errors")  # fmt: skip
            log(
                f"  {procs} process{'es' if procs > 1 else ''}: round took {took:.1f}s (process start included)"
            )
        problems = list(server.problems)
    finally:
        server.stop()
    return {"runs_per_process": runs, "tasks_per_run": len(codes), "connections_per_run": connections_per_run,
            "procs": list(procs_list), "rows": rows, "server_problems": problems}  # fmt: skip


def _row(variant: str, procs: int, runs: int, connections_per_run: int, done: dict[int, dict[str, Any]],
         calls: Counter[tuple[str, str]]) -> dict[str, Any]:  # fmt: skip
    per_worker = {i: calls[(variant, f"w{i:02d}")] for i in range(procs)}
    results = {i: done[i][variant] for i in range(procs)}
    windows = {i: _windows(variant, results[i]["seconds"]) for i in range(procs)}
    completed = sum(r["completed"] for r in results.values())
    total = sum(per_worker.values())
    errors: Counter[str] = Counter()
    first: dict[str, str] = {}
    for r in results.values():
        errors.update(r["errors"]["by_type"])
        for name, message in r["errors"]["first"].items():
            first.setdefault(name, message)
    row: dict[str, Any] = {
        "variant": variant, "procs": procs, "runs": procs * runs, "completed_runs": completed,
        "connections": completed * connections_per_run,
        "call_name": "AssumeRole calls" if variant == "sts" else "token requests",
        "calls": total, "calls_per_process": [per_worker[i] for i in range(procs)],
        "max_calls_per_process": max(per_worker.values()),
        "calls_per_run": total / (procs * runs),
        "calls_per_connection": total / (completed * connections_per_run) if completed else None,
        "seconds_per_process": [round(results[i]["seconds"], 3) for i in range(procs)],
        "window": windows[0], "windows_per_process": [windows[i]["windows"] for i in range(procs)],
        "max_windows": max(w["windows"] for w in windows.values()),
        "errors": {"total": sum(errors.values()), "by_type": dict(errors), "first": first},
        "met": all(per_worker[i] <= windows[i]["windows"] for i in range(procs)) and completed == procs * runs,
    }  # fmt: skip
    if variant == "sts":
        signed = {i: results[i]["rds_tokens_signed"] for i in range(procs)}
        row.update(rds_tokens_signed=sum(signed.values()), rds_tokens_per_process=[signed[i] for i in range(procs)],
                   rds_tokens_per_run=sum(signed.values()) / (procs * runs))  # fmt: skip
        row["met"] = row["met"] and all(signed[i] <= windows[i]["token_windows"] for i in range(procs))
    return row
