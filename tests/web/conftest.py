"""The web tier: the provider's plugin in a real api-server, driven over HTTP and through a real browser.

``web`` is one lean Airflow deployment per session (``AirflowDeployment.start_web``: ``airflow db migrate``
and the api-server only, its metadata DB and the Engine DBs ``web.pg`` / ``web.sqlite`` on the session's
throwaway PostgreSQL cluster) with Airflow's simple auth manager and two users, ``admin`` (role ADMIN)
and ``viewer`` (role VIEWER), passwords as their names. ``web.client("viewer")`` is an ``httpx.Client`` on
the api-server with that user's token (``web.client(None)``: no token).

``browser`` is Debian's chromium (``/usr/bin/chromium``, from ``make system-deps``) driven headless by
playwright, started once per session; ``page`` is a fresh context (no cookies) and page whose relative
URLs go to the api-server. ``sign_in(page, "viewer")`` logs in through the real login form, ``shot(page,
"name")`` saves a full-page PNG under the test's ``tmp_path``::

    def test_something(web, page):
        with web.client("viewer") as api:
            assert api.get("/api/v2/dags").status_code == 200
        sign_in(page, "viewer")
        shot(page, "home")

Skips: no PostgreSQL (through ``pg_cluster``; a failure with ETL_CRAFT_REQUIRE_POSTGRES=1), no browser
(as root, a missing chromium is installed with apt-get first; a failure with ETL_CRAFT_REQUIRE_BROWSER=1,
as in CI). A failed test's report carries the api-server's log and, for a browser test, the page's URL
and a screenshot's path; ``ETL_CRAFT_DEPLOYMENT_KEEP=1`` leaves the deployment's folder behind.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import airflow
import pytest

from harness.deployment import WEB_USERS, AirflowDeployment
from harness.postgres import PgCluster

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

#: As in the deployment tier: with 1, the deployment's folder (logs, passwords file) is left behind.
KEEP_ENV = "ETL_CRAFT_DEPLOYMENT_KEEP"
#: With 1 (as in CI), a missing browser fails the browser tests instead of skipping them.
REQUIRE_BROWSER_ENV = "ETL_CRAFT_REQUIRE_BROWSER"
CHROMIUM = Path("/usr/bin/chromium")
#: Default wait of every page action and ``expect`` assertion (ms): a first UI load on a busy machine is slow.
PAGE_TIMEOUT_MS = 30_000

#: The Airflow line under test; the plugin UI (external views) needs 3.1+, the API loads on 3.0 too.
AIRFLOW_LINE = tuple(int(part) for part in airflow.__version__.split(".")[:2])
needs_plugin_ui = pytest.mark.skipif(
    AIRFLOW_LINE < (3, 1),
    reason=f"Airflow {airflow.__version__} has no plugin UI (external views come with 3.1)",
)

#: The folder each live page's screenshots go to (its test's tmp_path).
_shot_dirs: dict[int, Path] = {}


@pytest.fixture(scope="session")
def airflow_web(pg_cluster: PgCluster) -> Iterator[AirflowDeployment]:
    """``airflow db migrate`` and the api-server (simple auth manager users ``WEB_USERS``), once per session."""
    root = Path(tempfile.mkdtemp(prefix="etl-craft-web-", dir="/tmp"))
    try:
        deployment = AirflowDeployment.start_web(pg_cluster, root)
        try:
            yield deployment
        finally:
            deployment.stop()
    finally:
        if os.environ.get(KEEP_ENV) != "1":
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def web(airflow_web: AirflowDeployment) -> AirflowDeployment:
    """The session's web deployment, its api-server checked alive."""
    airflow_web.test_dag_ids.clear()
    airflow_web.check_alive()
    return airflow_web


# -- the browser ---------------------------------------------------------------------------------------------


def _apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", *args], env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                          capture_output=True, text=True, timeout=900, check=False)  # fmt: skip


@functools.cache
def _install_chromium() -> str | None:
    """As root, ``apt-get install chromium`` (once per session; after ``apt-get update`` if the package lists
    are stale); why it did not work, or None."""
    install = ("install", "-y", "-q", "--no-install-recommends", "chromium")
    try:
        done = _apt_get(*install)
        if done.returncode != 0 and _apt_get("update", "-q").returncode == 0:
            done = _apt_get(*install)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"apt-get install chromium failed: {exc}"
    if done.returncode != 0:
        return f"apt-get install chromium failed ({done.returncode}): {done.stderr.strip()[-500:]}"
    return None


def browser_unavailable() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (it comes with the [dev] extra)"
    if not CHROMIUM.exists() and os.geteuid() == 0 and (failed := _install_chromium()):
        return failed
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium, or make system-deps as root)"
    return None


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_BROWSER_ENV) == "1":
        pytest.fail(f"the browser tests cannot run: {reason} (and {REQUIRE_BROWSER_ENV}=1)", pytrace=False)
    pytest.skip(f"the browser tests cannot run: {reason}")


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless (``--no-sandbox`` as root), driven by playwright; once per session."""
    if reason := browser_unavailable():
        _unavailable(reason)
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=PAGE_TIMEOUT_MS)
    with sync_playwright() as playwright:
        try:
            chromium = playwright.chromium.launch(
                executable_path=str(CHROMIUM),
                headless=True,
                args=["--no-sandbox"] if os.geteuid() == 0 else [],
            )
        except PlaywrightError as exc:
            _unavailable(f"{CHROMIUM} does not start: {exc}")
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Browser, web: AirflowDeployment, tmp_path: Path) -> Iterator[Page]:
    """A fresh browser context (no cookies) and page; relative URLs go to the api-server."""
    context = browser.new_context(base_url=web.base_url, viewport={"width": 1366, "height": 900})
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    new_page = context.new_page()
    _shot_dirs[id(new_page)] = tmp_path
    try:
        yield new_page
    finally:
        _shot_dirs.pop(id(new_page), None)
        context.close()


def shot(page: Page, name: str) -> Path:
    """Save a full-page PNG of ``page`` as ``<name>.png`` under its test's tmp_path; its path."""
    folder = _shot_dirs.get(id(page)) or Path(tempfile.mkdtemp(prefix="etl-craft-shots-", dir="/tmp"))
    path = folder / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', name)}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def sign_in(page: Page, user: str, password: str | None = None) -> None:
    """Log ``user`` in through the simple auth manager's login form, as a person does, and wait for the home
    page: open ``/``, get sent to the login page, fill in the form, submit, get sent back.

    ``password`` defaults to the user's in ``WEB_USERS``.
    """
    from playwright.sync_api import expect

    if password is None:
        password = WEB_USERS[user][1]
    page.goto("/")
    page.wait_for_url(re.compile(r"/auth/login"))
    page.locator('input[name="username"]').fill(user)
    page.locator('input[name="password"]').fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/" not in url)
    # The home page: the navigation and the dashboard's welcome heading.
    expect(page.get_by_role("heading", name="Welcome")).to_be_visible()
    expect(page.get_by_role("link", name="Dags").first).to_be_visible()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On a failed test, attach the api-server's log and, for a browser test, a screenshot of its page."""
    outcome = yield
    report = outcome.get_result()
    if not (report.failed and call.when == "call"):
        return
    funcargs = getattr(item, "funcargs", {})
    web_deployment = funcargs.get("web")
    if isinstance(web_deployment, AirflowDeployment):
        report.sections.append(("airflow api-server logs", web_deployment.report()))
    browser_page = funcargs.get("page")
    if browser_page is not None:
        try:
            where = f"page {browser_page.url}, screenshot {shot(browser_page, 'failure')}"
        except Exception as exc:  # the page may be gone with the failure
            where = f"no screenshot: {exc}"
        report.sections.append(("browser", where))
