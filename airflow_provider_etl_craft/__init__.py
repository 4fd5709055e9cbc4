"""Apache Airflow provider for etl-craft: Engine DB hook, run-lifecycle operators and CLI."""

from __future__ import annotations

__version__ = "0.1.0"
