"""The derived parts of the provider metadata, as literals: written by ``make provider-info`` from
:func:`airflow_provider_etl_craft.provider_info_source.derived`; do not edit it by hand (docs/performance.md)."""

from __future__ import annotations

from typing import Any

CONN_FIELDS: dict[str, Any] = {
    "config_path": {
        "label": "craft-connector.yml path",
        "description": "File-backed: the config file to read",
        "schema": {"type": ["string", "null"]},
    },
    "profile": {
        "label": "Engine profile",
        "description": "File-backed: profile to use (else the file's choice)",
        "schema": {"type": ["string", "null"]},
    },
    "jdbc_url": {
        "label": "JDBC URL",
        "description": "Inline SQLite: jdbc:sqlite:/path/engine.db",
        "schema": {"type": ["string", "null"]},
    },
    "engine_schema": {
        "label": "Engine schema",
        "description": "Inline PostgreSQL: the existing schema",
        "schema": {"type": ["string", "null"]},
    },
    "auth_mode": {
        "label": "Auth mode",
        "description": "Inline PostgreSQL: password, token, key_file, oauth, sso or sts",
        "schema": {
            "type": ["string", "null"],
            "enum": [None, "password", "token", "key_file", "oauth", "sso", "sts"],
        },
    },
    "key_file": {
        "label": "Client key file",
        "description": "key_file: absolute path of the client key",
        "schema": {"type": ["string", "null"]},
    },
    "cert_file": {
        "label": "Client certificate file",
        "description": "key_file: absolute path of the certificate (optional)",
        "schema": {"type": ["string", "null"]},
    },
    "client_id": {
        "label": "OAuth client id",
        "description": "oauth and sso: the client id",
        "schema": {"type": ["string", "null"]},
    },
    "token_url": {
        "label": "OAuth token URL",
        "description": "oauth: the https token endpoint",
        "schema": {"type": ["string", "null"]},
    },
    "scope": {
        "label": "OAuth scope",
        "description": "oauth and sso: the scope to request (optional)",
        "schema": {"type": ["string", "null"]},
    },
    "issuer": {
        "label": "OAuth issuer",
        "description": "sso: the issuer URL libpq discovers",
        "schema": {"type": ["string", "null"]},
    },
    "region": {
        "label": "AWS region",
        "description": "sts: the RDS region",
        "schema": {"type": ["string", "null"]},
    },
    "role_arn": {
        "label": "AWS role ARN",
        "description": "sts: the role to assume first (optional)",
        "schema": {"type": ["string", "null"]},
    },
    "sslmode": {"label": "SSL mode", "schema": {"type": ["string", "null"]}},
    "sslrootcert": {"label": "SSL root certificate", "schema": {"type": ["string", "null"]}},
}

UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": [],
    "relabeling": {
        "schema": "Database",
        "login": "User",
        "password": "Secret (password, token, key passphrase or client secret)",
    },
    "placeholders": {"host": "db.internal (inline PostgreSQL)", "schema": "etl_craft", "port": "5432"},
}

CONFIG: dict[str, Any] = {
    "etl_craft": {
        "description": "Defaults of the etl-craft provider's operators; an operator argument wins.",
        "options": {
            "default_conn_id": {
                "description": "Airflow connection of the Engine DB that "
                "operators, hooks and etl_craft_pipeline use "
                "when none is named.",
                "version_added": "0.2.0",
                "type": "string",
                "example": None,
                "default": "etl_craft_default",
            },
            "lock_timeout": {
                "description": "Seconds a claim, a finish or a reopening task "
                "waits for its pipeline:<code> lock before a "
                "retryable LOCK_TIMEOUT.",
                "version_added": "0.2.0",
                "type": "float",
                "example": None,
                "default": "60",
            },
            "claim_poke_interval": {
                "description": "Seconds between two looks of a claim "
                "waiting for another run of its pipeline "
                "(or an upstream pipeline) to end.",
                "version_added": "0.2.0",
                "type": "float",
                "example": None,
                "default": "60",
            },
            "claim_timeout": {
                "description": "Seconds a claim may wait before it fails naming the run it waited for.",
                "version_added": "0.2.0",
                "type": "float",
                "example": None,
                "default": "21600",
            },
            "wait_mode": {
                "description": "How a claim waits: reschedule (no worker slot held "
                "between looks) or poke (keeps its slot).",
                "version_added": "0.2.0",
                "type": "string",
                "example": None,
                "default": "reschedule",
            },
            "gate_poke_interval": {
                "description": "Seconds between two looks of a recorded "
                "task waiting for an IN-PROGRESS upstream "
                "or a pause.",
                "version_added": "0.2.0",
                "type": "float",
                "example": None,
                "default": "60",
            },
            "gate_timeout": {
                "description": "Seconds a recorded task may wait for an upstream or a pause before it fails.",
                "version_added": "0.2.0",
                "type": "float",
                "example": None,
                "default": "21600",
            },
            "wait_poll_interval": {
                "description": "Seconds between two looks of a deferred "
                "claim or gate at the Engine DB when no "
                "change notice wakes it (a PostgreSQL "
                "Engine DB without LISTEN; SQLite looks "
                "when its data_version changes).",
                "version_added": "0.2.0",
                "type": "float",
                "example": None,
                "default": "2",
            },
            "wait_hand_back_delay": {
                "description": "Seconds after a claim or gate defers (or "
                "is rescheduled) before it may run again, "
                "however soon what it waits for happens: "
                "Airflow fails a try that resumes before "
                "its scheduler took in the exit of the "
                "process that deferred it "
                "(docs/deferred-waits.md). Raise it when "
                "that takes longer (a loaded scheduler, "
                "an executor that reports late).",
                "version_added": "0.2.0",
                "type": "float",
                "example": None,
                "default": "5",
            },
            "wait_listen": {
                "description": "Whether deferred waits LISTEN for the change "
                "notices of a PostgreSQL Engine DB. Set False when "
                "it is reached through a transaction-mode pooler "
                "(PgBouncer pool_mode=transaction), which does not "
                "deliver them; the waits then poll every "
                "wait_poll_interval.",
                "version_added": "0.2.0",
                "type": "boolean",
                "example": None,
                "default": "True",
            },
            "recorded_task_link": {
                "description": "Whether recorded tasks carry the Engine "
                "run extra link too (the claim and the "
                "finish always do). Airflow stores each "
                "link as an XCom when a try ends: one more "
                "call to its API per try, for a page that "
                "is the same for every task of the DAG run "
                "(docs/ui.md).",
                "version_added": "0.2.0",
                "type": "boolean",
                "example": None,
                "default": "False",
            },
            "lineage_target_namespace": {
                "description": "OpenLineage namespace of the "
                "warehouse a recorded task's "
                "TARGET_OBJECT parameter names a "
                "table of (docs/lineage.md). Empty: "
                "the namespace of the datasets the "
                "wrapped operator reports, else no "
                "dataset.",
                "version_added": "0.2.0",
                "type": "string",
                "example": "postgres://warehouse:5432",
                "default": "",
            },
        },
    }
}
