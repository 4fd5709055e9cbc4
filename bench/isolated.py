"""Run one bench part in a fresh interpreter: parts that configure Airflow before its first import (3, 5, 9, 10).

Parts 9 and 10 time one task try per fresh interpreter too: their command line (:func:`part_main`) also runs one
such try (:func:`run_child`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
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


# --------------------------------------------------------------------------- the part's side (parts 9 and 10)


def part_parser(doc: str, repeats: int) -> argparse.ArgumentParser:
    """The options :func:`run_isolated` passes a part (``--workdir``, ``--out``) and ``--repeats``; the part adds
    its own. ``doc``: the part's module docstring (its first line describes the command)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeats", type=int, default=repeats)
    return parser


def part_main(
    argv: list[str] | None,
    parser: argparse.ArgumentParser,
    child: Callable[[Path, str], dict[str, Any]],
    measure: Callable[[argparse.Namespace, Path], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
) -> int:
    """A part's command line: ``--child DAG_FILE LOGICAL_DATE`` (see :func:`run_child`) prints ``child``'s sample
    as one JSON line; otherwise ``measure(args, workdir)`` (the folder made and resolved), printed through
    ``render`` and written to ``--out`` as JSON when given."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        print(json.dumps(child(Path(argv[1]), argv[2])), flush=True)
        return 0
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = measure(args, args.workdir.resolve())
    print(render(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


def run_child(module: str, env: dict[str, str], dag_file: Path, logical_date: datetime) -> dict[str, Any]:
    """One try in a fresh interpreter: ``python -m module --child dag_file logical_date`` (:func:`part_main`).

    :returns: the sample the child printed (its last JSON line).
    :raises RuntimeError: the child failed or printed no sample; the message ends with its output.
    """
    cmd = [sys.executable, "-m", module, "--child", str(dag_file), logical_date.isoformat()]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"the task process failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return dict(json.loads(lines[-1]))
