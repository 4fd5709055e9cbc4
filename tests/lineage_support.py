"""What the lineage tests share: when they run, and the offline check of whole OpenLineage events.

Every event a test captures is checked whole, offline (docs/lineage.md, "How events are validated"):

- each facet whose JSON schema is installed is validated against it with ``jsonschema``: the
  ``etl_craft_run`` facet against ``EtlCraftRunFacet.json`` (shipped in this package), Airflow's own facets
  (``airflow``, ``airflowDagRun``, ``airflowState``, ``airflowDebug``; the job's ``airflow``) against the
  schemas the pinned ``apache-airflow-providers-openlineage`` ships beside its facet classes;
- the event itself and OpenLineage's standard facets (``parent``, ``errorMessage``, ``nominalTime``,
  ``outputStatistics``, …) are checked against the pinned ``openlineage-python``'s model of the spec: the
  classes OpenLineage generates from the spec's JSON schemas, one per ``_schemaURL``. Required properties,
  nested objects, enums, types and the model's validators (ISO times, URIs) are checked; additional
  properties are allowed, as the spec allows them. No package on a registry reachable here ships the spec's
  JSON files themselves (the pinned openlineage-python, -integration-common, -sql, -airflow, -dbt and the
  Airflow provider's wheel and sdist were looked at); with ``ETL_CRAFT_OPENLINEAGE_SPEC`` naming a folder of
  them (any layout: each file is found by its ``$id``), those are used instead, with ``jsonschema``;
- a facet whose ``_schemaURL`` is neither installed nor in the pinned model fails the check, unless
  :data:`UNCHECKED_FACETS` names it with its reason.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import os
import pkgutil
import types
import typing
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


#: OpenLineage is an optional integration: without it these tests skip, unless the run says it must be there.
OPENLINEAGE = _importable("openlineage.client") and _importable("airflow.providers.openlineage")
lineage_required = pytest.mark.skipif(
    not OPENLINEAGE and not os.environ.get("ETL_CRAFT_REQUIRE_OPENLINEAGE"),
    reason="apache-airflow-providers-openlineage is not installed (ETL_CRAFT_REQUIRE_OPENLINEAGE=1 makes it fail)",
)

#: A folder holding the OpenLineage spec's JSON schema files (found by ``$id``); optional (module docstring).
SPEC_DIR_ENV = "ETL_CRAFT_OPENLINEAGE_SPEC"
CORE_ID = "https://openlineage.io/spec/2-0-2/OpenLineage.json"
RUN_EVENT_URL = f"{CORE_ID}#/$defs/RunEvent"
GENERIC_RUN_FACET = f"{CORE_ID}#/$defs/RunFacet"
GENERIC_JOB_FACET = f"{CORE_ID}#/$defs/JobFacet"

#: What the schemas that ``$ref`` the core spec need of it when its file is not at hand: a RunFacet or a
#: JobFacet is a BaseFacet, whose ``_producer`` and ``_schemaURL`` are required URIs (the pinned model checks
#: the same of every facet).
CORE_STAND_IN = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": CORE_ID,
    "$defs": {
        "BaseFacet": {
            "type": "object",
            "properties": {
                "_producer": {"type": "string", "format": "uri"},
                "_schemaURL": {"type": "string", "format": "uri"},
            },
            "additionalProperties": True,
            "required": ["_producer", "_schemaURL"],
        },
        "RunFacet": {"type": "object", "allOf": [{"$ref": "#/$defs/BaseFacet"}]},
        "JobFacet": {"type": "object", "allOf": [{"$ref": "#/$defs/BaseFacet"}]},
    },
}

#: Airflow's facets carry the generic RunFacet/JobFacet ``_schemaURL``: they are found by name, and checked
#: against the schema file the Airflow provider ships for them.
AIRFLOW_RUN_FACETS = {
    "airflow": "AirflowRunFacet",
    "airflowDagRun": "AirflowDagRunFacet",
    "airflowState": "AirflowStateRunFacet",
    "airflowDebug": "AirflowDebugRunFacet",
}
AIRFLOW_JOB_FACETS = {"airflow": "AirflowJobFacet"}
#: Facets left unchecked beyond the BaseFacet rules, with the reason.
UNCHECKED_FACETS = {
    (
        "run",
        "airflow_mappedTask",
    ): "Airflow's deprecated mapped-task facet: the provider ships no schema for it",
}

#: Where an installed schema and the pinned producer disagree, the error left out, with the reason:
#: (schema, path of the property in the facet, JSON-schema keyword that failed) -> reason.
KNOWN_DEVIATIONS = {
    ("airflow:AirflowRunFacet", ("task", "retry_exponential_backoff"), "type"): (
        "Airflow 3 made retry_exponential_backoff a multiplier (a number); the provider's 2.20.3 schema "
        "still says boolean"
    ),
    ("airflow:AirflowRunFacet", ("taskInstance", "pool"), "required"): (
        "the provider 2.20.3 on Airflow 3 sends no taskInstance.pool, which its schema still requires"
    ),
}


class EventInvalid(AssertionError):
    """An event, or one of its facets, is not what the OpenLineage spec (as pinned here) allows."""


def facet_schema() -> dict[str, Any]:
    """The facet's JSON schema as the package ships it."""
    text = resources.files("airflow_provider_etl_craft.lineage").joinpath("EtlCraftRunFacet.json").read_text()
    return json.loads(text)


@cache
def _spec_files() -> dict[str, dict[str, Any]]:
    """The spec's JSON schemas by ``$id``, from :data:`SPEC_DIR_ENV`'s folder (empty without it)."""
    folder = os.environ.get(SPEC_DIR_ENV)
    if not folder:
        return {}
    found = {}
    for path in sorted(Path(folder).rglob("*.json")):
        schema = json.loads(path.read_text())
        if isinstance(schema, dict) and isinstance(schema.get("$id"), str):
            found[schema["$id"]] = schema
    if CORE_ID not in found:
        raise EventInvalid(f"{SPEC_DIR_ENV}={folder} holds no {CORE_ID}")
    return found


def _airflow_schema(name: str) -> dict[str, Any]:
    text = resources.files("airflow.providers.openlineage.facets").joinpath(f"{name}.json").read_text()
    return json.loads(text)


@cache
def _validator(url: str) -> Callable[[Any], None]:
    """A jsonschema validator of ``url`` (``file-id#pointer``, or ``airflow:Name`` for Airflow's facets)."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    ours = facet_schema()
    schemas = {CORE_ID: CORE_STAND_IN, **_spec_files(), ours["$id"]: ours}
    registry = Registry().with_resources(
        (uri, Resource.from_contents(schema)) for uri, schema in schemas.items()
    )
    if url.startswith("airflow:"):
        name = url.removeprefix("airflow:")
        schema = {**_airflow_schema(name), "$ref": f"#/$defs/{name}"}
    else:
        schema = {"$ref": url}
    validator = Draft202012Validator(schema, registry=registry, format_checker=_format_checker())

    def validate(instance: Any) -> None:
        errors = sorted(
            (e for e in validator.iter_errors(instance) if _deviation(url, e) not in KNOWN_DEVIATIONS),
            key=lambda e: list(e.absolute_path),
        )
        if errors:
            raise EventInvalid(f"{url}: {errors[0].message} at {list(errors[0].absolute_path)}")

    return validate


def _format_checker() -> Any:
    """jsonschema's format checks, plus ``date-time`` and ``uri``, which it checks only with optional
    packages this tier does not install: an RFC 3339 date-time (date, ``T``, time, offset), a URI with a
    scheme."""
    from jsonschema import Draft202012Validator, FormatChecker

    checker = FormatChecker(Draft202012Validator.FORMAT_CHECKER.checkers)

    @checker.checks("date-time", raises=ValueError)
    def date_time(value: object) -> bool:
        if not isinstance(value, str):
            return True
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        return "T" in value.upper() and parsed.tzinfo is not None

    @checker.checks("uri", raises=ValueError)
    def uri(value: object) -> bool:
        return not isinstance(value, str) or bool(urlsplit(value).scheme)

    return checker


def _deviation(url: str, error: Any) -> tuple[str, tuple[Any, ...], str]:
    """The :data:`KNOWN_DEVIATIONS` key of a validation error (a missing property's path ends in its name)."""
    path = tuple(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        path += tuple(p for p in error.validator_value if p not in error.instance)[:1]
    return url, path, str(error.validator)


def facet_validator() -> Callable[[dict[str, Any]], None]:
    """Validate a run's ``etl_craft_run`` facet (in ``run.facets``) against the shipped schema."""
    ours = facet_schema()
    validate = _validator(f"{ours['$id']}#/$defs/EtlCraftRunFacet")

    def check(run_facets: dict[str, Any]) -> None:
        if "etl_craft_run" in run_facets:
            validate(run_facets["etl_craft_run"])

    return check


# -- the pinned openlineage-python's model of the spec ------------------------------------------------------


@cache
def _model_classes() -> dict[str, type]:
    """The pinned client's generated classes by the ``_schemaURL`` each stands for."""
    import attr
    import openlineage.client.generated as generated

    classes: dict[str, type] = {}
    for info in pkgutil.iter_modules(generated.__path__):
        module = importlib.import_module(f"{generated.__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and attr.has(value) and "_get_schema" in vars(value):
                classes.setdefault(value._get_schema(), value)
    return classes


def _model_check(url: str, instance: Any) -> None:
    cls = _model_classes().get(url)
    if cls is None:
        raise EventInvalid(f"no schema for {url} offline (neither installed nor in the pinned model)")
    try:
        _build(cls, instance, url)
    except EventInvalid:
        raise
    except (TypeError, ValueError) as exc:  # the model's own validators
        raise EventInvalid(f"{url}: {exc}") from exc


def _build(tp: Any, value: Any, where: str) -> Any:
    """``value`` as the model type ``tp``: required properties, nested objects, enums and types checked."""
    import attr

    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(options) < len(typing.get_args(tp)):
            return None
        return _build(options[0], value, where)
    if origin is list:
        if not isinstance(value, list):
            raise EventInvalid(f"{where}: {value!r} is not an array")
        (item,) = typing.get_args(tp)
        return [_build(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is Any:
        return value  # facet maps: each facet is checked on its own
    if isinstance(tp, type) and attr.has(tp):
        return _build_object(tp, value, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    expected = {str: (str,), int: (int,), float: (int, float), bool: (bool,)}.get(tp, (object,))
    if not isinstance(value, expected) or (tp is int and isinstance(value, bool)):
        raise EventInvalid(f"{where}: {value!r} is not a {getattr(tp, '__name__', tp)}")
    return value


def _build_object(cls: type, value: Any, where: str) -> Any:
    import attr

    if not isinstance(value, dict):
        raise EventInvalid(f"{where}: {value!r} is not an object")
    attr.resolve_types(cls)
    kwargs = {}
    for field in attr.fields(cls):
        if not field.init:
            continue
        key = field.name if field.name in value else field.alias
        if key in value:
            kwargs[field.alias] = _build(field.type, value[key], f"{where}.{key}")
        elif field.default is attr.NOTHING:
            raise EventInvalid(f"{where}: required property {key!r} is missing")
    return cls(**kwargs)


# -- whole events ---------------------------------------------------------------------------------------------


def _facets(event: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(where, name, facet) of every facet of the event: run, job, and each dataset's."""
    yield from (("run", k, v) for k, v in (event.get("run", {}).get("facets") or {}).items())
    yield from (("job", k, v) for k, v in (event.get("job", {}).get("facets") or {}).items())
    for side, extra in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
        for i, dataset in enumerate(event.get(side) or []):
            for key in ("facets", extra):
                yield from ((f"{side}[{i}].{key}", k, v) for k, v in (dataset.get(key) or {}).items())


def validate_facet(where: str, name: str, facet: Any) -> None:
    """One facet: against its installed schema, else the pinned model (module docstring)."""
    if not isinstance(facet, dict) or not isinstance(facet.get("_schemaURL"), str):
        raise EventInvalid(f"{where}.{name}: a facet must be an object with a _schemaURL")
    url = facet["_schemaURL"]
    label = f"{where}.{name}"
    _validator(f"{CORE_ID}#/$defs/BaseFacet")(facet)  # every facet: _producer and _schemaURL, URIs
    airflow = {"run": AIRFLOW_RUN_FACETS, "job": AIRFLOW_JOB_FACETS}.get(where, {})
    if url in (GENERIC_RUN_FACET, GENERIC_JOB_FACET) and name in airflow:
        _validator(f"airflow:{airflow[name]}")(facet)
    elif url.partition("#")[0] in (facet_schema()["$id"], *_spec_files()):
        _validator(url)(facet)
    elif (where, name) in UNCHECKED_FACETS:
        pass  # the BaseFacet rules only (the reason is in UNCHECKED_FACETS)
    elif url in (GENERIC_RUN_FACET, GENERIC_JOB_FACET):
        raise EventInvalid(f"{label}: names only the generic {url}, and no schema of its own is known here")
    else:
        try:
            _model_check(url, facet)
        except EventInvalid as exc:
            raise EventInvalid(f"{label}: {exc}") from exc


def validate_event(event: dict[str, Any]) -> None:
    """A whole RunEvent as a transport wrote it: the event, then every facet; raises :class:`EventInvalid`."""
    if event.get("schemaURL") != RUN_EVENT_URL:
        raise EventInvalid(f"not a {RUN_EVENT_URL}: {event.get('schemaURL')!r}")
    if _spec_files():
        _validator(RUN_EVENT_URL)(event)
    else:
        _model_check(RUN_EVENT_URL, event)
    for where, name, facet in _facets(event):
        validate_facet(where, name, facet)


# -- captured events against expected ones --------------------------------------------------------------------

#: What the comparison keeps of an ``etl_craft_run`` facet (the ids and the Engine DB are compared with the
#: AUD_ rows elsewhere).
FACET_KEYS = ("operation", "taskCode", "status", "attemptNumber", "mapIndex", "counts")


def normalise(events: list[dict[str, Any]], dag_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """The tasks' events with times, run ids and producers stripped, as Airflow's OpenLineage system tests
    compare them: task (``task_id`` or ``task_id[map_index]``) -> its events in the order they were written,
    each ``(eventType, try_number, facet)`` with the ``etl_craft_run`` facet's :data:`FACET_KEYS` (or None).
    The DAG run's own events and the Engine SQL's sub-jobs (``<task>.query.N``) are left out."""
    found: dict[str, list[tuple[Any, ...]]] = {}
    for event in events:
        job = event["job"]["name"]
        ti = event["run"]["facets"].get("airflow", {}).get("taskInstance")
        if not job.startswith(f"{dag_id}.") or ti is None:
            continue
        task = job.removeprefix(f"{dag_id}.")
        if ti.get("map_index", -1) not in (-1, None):
            task += f"[{ti['map_index']}]"
        ours = event["run"]["facets"].get("etl_craft_run")
        facet = None if ours is None else {k: ours[k] for k in FACET_KEYS if k in ours}
        found.setdefault(task, []).append((event["eventType"], ti.get("try_number"), facet))
    return found


def expected_task(code: str, tries: list[tuple[str, dict[str, Any]]], map_index: int | None = None) -> list:
    """A recorded task's events: per try a START (what is known before it runs), then its end with the
    attempt it recorded (``tries``: ``(eventType, {status, counts?})`` per try)."""
    events: list[tuple[Any, ...]] = []
    place = {} if map_index is None else {"mapIndex": map_index}
    for number, (end, attempt) in enumerate(tries, start=1):
        events.append(("START", number, {"operation": "task", "taskCode": code}))
        facet = {"operation": "task", "taskCode": code, "attemptNumber": number, **place, **attempt}
        events.append((end, number, {k: facet[k] for k in FACET_KEYS if k in facet}))
    return events


def expected_claim_and_finish(group: str, status: str = "SUCCESS") -> dict[str, list[tuple[Any, ...]]]:
    """The claim's and the finish's events of a pipeline run that claims and ends with ``status``."""
    return {
        f"{group}.claim": [
            ("START", 1, {"operation": "claim"}),
            ("COMPLETE", 1, {"operation": "claim", "status": "IN-PROGRESS"}),
        ],
        f"{group}.finish": [
            ("START", 1, {"operation": "finish"}),
            ("COMPLETE", 1, {"operation": "finish", "status": status}),
        ],
    }
