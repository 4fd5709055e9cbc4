"""The provider's ``[etl_craft]`` Airflow configuration: each option declared once, read with its default.

A deployment sets them once (``airflow.cfg``, or ``AIRFLOW__ETL_CRAFT__<OPTION>`` as managed services'
configuration overrides do); an operator argument still wins. The provider info's ``config`` section, and
so ``airflow config list``, is built from :data:`OPTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from msgspec import Struct

SECTION = "etl_craft"
VERSION_ADDED = "0.2.0"


class Option(Struct, frozen=True):
    name: str
    type: str  # "string", "integer", "float" or "boolean": what the provider info declares
    default: str
    description: str
    #: A value to show beside the default (``airflow config list`` and docs/configuration.md).
    example: str | None = None

    def convert(self, raw: str) -> Any:
        converters: dict[str, Callable[[str], Any]] = {"integer": int, "float": float, "boolean": _boolean}
        return converters.get(self.type, str)(raw)


def _boolean(raw: str) -> bool:
    """Airflow's spellings of a boolean option (``conf.getboolean``)."""
    value = raw.strip().lower()
    if value in ("true", "t", "1", "yes", "on"):
        return True
    if value in ("false", "f", "0", "no", "off"):
        return False
    raise ValueError(raw)


OPTIONS: dict[str, Option] = {
    option.name: option
    for option in (
        Option("default_conn_id", "string", "etl_craft_default",
               "Airflow connection of the Engine DB that operators, hooks and etl_craft_pipeline use when none "
               "is named."),
        Option("lock_timeout", "float", "60",
               "Seconds a claim, a finish or a reopening task waits for its pipeline:<code> lock before a "
               "retryable LOCK_TIMEOUT."),
        Option("claim_poke_interval", "float", "60",
               "Seconds between two looks of a claim waiting for another run of its pipeline (or an "
               "upstream pipeline) to end."),
        Option("claim_timeout", "float", "21600",
               "Seconds a claim may wait before it fails naming the run it waited for."),
        Option("wait_mode", "string", "reschedule",
               "How a claim waits: reschedule (no worker slot held between looks) or poke (keeps its slot)."),
        Option("gate_poke_interval", "float", "60",
               "Seconds between two looks of a recorded task waiting for an IN-PROGRESS upstream or a pause."),
        Option("gate_timeout", "float", "21600",
               "Seconds a recorded task may wait for an upstream or a pause before it fails."),
        Option("wait_poll_interval", "float", "2",
               "Seconds between two looks of a deferred claim or gate at the Engine DB when no change notice "
               "wakes it (a PostgreSQL Engine DB without LISTEN; SQLite looks when its data_version changes)."),
        Option("wait_hand_back_delay", "float", "5",
               "Seconds after a claim or gate defers (or is rescheduled) before it may run again, however soon "
               "what it waits for happens: Airflow fails a try that resumes before its scheduler took in the "
               "exit of the process that deferred it (docs/deferred-waits.md). Raise it when that takes longer "
               "(a loaded scheduler, an executor that reports late)."),
        Option("wait_listen", "boolean", "True",
               "Whether deferred waits LISTEN for the change notices of a PostgreSQL Engine DB. Set False when "
               "it is reached through a transaction-mode pooler (PgBouncer pool_mode=transaction), which "
               "does not deliver them; the waits then poll every wait_poll_interval."),
        Option("recorded_task_link", "boolean", "False",
               "Whether recorded tasks carry the Engine run extra link too (the claim and the finish always "
               "do). Airflow stores each link as an XCom when a try ends: one more call to its API per try, "
               "for a page that is the same for every task of the DAG run (docs/ui.md)."),
        Option("lineage_target_namespace", "string", "",
               "OpenLineage namespace of the warehouse a recorded task's TARGET_OBJECT parameter names a table "
               "of (docs/lineage.md). Empty: the namespace of the datasets the wrapped operator reports, else "
               "no dataset.",
               example="postgres://warehouse:5432"),
    )
}  # fmt: skip


def setting(name: str) -> Any:
    """The value of ``[etl_craft] <name>``: Airflow's configuration, else the declared default.

    No I/O (Airflow's configuration is in memory), but a lookup costs tens of microseconds (environment,
    file, deprecated names): a recorded task reads its defaults when a try uses them, not at each parse.
    """
    option = OPTIONS[name]
    from airflow_provider_etl_craft._compat import conf

    raw = conf.get(SECTION, name, fallback=option.default)
    try:
        return option.convert(raw)
    except ValueError:
        raise ValueError(
            f"[{SECTION}] {name} = {raw!r} is not a valid {option.type} (AIRFLOW__{SECTION.upper()}__{name.upper()}); "
            f"the default is {option.default}"
        ) from None


def provider_config() -> dict[str, Any]:
    """The provider info's ``config`` section."""
    return {
        SECTION: {
            "description": "Defaults of the etl-craft provider's operators; an operator argument wins.",
            "options": {
                o.name: {
                    "description": o.description,
                    "version_added": VERSION_ADDED,
                    "type": o.type,
                    "example": o.example,
                    "default": o.default,
                }
                for o in OPTIONS.values()
            },  # fmt: skip
        }
    }
