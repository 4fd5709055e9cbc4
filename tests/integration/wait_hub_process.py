"""A triggerer stand-in: runs many EngineChangeTriggers in one asyncio event loop of its own process.

argv: a JSON list of [pipeline_code, seen] pairs, and the listen flag ("1"/"0"). It prints ``READY <n>`` once
every wait is registered with its hub, then one ``EVENT <index> <status> <monotonic seconds>`` line per
trigger as it fires. The Airflow connection comes from the environment (``AIRFLOW_CONN_…``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from airflow_provider_etl_craft.triggers import wait_hub
from airflow_provider_etl_craft.triggers.engine_change import EngineChangeTrigger

CONN_ID = "etl_craft_hub_test"


async def main(waits: list[tuple[str, list[int]]], listen: bool) -> None:
    async def one(index: int, code: str, seen: list[int]) -> None:
        trigger = EngineChangeTrigger(
            etl_craft_conn_id=CONN_ID,
            profile=None,
            pipeline_code=code,
            seen=seen,
            recheck_after=600.0,
            deadline=None,
            poll_interval=600.0 if listen else 0.5,
            listen=listen,
        )
        event = await trigger.run().__anext__()
        print(f"EVENT {index} {event.payload['status']} {time.monotonic():.6f}", flush=True)

    tasks = [asyncio.create_task(one(i, code, seen)) for i, (code, seen) in enumerate(waits)]
    while sum(len(h.waiters) for h in wait_hub._HUBS.values()) < len(waits):
        await asyncio.sleep(0.05)
    hubs = list(wait_hub._HUBS.values())
    while any(h.waiters and any(w.ids is None for w in h.waiters) for h in hubs):  # every wait read once
        await asyncio.sleep(0.05)
    print(f"READY {len(waits)} hubs={len(hubs)}", flush=True)
    await asyncio.gather(*tasks)
    print(f"OPENED {sum(h.opened for h in hubs)}", flush=True)


if __name__ == "__main__":
    asyncio.run(main([tuple(w) for w in json.loads(sys.argv[1])], sys.argv[2] == "1"))
