"""The provider's metrics, sent through Airflow's own ``Stats`` (so wherever ``[metrics]`` sends Airflow's).

Every name starts with ``etl_craft.`` and says what happened without its tags: plain StatsD drops tags
(unless ``statsd_influxdb_enabled``), while Datadog, InfluxDB-style StatsD and OpenTelemetry keep them. The
outcome or result is part of the name; what a dashboard splits by pipeline (run duration and outcome, SLA
breaches, claim wait) is also sent under a second name that carries the pipeline code
(``etl_craft.pipeline.<CODE>.…``), as Airflow does with a DAG id. docs/metrics.md has the table.

Sending is fire and forget (a UDP datagram, or an OpenTelemetry instrument update): no function here
raises or waits, and a ``[metrics]`` section that sends nowhere makes each a no-op.
"""

from __future__ import annotations

import logging
import re
import socket
from datetime import timedelta
from typing import Any

from airflow_provider_etl_craft import _compat
from airflow_provider_etl_craft.runs import events
from airflow_provider_etl_craft.runs.vocabulary import SlaStatus

log = logging.getLogger(__name__)

PREFIX = "etl_craft"

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def part(value: object) -> str:
    """``value`` as one segment of a metric name: lower case, characters StatsD refuses (dots included,
    which would split the segment) as ``_``."""
    return _UNSAFE.sub("_", str(value)).lower() or "_"


def _code(value: str) -> str:
    """A pipeline or task code as a name segment, its case kept (codes are upper-case identifiers)."""
    return _UNSAFE.sub("_", value) or "_"


def enabled() -> bool:
    """Whether ``[metrics]`` sends anywhere (StatsD, Datadog or OpenTelemetry): a metric that costs a
    statement (the run duration after a one-call finish) is read only then."""
    try:
        conf = _compat.resolve("conf")
        return any(
            conf.getboolean("metrics", option, fallback=False)
            for option in ("statsd_on", "statsd_datadog_enabled", "otel_on")
        )
    except Exception:  # a metric's question must never fail the task
        return False


def _send(kind: str, name: str, value: Any, tags: dict[str, str]) -> None:
    """One metric through Airflow's ``Stats``; a failure is logged at debug level, never raised."""
    try:
        stats = _compat.stats()
        if kind == "incr":
            stats.incr(name, tags=tags)
        elif kind == "timing":
            stats.timing(name, timedelta(seconds=max(float(value), 0.0)), tags=tags)
        else:
            stats.gauge(name, value, tags=tags)
    except Exception as exc:  # metrics must never fail or slow a task
        log.debug("etl-craft: could not send metric %s: %s", name, exc)


# -- claims --------------------------------------------------------------------------------------------------


def claim(pipeline: str, outcome: str) -> None:
    """A claim's look ended ``outcome`` (CREATED, RESUMED, REOPENED, BLOCKED, WAITING, SKIPPED)."""
    _send("incr", f"{PREFIX}.claim.{part(outcome)}", 1, {"pipeline": pipeline, "outcome": outcome})


def claim_wait(pipeline: str, outcome: str, seconds: float) -> None:
    """Time from the claim task's first look to the look that got its run (CREATED, RESUMED, REOPENED)."""
    tags = {"pipeline": pipeline, "outcome": outcome}
    _send("timing", f"{PREFIX}.claim.wait", seconds, tags)
    _send("timing", f"{PREFIX}.pipeline.{_code(pipeline)}.claim_wait", seconds, tags)


# -- runs ----------------------------------------------------------------------------------------------------


def run_finished(pipeline: str, status: str, duration: float | None, sla_status: str | None) -> None:
    """A finish ended a run: its outcome, its duration (START_DATE to END_DATE), and an SLA breach."""
    tags = {"pipeline": pipeline, "status": status}
    _send("incr", f"{PREFIX}.run.{part(status)}", 1, tags)
    _send("incr", f"{PREFIX}.pipeline.{_code(pipeline)}.run.{part(status)}", 1, tags)
    if duration is not None:
        _send("timing", f"{PREFIX}.run.duration", duration, tags)
        _send("timing", f"{PREFIX}.pipeline.{_code(pipeline)}.run_duration", duration, tags)
    if sla_status == SlaStatus.BREACHED:
        _send("incr", f"{PREFIX}.sla.breached", 1, {"pipeline": pipeline})
        _send("incr", f"{PREFIX}.pipeline.{_code(pipeline)}.sla_breached", 1, {"pipeline": pipeline})


# -- attempts, gates, locks, errors ----------------------------------------------------------------------


def attempt(pipeline: str, task: str, status: str) -> None:
    """An attempt ended ``status`` (SUCCESS, FAILED, TIMED_OUT, SKIPPED, CANCELLED, LOST) or was PARKED."""
    _send(
        "incr", f"{PREFIX}.attempt.{part(status)}", 1, {"pipeline": pipeline, "task": task, "status": status}
    )


def gate(pipeline: str, task: str | None, result: str) -> None:
    """A gate's verdict (SATISFIED, UNSATISFIED, WAIT): the claim's pipeline dependencies or a task's."""
    tags = {"pipeline": pipeline, "level": "pipeline" if task is None else "task", "result": result}
    if task is not None:
        tags["task"] = task
    _send("incr", f"{PREFIX}.gate.{part(result)}", 1, tags)


def lock_wait(pipeline: str, step: str, seconds: float, how: str) -> None:
    """How long a step waited to hold the ``pipeline:<code>`` lock."""
    _send("timing", f"{PREFIX}.lock.wait", seconds, {"pipeline": pipeline, "step": step, "how": how})


def engine_error(status_name: str, retryable: bool) -> None:
    """A typed provider error became an Airflow outcome (retryable: a retry; else a failure without one)."""
    tags = {"status": status_name, "retryable": str(retryable).lower()}
    _send("incr", f"{PREFIX}.engine_error.{part(status_name)}", 1, tags)


# -- triggerer -----------------------------------------------------------------------------------------------

_HOST = part(socket.gethostname())


def deferred_waits(count: int) -> None:
    """How many deferred waits this triggerer process holds now."""
    tags = {"hostname": _HOST}
    _send("gauge", f"{PREFIX}.triggerer.deferred_waits", count, tags)
    _send("gauge", f"{PREFIX}.triggerer.deferred_waits.{_HOST}", count, tags)


# -- what the lifecycle core reports ---------------------------------------------------------------------


def _from_lifecycle(event: str, fields: dict[str, Any]) -> None:
    if event == events.LOCK_WAIT:
        lock_wait(fields["pipeline"], fields["step"], fields["seconds"], fields["how"])
    elif event == events.GATE:
        gate(fields["pipeline"], fields["task"], fields["result"])


events.listen(_from_lifecycle)
