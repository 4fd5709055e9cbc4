"""``python run_dag.py <dag file>``: run one DAG run of the file's ``dag`` with ``dag.test()``; print its state.

The reliability tests run DAGs in a child process so that Airflow's task runner (signal handlers, logging,
settings) never touches the test process.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from airflow_provider_etl_craft.testing import run_dag_test


def main(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"reliability_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = run_dag_test(module.dag)
    print(f"RUN_ID={run.run_id}", flush=True)
    print(f"STATE={run.state}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
