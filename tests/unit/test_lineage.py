"""The operators' OpenLineage facets and the hook's OpenLineage answers, without running a DAG (docs/lineage.md).

OpenLineage is optional: no module of the provider imports it at DAG parse or without the integration (checked
in fresh interpreters), and without it the operators' lineage methods answer None.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.lineage.memo import Claimed, DagRunRef, Ended, EngineDb, Finished
from airflow_provider_etl_craft.operators.pipeline_run import (
    ClaimPipelineRunOperator,
    FinishPipelineRunOperator,
)
from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator, recorded
from harness.engines import engine_rows, write_config
from tests.lineage_support import (
    GENERIC_RUN_FACET,
    EventInvalid,
    facet_schema,
    facet_validator,
    lineage_required,
    validate_event,
)

#: The provider's modules a DAG file or a task process may import.
PROVIDER_MODULES = (
    "airflow_provider_etl_craft.operators.pipeline_run",
    "airflow_provider_etl_craft.operators.task_run",
    "airflow_provider_etl_craft.operators.init_db",
    "airflow_provider_etl_craft.operators.purge",
    "airflow_provider_etl_craft.decorators",
    "airflow_provider_etl_craft.task_groups",
    "airflow_provider_etl_craft.hooks.engine_db",
    "airflow_provider_etl_craft.lineage",
    "airflow_provider_etl_craft.lineage.memo",
    "airflow_provider_etl_craft.lineage.engine_job",
)
OPENLINEAGE_MODULES = ("openlineage", "airflow.providers.openlineage")

# Airflow itself reads every installed provider's info (its configuration defaults) when it loads: those
# modules are Airflow's. What counts is what importing the provider's modules adds to them.
IMPORTS_PROBE = """
import importlib, json, sys
def lineage_modules():
    return {m for m in sys.modules if m.split(".")[0] == "openlineage" or m.startswith("airflow.providers.openlineage")}
for name in ("airflow.sdk", "airflow.providers.common.sql.hooks.sql", "airflow.providers.standard.operators.python"):
    importlib.import_module(name)
before = lineage_modules()
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print(json.dumps(sorted(lineage_modules() - before)))
"""

# Import hooks that make OpenLineage's modules named in argv[1] missing (those and the modules under them), as
# in an environment without the integration, or with one older than the facets need.
ABSENT_PROBE = """
import importlib.abc, json, sys

MISSING = json.loads(sys.argv[1])
# Airflow itself reads the installed provider's info when it loads: that one stays.
KEPT = ("airflow.providers.openlineage", "airflow.providers.openlineage.get_provider_info")

class NoOpenLineage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in KEPT and any(name == m or name.startswith(m + ".") for m in MISSING):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, NoOpenLineage())
from airflow_provider_etl_craft.operators.pipeline_run import ClaimPipelineRunOperator, FinishPipelineRunOperator
from airflow_provider_etl_craft.operators.task_run import EtlCraftPythonOperator

ops = [ClaimPipelineRunOperator(task_id="claim", pipeline_code="P"),
       FinishPipelineRunOperator(task_id="finish", pipeline_code="P"),
       EtlCraftPythonOperator(task_id="load", pipeline_code="P", python_callable=lambda: 1)]
answers = []
for op in ops:
    answers += [op.get_openlineage_facets_on_start(), op.get_openlineage_facets_on_complete(None),
                op.get_openlineage_facets_on_failure(None)]
print(json.dumps(answers))
"""


def _probe(code: str, *args: str) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.smoke
def test_no_module_of_the_provider_imports_openlineage() -> None:
    assert json.loads(_probe(IMPORTS_PROBE, json.dumps(PROVIDER_MODULES))) == []


@pytest.mark.smoke
def test_without_openlineage_the_lineage_methods_answer_none() -> None:
    assert json.loads(_probe(ABSENT_PROBE, json.dumps(OPENLINEAGE_MODULES))) == [None] * 9


# Not in the smoke set (which every older line runs, with its managed image's OpenLineage: the others here are):
# the probe hides the same modules on every line.
@lineage_required
def test_with_an_integration_too_old_for_the_facets_the_lineage_methods_answer_none() -> None:
    """The integration is there, but its client lacks the v2 event and facet classes the facets are built of
    (an OpenLineage client older than those): no lineage of ours, and the events go out as Airflow builds them."""
    too_old = ["openlineage.client.event_v2", "openlineage.client.facet_v2"]
    assert json.loads(_probe(ABSENT_PROBE, json.dumps(too_old))) == [None] * 9


# -- the facets (with the integration) --------------------------------------------------------------------

SQLITE_DB = EngineDb(dialect="sqlite", schema="main")


def run_facets(lineage: Any) -> dict[str, Any]:
    from openlineage.client.serde import Serde

    return {name: Serde.to_dict(value) for name, value in lineage.run_facets.items()}


@pytest.mark.smoke
@lineage_required
def test_the_shipped_schema_is_the_one_the_facet_names() -> None:
    from airflow_provider_etl_craft.lineage.facets import PRODUCER, SCHEMA_URL

    url, _, fragment = SCHEMA_URL.partition("#")
    schema = facet_schema()
    assert schema["$id"] == url
    assert fragment == "/$defs/EtlCraftRunFacet" and "EtlCraftRunFacet" in schema["$defs"]
    facet = run_facets(
        ClaimPipelineRunOperator(task_id="c", pipeline_code="P").get_openlineage_facets_on_start()
    )
    assert facet["etl_craft_run"]["_schemaURL"] == SCHEMA_URL
    assert facet["etl_craft_run"]["_producer"] == PRODUCER


def _asset_name(asset: Any) -> tuple[str, str]:
    """How the output dataset of a postgres Asset is named: as the integration names it where it converts Assets
    (``db.schema.table``), else from the URI (the 3.0 image's OpenLineage provider converts none)."""
    from airflow.providers.openlineage.extractors.manager import ExtractorManager

    if ExtractorManager.convert_to_ol_dataset(asset) is not None:
        return "postgres://wh:5432", "sales.public.orders"
    return "postgres://wh:5432", "sales/public/orders"


@pytest.mark.smoke
@lineage_required
def test_a_task_facet_carries_the_attempt_it_recorded() -> None:
    op = EtlCraftPythonOperator(
        task_id="load",
        pipeline_code="P",
        python_callable=lambda: 1,
        outlets=[_asset("postgres://wh:5432/sales/public/orders")],
    )
    op._etl_craft_run_key = "airflow:d:r"
    op._etl_craft_ended = Ended(engine_db=SQLITE_DB, pipeline_run_id=7, task_run_id=11, attempt_number=2,
                                map_index=None, attempt_status="SUCCESS", task_run_status="SUCCESS",
                                counts=(5, None, 4, 1, None, 5))  # fmt: skip
    assert op.get_openlineage_facets_on_start().outputs == []  # a start knows no attempt yet
    lineage = op.get_openlineage_facets_on_complete(None)
    facets = run_facets(lineage)
    facet_validator()(facets)
    got = {k: v for k, v in facets["etl_craft_run"].items() if not k.startswith("_")}
    assert got == {
        "operation": "task",
        "pipelineCode": "P",
        "taskCode": "LOAD",
        "engineDb": {"dialect": "sqlite", "schema": "main"},
        "pipelineRunId": 7,
        "runKey": "airflow:d:r",
        "taskRunId": 11,
        "attemptNumber": 2,
        "status": "SUCCESS",
        "taskRunStatus": "SUCCESS",
        "counts": {"sourceCount": 5, "insertCount": 4, "updateCount": 1, "rowsWritten": 5},
    }
    [output] = lineage.outputs
    assert (output.namespace, output.name) == _asset_name(op.outlets[0])
    assert output.outputFacets["outputStatistics"].rowCount == 5


@pytest.mark.smoke
@lineage_required
def test_a_recorded_operator_keeps_the_lineage_of_the_operator_it_wraps() -> None:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset

    from airflow_provider_etl_craft._compat import BaseOperator

    class Reads(BaseOperator):
        def execute(self, context: Any) -> None:
            return None

        def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
            return OperatorLineage(inputs=[Dataset(namespace="postgres://wh:5432", name="db.s.src")])

    op = recorded(Reads)(task_id="copy", pipeline_code="P")
    lineage = op.get_openlineage_facets_on_complete(None)
    assert [d.name for d in lineage.inputs] == ["db.s.src"]
    assert run_facets(lineage)["etl_craft_run"]["taskCode"] == "COPY"


# -- a task's declared target (CFG_TASK_PARAMETERS TARGET_OBJECT) ---------------------------------------------

#: A pipeline with two tasks, one run of it, and a task run of each; LOAD declares its target (an older value of
#: the parameter retired), PLAIN declares none.
TARGET_SETUP = (
    "INSERT INTO CFG_PIPELINES (PIPELINE_CODE, PIPELINE_NAME, SLA_IN_HOURS, REFRESH_TYPE) VALUES ('P', 'P', 24, 'FULL')",
    "INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER) "
    "SELECT 'LOAD', 'ETL', PIPELINE_ID, 'PYTHON' FROM CFG_PIPELINES",
    "INSERT INTO CFG_TASKS (TASK_CODE, TASK_TYPE, PIPELINE_ID, HANDLER) "
    "SELECT 'PLAIN', 'ETL', PIPELINE_ID, 'PYTHON' FROM CFG_PIPELINES",
    "INSERT INTO CFG_TASK_PARAMETERS (TASK_ID, PARAMETER_NAME, PARAMETER_VALUE, ACTIVE_FLAG) "
    "SELECT TASK_ID, 'TARGET_OBJECT', 'sales.orders_old', 'N' FROM CFG_TASKS WHERE TASK_CODE = 'LOAD'",
    "INSERT INTO CFG_TASK_PARAMETERS (TASK_ID, PARAMETER_NAME, PARAMETER_VALUE) "
    "SELECT TASK_ID, 'TARGET_OBJECT', 'sales.orders_uk' FROM CFG_TASKS WHERE TASK_CODE = 'LOAD'",
    "INSERT INTO CFG_TASK_PARAMETERS (TASK_ID, PARAMETER_NAME, PARAMETER_VALUE) "
    "SELECT TASK_ID, 'SOURCE_OBJECT', 'raw.orders' FROM CFG_TASKS WHERE TASK_CODE = 'PLAIN'",
    "INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, STATUS) SELECT PIPELINE_ID, 'IN-PROGRESS' FROM CFG_PIPELINES",
    "INSERT INTO AUD_TASK_RUN_LOG (TASK_ID, PIPELINE_RUN_ID, STATUS) "
    "SELECT TASK_ID, PIPELINE_RUN_ID, 'SUCCESS' FROM CFG_TASKS, AUD_PIPELINES_RUN_LOG",
)
WAREHOUSE = "postgres://warehouse:5432"


@pytest.fixture
def target_engine(make_engine: Any) -> Any:
    """A SQLite Engine DB whose task LOAD declares TARGET_OBJECT ``sales.orders_uk``; its dialect, as a
    recorded try resolves it (the process's, :mod:`~airflow_provider_etl_craft.engine.reuse`)."""
    from airflow_provider_etl_craft.engine.reuse import engine_for

    hook = make_engine("sqlite").hook()
    hook.init_db()
    for sql in TARGET_SETUP:
        engine_rows(hook, sql)
    return engine_for(hook.engine_profile)


def _ended_attempt(engine: Any, task_code: str, rows: int | None = 5) -> Ended:
    [(task_run_id, run_id)] = engine_rows_of(engine, task_code)
    return Ended(engine_db=SQLITE_DB, pipeline_run_id=run_id, task_run_id=task_run_id, attempt_number=1,
                 map_index=None, attempt_status="SUCCESS", task_run_status="SUCCESS",
                 counts=(None, None, None, None, None, rows))  # fmt: skip


def engine_rows_of(engine: Any, task_code: str) -> list[tuple[Any, ...]]:
    from contextlib import closing

    with closing(engine.connect()) as conn:
        return [tuple(r) for r in engine.query(conn, "SELECT tr.TASK_RUN_ID, tr.PIPELINE_RUN_ID FROM AUD_TASK_RUN_LOG tr "
                                                     "JOIN CFG_TASKS t ON t.TASK_ID = tr.TASK_ID WHERE t.TASK_CODE = ?",
                                               (task_code,))]  # fmt: skip


def _tried(op: Any, engine: Any, task_code: str, rows: int | None = 5) -> Any:
    """``op`` as a try that recorded its attempt on ``engine`` leaves it where the listener runs: its end, with
    the declared target read as the end step reads it (on the process's lent connection)."""
    import msgspec

    from airflow_provider_etl_craft.operators.task_run import _declared_target
    from airflow_provider_etl_craft.runs.lifecycle import lent_lifecycle

    ended = _ended_attempt(engine, task_code, rows)
    with lent_lifecycle(engine) as lifecycle:
        target = _declared_target(lifecycle, _Handle(ended.task_run_id))
    op._etl_craft_engine = engine
    op._etl_craft_ended = msgspec.structs.replace(ended, target_object=target)
    return op


class _Handle:
    def __init__(self, task_run_id: int) -> None:
        self.task_run_id = task_run_id


def test_the_declared_target_is_read_on_the_tries_connection_and_a_failed_read_never_fails_it(
    target_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The active value, trimmed (a retired one is not read); none for a task without one; a failed read is a
    warning and None. One login in all: the process's lent connection."""
    from airflow_provider_etl_craft.engine import reuse
    from airflow_provider_etl_craft.operators.task_run import _declared_target
    from airflow_provider_etl_craft.runs.lifecycle import lent_lifecycle

    [(load, _)] = engine_rows_of(target_engine, "LOAD")
    [(plain, _)] = engine_rows_of(target_engine, "PLAIN")
    with lent_lifecycle(target_engine) as lifecycle:
        assert _declared_target(lifecycle, _Handle(load)) == "sales.orders_uk"
        assert _declared_target(lifecycle, _Handle(plain)) is None
        lifecycle.engine.execute(lifecycle.conn, "UPDATE CFG_TASK_PARAMETERS SET PARAMETER_VALUE = '  ' "
                                                 "WHERE PARAMETER_NAME = 'TARGET_OBJECT' AND ACTIVE_FLAG = 'Y'")  # fmt: skip
        assert _declared_target(lifecycle, _Handle(load)) is None
    assert reuse.open_count() == 1

    class Broken:
        engine = target_engine

        class conn:  # noqa: N801 - a connection whose cursor fails as a lost one does
            @staticmethod
            def cursor() -> Any:
                raise OSError("the Engine DB went away")

    with caplog.at_level("WARNING", logger="airflow_provider_etl_craft.operators.task_run"):
        assert _declared_target(Broken(), _Handle(load)) is None
    [line] = [r for r in caplog.records if "TARGET_OBJECT" in r.getMessage()]
    assert "went away" in line.getMessage()


@lineage_required
def test_a_try_imports_the_facets_before_the_listener_forks_only_where_the_listener_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rendering a try's templates loads the facets module when the listener's module is loaded (lineage on),
    so each of the listener's forks finds it; without the listener nothing is imported."""
    import types

    from airflow_provider_etl_craft.operators import _lineage

    monkeypatch.delitem(sys.modules, _lineage.FACETS_MODULE, raising=False)
    monkeypatch.delitem(sys.modules, _lineage.LISTENER_MODULE, raising=False)
    op = EtlCraftPythonOperator(task_id="load", pipeline_code="P", python_callable=lambda: 1)
    op.render_template_fields({})
    assert not _lineage.listening() and _lineage.FACETS_MODULE not in sys.modules
    monkeypatch.setitem(sys.modules, _lineage.LISTENER_MODULE, types.ModuleType(_lineage.LISTENER_MODULE))
    claim = ClaimPipelineRunOperator(task_id="claim", pipeline_code="P")
    claim.render_template_fields({})
    assert _lineage.listening() and _lineage.FACETS_MODULE in sys.modules


def _outputs(lineage: Any) -> dict[tuple[str, str], int | None]:
    found = {}
    for d in lineage.outputs:
        statistics = (getattr(d, "outputFacets", None) or {}).get("outputStatistics")
        found[d.namespace, d.name] = None if statistics is None else statistics.rowCount
    return found


@lineage_required
def test_a_declared_target_is_an_output_dataset_with_the_rows_written(
    target_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TARGET_OBJECT names the table, [etl_craft] lineage_target_namespace the warehouse; an outlets Asset
    gets its facet too. One read on the try's Engine connection, which stays the process's one."""
    from airflow_provider_etl_craft.engine import reuse

    monkeypatch.setenv("AIRFLOW__ETL_CRAFT__LINEAGE_TARGET_NAMESPACE", WAREHOUSE)
    asset = _asset("postgres://wh:5432/sales/public/orders")
    op = _tried(EtlCraftPythonOperator(task_id="load", pipeline_code="P", python_callable=lambda: 1,
                                       outlets=[asset]), target_engine, "LOAD")  # fmt: skip
    assert op.get_openlineage_facets_on_start().outputs == []  # a start reads nothing
    lineage = op.get_openlineage_facets_on_complete(None)
    assert _outputs(lineage) == {_asset_name(asset): 5, (WAREHOUSE, "sales.orders_uk"): 5}
    assert reuse.open_count() == 1
    failed = _tried(EtlCraftPythonOperator(task_id="load", pipeline_code="P", python_callable=lambda: 1),
                    target_engine, "LOAD", rows=None)  # fmt: skip
    assert _outputs(failed.get_openlineage_facets_on_failure(None)) == {(WAREHOUSE, "sales.orders_uk"): None}
    plain = _tried(EtlCraftPythonOperator(task_id="plain", pipeline_code="P", python_callable=lambda: 1),
                   target_engine, "PLAIN")  # fmt: skip
    assert plain.get_openlineage_facets_on_complete(None).outputs == []  # no TARGET_OBJECT: no dataset


def _reporting(inputs: tuple[Any, ...] = (), outputs: tuple[Any, ...] = ()) -> Any:
    """A recorded operator whose wrapped operator reports ``inputs`` and ``outputs`` (as common-sql's do)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_provider_etl_craft._compat import BaseOperator

    class Reports(BaseOperator):
        def execute(self, context: Any) -> None:
            return None

        def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
            return OperatorLineage(inputs=list(inputs), outputs=list(outputs))

    return recorded(Reports)(task_id="load", pipeline_code="P")


@lineage_required
def test_without_the_setting_a_declared_target_takes_the_wrapped_operators_namespace(
    target_engine: Any,
) -> None:
    from openlineage.client.event_v2 import Dataset

    source = Dataset(namespace="postgres://dwh:5432", name="dwh.raw.orders")
    op = _tried(_reporting(inputs=(source,)), target_engine, "LOAD")
    lineage = op.get_openlineage_facets_on_complete(None)
    assert _outputs(lineage) == {("postgres://dwh:5432", "sales.orders_uk"): 5}
    assert [d.name for d in lineage.inputs] == ["dwh.raw.orders"]


@lineage_required
def test_a_declared_target_the_wrapped_operator_reports_gets_the_rows_on_its_dataset(
    target_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SQL's own dataset of the table (database part, other case) carries the rows; none is added."""
    from openlineage.client.event_v2 import Dataset

    monkeypatch.setenv("AIRFLOW__ETL_CRAFT__LINEAGE_TARGET_NAMESPACE", WAREHOUSE)
    written = Dataset(namespace="postgres://dwh:5432", name="DWH.Sales.Orders_UK")
    other = Dataset(namespace="postgres://dwh:5432", name="dwh.sales.orders_us")
    op = _tried(_reporting(outputs=(written, other)), target_engine, "LOAD")
    lineage = op.get_openlineage_facets_on_complete(None)
    assert _outputs(lineage) == {
        ("postgres://dwh:5432", "DWH.Sales.Orders_UK"): 5,
        ("postgres://dwh:5432", "dwh.sales.orders_us"): None,
    }


@lineage_required
def test_a_declared_target_of_no_known_namespace_is_left_out_with_a_debug_line(
    target_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    op = _tried(EtlCraftPythonOperator(task_id="load", pipeline_code="P", python_callable=lambda: 1),
                target_engine, "LOAD")  # fmt: skip
    with caplog.at_level("DEBUG", logger="airflow_provider_etl_craft.lineage.facets"):
        lineage = op.get_openlineage_facets_on_complete(None)
    assert lineage.outputs == [] and run_facets(lineage)["etl_craft_run"]["taskCode"] == "LOAD"
    [line] = [r for r in caplog.records if "TARGET_OBJECT" in r.getMessage()]
    assert line.levelname == "DEBUG" and "sales.orders_uk" in line.getMessage()


@pytest.mark.smoke
@lineage_required
def test_claim_and_finish_facets() -> None:
    claim = ClaimPipelineRunOperator(task_id="claim", pipeline_code="P")
    claim._etl_craft_claimed = Claimed(engine_db=SQLITE_DB, action="CREATED", pipeline_run_id=3,
                                       run_key="airflow:d:r", status="IN-PROGRESS")  # fmt: skip
    facets = run_facets(claim.get_openlineage_facets_on_complete(None))
    facet_validator()(facets)
    assert (
        facets["etl_craft_run"]["pipelineRunId"] == 3 and facets["etl_craft_run"]["status"] == "IN-PROGRESS"
    )

    class Unreachable:
        profile = type("Profile", (), {"dialect_name": "postgresql", "schema": "etl"})()

        def connect(self) -> None:
            raise OSError("the Engine DB is down")

    finish = FinishPipelineRunOperator(task_id="finish", pipeline_code="P")
    finish._etl_craft_finished = Finished(engine=Unreachable(), pipeline_run_id=3, run_key="airflow:d:r",
                                          status="FAILED", sla_status="BREACHED")  # fmt: skip
    facets = run_facets(finish.get_openlineage_facets_on_failure(None))  # the totals' read fails: no totals
    facet_validator()(facets)
    got = {k: v for k, v in facets["etl_craft_run"].items() if not k.startswith("_")}
    assert got == {"operation": "finish", "pipelineCode": "P", "engineDb": {"dialect": "postgresql", "schema": "etl"},
                   "pipelineRunId": 3, "runKey": "airflow:d:r", "status": "FAILED", "slaStatus": "BREACHED"}  # fmt: skip


@pytest.mark.smoke
@lineage_required
def test_a_facet_that_cannot_be_built_never_fails_the_task() -> None:
    op = EtlCraftPythonOperator(task_id="load", pipeline_code="P", python_callable=lambda: 1)
    op._etl_craft_ended = "not an attempt"  # type: ignore[assignment]
    assert op.get_openlineage_facets_on_complete(None) is None


# -- the hook -----------------------------------------------------------------------------------------------


def _asset(uri: str) -> Any:
    from airflow_provider_etl_craft._compat import Asset

    return Asset(uri)


@pytest.mark.smoke
@lineage_required
def test_the_hook_names_a_sqlite_engine_db_as_openlineage_does(tmp_path: Path) -> None:
    from airflow.providers.openlineage.sqlparser import SQLParser

    path = write_config(
        tmp_path, "Engine:\n  test:\n    jdbc_url: jdbc:sqlite:engine/etl-craft.db\n    schema: main\n"
    )
    hook = EngineDBHook.from_config(path)
    info = hook.get_openlineage_database_info(None)
    assert SQLParser.create_namespace(info) == f"sqlite://{tmp_path / 'engine' / 'etl-craft.db'}"
    assert hook.get_openlineage_database_dialect(None) == "sqlite"
    assert hook.get_openlineage_default_schema() == "main"


@pytest.mark.smoke
@lineage_required
def test_the_hook_names_a_postgres_engine_db_by_its_first_server_without_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.openlineage.sqlparser import SQLParser

    monkeypatch.setenv("LINEAGE_SECRET", "s3cret")
    path = write_config(
        tmp_path,
        "Engine:\n  test:\n    jdbc_url: jdbc:postgresql://db1.internal:5433,db2.internal:5432/engine?targetServerType=primary\n"
        "    schema: etl_craft\n    user: etl_user\n    auth_mode: password\n    secret: LINEAGE_SECRET\n",
    )
    hook = EngineDBHook.from_config(path)
    info = hook.get_openlineage_database_info(None)
    assert SQLParser.create_namespace(info) == "postgres://db1.internal:5433"
    assert info.database == "engine"
    assert "etl_user" not in repr(info) and "s3cret" not in repr(info)
    assert hook.get_openlineage_database_dialect(None) == "postgres"
    assert hook.get_openlineage_default_schema() == "etl_craft"


@pytest.mark.smoke
@lineage_required
def test_the_example_event_of_the_docs_page_validates() -> None:
    """docs/lineage.md's example: its facet is valid, and names only fields the facet has."""
    import attrs

    from airflow_provider_etl_craft.lineage.facets import PRODUCER, SCHEMA_URL, EtlCraftRunFacet

    page = (Path(__file__).resolve().parents[2] / "docs" / "lineage.md").read_text()
    examples = re.findall(r"```json\n(.*?)```", page, re.S)
    assert len(examples) == 2  # a task's event, the Engine run's
    for example in examples:
        event = json.loads(example)
        facet_validator()(event["run"]["facets"])
        facet = event["run"]["facets"]["etl_craft_run"]
        assert (facet["_producer"], facet["_schemaURL"]) == (PRODUCER, SCHEMA_URL)
        fields = {f.name for f in attrs.fields(EtlCraftRunFacet)} - {"_producer", "_schemaURL"}
        assert set(facet) - {"_producer", "_schemaURL"} <= fields
        run = facet["engineRun"]  # the run id as the docs derive it
        assert run["runId"] == str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run['namespace']}/{run['name']}#4182"))
    engine = json.loads(examples[1])
    assert (engine["job"]["namespace"], engine["job"]["name"]) == (run["namespace"], run["name"])
    assert engine["run"]["runId"] == run["runId"]


# -- the Engine run as a job of its own ---------------------------------------------------------------------

PG_DB = EngineDb(dialect="postgresql", schema="etl", namespace="postgres://db1:5433", database="engine")
DAG_RUN = DagRunRef(dag_id="d", run_date=datetime(2026, 3, 1, tzinfo=UTC), clear_number=0, conf={})


def test_the_engine_run_id_is_derived_from_the_engine_db_and_the_run() -> None:
    """Claim and finish, in different processes, compute the same run id, with nothing stored."""
    from airflow_provider_etl_craft.lineage.engine_job import engine_run

    run = engine_run(PG_DB, "P", 3)
    assert run is not None
    assert (run.namespace, run.name) == ("postgres://db1:5433", "engine.etl.P")
    assert run.run_id == str(uuid.uuid5(uuid.NAMESPACE_URL, "postgres://db1:5433/engine.etl.P#3"))
    assert engine_run(PG_DB, "P", 3) == run  # deterministic
    assert engine_run(PG_DB, "P", 4).run_id != run.run_id  # type: ignore[union-attr]
    other = EngineDb(dialect="postgresql", schema="etl2", namespace="postgres://db1:5433", database="engine")
    assert engine_run(other, "P", 3).run_id != run.run_id  # type: ignore[union-attr]
    sqlite = engine_run(EngineDb(dialect="sqlite", schema="main", namespace="sqlite:///e/etl.db"), "P", 3)
    assert sqlite is not None and sqlite.name == "main.P"
    assert engine_run(SQLITE_DB, "P", 3) is None  # an Engine DB of unknown place: no job of its own
    assert engine_run(PG_DB, "P", None) is None


@lineage_required
def test_the_engine_job_namespace_is_the_hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.openlineage.sqlparser import SQLParser

    monkeypatch.setenv("LINEAGE_SECRET", "s3cret")
    path = write_config(
        tmp_path,
        "Engine:\n  test:\n    jdbc_url: jdbc:postgresql://db1.internal:5433,db2.internal:5432/engine?targetServerType=primary\n"
        "    schema: etl_craft\n    user: etl_user\n    auth_mode: password\n    secret: LINEAGE_SECRET\n",
    )
    hook = EngineDBHook.from_config(path)
    found = EngineDb.of(hook.engine)
    assert found.namespace == SQLParser.create_namespace(hook.get_openlineage_database_info(None))
    assert (found.database, found.schema) == ("engine", "etl_craft")


@pytest.fixture
def sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The OpenLineage listener's adapter writes its events to a file (one JSON event a line)."""
    from airflow.providers.openlineage.plugins.listener import get_openlineage_listener
    from openlineage.client import OpenLineageClient
    from openlineage.client.transport.file import FileConfig, FileTransport

    events = tmp_path / "events.jsonl"
    client = OpenLineageClient(transport=FileTransport(FileConfig(log_file_path=str(events), append=True)))
    monkeypatch.setattr(get_openlineage_listener().adapter, "_client", client)
    return events


def _sent(events: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []


@lineage_required
def test_claim_starts_and_finish_ends_the_engine_run(sent: Path) -> None:
    from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter

    claim = ClaimPipelineRunOperator(task_id="claim", pipeline_code="P")
    assert claim.get_openlineage_facets_on_start() is not None and _sent(sent) == []  # nothing claimed yet
    claim._etl_craft_claimed = Claimed(engine_db=PG_DB, action="CREATED", pipeline_run_id=3, run_key="airflow:d:r",
                                       status="IN-PROGRESS", dag_run=DAG_RUN)  # fmt: skip
    claim_facet = run_facets(claim.get_openlineage_facets_on_complete(None))["etl_craft_run"]

    class Engine:
        profile = type(
            "Profile", (), {"dialect_name": "postgresql", "schema": "etl", "target": _pg_target()}
        )()

        def connect(self) -> None:
            raise OSError("the Engine DB is down")

    finish = FinishPipelineRunOperator(task_id="finish", pipeline_code="P")
    finish._etl_craft_finished = Finished(engine=Engine(), pipeline_run_id=3, run_key="airflow:d:r", status="FAILED",
                                          sla_status=None, dag_run=DAG_RUN)  # fmt: skip
    finish.get_openlineage_facets_on_failure(None)

    start, end = _sent(sent)
    assert (start["eventType"], end["eventType"]) == ("START", "FAIL")
    run_id = str(uuid.uuid5(uuid.NAMESPACE_URL, "postgres://db1:5433/engine.etl.P#3"))
    for event in (start, end):
        assert event["job"]["namespace"] == "postgres://db1:5433" and event["job"]["name"] == "engine.etl.P"
        assert event["run"]["runId"] == run_id
        facet_validator()(event["run"]["facets"])
        parent = event["run"]["facets"]["parent"]
        dag_run_id = OpenLineageAdapter.build_dag_run_id(
            dag_id="d", logical_date=DAG_RUN.run_date, clear_number=0
        )
        assert parent["job"]["name"] == "d" and parent["run"]["runId"] == dag_run_id
        assert parent["root"]["job"]["name"] == "d" and parent["root"]["run"]["runId"] == dag_run_id
    assert start["run"]["facets"]["etl_craft_run"] == claim_facet
    assert claim_facet["engineRun"] == {
        "namespace": "postgres://db1:5433",
        "name": "engine.etl.P",
        "runId": run_id,
    }
    assert end["run"]["facets"]["etl_craft_run"]["status"] == "FAILED"


def _pg_target() -> Any:
    from airflow_provider_etl_craft.engine.url import PostgresTarget

    return PostgresTarget(host="db1", port=5433, database="engine")


@lineage_required
def test_a_skipped_claim_starts_and_completes_the_engine_run(sent: Path) -> None:
    claim = ClaimPipelineRunOperator(task_id="claim", pipeline_code="P")
    claim._etl_craft_claimed = Claimed(engine_db=PG_DB, action="SKIPPED", pipeline_run_id=4, run_key="airflow:d:r",
                                       status="SKIPPED", dag_run=DAG_RUN)  # fmt: skip
    claim.get_openlineage_facets_on_complete(None)
    assert [e["eventType"] for e in _sent(sent)] == ["START", "COMPLETE"]


@lineage_required
def test_a_transport_that_is_down_never_fails_the_task(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """An HTTP backend nobody listens on: the adapter's warning; an adapter that raises: ours. The facets stay."""
    import socket

    from airflow.providers.openlineage.plugins.listener import get_openlineage_listener
    from openlineage.client import OpenLineageClient
    from openlineage.client.transport.http import HttpConfig, HttpTransport

    with socket.socket() as sock:  # a loopback port with nobody listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = HttpConfig(url=f"http://127.0.0.1:{port}", timeout=2.0, retry={"total": 0})
    adapter = get_openlineage_listener().adapter
    monkeypatch.setattr(adapter, "_client", OpenLineageClient(transport=HttpTransport(config)))
    claim = ClaimPipelineRunOperator(task_id="claim", pipeline_code="P")
    claim._etl_craft_claimed = Claimed(engine_db=PG_DB, action="CREATED", pipeline_run_id=3, run_key="airflow:d:r",
                                       status="IN-PROGRESS", dag_run=DAG_RUN)  # fmt: skip
    with caplog.at_level("WARNING"):
        lineage = claim.get_openlineage_facets_on_complete(None)
    assert run_facets(lineage)["etl_craft_run"]["pipelineRunId"] == 3
    assert "Failed to emit OpenLineage" in caplog.text + capsys.readouterr().out  # Airflow logs to stdout

    def broken(event: Any) -> None:
        raise RuntimeError("no client for this configuration")

    monkeypatch.setattr(adapter, "emit", broken)
    caplog.clear()
    with caplog.at_level("WARNING"):
        lineage = claim.get_openlineage_facets_on_complete(None)
    assert run_facets(lineage)["etl_craft_run"]["pipelineRunId"] == 3
    logged = caplog.text + capsys.readouterr().out
    assert "OpenLineage START event of Engine run" in logged and "was not sent" in logged


#: Broken copies of the docs page's example event, each of which the whole-event check must refuse.
BROKEN_EVENTS = {
    "an unknown event type": lambda e: e.update(eventType="DONE"),
    "an event time that is no date-time": lambda e: e.update(eventTime="yesterday"),
    "a job without a namespace": lambda e: e["job"].pop("namespace"),
    "a parent run without its id": lambda e: e["run"]["facets"]["parent"]["run"].pop("runId"),
    "a parent facet without a producer": lambda e: e["run"]["facets"]["parent"].pop("_producer"),
    "a producer that is no URI": lambda e: e["run"]["facets"]["etl_craft_run"].update(_producer="v0.1.0"),
    "a row count that is a string": lambda e: e["outputs"][0]["outputFacets"]["outputStatistics"].update(
        rowCount="120"
    ),
    "a status outside the facet's enum": lambda e: e["run"]["facets"]["etl_craft_run"].update(status="DONE"),
    "a facet with only the generic RunFacet schema": lambda e: e["run"]["facets"].update(
        other={"_producer": "https://example.com/p", "_schemaURL": GENERIC_RUN_FACET}
    ),
    "a facet whose schema is nowhere offline": lambda e: e["run"]["facets"].update(
        mystery={"_producer": "https://example.com/p", "_schemaURL": "https://example.com/Mystery.json"}
    ),
    "Airflow's facet with a try number that is a string": lambda e: e["run"]["facets"].update(
        airflow={
            "_producer": "https://example.com/p",
            "_schemaURL": GENERIC_RUN_FACET,
            "taskInstance": {"try_number": "2"},
        }
    ),  # fmt: skip
}


@lineage_required
@pytest.mark.parametrize("broken", sorted(BROKEN_EVENTS))
def test_a_whole_event_is_checked_against_the_pinned_spec(broken: str) -> None:
    """The docs page's example event passes the whole-event check; each broken copy of it fails."""
    import copy

    page = (Path(__file__).resolve().parents[2] / "docs" / "lineage.md").read_text()
    example = re.findall(r"```json\n(.*?)```", page, re.S)[0]  # the task's event
    event = json.loads(example)
    validate_event(event)
    bad = copy.deepcopy(event)
    BROKEN_EVENTS[broken](bad)
    with pytest.raises(EventInvalid):
        validate_event(bad)


@lineage_required
def test_a_folder_of_spec_files_is_used_for_the_facets_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ETL_CRAFT_OPENLINEAGE_SPEC, a facet whose ``_schemaURL`` file is in the folder is validated against
    that file (found by its ``$id``, any layout). The files here are made up for the test: a core whose
    RunEvent allows anything, and a NominalTimeRunFacet that forbids what the real one allows."""
    from tests import lineage_support

    core = {
        **lineage_support.CORE_STAND_IN,
        "$defs": {**lineage_support.CORE_STAND_IN["$defs"], "RunEvent": {}},
    }
    nominal_id = "https://openlineage.io/spec/facets/1-0-1/NominalTimeRunFacet.json"
    nominal = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": nominal_id,
        "$defs": {"NominalTimeRunFacet": {"not": {"required": ["nominalStartTime"]}}},
    }
    (tmp_path / "facets").mkdir()
    (tmp_path / "OpenLineage.json").write_text(json.dumps(core))
    (tmp_path / "facets" / "any-name.json").write_text(json.dumps(nominal))
    page = (Path(__file__).resolve().parents[2] / "docs" / "lineage.md").read_text()
    example = re.findall(r"```json\n(.*?)```", page, re.S)[0]  # the task's event
    event = json.loads(example)
    event["run"]["facets"]["nominalTime"] = {
        "_producer": "https://example.com/p",
        "_schemaURL": f"{nominal_id}#/$defs/NominalTimeRunFacet",
        "nominalStartTime": "2026-03-01T00:00:00+00:00",
    }
    validate_event(event)  # the pinned model: a valid facet
    monkeypatch.setenv(lineage_support.SPEC_DIR_ENV, str(tmp_path))
    lineage_support._spec_files.cache_clear()
    lineage_support._validator.cache_clear()
    try:
        with pytest.raises(EventInvalid, match="NominalTimeRunFacet"):
            validate_event(event)
    finally:  # the next test validates without the folder again
        monkeypatch.delenv(lineage_support.SPEC_DIR_ENV)
        lineage_support._spec_files.cache_clear()
        lineage_support._validator.cache_clear()
