"""Run one bench part in a fresh interpreter: parts that configure Airflow before its first import (3, 5, 9, 10)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_isolated(
    module: str, folder: Path, log_name: str, part: int, *options: str, python: Path | None = None
) -> dict[str, Any]:
    """``python -m module --workdir folder --out folder/result.json *options``, its output in ``folder/log_name``.

    :param python: the interpreter (default: this one); part 10 runs in the OpenLineage venv's.

    :returns: the JSON the part wrote to ``--out``.
    :raises RuntimeError: the part failed or wrote nothing; the message ends with the last lines of its log.
    """
    folder.mkdir()
    out, log_path = folder / "result.json", folder / log_name
    cmd = [str(python or sys.executable), "-m", module, "--workdir", str(folder), "--out", str(out), *options]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    with log_path.open("w") as sink:
        done = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if done.returncode != 0 or not out.exists():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"part {part} exited with {done.returncode}; last lines of its log:\n{tail}")
    return dict(json.loads(out.read_text()))
