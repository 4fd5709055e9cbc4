"""In-doubt commits (docs/high-availability.md): each run-lifecycle step, cut right after its COMMIT reached the
server, is sent again on a new connection and recognises its own write: no error, no doubled row.

The cut is exact: a loopback proxy (``tests.fixtures.cut_proxy``) forwards the step's committing command,
waits for the server to finish it, and closes the session without passing the answer on. Single-statement
forms (``ETL_CRAFT_CLAIM``, ``ETL_CRAFT_FINISH``, the attempt CTEs) and transaction forms (``COMMIT``) are
each cut. PostgreSQL only: a SQLite Engine DB is a local file, whose commits are never in doubt.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.errors import EngineUnreachableError, StaleTransitionError
from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs import RunIdentity, RunLifecycle
from airflow_provider_etl_craft.runs.gates import GateSkipped
from harness.engines import EngineSetup, engine_rows, write_config
from tests.fixtures.cut_proxy import CutProxy

pytestmark = pytest.mark.postgres

MIGRATION = """
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) VALUES ('UP', 'Up', 'FULL', 't');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) VALUES ('X', 'X', 'FULL', 't');
INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, REFRESH_TYPE, CREATED_BY) VALUES ('DOWN', 'Down', 'FULL', 't');
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'U1', 'ETL', PIPELINE_ID, 'PYTHON', 't' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'UP';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT 'D1', 'ETL', PIPELINE_ID, 'PYTHON', 't' FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'DOWN';
INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER, CREATED_BY)
SELECT c.CODE, 'ETL', p.PIPELINE_ID, 'PYTHON', 't' FROM CFG_PIPELINES p,
(SELECT 'T1' AS CODE UNION ALL SELECT 'T2' UNION ALL SELECT 'CT') c WHERE p.PIPELINE_CODE = 'X';
INSERT INTO CFG_PIPELINE_DEPENDENCY (PIPELINE_ID, DEPENDS_ON_PIPELINE_ID, DEPENDENCY_TYPE, CREATED_BY)
SELECT d.PIPELINE_ID, u.PIPELINE_ID, 'SUCCESS', 't' FROM CFG_PIPELINES d, CFG_PIPELINES u
WHERE d.PIPELINE_CODE = 'DOWN' AND u.PIPELINE_CODE = 'UP';
INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_PIPELINE_ID, DEPENDS_ON_TASK_ID, DEPENDENCY_TYPE,
CREATED_BY) SELECT t.PIPELINE_ID, t.TASK_ID, u.PIPELINE_ID, u.TASK_ID, 'SUCCESS', 't'
FROM CFG_TASKS t, CFG_TASKS u WHERE t.TASK_CODE = 'T2' AND u.TASK_CODE = 'T1';
INSERT INTO CFG_TASK_DEPENDENCY (PIPELINE_ID, TASK_ID, DEPENDS_ON_PIPELINE_ID, DEPENDS_ON_TASK_ID, DEPENDENCY_TYPE,
CREATED_BY) SELECT t.PIPELINE_ID, t.TASK_ID, u.PIPELINE_ID, u.TASK_ID, 'SUCCESS', 't'
FROM CFG_TASKS t, CFG_TASKS u WHERE t.TASK_CODE = 'CT' AND u.TASK_CODE = 'U1';
"""
X_SUCCESS = {"T1": "success", "T2": "success", "CT": "success"}


def commit(text: str) -> bool:
    return text.strip().upper() == "COMMIT"


def containing(*parts: str) -> Callable[[str], bool]:
    return lambda text: all(p in text for p in parts)


@dataclass
class Cut:
    """A migrated Engine DB, a hook on it through the cutting proxy, and one to read rows back directly."""

    proxy: CutProxy
    hook: EngineDBHook
    direct: EngineDBHook

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return engine_rows(self.direct, sql, params)

    def attempts(self, task_code: str) -> list[tuple[Any, ...]]:
        return self.rows(
            "SELECT a.ATTEMPT_NUMBER, a.STATUS FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr "
            "ON tr.TASK_RUN_ID = a.TASK_RUN_ID JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID WHERE t.TASK_CODE = ? "
            "ORDER BY a.ATTEMPT_ID",
            task_code,
        )

    def step(self, match: Callable[[str], bool], call: Callable[[RunLifecycle], Any]) -> Any:
        """``call`` on a new lifecycle through the proxy, its session cut right after ``match``'s command."""
        self.proxy.arm(match)
        with self.hook.lifecycle() as lc:
            result = call(lc)
        assert not self.proxy.armed, "the step never sent the command to cut after"
        return result


@pytest.fixture
def cut(make_engine: Callable[[str], EngineSetup], tmp_path: Path) -> Iterator[Cut]:
    setup = make_engine("postgresql")
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "0001_in_doubt.sql").write_text(MIGRATION, encoding="utf-8")
    setup.hook().migrate(folder)
    cluster = setup.database.cluster  # type: ignore[attr-defined]
    proxy = CutProxy((cluster.host, cluster.port))
    text = setup.config_path.read_text(encoding="utf-8")
    proxied = re.sub(r"//[^/]+/(\w+)\?sslmode=require", rf"//127.0.0.1:{proxy.port}/\1?sslmode=disable", text)
    assert proxied != text
    config = write_config(tmp_path / "proxied", proxied)
    try:
        yield Cut(proxy, EngineDBHook.from_config(config), setup.hook())
    finally:
        proxy.close()


def ident(n: int = 1, dag_id: str = "in_doubt") -> RunIdentity:
    return RunIdentity(dag_id=dag_id, run_id=f"manual__{n}")


def run_up_to_success(cut: Cut) -> None:
    """A finished SUCCESS run of UP (its U1 SUCCESS), so DOWN and X.CT find it."""
    with cut.direct.lifecycle() as lc:
        lc.claim("UP", ident(dag_id="up"))
        lc.finish_task(lc.start_task("UP", "U1", ident(dag_id="up"), 1), "SUCCESS")
        assert lc.finish_run("UP", ident(dag_id="up"), {"U1": "success"}).status == "SUCCESS"


def test_a_claim_cut_after_its_one_call_resumes_the_run_it_created(cut: Cut, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        outcome = cut.step(containing("ETL_CRAFT_CLAIM"), lambda lc: lc.claim("X", ident()))
    assert outcome.action == "RESUMED"
    assert cut.rows("SELECT PIPELINE_RUN_ID, STATUS FROM AUD_PIPELINES_RUN_LOG") == [
        (outcome.pipeline_run_id, "IN-PROGRESS")
    ]
    assert cut.rows("SELECT COUNT(*) FROM AUD_RUN_INTERVENTIONS") == [(0,)]
    assert any("Claim: its commit is in doubt" in r.getMessage() for r in caplog.records)


def test_a_claim_cut_after_it_recorded_a_skip_knows_the_skip_for_its_own(cut: Cut) -> None:
    """DOWN's upstream UP never ran: the claim records the run SKIPPED (a transaction). Its repeat must not
    take that run for a cleared DAG run's and reopen it."""
    outcome = cut.step(commit, lambda lc: lc.claim("DOWN", ident()))
    assert outcome.action == "SKIPPED"
    assert cut.rows("SELECT STATUS, REPAIR_PENDING FROM AUD_PIPELINES_RUN_LOG") == [("SKIPPED", "N")]
    assert cut.rows("SELECT COUNT(*) FROM AUD_RUN_INTERVENTIONS") == [(0,)]
    assert cut.rows("SELECT COUNT(*) FROM AUD_GATE_DECISIONS") == [(1,)]


def test_a_start_cut_after_its_one_statement_returns_its_own_attempt(cut: Cut) -> None:
    with cut.direct.lifecycle() as lc:
        lc.claim("X", ident())
    handle = cut.step(
        containing("INSERT INTO AUD_TASK_ATTEMPTS"), lambda lc: lc.start_task("X", "T1", ident(), 1)
    )
    assert cut.attempts("T1") == [(1, "RUNNING")]
    assert cut.rows("SELECT ATTEMPT_COUNT FROM AUD_TASK_RUN_LOG") == [(1,)]
    with cut.direct.lifecycle() as lc:  # the handle is the attempt's: it ends it
        lc.finish_task(handle, "SUCCESS")
    assert cut.attempts("T1") == [(1, "SUCCESS")]


def test_a_judged_start_cut_after_its_commit_returns_its_own_attempt(cut: Cut) -> None:
    with cut.direct.lifecycle() as lc:
        lc.claim("X", ident())
        lc.finish_task(lc.start_task("X", "T1", ident(), 1), "SUCCESS")
    handle = cut.step(commit, lambda lc: lc.start_task("X", "T2", ident(), 1))
    assert cut.attempts("T2") == [(1, "RUNNING")]
    assert cut.rows("SELECT COUNT(*) FROM AUD_GATE_DECISIONS WHERE ATTEMPT_ID = ?", handle.attempt_id) == [
        (1,)
    ]


def test_a_start_recorded_skipped_and_cut_raises_its_skip_again(cut: Cut) -> None:
    """CT depends on UP.U1, which never ran: the start records the attempt CANCELLED and the task SKIPPED."""
    with cut.direct.lifecycle() as lc:
        lc.claim("X", ident())
    with pytest.raises(GateSkipped):
        cut.step(commit, lambda lc: lc.start_task("X", "CT", ident(), 1))
    assert cut.attempts("CT") == [(1, "CANCELLED")]


def test_an_end_cut_after_its_one_statement_is_done_once(cut: Cut) -> None:
    with cut.direct.lifecycle() as lc:
        lc.claim("X", ident())
        handle = lc.start_task("X", "T1", ident(), 1)
    cut.step(containing("UPDATE AUD_TASK_ATTEMPTS SET STATUS"), lambda lc: lc.finish_task(handle, "SUCCESS"))
    assert cut.attempts("T1") == [(1, "SUCCESS")]
    with cut.direct.lifecycle() as lc:
        lc.finish_task(handle, "SUCCESS")  # the same call again: its own effect, not someone else's
        with pytest.raises(StaleTransitionError, match="closed by someone else"):
            lc.finish_task(handle, "FAILED", error="a different ending is not this call's")
    assert cut.attempts("T1") == [(1, "SUCCESS")]


def test_an_end_that_consumes_cut_after_its_commit_consumes_once(cut: Cut) -> None:
    run_up_to_success(cut)
    with cut.direct.lifecycle() as lc:
        lc.claim("X", ident())
        handle = lc.start_task("X", "CT", ident(), 1)
    assert handle.consumes
    cut.step(commit, lambda lc: lc.finish_task(handle, "SUCCESS"))
    assert cut.attempts("CT") == [(1, "SUCCESS")]
    assert cut.rows("SELECT COUNT(*) FROM AUD_DEPENDENCY_CONSUMPTION") == [(1,)]


def test_a_park_cut_after_its_statement_is_done_once(cut: Cut) -> None:
    with cut.direct.lifecycle() as lc:
        lc.claim("X", ident())
        handle = lc.start_task("X", "T1", ident(), 1)
    cut.step(containing("SET STATUS = 'QUEUED'"), lambda lc: lc.park_task(handle, "deferred"))
    assert cut.attempts("T1") == [(1, "QUEUED")]
    with cut.direct.lifecycle() as lc:  # the try comes back and takes its attempt over
        resumed = lc.start_task("X", "T1", ident(), 1, resume=True)
        lc.finish_task(resumed, "SUCCESS")
    assert cut.attempts("T1") == [(1, "SUCCESS")]


@pytest.mark.parametrize(
    ("form", "match"), [("one call", containing("ETL_CRAFT_FINISH")), ("transaction", commit)]
)
def test_a_finish_cut_after_it_committed_reports_its_own_end(
    cut: Cut, form: str, match: Callable[[str], bool]
) -> None:
    with cut.direct.lifecycle() as lc:
        lc.claim("X", ident())
        for code in ("T1", "T2"):
            lc.finish_task(lc.start_task("X", code, ident(), 1), "SUCCESS")
    states = dict(X_SUCCESS)
    if form == "transaction":
        states["CT"] = "skipped"  # CT never started: the finish records it, which only the transaction does
    else:
        run_up_to_success(cut)
        with cut.direct.lifecycle() as lc:
            lc.finish_task(lc.start_task("X", "CT", ident(), 1), "SUCCESS")
    outcome = cut.step(match, lambda lc: lc.finish_run("X", ident(), states))
    assert (outcome.status, outcome.already_ended) == ("SUCCESS", False)
    assert cut.rows("SELECT STATUS FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p ON p.PIPELINE_ID = "
                    "r.PIPELINE_ID WHERE p.PIPELINE_CODE = 'X'") == [("SUCCESS",)]  # fmt: skip


def test_without_a_new_connection_an_in_doubt_end_says_so_and_a_retry_recognises_it(cut: Cut) -> None:
    """The step cannot be sent again (no connection): the error is retryable and in doubt, never "nothing was
    committed"; the retry (here the same call on a later connection) finds the write and carries on."""
    with cut.direct.lifecycle() as lc:
        lc.claim("X", ident())
        handle = lc.start_task("X", "T1", ident(), 1)
    cut.proxy.arm(containing("UPDATE AUD_TASK_ATTEMPTS SET STATUS"))
    with pytest.raises(EngineUnreachableError) as caught, cut.hook.lifecycle() as lc:
        lc.reconnect_with = None
        lc.finish_task(handle, "SUCCESS")
    assert caught.value.retryable and caught.value.in_doubt
    assert "in doubt" in str(caught.value) and "not committed" not in str(caught.value)
    with cut.hook.lifecycle() as lc:
        lc.finish_task(handle, "SUCCESS")
    assert cut.attempts("T1") == [(1, "SUCCESS")]


def test_a_session_cut_before_the_commit_is_not_in_doubt(cut: Cut) -> None:
    """Lost inside the transaction (the server rolls it back): retryable, and not in doubt."""
    with cut.direct.lifecycle() as lc:
        lc.claim("X", ident())
        lc.finish_task(lc.start_task("X", "T1", ident(), 1), "SUCCESS")
    cut.proxy.arm(containing("t.RUN_CONDITION_COUNT"))  # the judged start's read, inside its transaction
    with pytest.raises(EngineUnreachableError) as caught, cut.hook.lifecycle() as lc:
        lc.reconnect_with = None
        lc.start_task("X", "T2", ident(), 1)
    assert caught.value.retryable and not caught.value.in_doubt
    assert cut.attempts("T2") == []
