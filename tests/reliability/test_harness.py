"""The worker pool itself: a worker's exception fails the test, and the pool stays usable afterwards."""

from __future__ import annotations

import pytest

from harness.engines import EngineSetup
from tests.reliability import workers
from tests.reliability.conftest import Pool


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_a_worker_exception_fails_the_job_and_the_pool_stays_usable(engine: EngineSetup, pool: Pool) -> None:
    job = pool.send(workers.fail_on_purpose, engine, (0, 1))
    with pytest.raises(AssertionError, match="worker 1 fails on purpose"):
        job.wait(timeout=60)
    job = pool.send(workers.ping, engine, range(len(pool.procs)))
    job.wait(timeout=60)
    pongs = dict(job.of_kind("PONG"))
    assert set(pongs) == set(range(len(pool.procs)))
    assert {pid for pid, _ in pongs.values()} == {p.pid for p in pool.procs}  # sixteen distinct OS processes
    assert {dialect for _, dialect in pongs.values()} == {"sqlite"}
