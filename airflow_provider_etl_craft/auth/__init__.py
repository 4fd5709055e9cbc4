"""Registry of PostgreSQL auth modes (``auth_mode`` in a profile), and the key lists derived from it.

Each mode declares its keys once (:class:`Field`); the profile loader, the inline connection, the connection
form and the table of modes in docs/auth.md are derived from :data:`AUTH_MODES`.

The registry loads on first use (PEP 562): a SQLite profile, which takes no auth mode, resolves without the
modes' modules, which a recorded try would otherwise import for nothing (docs/performance.md).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from airflow_provider_etl_craft.auth.base import NO_AUTH, AuthMode, ConnSlot, Field, ProfileView

if TYPE_CHECKING:
    #: Every mode, by name.
    AUTH_MODES: dict[str, AuthMode]
    #: Every profile key some mode takes, in the order the modes declare them.
    AUTH_KEYS: tuple[str, ...]


@functools.cache
def _registry() -> tuple[dict[str, AuthMode], tuple[str, ...]]:
    """The modes by name, and every key some mode takes (each once, in the order the modes declare them)."""
    from airflow_provider_etl_craft.auth.key_file import KEY_FILE
    from airflow_provider_etl_craft.auth.oauth import OAUTH
    from airflow_provider_etl_craft.auth.password import PASSWORD, TOKEN
    from airflow_provider_etl_craft.auth.sso import SSO
    from airflow_provider_etl_craft.auth.sts import STS

    modes: dict[str, AuthMode] = {mode.name: mode for mode in (PASSWORD, TOKEN, KEY_FILE, OAUTH, SSO, STS)}
    return modes, tuple(dict.fromkeys(key for mode in modes.values() for key in mode.keys))


def __getattr__(name: str) -> Any:
    if name == "AUTH_MODES":
        return _registry()[0]
    if name == "AUTH_KEYS":
        return _registry()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fields_in(slot: ConnSlot) -> list[Field]:
    """Every mode's fields that an inline Airflow connection holds in ``slot``, in registry order."""
    return [f for mode in _registry()[0].values() for f in mode.fields if f.conn == slot]


def keys_in(slot: ConnSlot) -> tuple[str, ...]:
    """The profile keys an inline Airflow connection holds in ``slot`` (each once)."""
    return tuple(dict.fromkeys(f.key for f in fields_in(slot)))


__all__ = ["AUTH_KEYS", "AUTH_MODES", "NO_AUTH", "AuthMode", "Field", "ProfileView", "fields_in", "keys_in"]
