"""ENGINE 0007 (the index that keeps the finish independent of how many pipelines an Engine DB configures)
upgrades Engine DBs at 0006 in place, on both dialects.

On the provider's own Engine DB every row is kept, the schema is a fresh init-db's, and the finish's task list
(the pipeline's active tasks and those its run recorded) is read through the new index instead of every
configured task. On an Engine DB that etl-craft made and the previous release adopted (up to ENGINE 0006), the
step adds the index beside etl-craft's own; etl-craft's rows, ledger and ``migrate`` are untouched.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_etl_craft.runs.finish import _TASKS_OF_RUN
from bench import history
from harness.engines import EngineSetup, engine_rows
from tests.fixtures.etl_craft_made import (
    ADDED_INDEXES,
    added_indexes,
    build,
    counts,
    shape,
    without_added,
)
from tests.integration import test_engine_upgrade_0006 as at_0006_tests
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
from tests.integration.test_shared_engine_db import etl_craft_migrate_accepts, ledger

#: A second, empty Engine DB beside ``engine``.
fresh = at_0006_tests.fresh

NEW = "0007_config_indexes.sql"
INDEX = "IX_CFG_TASKS_PIPELINE"
#: What 0007 adds, per table.
ADDED = {table: ADDED_INDEXES[table] for table in ("CFG_PIPELINES", "CFG_TASKS")}
#: Configured pipelines (each with 20 tasks) the planner has to avoid reading.
PIPELINES = 200


def at_0006(engine: EngineSetup) -> None:
    """The provider's own Engine DB as the release at ENGINE 0006 left it, with a row in every table."""
    at_0006_tests.at_0005(engine)
    apply_packaged(engine, at_0006_tests.NEW)


def adopted_at_0006(engine: EngineSetup) -> None:
    """An etl-craft Engine DB adopted by the release at ENGINE 0006."""
    build(engine)
    adopt_before(engine, NEW)


def has_index(engine: EngineSetup) -> bool:
    """Whether the Engine DB has 0007's indexes (all of them: the assertion fails when only some are there)."""
    indexes = index_names(engine)
    there = [name in indexes for names in ADDED.values() for name in names]
    assert len(set(there)) == 1, indexes
    return there[0]


def plan(engine: EngineSetup) -> str:
    """The plan of the finish's task list for the first pipeline, on the analysed Engine DB."""
    ((pipeline_id,),) = engine_rows(engine.hook(), "SELECT MIN(PIPELINE_ID) FROM CFG_PIPELINES")
    return analysed_plan(engine, _TASKS_OF_RUN, (1, pipeline_id))


def test_an_own_engine_db_at_0006_is_upgraded_and_keeps_every_row(engine: EngineSetup, fresh: Any) -> None:
    at_0006(engine)
    hook = engine.hook()
    assert not has_index(engine)
    before = everything(hook)
    status, out, err = cli(engine, "migrate")
    assert (status, err) == (0, "") and f"applied ENGINE {NEW}" in out
    assert engine_versions(hook)[-2:] == [at_0006_tests.NEW, NEW]
    after = everything(hook)
    assert {t: after[t] for t in TABLES} == {t: before[t] for t in TABLES}
    assert has_index(engine)
    assert fresh.hook().init_db().created
    assert catalog(engine) == catalog(fresh)


def test_the_finish_reads_one_pipelines_tasks_through_the_index(engine: EngineSetup) -> None:
    at_0006(engine)
    history.seed(engine.hook(), PIPELINES)
    before = plan(engine)
    assert INDEX.lower() not in before.lower()
    assert ("SCAN t" in before) if engine.dialect == "sqlite" else ("Seq Scan on cfg_tasks" in before), before
    status, _, err = cli(engine, "migrate")
    assert (status, err) == (0, "")
    after = plan(engine)
    assert INDEX.lower() in after.lower(), after
    assert ("SCAN t" not in after) if engine.dialect == "sqlite" else ("Seq Scan on cfg_tasks" not in after)


def test_an_adopted_etl_craft_engine_db_gains_the_index_and_nothing_else(engine: EngineSetup) -> None:
    adopted_at_0006(engine)
    assert not has_index(engine)
    rows, etl_craft_ledger, tables = counts(engine), ledger(engine), shape(engine)

    status, out, err = cli(engine, "migrate")
    assert (status, err) == (0, "") and f"applied ENGINE {NEW}" in out, (out, err)

    assert has_index(engine)
    assert counts(engine) == rows and ledger(engine) == etl_craft_ledger
    now = shape(engine)
    assert added_indexes(tables, now) == ADDED
    assert without_added(now) == without_added(tables)  # every other column and index as it was
    etl_craft_migrate_accepts(engine)
    status, out, _ = cli(engine, "check")
    assert status == 0 and "migrations: none pending" in out, out
