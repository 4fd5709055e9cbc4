"""Plain-text tables for the CLI and the demo (no dependency beyond the standard library)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    max_width: int | None = 40,
    widths: Mapping[str, int | None] | None = None,
) -> str:
    """Left-aligned columns separated by two spaces; long cells are cut with ``…``; NULL shows as ``-``.

    :param max_width: longest cell text kept (None: never cut).
    :param widths: per-column overrides of ``max_width``, by header (None: never cut that column).
    """
    limits = [(widths or {}).get(h, max_width) for h in headers]

    def cell(value: Any, limit: int | None) -> str:
        text = "-" if value is None else str(value).replace("\n", " ")
        return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"

    body = [[cell(v, limit) for v, limit in zip(row, limits, strict=True)] for row in rows]
    sizes = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, sizes, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in sizes))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, sizes, strict=True)).rstrip() for r in body]
    return "\n".join(lines)
