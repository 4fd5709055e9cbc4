"""A purge in a process of its own, for the kill -9 and claim-wait tests of test_purge.py.

``python -m tests.integration.purge_worker CONFIG BATCH_SIZE PAUSE_S [ARCHIVE_DIR]``: purges every run that
ended before now, prints ``batch N`` (flushed) after each committed batch and sleeps PAUSE_S after the second, then
prints ``done`` and the result as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import closing
from pathlib import Path

from airflow_provider_etl_craft.hooks.engine_db import EngineDBHook
from airflow_provider_etl_craft.runs.purge import Purge


def main(argv: list[str]) -> int:
    config, batch_size, pause = argv[0], int(argv[1]), float(argv[2])
    archive = Path(argv[3]) if len(argv) > 3 else None
    hook = EngineDBHook.from_config(config)

    def after(batch: int) -> None:
        print(f"batch {batch} {time.monotonic()}", flush=True)
        if batch >= 2:  # hold the purge after its second batch, for a test to kill it there
            time.sleep(pause)

    with closing(hook.engine.connect()) as conn:
        print(f"start {time.monotonic()}", flush=True)
        job = Purge(
            hook.engine, conn, hook.engine.now(), batch_size=batch_size, archive_dir=archive, on_batch=after
        )
        result = job.run()
    print(f"done {time.monotonic()}", flush=True)
    print(json.dumps(result.as_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
