"""Child processes the killed-holder tests start with ``subprocess`` and then ``kill -9``.

``python children.py <command> <craft-connector.yml> <args…>``; each command takes hold of something in the
Engine DB, prints ``READY <details>`` on stdout, and sleeps until it is killed:

- ``lock NAME``: holds ``hook.lock(NAME)``;
- ``attempt PIPELINE TASK RUN_ID TRY``: has opened that task try (``start_task``) and is "running the work";
- ``txn RUN_KEY``: is inside an open write transaction that changed the run's status (not committed).
"""

from __future__ import annotations

import os
import sys
import time

HOLD_SECONDS = 600


def main(argv: list[str]) -> None:
    from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
    from airflow_provider_etl_craft.runs import RunIdentity

    command, config, *args = argv
    hook = EngineDBHook.from_config(config)
    if command == "lock":
        (name,) = args
        with hook.lock(name, timeout=30):
            print("READY", os.getpid(), flush=True)
            time.sleep(HOLD_SECONDS)
    elif command == "attempt":
        pipeline, task, run_id, try_number = args
        with hook.lifecycle(lock_timeout=30) as lc:
            handle = lc.start_task(pipeline, task, RunIdentity("killed_dag", run_id), int(try_number))
        print("READY", handle.attempt_id, handle.task_run_id, flush=True)
        time.sleep(HOLD_SECONDS)  # the work "runs" until the worker is killed
    elif command == "txn":
        (run_key,) = args
        conn = hook.get_conn()
        with hook.engine.transaction(conn) as cur:
            cur.execute(hook.engine.sql("UPDATE AUD_PIPELINES_RUN_LOG SET STATUS = 'FAILED' WHERE RUN_KEY = ?"),
                        (run_key,))  # fmt: skip
            print("READY", cur.rowcount, flush=True)
            time.sleep(HOLD_SECONDS)
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
