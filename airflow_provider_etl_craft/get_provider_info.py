"""Provider metadata read by Airflow's providers manager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any

from airflow_provider_etl_craft import __version__
from airflow_provider_etl_craft.settings import provider_config

#: The connection form: extras shown as fields (stored in the connection's extra JSON).
CONN_FIELDS: dict[str, dict[str, Any]] = {
    "config_path": {"label": "craft-connector.yml path", "description": "File-backed: the config file to read",
                    "schema": {"type": ["string", "null"]}},
    "profile": {"label": "Engine profile", "description": "File-backed: profile to use (else the file's choice)",
                "schema": {"type": ["string", "null"]}},
    "jdbc_url": {"label": "JDBC URL", "description": "Inline SQLite: jdbc:sqlite:/path/engine.db",
                 "schema": {"type": ["string", "null"]}},
    "engine_schema": {"label": "Engine schema", "description": "Inline PostgreSQL: the existing schema",
                      "schema": {"type": ["string", "null"]}},
    "auth_mode": {"label": "Auth mode", "description": "Inline PostgreSQL: password, token, key_file, oauth, sso or sts",
                  "schema": {"type": ["string", "null"],
                             "enum": [None, "password", "token", "key_file", "oauth", "sso", "sts"]}},
    "key_file": {"label": "Client key file", "description": "key_file: absolute path of the client key",
                 "schema": {"type": ["string", "null"]}},
    "cert_file": {"label": "Client certificate file", "description": "key_file: absolute path of the certificate",
                  "schema": {"type": ["string", "null"]}},
    "client_id": {"label": "OAuth client id", "description": "oauth and sso: the client id",
                  "schema": {"type": ["string", "null"]}},
    "token_url": {"label": "OAuth token URL", "description": "oauth: the https token endpoint",
                  "schema": {"type": ["string", "null"]}},
    "scope": {"label": "OAuth scope", "description": "oauth: optional scope", "schema": {"type": ["string", "null"]}},
    "issuer": {"label": "OAuth issuer", "description": "sso: the issuer URL libpq discovers",
               "schema": {"type": ["string", "null"]}},
    "region": {"label": "AWS region", "description": "sts: the RDS region", "schema": {"type": ["string", "null"]}},
    "role_arn": {"label": "AWS role ARN", "description": "sts: optional role to assume first",
                 "schema": {"type": ["string", "null"]}},
    "sslmode": {"label": "SSL mode", "schema": {"type": ["string", "null"]}},
    "sslrootcert": {"label": "SSL root certificate", "schema": {"type": ["string", "null"]}},
}  # fmt: skip
UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": [],
    "relabeling": {
        "schema": "Database",
        "login": "User",
        "password": "Secret (password, token, client secret or key passphrase)",
    },
    "placeholders": {"host": "db.internal (inline PostgreSQL)", "schema": "etl_craft", "port": "5432"},
}


def get_provider_info() -> dict[str, Any]:
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
                    "airflow_provider_etl_craft.operators.pipeline_run",
                    "airflow_provider_etl_craft.operators.task_run",
                ],
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
        "config": provider_config(),
    }
