"""What the lineage tests share: when they run, and the offline check of the ``etl_craft_run`` facet's schema."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from importlib import resources
from typing import Any

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

#: What the facet schema's ``$ref`` to the OpenLineage spec needs of it, kept here so the check runs offline:
#: the spec's RunFacet is a BaseFacet, whose ``_producer`` and ``_schemaURL`` are required URIs.
OPENLINEAGE_SPEC = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://openlineage.io/spec/2-0-2/OpenLineage.json",
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
    },
}


def facet_schema() -> dict[str, Any]:
    """The facet's JSON schema as the package ships it."""
    text = resources.files("airflow_provider_etl_craft.lineage").joinpath("EtlCraftRunFacet.json").read_text()
    return json.loads(text)


def facet_validator() -> Callable[[dict[str, Any]], None]:
    """Validate a run's facets (``run.facets``) against the shipped schema; raises ``ValidationError``."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    schema = facet_schema()
    registry = Registry().with_resources(
        [
            (OPENLINEAGE_SPEC["$id"], Resource.from_contents(OPENLINEAGE_SPEC)),
            (schema["$id"], Resource.from_contents(schema)),
        ]
    )
    validator = Draft202012Validator(
        schema, registry=registry, format_checker=Draft202012Validator.FORMAT_CHECKER
    )

    def validate(run_facets: dict[str, Any]) -> None:
        validator.validate(run_facets)

    return validate
