"""What the run lifecycle tells listeners outside it (the provider's metrics), without importing Airflow.

The lifecycle core measures two things only it can see: how long a step waited for the ``pipeline:<code>``
lock, and each gate's verdict. It hands them to the listeners registered here
(:mod:`airflow_provider_etl_craft.metrics` registers one when Airflow is there). With no listener a report
costs one empty loop; a listener that raises is logged at debug level and never fails the step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: Lock wait: ``pipeline`` (code), ``step`` (claim, start, finish, …), ``seconds``, ``how`` ("transaction": the
#: time from BEGIN to holding the lock; "one_call": the round trip of the server-side function that takes it).
LOCK_WAIT = "lock_wait"
#: A gate's verdict: ``pipeline``, ``task`` (None for the claim's pipeline dependencies), ``result``.
GATE = "gate"

Listener = Callable[[str, dict[str, Any]], None]

_LISTENERS: list[Listener] = []


def listen(listener: Listener) -> None:
    """Call ``listener(event, fields)`` on every report from now on (once, however often it is registered)."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)


def unlisten(listener: Listener) -> None:
    """Stop calling ``listener``."""
    if listener in _LISTENERS:
        _LISTENERS.remove(listener)


def report(event: str, **fields: Any) -> None:
    """Hand ``event`` to every listener; never raises."""
    for listener in tuple(_LISTENERS):
        try:
            listener(event, fields)
        except Exception as exc:  # a listener must never fail a lifecycle step
            log.debug("etl-craft: listener %r failed on %s: %s", listener, event, exc)
