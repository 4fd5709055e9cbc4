"""Row counts a task reports through its return value, and how they are stored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgspec import Struct
from msgspec.structs import astuple, fields, replace

from airflow_provider_etl_craft.errors import TaskFailedError

#: Longest error message kept in ERROR_MESSAGE; longer ones keep their start and say how much was cut.
MAX_ERROR_CHARS = 4000


class TaskCounts(Struct, frozen=True):
    """The documented count shape; every field is optional.

    A task callable may return:

    * ``None`` (or anything that is not one of the shapes below): no counts recorded;
    * an ``int``: rows written;
    * a mapping with any of ``source_count``, ``target_count``, ``insert_count``, ``update_count``,
      ``delete_count``, ``rows_written`` (other keys are ignored, so a richer result dict is fine);
    * a :class:`TaskCounts`.

    When ``rows_written`` is absent it is the sum of the insert, update and delete counts given
    (``HAS_DATA`` dependencies read it).
    """

    source_count: int | None = None
    target_count: int | None = None
    insert_count: int | None = None
    update_count: int | None = None
    delete_count: int | None = None
    rows_written: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                _count(f.name, value)

    @classmethod
    def from_result(cls, value: Any) -> TaskCounts:
        """Read counts from a task's return value (see the class docstring).

        :raises TaskFailedError: a count key holds something other than a non-negative integer.
        """
        if isinstance(value, TaskCounts):
            counts = value
        elif isinstance(value, int) and not isinstance(value, bool):
            counts = cls(rows_written=_count("rows_written", value))
        elif isinstance(value, Mapping):
            names = {f.name for f in fields(cls)}
            found = {str(k).lower(): v for k, v in value.items() if str(k).lower() in names}
            counts = cls(**{k: _count(k, v) for k, v in found.items() if v is not None})
        else:
            return cls()
        if counts.rows_written is None:
            parts = [
                c for c in (counts.insert_count, counts.update_count, counts.delete_count) if c is not None
            ]
            if parts:
                counts = replace(counts, rows_written=sum(parts))
        return counts

    def values(self) -> tuple[int | None, ...]:
        """In column order: SOURCE, TARGET, INSERT, UPDATE, DELETE counts, ROWS_WRITTEN."""
        return astuple(self)


#: The columns are 64-bit integers.
MAX_COUNT = 2**63 - 1


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise TaskFailedError(
            f"the task returned {name}={value!r:.100}; counts must be non-negative integers below 2**63 "
            "(see TaskCounts for the shape a task may return)"
        )
    return value


def clean_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Make text storable anywhere: valid UTF-8, no NUL (PostgreSQL refuses it), the first ``limit`` characters
    (then a short marker saying how many were cut)."""
    text = text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\\0")
    if len(text) > limit:
        cut = len(text) - limit
        text = f"{text[:limit]}… [{cut} more characters trimmed]"
    return text
