"""The pipelines overview reads each pipeline's newest run through an index, not by grouping all history
(issue 26): on both dialects the plan of the latest-runs query reads AUD_PIPELINES_RUN_LOG only through
IX_AUD_PIPELINES_RUN_LOG_LATEST and its primary key, and the answer is the newest run of every code, a
retired pipeline row's runs included. The pipeline page's duration trend reads its newest finished runs the
same way: through that index, stopped at its limit, never sorting the history.
"""

from __future__ import annotations

from contextlib import closing
from typing import Any

import pytest

from airflow_provider_etl_craft.runs.claim import _CANDIDATES
from airflow_provider_etl_craft.runs.finish import _KEYED_RUN
from airflow_provider_etl_craft.runs.queries import (
    _CURRENT_OR_LATEST_RUN,
    _LATEST_RUNS,
    _TREND_RUNS,
    RunQueries,
)
from harness.engines import EngineSetup
from tests.reliability.conftest import pipeline_sql

PIPELINES = 12
RUNS_PER_PIPELINE = 1500
INDEX = "IX_AUD_PIPELINES_RUN_LOG_LATEST"

#: Runs of every pipeline row, interleaved (ids grow across pipelines as real history does): run n of the
#: history goes to pipeline row n % rows, with a RUN_KEY unique per pipeline.
_HISTORY = {
    "sqlite": (
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ? - 1), "
        "p AS (SELECT PIPELINE_ID, ROW_NUMBER() OVER (ORDER BY PIPELINE_ID) - 1 AS k, COUNT(*) OVER () AS c "
        "FROM CFG_PIPELINES) "
        "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, STATUS, RUN_KEY, START_DATE, END_DATE) "
        "SELECT p.PIPELINE_ID, CASE WHEN n.i % 7 = 0 THEN 'FAILED' ELSE 'SUCCESS' END, 'k' || n.i, "
        "'2026-01-01T00:00:00+00:00', '2026-01-01T00:01:00+00:00' FROM n JOIN p ON n.i % p.c = p.k ORDER BY n.i"
    ),
    "postgresql": (
        "WITH p AS (SELECT PIPELINE_ID, ROW_NUMBER() OVER (ORDER BY PIPELINE_ID) - 1 AS k, COUNT(*) OVER () AS c "
        "FROM CFG_PIPELINES) "
        "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, STATUS, RUN_KEY, START_DATE, END_DATE) "
        "SELECT p.PIPELINE_ID, CASE WHEN n.i % 7 = 0 THEN 'FAILED' ELSE 'SUCCESS' END, 'k' || n.i, "
        "now(), now() FROM generate_series(0, ? - 1) AS n(i) JOIN p ON n.i % p.c = p.k ORDER BY n.i"
    ),
}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, make_engine: Any) -> EngineSetup:
    setup: EngineSetup = make_engine(request.param)
    folder = setup.config_path.parent / "migrations"
    folder.mkdir()
    text = "".join(pipeline_sql(f"P{n:02}", ["WORK"]) for n in range(PIPELINES))
    # A retired row of P00 next to its active one: the code's newest run may be either's.
    text += "UPDATE CFG_PIPELINES SET ACTIVE_FLAG = 'N' WHERE PIPELINE_CODE = 'P00';\n" + pipeline_sql(
        "P00", []
    )
    (folder / "0001_pipelines.sql").write_text(text, encoding="utf-8")
    setup.hook().migrate(folder)
    hook = setup.hook()
    with closing(hook.engine.connect()) as conn:
        hook.engine.execute(conn, _HISTORY[setup.dialect], (RUNS_PER_PIPELINE * (PIPELINES + 1),))
        hook.engine.execute(conn, "ANALYZE")  # the planner knows how many runs there are
    return setup


def plan(setup: EngineSetup, query: str, params: tuple[Any, ...]) -> list[str]:
    hook = setup.hook()
    explain = "EXPLAIN QUERY PLAN " if setup.dialect == "sqlite" else "EXPLAIN "
    with closing(hook.engine.connect()) as conn:
        rows = hook.engine.query(conn, explain + query, params)
    return [str(row[-1] if setup.dialect == "sqlite" else row[0]) for row in rows]


def test_the_latest_runs_query_reads_the_run_table_only_through_indexes(engine: EngineSetup) -> None:
    """PostgreSQL: no Seq Scan of the run table after ANALYZE and no sort; SQLite: no full SCAN of it and no
    sort; both read the newest run through the index."""
    steps = plan(engine, _LATEST_RUNS, ())
    text = "\n".join(steps)
    assert INDEX.lower() in text.lower(), text
    if engine.dialect == "postgresql":
        assert not any("seq scan on aud_pipelines_run_log" in s.lower() for s in steps), text
        assert not any(s.strip().removeprefix("->  ").startswith("Sort") for s in steps), text
    else:
        # p: CFG_PIPELINES, every row of it (the overview lists each code), by its table or an index of it
        assert [s.split()[1] for s in steps if s.startswith("SCAN")] == ["p"], text
        assert not any("TEMP B-TREE" in s for s in steps), text  # no sort: the index gives the order


def test_the_current_or_latest_run_of_one_pipeline_reads_no_history(engine: EngineSetup) -> None:
    """``status``'s query: the candidates come through indexes; only they are sorted, never the run table."""
    steps = plan(engine, _CURRENT_OR_LATEST_RUN, ("P01", "P01"))
    text = "\n".join(steps)
    assert INDEX.lower() in text.lower(), text
    if engine.dialect == "postgresql":
        assert not any("seq scan on aud_pipelines_run_log" in s.lower() for s in steps), text
    else:
        assert not [s for s in steps if s.startswith("SCAN") and s.split()[1] in ("r", "r2", "r3")], text


def test_the_newest_run_of_each_code_is_unchanged(engine: EngineSetup) -> None:
    """Each code's newest run as a full read of the history finds it (P00: of its retired and active rows)."""
    hook = engine.hook()
    with closing(hook.engine.connect()) as conn:
        every = hook.engine.query(
            conn,
            "SELECT p.PIPELINE_CODE, r.PIPELINE_RUN_ID, r.STATUS FROM AUD_PIPELINES_RUN_LOG r "
            "JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID",
        )
        summaries = RunQueries(hook.engine, conn).pipelines()
    newest: dict[str, tuple[int, str]] = {}
    for code, run_id, status in every:
        if code not in newest or int(run_id) > newest[code][0]:
            newest[code] = (int(run_id), status)
    got = {
        s.pipeline_code: (s.latest_run.pipeline_run_id, s.latest_run.status)
        for s in summaries
        if s.latest_run
    }
    assert got == newest and len(got) == PIPELINES


def test_status_shows_the_in_progress_run_else_the_newest(engine: EngineSetup) -> None:
    """An older run of P00's retired row set IN-PROGRESS wins over every newer run; without it, the newest."""
    hook = engine.hook()
    with closing(hook.engine.connect()) as conn:
        queries = RunQueries(hook.engine, conn)
        newest = queries.current_or_latest_run("P00")
        assert newest is not None
        (oldest,) = hook.engine.query(conn, "SELECT MIN(PIPELINE_RUN_ID) FROM AUD_PIPELINES_RUN_LOG")
        hook.engine.execute(
            conn,
            "UPDATE AUD_PIPELINES_RUN_LOG SET STATUS = 'IN-PROGRESS' WHERE PIPELINE_RUN_ID = ?",
            (oldest[0],),
        )
        running = queries.current_or_latest_run("P00")
    assert running is not None and running.pipeline_run_id == oldest[0] and running.status == "IN-PROGRESS"
    assert newest.pipeline_run_id > oldest[0] and newest.status != "IN-PROGRESS"


def test_the_trend_query_reads_the_newest_runs_through_the_index(engine: EngineSetup) -> None:
    """The duration chart's query: PostgreSQL reads the run table only through the index, with no Seq Scan and
    no Sort (the index gives the order, LIMIT stops the scan); SQLite searches the index, no temporary B-tree."""
    hook = engine.hook()
    with closing(hook.engine.connect()) as conn:
        ((pipeline_id,),) = hook.engine.query(
            conn, "SELECT MIN(PIPELINE_ID) FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'P01'"
        )
    steps = plan(engine, _TREND_RUNS, (pipeline_id, pipeline_id, 50))
    text = "\n".join(steps)
    assert INDEX.lower() in text.lower(), text
    if engine.dialect == "postgresql":
        assert not any("seq scan" in s.lower() for s in steps), text
        assert not any(s.strip().removeprefix("->  ").startswith("Sort") for s in steps), text
        assert steps[0].startswith("Limit"), text
    else:
        assert not any(s.startswith("SCAN") for s in steps), text
        assert not any("TEMP B-TREE" in s for s in steps), text


def test_the_trend_is_the_newest_finished_runs_of_every_row_of_the_code(engine: EngineSetup) -> None:
    """P00's trend merges its retired and active rows' runs: the newest ``limit`` finished runs, oldest first,
    as a full read finds them; an IN-PROGRESS run is left out."""
    hook = engine.hook()
    with closing(hook.engine.connect()) as conn:
        hook.engine.execute(
            conn,
            "UPDATE AUD_PIPELINES_RUN_LOG SET STATUS = 'IN-PROGRESS' WHERE PIPELINE_RUN_ID = (SELECT MAX(r.PIPELINE_RUN_ID) "
            "FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = 'P00')",
        )
        every = hook.engine.query(
            conn,
            "SELECT r.PIPELINE_RUN_ID, r.STATUS FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p "
            "ON p.PIPELINE_ID = r.PIPELINE_ID WHERE p.PIPELINE_CODE = 'P00' ORDER BY r.PIPELINE_RUN_ID",
        )
        trend = RunQueries(hook.engine, conn).trend("P00", 50)
    finished = [(int(run_id), status) for run_id, status in every if status != "IN-PROGRESS"]
    assert len(every) - len(finished) == 1
    assert [(r.pipeline_run_id, r.status) for r in trend] == finished[-50:]
    assert all(r.duration_seconds is not None and r.duration_seconds >= 0 for r in trend)


@pytest.mark.parametrize("statistics", [True, False], ids=["analysed", "never-analysed"])
def test_the_finish_reads_its_run_by_key_through_the_run_key_index(
    engine: EngineSetup, statistics: bool
) -> None:
    """The finish's keyed-run read (one pipeline code, one RUN_KEY) takes the run through
    UX_AUD_PIPELINES_RUN_LOG_RUN_KEY, with or without planner statistics (an Engine DB etl-craft made has none):
    never a scan of the run table, so finishing a run does not grow with history."""
    hook = engine.hook()
    if not statistics:
        with closing(hook.engine.connect()) as conn:
            drop = "DROP TABLE sqlite_stat1" if engine.dialect == "sqlite" else "SELECT 1"
            hook.engine.execute(conn, drop)
    steps = plan(engine, _KEYED_RUN.removesuffix(" FOR UPDATE"), ("P01", "k1"))
    text = "\n".join(steps)
    assert "ux_aud_pipelines_run_log_run_key" in text.lower(), text
    if engine.dialect == "postgresql":
        assert not any("seq scan on aud_pipelines_run_log" in s.lower() for s in steps), text
    else:
        assert not [s for s in steps if s.startswith("SCAN") and s.split()[1] == "r"], text


@pytest.mark.parametrize("statistics", [True, False], ids=["analysed", "never-analysed"])
def test_the_claim_reads_its_candidate_runs_through_two_index_probes(
    engine: EngineSetup, statistics: bool
) -> None:
    """The claim's candidates (the keyed run, and the pipeline's IN-PROGRESS run) come through the run-key
    index and an index on the status, never by reading every run of the pipeline."""
    hook = engine.hook()
    with closing(hook.engine.connect()) as conn:
        ((pipeline_id,),) = hook.engine.query(
            conn, "SELECT MIN(PIPELINE_ID) FROM CFG_PIPELINES WHERE PIPELINE_CODE = 'P01'"
        )
        if not statistics and engine.dialect == "sqlite":
            hook.engine.execute(conn, "DROP TABLE sqlite_stat1")
    steps = plan(engine, _CANDIDATES, (pipeline_id, "k1", pipeline_id))
    text = "\n".join(steps)
    assert "ux_aud_pipelines_run_log_run_key" in text.lower(), text
    if engine.dialect == "postgresql":
        assert not any("seq scan on aud_pipelines_run_log" in s.lower() for s in steps), text
    else:
        assert not [s for s in steps if s.startswith("SCAN")], text
        assert not any(INDEX in s for s in steps), text  # not every run of the pipeline, newest first
