"""Who is writing: the actor every Engine DB transaction carries (etl-craft's guards refuse writes without one).

etl-craft's triggers read the actor of a write from the transaction (PostgreSQL settings
``etl_craft.actor``/``etl_craft.actor_kind``/``etl_craft.migration``, SQLite functions of the same names);
the dialects set them from :func:`current` at the start of every transaction (docs/etl-craft-parity.md,
"Sharing an Engine DB"). A context variable, so threads and asyncio tasks each act as their own actor.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from enum import StrEnum

from msgspec import Struct


class ActorKind(StrEnum):
    """Who an actor is: the ``*_BY_KIND`` columns' values (etl-craft's CHECK constraints accept these)."""

    HUMAN = "HUMAN"
    SCHEDULE = "SCHEDULE"
    ORCHESTRATOR = "ORCHESTRATOR"
    WORKER = "WORKER"
    SYSTEM = "SYSTEM"


#: Actor kinds etl-craft's CHECK constraints accept.
KINDS = frozenset(ActorKind)


class Actor(Struct, frozen=True):
    """An actor name and kind, and the migration file being applied (empty outside migrate)."""

    name: str
    kind: str
    migration: str = ""
    #: etl-craft's ``purpose`` of the writes: ``retention`` inside a purge batch only (docs/retention.md).
    purpose: str = ""


#: What the provider acts as outside a run or a CLI action of a person (init-db, migrate, housekeeping).
PROVIDER = Actor("etl-craft-airflow", "SYSTEM")
_CURRENT: ContextVar[Actor] = ContextVar("etl_craft_actor", default=PROVIDER)


def current() -> Actor:
    """The actor of the writes made now in this context."""
    return _CURRENT.get()


@contextmanager
def acting_as(
    name: str | None, kind: str | None = None, migration: str | None = None, purpose: str | None = None
) -> Iterator[Actor]:
    """Write as ``name`` of ``kind`` (kept from the enclosing actor where None) inside the block."""
    outer = _CURRENT.get()
    actor = Actor(
        name or outer.name,
        kind if kind is not None and kind in KINDS else outer.kind,
        migration or outer.migration,
        outer.purpose if purpose is None else purpose,
    )
    token = _CURRENT.set(actor)
    try:
        yield actor
    finally:
        _CURRENT.reset(token)
