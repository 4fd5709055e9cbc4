"""The parts of the provider metadata that repeat other declarations: the connection form (from the auth modes'
fields) and the ``[etl_craft]`` options (from :mod:`~airflow_provider_etl_craft.settings`).

Airflow reads the provider metadata in every process it starts (its configuration loads each provider's
``config``), so :mod:`airflow_provider_etl_craft.get_provider_info` does not build these parts: it reads them
from :mod:`airflow_provider_etl_craft._provider_info_derived`, plain literals that ``make provider-info``
writes from :func:`derived`. An Airflow process loads neither the auth registry nor the settings for them
(docs/performance.md); a test fails when the literals and :func:`derived` differ.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

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


def derived() -> dict[str, Any]:
    """The parts of the provider dict derived from other declarations, by the name
    :mod:`~airflow_provider_etl_craft._provider_info_derived` gives each."""
    return {"CONN_FIELDS": CONN_FIELDS, "UI_FIELD_BEHAVIOUR": UI_FIELD_BEHAVIOUR, "CONFIG": provider_config()}
