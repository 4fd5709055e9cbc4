"""ENGINE 0005 (retention, docs/retention.md) upgrades an Engine DB at 0004 in place, on both dialects: every row
is kept, the append-only tables still refuse every writer but a purge batch, a purge then works, and the
upgraded schema is the one a fresh init-db creates."""

from __future__ import annotations

from contextlib import closing
from typing import Any

import pytest

from airflow_provider_etl_craft.engine.schema import (
    SCHEMA_VERSION,
    checksum,
    packaged_migrations,
    schema_text,
)
from airflow_provider_etl_craft.runs.purge import Purge
from harness.engines import EngineSetup, engine_rows
from tests.integration import test_engine_upgrade_0004 as at_0004_tests
from tests.integration.test_engine_upgrade_0004 import SEED, TABLES, catalog, cli, engine_versions, everything

#: A second, empty Engine DB beside ``engine`` (the 0004 upgrade test's fixture).
fresh = at_0004_tests.fresh

NEW = "0005_purge.sql"
PREVIOUS = ("0002_map_index.sql", "0003_claim_finish_functions.sql", "0004_cfg_semantics.sql")
LATER = ("0006_history_indexes.sql", "0007_config_indexes.sql")


def at_0004(engine: EngineSetup) -> None:
    """An Engine DB as the release at ENGINE 0004 left it, with a row in every table (decisions, consumption)."""
    dialect = engine.hook().engine
    ledger = dialect.sql("INSERT INTO SCHEMA_MIGRATIONS (SOURCE, VERSION, CHECKSUM) VALUES ('ENGINE', ?, ?)")
    earlier = [(v, text) for v, text in packaged_migrations(dialect.name) if v < NEW]
    assert [v for v, _ in earlier] == list(PREVIOUS)
    with closing(dialect.connect(create=True)) as conn, dialect.schema_transaction(conn) as cur:
        dialect.execute_script(cur, schema_text(dialect.name))
        cur.execute(ledger, (SCHEMA_VERSION, checksum(schema_text(dialect.name))))
        for version, text in earlier:
            if version == PREVIOUS[-1]:  # rows as the 0003 release wrote them, then 0004 over them
                for statement in SEED:
                    cur.execute(statement)
            dialect.execute_script(cur, text)
            cur.execute(ledger, (version, checksum(text)))


def test_an_engine_db_at_0004_is_upgraded_keeping_every_row_and_its_guards(engine: EngineSetup) -> None:
    at_0004(engine)
    hook = engine.hook()
    before = everything(hook)
    assert all(before[table] for table in TABLES)
    status, out, err = cli(engine, "migrate")
    assert (status, err) == (0, "") and f"applied ENGINE {NEW}" in out
    assert engine_versions(hook) == [SCHEMA_VERSION, *PREVIOUS, NEW, *LATER]
    after = everything(hook)
    assert {t: after[t] for t in TABLES} == {t: before[t] for t in TABLES}
    assert engine_rows(hook, "SELECT COUNT(*) FROM AUD_ENGINE_PURGES") == [(0,)]

    for sql in ("DELETE FROM AUD_GATE_DECISIONS", "DELETE FROM AUD_DEPENDENCY_CONSUMPTION",
                "UPDATE AUD_DEPENDENCY_CONSUMPTION SET CONSUMED_REVISION = 9"):  # fmt: skip
        with pytest.raises(hook.engine.integrity_error()):
            engine_rows(hook, sql)

    with closing(hook.engine.connect()) as conn:
        result = Purge(hook.engine, conn, hook.engine.now()).run()
    # Each run is its pipeline's newest (and the consumed one): kept; the resumed pause of OLD goes.
    assert result.counts["RUNS_DELETED"] == 0 and result.counts["PAUSES_DELETED"] == 1
    assert everything(hook)["AUD_GATE_DECISIONS"] == before["AUD_GATE_DECISIONS"]


def test_a_fresh_init_db_and_an_engine_db_upgraded_from_0004_have_the_same_schema(
    engine: EngineSetup, fresh: Any
) -> None:
    at_0004(engine)
    assert cli(engine, "migrate")[0] == 0
    assert fresh.hook().init_db().created
    assert catalog(engine) == catalog(fresh)
