"""Write the provider metadata Airflow reads, ``airflow_provider_etl_craft/get_provider_info.py``, as a literal
built by :func:`airflow_provider_etl_craft.provider_info_source.build` (``make provider-info``).

Airflow reads that module in every process it starts, so it imports nothing of the provider's; its contents
repeat the auth modes' fields, the ``[etl_craft]`` options and the version, and
``tests/unit/test_provider_info.py`` fails when they no longer match. Usage: ``python tools/provider_info.py``.
"""

from __future__ import annotations

import pprint
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "airflow_provider_etl_craft" / "get_provider_info.py"

HEADER = '''"""The provider metadata Airflow reads (entry point ``apache_airflow_provider``).

Written by ``make provider-info`` from :mod:`airflow_provider_etl_craft.provider_info_source`; do not edit it by
hand. A plain literal: Airflow reads it in every process it starts (docs/performance.md).
"""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    """The provider dict, a new one per call."""
    return '''


def render() -> str:
    """The module's text (before ``ruff format``)."""
    sys.path.insert(0, str(ROOT))
    from airflow_provider_etl_craft.provider_info_source import build

    body = pprint.pformat(build(), width=110, sort_dicts=False).replace("\n", "\n    ")
    return f"{HEADER}{body}\n"


def main() -> int:
    TARGET.write_text(render(), encoding="utf-8")
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff:
        subprocess.run([ruff, "format", "--quiet", str(TARGET)], check=True)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
