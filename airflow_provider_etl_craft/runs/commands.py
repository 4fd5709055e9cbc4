"""What an operator can ask of an Engine DB from outside a DAG: one function per command, one JSON document each.

The CLI (``etl-craft-airflow … --format json`` prints these documents; its tables are drawn from them) and the
Airflow plugin's REST API (returns them as they are) both call these functions, so the two cannot disagree.
Every text value goes through Airflow's secret masker: an error message that echoed a secret shows ``***``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.engine.actor import ActorKind
from airflow_provider_etl_craft.errors import EtlCraftError, MetadataError
from airflow_provider_etl_craft.runs import graph
from airflow_provider_etl_craft.runs.identity import RunIdentity
from airflow_provider_etl_craft.runs.queries import RunQueries, as_json

if TYPE_CHECKING:
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook

Document = dict[str, Any]
#: Runs per page when the caller does not say (``history --limit``, the API's ``limit``).
DEFAULT_PAGE = 20
#: Finished runs the duration trend shows when the caller does not say, and the most it shows.
TREND_RUNS = 50
MAX_TREND_RUNS = 500


@contextmanager
def _queries(hook: EngineDBHook) -> Iterator[RunQueries]:
    with closing(hook.engine.connect()) as conn:
        queries = RunQueries(hook.engine, conn)
        queries.check_tables()
        yield queries


@contextmanager
def classified(hook: EngineDBHook) -> Iterator[None]:
    """Driver errors of any command leave as the provider's typed errors (the dialect classifies them)."""
    try:
        yield
    except EtlCraftError:
        raise
    except Exception as exc:
        try:
            engine = hook.engine
        except EtlCraftError:
            raise exc from None
        if isinstance(exc, engine.database_error()):
            raise engine.classify(exc) from exc
        raise


def masked(value: Any) -> Any:
    """Every text value through Airflow's secret masker, recursively."""
    if isinstance(value, str):
        return str(_compat.redact(value))
    if isinstance(value, list):
        return [masked(v) for v in value]
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items()}
    return value


def pipelines(hook: EngineDBHook) -> Document:
    """Every pipeline code with its row, open pause and newest run (``etl-craft-airflow pipelines``)."""
    with _queries(hook) as queries:
        return masked({"pipelines": as_json(queries.pipelines())})


def status(hook: EngineDBHook, code: str) -> Document:
    """The pipeline, its open pause, and its IN-PROGRESS run (else its newest run) with all its details."""
    with _queries(hook) as queries:
        pipeline = queries.pipeline(code)
        pause = queries.open_pause(pipeline.pipeline_id)
        run = queries.current_or_latest_run(code)
    return masked({"pipeline": as_json(pipeline), "pause": as_json(pause), "run": as_json(run)})


def history(hook: EngineDBHook, code: str, limit: int = DEFAULT_PAGE, before: int | None = None) -> Document:
    """One page of the pipeline's runs, newest first: ``limit`` runs with ids below ``before``.

    ``next_before`` is the ``before`` of the next (older) page; None when this page is the last.
    """
    with _queries(hook) as queries:
        pipeline = queries.pipeline(code)
        page = queries.recent_runs(code, limit, before)
    return masked(
        {"pipeline": as_json(pipeline), "runs": as_json(page.runs), "next_before": page.next_before}
    )


def trend(hook: EngineDBHook, code: str, limit: int = TREND_RUNS) -> Document:
    """The pipeline and its ``limit`` newest finished runs, oldest first, with their durations and SLA verdicts:
    what the UI's duration chart draws (docs/ui.md). ``limit`` is capped at :data:`MAX_TREND_RUNS`.
    """
    limit = max(1, min(limit, MAX_TREND_RUNS))
    with _queries(hook) as queries:
        pipeline = queries.pipeline(code)
        runs = queries.trend(code, limit)
    return masked({"pipeline": as_json(pipeline), "limit": limit, "runs": as_json(runs)})


def run_by_id(hook: EngineDBHook, pipeline_run_id: int) -> Document:
    """The run with this ``PIPELINE_RUN_ID`` and its pipeline row, as ``{"runs": [{"pipeline", "run"}]}``.

    :raises MetadataError: no such run.
    """
    with _queries(hook) as queries:
        found = queries.run(pipeline_run_id)
    if not found:
        raise MetadataError(
            f"no run has PIPELINE_RUN_ID {pipeline_run_id} in AUD_PIPELINES_RUN_LOG of the Engine DB "
            f"{hook.engine.describe()}; take the id from status or history of its pipeline"
        )
    return _runs_document(found)


def run_by_dag_run(hook: EngineDBHook, dag_id: str, run_id: str) -> Document:
    """The Engine run(s) of an Airflow DAG run (its run key), one per pipeline the DAG run claimed.

    :raises MetadataError: the DAG run claimed no Engine run.
    """
    run_key = RunIdentity(dag_id, run_id).run_key
    with _queries(hook) as queries:
        found = queries.runs_by_key(run_key)
    if not found:
        raise MetadataError(
            f"no Engine run has RUN_KEY {run_key} in the Engine DB {hook.engine.describe()}: DAG run {run_id} "
            f"of DAG {dag_id} has not claimed a run there (its claim task has not run, or it uses another "
            "Engine DB: choose its connection)"
        )
    return _runs_document(found)


def _runs_document(found: list[Any]) -> Document:
    return masked({"runs": [{"pipeline": as_json(p), "run": as_json(r)} for p, r in found]})


def pause(hook: EngineDBHook, code: str, reason: str, by: str) -> Document:
    """Open a pause of the pipeline by a person (kind HUMAN).

    :raises RunStateError: the pipeline is already paused (CLI exit 9, API 409).
    """
    with hook.lifecycle() as lifecycle:
        pause_id = lifecycle.pause(code, reason, by)
    return masked({"pipeline_code": code, "pause_id": pause_id, "paused_by": by, "reason": reason})


def resume(hook: EngineDBHook, code: str, reason: str, by: str) -> Document:
    """End the pipeline's open pause.

    :raises RunStateError: the pipeline is not paused (CLI exit 9, API 409).
    """
    with hook.lifecycle() as lifecycle:
        ended = lifecycle.resume(code, reason, by)
    return masked(
        {
            "pipeline_code": code,
            "pause_id": ended.pause_id,
            "paused_by": ended.paused_by,
            "reason": ended.reason,
            "resumed_by": by,
            "resume_reason": reason,
        }
    )


def validate(hook: EngineDBHook, code: str | None = None) -> Document:
    """Every problem of the dependency graph of each active pipeline, or of ``code`` only (``validate``).

    ``{"pipelines", "tasks", "failed", "problems": [{"pipeline_code", "status_name", "exit_code", "message"}]}``:
    what was checked, and each problem with the error a claim of its pipeline is refused with.

    :raises MetadataError: ``code`` is not an active pipeline.
    """
    with _queries(hook) as queries:
        if code is not None:
            pipeline = queries.pipeline(code)
            if pipeline.active_flag != "Y":
                raise MetadataError(
                    f"pipeline {code} is retired (ACTIVE_FLAG='N') in CFG_PIPELINES of the Engine DB "
                    f"{hook.engine.describe()}, so it has no graph to check; fix --pipeline, or reactivate it "
                    "through a project migration"
                )
        report = graph.validate(hook.engine, queries.conn, None if code is None else [code])
    return masked(report.as_json())


def purge(
    hook: EngineDBHook,
    older_than: timedelta,
    *,
    pipeline: str | None = None,
    batch_size: int | None = None,
    archive_dir: str | Path | None = None,
    dry_run: bool = False,
    by: str | None = None,
    kind: str = ActorKind.SYSTEM,
) -> Document:
    """Delete finished runs that ended more than ``older_than`` ago, with their rows (docs/retention.md).

    :raises MetadataError: ``pipeline`` is not in CFG_PIPELINES (CLI exit 4).
    :raises RunStateError: another purge is running (CLI exit 9).
    :raises EngineDBError: the Engine DB is not at the latest ENGINE migration (CLI exit 12).
    """
    from airflow_provider_etl_craft.runs.purge import DEFAULT_BATCH_SIZE, Purge

    with closing(hook.engine.connect()) as conn:
        cutoff = hook.engine.now() - older_than
        job = Purge(
            hook.engine,
            conn,
            cutoff,
            pipeline=pipeline,
            batch_size=batch_size or DEFAULT_BATCH_SIZE,
            archive_dir=None if archive_dir is None else Path(archive_dir),
            dry_run=dry_run,
            by=by,
            kind=kind,
        )
        return masked(job.run().as_json())
