"""What importing some modules costs a fresh task process: each module's own import time, median over fresh
interpreters.

Each interpreter imports what every task process has loaded before a DAG file (Airflow's Task SDK, the standard
``PythonOperator``, Airflow's plugin manager), then ``--first`` modules (untimed), then each module given, in
order, timing each one that is not loaded yet: its time includes whatever it imports that nothing before it
did. Bytecode is written once (a warm-up run, not counted) under ``--pycache``, as an installed wheel has it.
Usage::

    python tools/import_cost.py airflow_provider_etl_craft.plugins.plugin
    python tools/import_cost.py --first airflow_provider_etl_craft.plugins.plugin \\
        airflow_provider_etl_craft.decorators --runs 15
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What a task process has loaded before it imports a DAG file.
BASELINE = ("airflow.sdk", "airflow.providers.standard.operators.python", "airflow.plugins_manager")

CHILD = """
import importlib, json, sys, time, warnings
warnings.filterwarnings("ignore")
baseline, first, timed = json.loads(sys.argv[1])
for name in baseline + first:
    importlib.import_module(name)
spent = {}
for name in timed:
    if name not in sys.modules:
        started = time.perf_counter()
        importlib.import_module(name)
        spent[name] = (time.perf_counter() - started) * 1000
print(json.dumps(spent))
"""


def measure(modules: list[str], first: list[str], runs: int, pycache: Path) -> dict[str, float]:
    """Median ms per module over ``runs`` fresh interpreters (after one uncounted warm-up)."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(pycache)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    argument = json.dumps([list(BASELINE), first, modules])
    samples: list[dict[str, float]] = []
    for run in range(runs + 1):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, argument], capture_output=True, text=True, env=env, check=True
        )
        if run:
            samples.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {name: statistics.median(s.get(name, 0.0) for s in samples) for name in samples[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("modules", nargs="+")
    parser.add_argument("--first", default="", help="modules imported before, untimed (comma-separated)")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--pycache", type=Path, help="bytecode directory (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        spent = measure(
            args.modules, [m for m in args.first.split(",") if m], args.runs, args.pycache or Path(scratch)
        )
    for name, ms in spent.items():
        print(f"{ms:8.2f} ms  {name}")
    print(f"{sum(spent.values()):8.2f} ms  in all (medians of {args.runs} fresh interpreters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
