"""ENGINE 0006 (the indexes that keep reads and the purge independent of history) upgrades Engine DBs at 0005
in place, on both dialects.

On the provider's own Engine DB the latest-run index is there since ENGINE 0001 and the purge's reverse-reference
indexes are added; every row is kept and the schema is a fresh init-db's. On an Engine DB that etl-craft made and
the previous release adopted (up to ENGINE 0005), the step adds all of them beside etl-craft's own indexes, so the
latest-runs query stops reading a pipeline's whole history; etl-craft's rows, ledger and ``migrate`` are
untouched.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_etl_craft.runs.queries import _LATEST_RUNS
from harness.engines import EngineSetup
from tests.fixtures.etl_craft_made import (
    ADDED_INDEXES,
    added_indexes,
    build,
    counts,
    etl_craft_connection,
    run,
    shape,
    without_added,
)
from tests.integration import test_engine_upgrade_0005 as at_0005_tests
from tests.integration.test_engine_upgrade_0004 import (
    TABLES,
    adopt_before,
    analysed_plan,
    apply_packaged,
    catalog,
    cli,
    engine_versions,
    everything,
    index_names,
)
from tests.integration.test_latest_runs_plan import _HISTORY
from tests.integration.test_shared_engine_db import etl_craft_migrate_accepts, ledger

#: A second, empty Engine DB beside ``engine``.
fresh = at_0005_tests.fresh

NEW = "0006_history_indexes.sql"
LATER = ("0007_config_indexes.sql",)
INDEX = "IX_AUD_PIPELINES_RUN_LOG_LATEST"


def at_0005(engine: EngineSetup) -> None:
    """The provider's own Engine DB as the release at ENGINE 0005 left it, with a row in every table."""
    at_0005_tests.at_0004(engine)
    apply_packaged(engine, at_0005_tests.NEW)


def adopted_at_0005(engine: EngineSetup) -> None:
    """An etl-craft Engine DB with its history (and 20,000 more runs, written as etl-craft writes them, so the
    planner has a history to avoid), adopted by the release at ENGINE 0005."""
    build(engine)
    with etl_craft_connection(engine) as conn:
        run(conn, engine.dialect, _HISTORY[engine.dialect].replace("?", "20000"))  # psycopg2: % stays as is
    adopt_before(engine, NEW)


def has_index(engine: EngineSetup) -> bool:
    return INDEX.upper() in index_names(engine)


def plan(engine: EngineSetup) -> str:
    return analysed_plan(engine, _LATEST_RUNS)


def test_an_own_engine_db_at_0005_is_upgraded_and_keeps_every_row(engine: EngineSetup, fresh: Any) -> None:
    at_0005(engine)
    hook = engine.hook()
    assert has_index(engine)  # the provider's schema has had the latest-run index since ENGINE 0001
    before = everything(hook)
    status, out, err = cli(engine, "migrate")
    assert (status, err) == (0, "") and f"applied ENGINE {NEW}" in out
    assert engine_versions(hook)[-3:] == [at_0005_tests.NEW, NEW, *LATER]
    after = everything(hook)
    assert {t: after[t] for t in TABLES} == {t: before[t] for t in TABLES}
    assert fresh.hook().init_db().created
    assert catalog(engine) == catalog(fresh)


def test_an_adopted_etl_craft_engine_db_gains_the_index_and_nothing_else(engine: EngineSetup) -> None:
    adopted_at_0005(engine)
    assert not has_index(engine)
    assert INDEX.lower() not in plan(engine).lower()
    rows, etl_craft_ledger, tables = counts(engine), ledger(engine), shape(engine)

    status, out, err = cli(engine, "migrate")
    assert (status, err) == (0, "") and f"applied ENGINE {NEW}" in out, (out, err)

    assert has_index(engine)
    assert INDEX.lower() in plan(engine).lower()
    assert counts(engine) == rows and ledger(engine) == etl_craft_ledger
    now = shape(engine)
    assert added_indexes(tables, now) == ADDED_INDEXES
    assert without_added(now) == tables  # every other column and index of etl-craft's as it was
    etl_craft_migrate_accepts(engine)
    status, out, _ = cli(engine, "check")
    assert status == 0 and "migrations: none pending" in out, out
