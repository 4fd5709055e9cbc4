"""Arguments renamed in 0.2.0: the old name keeps working for one release, with a warning (docs/changelog.md).

Why the names changed is said in :mod:`airflow_provider_etl_craft.operators`.
"""

from __future__ import annotations

import warnings
from typing import TypeVar

from airflow.exceptions import AirflowProviderDeprecationWarning

T = TypeVar("T")


def renamed(where: str, new: tuple[str, T | None], old: tuple[str, T | None]) -> T | None:
    """The value of an argument given by its new name or by its deprecated old one (None: neither).

    :param where: who takes the argument, for the messages (``ClaimPipelineRunOperator``, ...).
    :param new: the new name and the value given for it.
    :param old: the deprecated name and the value given for it.
    :raises TypeError: both names were given.
    """
    (new_name, value), (old_name, old_value) = new, old
    if old_value is None:
        return value
    if value is not None:
        raise TypeError(
            f"{where} got both {new_name}= and {old_name}=, its deprecated name; give only {new_name}="
        )
    warnings.warn(
        f"{where}: {old_name}= is deprecated and will be removed after 0.2; use {new_name}= (the same "
        "meaning on every etl-craft operator, @etl_craft_task and etl_craft_pipeline)",
        AirflowProviderDeprecationWarning,
        stacklevel=3,
    )
    return old_value
