"""The web tier itself works: real users with real roles in the api-server, and a browser that signs in."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from harness.deployment import AirflowDeployment
from tests.web.conftest import shot, sign_in

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.web, pytest.mark.postgres]


@pytest.mark.smoke
def test_unauthenticated_requests_are_refused(web: AirflowDeployment) -> None:
    with web.client(None) as api:
        assert api.get("/api/v2/dags").status_code == 401
        refused = api.post("/auth/token", json={"username": "viewer", "password": "not-the-password"})
        assert refused.status_code == 401


@pytest.mark.smoke
def test_viewer_reads_but_cannot_write(web: AirflowDeployment) -> None:
    pool = {"name": f"web_tier_{uuid.uuid4().hex[:8]}", "slots": 1}
    with web.client("viewer") as viewer, web.client("admin") as admin:
        listed = viewer.get("/api/v2/dags")
        assert listed.status_code == 200, listed.text
        assert "dags" in listed.json()
        assert viewer.get("/api/v2/pools").status_code == 200
        # No DAG exists in the lean deployment (no dag-processor): pools are a write the viewer may not do.
        assert viewer.post("/api/v2/pools", json=pool).status_code == 403
        created = admin.post("/api/v2/pools", json=pool)
        assert created.status_code == 201, created.text
        try:
            assert viewer.get(f"/api/v2/pools/{pool['name']}").json()["slots"] == 1
            assert viewer.delete(f"/api/v2/pools/{pool['name']}").status_code == 403
        finally:
            assert admin.delete(f"/api/v2/pools/{pool['name']}").status_code == 204


@pytest.mark.smoke
def test_engine_dbs_are_ready(web: AirflowDeployment) -> None:
    """The Engine DBs the plugin's API reads are there and migrated, on both dialects."""
    for engine in (web.pg, web.sqlite):
        ((count,),) = engine.rows("SELECT COUNT(*) FROM CFG_PIPELINES")
        assert int(count) >= 0
    assert {web.pg.conn_id, web.sqlite.conn_id, web.default.conn_id} == {
        "etl_craft_pg",
        "etl_craft_sqlite",
        "etl_craft_default",
    }


@pytest.mark.smoke
def test_viewer_signs_in_through_the_ui(web: AirflowDeployment, page: Page) -> None:
    from playwright.sync_api import expect  # only here: the API tests run without playwright

    sign_in(page, "viewer")
    assert page.url.startswith(web.base_url)
    # The navigation (its Browse menu comes once the user's menus are loaded) and the dashboard.
    for label in ("Home", "Dags", "Browse", "Welcome", "Health"):
        expect(page.locator("body")).to_contain_text(label)
    path = shot(page, "viewer-home")
    assert path.stat().st_size > 10_000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
