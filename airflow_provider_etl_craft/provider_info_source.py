"""Where the provider metadata comes from: :func:`build` derives it from the declarations it repeats (the auth
modes' fields, the ``[etl_craft]`` options, the version).

Airflow reads the provider metadata in every process it starts (its configuration loads each provider's
``config``), so the entry point, :mod:`airflow_provider_etl_craft.get_provider_info`, is a plain literal
written from :func:`build` by ``make provider-info``: an Airflow process loads neither the auth registry nor
msgspec for it (docs/performance.md). A test fails when the two differ.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_provider_etl_craft import __version__
from airflow_provider_etl_craft.auth import AUTH_MODES, fields_in
from airflow_provider_etl_craft.settings import provider_config


def _entry(label: str, description: str = "", **schema: Any) -> dict[str, Any]:
    """One text field of the connection form (empty allowed: it is stored in the extra JSON only when set)."""
    text = {"description": description} if description else {}
    return {"label": label, **text, "schema": {"type": ["string", "null"], **schema}}


def _one_of(words: Iterable[str]) -> str:
    """``a, b or c``."""
    *rest, last = words
    return f"{', '.join(rest)} or {last}" if rest else last


def _auth_extras() -> dict[str, dict[str, Any]]:
    """One form field per extra some auth mode takes, saying which modes use it (``oauth and sso: …``)."""
    uses: dict[str, dict[str, list[str]]] = {}
    labels: dict[str, str] = {}
    for mode in AUTH_MODES.values():
        for field in mode.fields:
            if field.conn == "extra":
                text = field.description + ("" if field.required else " (optional)")
                uses.setdefault(field.key, {}).setdefault(text, []).append(mode.name)
                labels.setdefault(field.key, field.label)
    return {
        key: _entry(labels[key], "; ".join(f"{' and '.join(modes)}: {text}" for text, modes in texts.items()))
        for key, texts in uses.items()
    }


#: The connection form: extras shown as fields (stored in the connection's extra JSON).
CONN_FIELDS: dict[str, dict[str, Any]] = {
    "config_path": _entry("craft-connector.yml path", "File-backed: the config file to read"),
    "profile": _entry("Engine profile", "File-backed: profile to use (else the file's choice)"),
    "jdbc_url": _entry("JDBC URL", "Inline SQLite: jdbc:sqlite:/path/engine.db"),
    "engine_schema": _entry("Engine schema", "Inline PostgreSQL: the existing schema"),
    "auth_mode": _entry("Auth mode", f"Inline PostgreSQL: {_one_of(AUTH_MODES)}", enum=[None, *AUTH_MODES]),
    **_auth_extras(),
    "sslmode": _entry("SSL mode"),
    "sslrootcert": _entry("SSL root certificate"),
}
UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": [],
    "relabeling": {
        "schema": "Database",
        "login": _one_of(dict.fromkeys(f.label for f in fields_in("login"))),
        "password": f"Secret ({_one_of(dict.fromkeys(f.label.lower() for f in fields_in('password')))})",
    },
    "placeholders": {"host": "db.internal (inline PostgreSQL)", "schema": "etl_craft", "port": "5432"},
}


def build() -> dict[str, Any]:
    """The provider dict; validated against Airflow's provider_info.schema.json by the tests."""
    return {
        "package-name": "airflow-provider-etl-craft",
        "name": "etl-craft",
        "description": "Drive etl-craft pipelines from Airflow and keep their Engine DB (CFG_/AUD_ tables).",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "etl-craft",
                "external-doc-url": "https://pypi.org/project/airflow-provider-etl-craft/",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "etl-craft",
                "python-modules": ["airflow_provider_etl_craft.hooks.engine_db"],
            }
        ],
        "operators": [
            {
                "integration-name": "etl-craft",
                "python-modules": [
                    "airflow_provider_etl_craft.operators.init_db",
                    "airflow_provider_etl_craft.operators.purge",
                    "airflow_provider_etl_craft.operators.pipeline_run",
                    "airflow_provider_etl_craft.operators.task_run",
                ],
            }
        ],
        "triggers": [
            {
                "integration-name": "etl-craft",
                "python-modules": ["airflow_provider_etl_craft.triggers.engine_change"],
            }
        ],
        "task-decorators": [
            {
                "name": "etl_craft",
                "class-name": "airflow_provider_etl_craft.decorators.etl_craft_task.etl_craft_task",
            }
        ],
        "connection-types": [
            {
                "connection-type": "etl_craft",
                "hook-class-name": "airflow_provider_etl_craft.hooks.engine_db.EngineDBHook",
                "hook-name": "etl-craft Engine DB",
                "conn-fields": CONN_FIELDS,
                "ui-field-behaviour": UI_FIELD_BEHAVIOUR,
            }
        ],
        "extra-links": ["airflow_provider_etl_craft.plugins.links.EngineRunLink"],
        "plugins": [
            {"name": "etl_craft", "plugin-class": "airflow_provider_etl_craft.plugins.plugin.EtlCraftPlugin"}
        ],
        "config": provider_config(),
    }
