"""Write ``airflow_provider_etl_craft/_provider_info_derived.py``: the parts of the provider metadata that repeat
other declarations (the connection form, the ``[etl_craft]`` options), as the literals
:func:`airflow_provider_etl_craft.provider_info_source.derived` builds (``make provider-info``).

Airflow reads the provider metadata in every process it starts, so ``get_provider_info.py`` reads these literals
instead of building them from the auth registry and the settings; ``tests/unit/test_provider_info.py`` fails when
they no longer match their sources. Usage: ``python tools/provider_info.py``.
"""

from __future__ import annotations

import pprint
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "airflow_provider_etl_craft" / "_provider_info_derived.py"

HEADER = '''"""The derived parts of the provider metadata, as literals: written by ``make provider-info`` from
:func:`airflow_provider_etl_craft.provider_info_source.derived`; do not edit it by hand (docs/performance.md)."""

from __future__ import annotations

from typing import Any
'''


def render() -> str:
    """The module's text (before ``ruff format``)."""
    sys.path.insert(0, str(ROOT))
    from airflow_provider_etl_craft.provider_info_source import derived

    parts = [HEADER]
    for name, value in derived().items():
        parts.append(f"\n{name}: dict[str, Any] = {pprint.pformat(value, width=110, sort_dicts=False)}\n")
    return "".join(parts)


def main() -> int:
    TARGET.write_text(render(), encoding="utf-8")
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff:
        subprocess.run([ruff, "format", "--quiet", str(TARGET)], check=True)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
