"""Celery workers on other machines: the deployment's CeleryExecutor, with each worker in its own network
namespace (``tests/fixtures/fix_netns.py``), address and hostname.

``CeleryMachines.start(deployment, ("machine-a", "machine-b"))`` runs one ``airflow celery worker`` per
machine. Each consumes a queue named after its machine, so a test pins a task to a machine with
``executor="CeleryExecutor", queue="machine-a"`` instead of trusting Celery's placement. What a worker
reaches lives on the root side, behind forwards on the bridge: the api-server (execution API), the Redis
broker and result backend, and the PostgreSQL cluster (metadata DB, Engine DB). Each machine has its own
``craft-connector.yml`` for ``etl_craft_pg``: the same Engine DB, addressed over the network, as each
machine of a real deployment carries its own copy of the config. Task logs go to the shared log folder
(one disk, as a shared volume would be).

Workers are steered through the broker with Celery's remote control, as an operator would: :meth:`take_over`
makes a surviving machine consume a lost machine's queue; :meth:`reset` (before every test) brings every
machine back with only its own queue.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from celery import Celery

from harness.airflow_home import airflow_cli
from harness.deployment import PG_SECRET_VAR, AirflowDeployment
from tests.fixtures.fix_netns import Machines

#: How long a worker may take to start and answer a ping (two cores, other components busy).
_WORKER_START_TIMEOUT = 120.0


def worker_node(machine: str) -> str:
    """The Celery node name of a machine's worker."""
    return f"celery@{machine}"


@dataclass
class CeleryMachines:
    """Celery workers, one per machine, serving the session's deployment."""

    deployment: AirflowDeployment
    machines: Machines
    names: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, repr=False)
    _app: Celery | None = field(default=None, repr=False)

    @classmethod
    def start(cls, deployment: AirflowDeployment, names: Sequence[str]) -> CeleryMachines:
        root = deployment.root / "machines"
        root.mkdir(exist_ok=True)
        machines = Machines.create(root, names)
        site = cls(deployment, machines, tuple(names))
        try:
            site._prepare(root)
            for name in site.names:
                site.start_worker(name)
            for name in site.names:
                site.wait_worker(name)
        except BaseException:
            site.stop()
            raise
        return site

    @property
    def app(self) -> Celery:
        """A Celery client on the broker (root side), for remote control only."""
        if self._app is None:
            self._app = Celery("etl-craft-tests", broker=self.deployment.broker_url())
        return self._app

    def _prepare(self, root: Path) -> None:
        deployment, gateway = self.deployment, self.machines.gateway
        cluster = deployment.cluster
        api = self.machines.forward(deployment.port)
        broker = self.machines.forward(deployment.broker_port)
        postgres = self.machines.forward(cluster.port)
        here, there = f"{cluster.host}:{cluster.port}", f"{gateway}:{postgres}"
        engine = deployment.pg.setup.config_path
        for name in self.names:
            config = root / name / "engine-pg" / "craft-connector.yml"
            config.parent.mkdir(parents=True)
            config.write_text(engine.read_text().replace(here, there))
        self.env = {
            **deployment.env,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{gateway}:{api}/execution/",
            "AIRFLOW__API__BASE_URL": f"http://{gateway}:{api}",
            "AIRFLOW__CELERY__BROKER_URL": deployment.broker_url(gateway, broker),
            "AIRFLOW__CELERY__RESULT_BACKEND": deployment.broker_url(gateway, broker, db=1),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": deployment.meta_url.replace(f"@{here}/", f"@{there}/"),
        }
        assert deployment.env[PG_SECRET_VAR]

    def config_path(self, name: str) -> Path:
        return self.deployment.root / "machines" / name / "engine-pg" / "craft-connector.yml"

    def log(self, name: str) -> Path:
        return self.deployment.root / "machines" / name / "worker.log"

    def start_worker(self, name: str) -> None:
        """Start machine ``name``'s worker (consuming its own queue); returns at once."""
        conn = json.dumps({"conn_type": "etl_craft", "extra": {"config_path": str(self.config_path(name))}})
        argv = [*airflow_cli(), "celery", "worker", "--queues", name, "--celery-hostname", worker_node(name),
                "--concurrency", "2", "--skip-serve-logs", "--without-gossip", "--without-mingle"]  # fmt: skip
        env = {**self.env, "AIRFLOW_CONN_ETL_CRAFT_PG": conn}
        self.machines.popen(name, argv, env, self.log(name), cwd=self.deployment.root)

    def answers(self, name: str) -> bool:
        replies = self.app.control.ping(destination=[worker_node(name)], timeout=1.0)
        return any(worker_node(name) in reply for reply in replies)

    def wait_worker(self, name: str) -> None:
        self.deployment.wait_until(lambda: self.answers(name), _WORKER_START_TIMEOUT,
                                   f"the Celery worker on {name} to answer (its log: {self.log(name)})")  # fmt: skip

    def queues(self, name: str) -> set[str]:
        """The queues machine ``name``'s worker consumes."""
        reply = self.app.control.inspect(destination=[worker_node(name)], timeout=2.0).active_queues() or {}
        return {q["name"] for q in reply.get(worker_node(name), [])}

    def take_over(self, survivor: str, queue: str) -> None:
        """Machine ``survivor`` also consumes ``queue`` (a lost machine's), as an operator's failover does."""
        self.app.control.add_consumer(queue, destination=[worker_node(survivor)], reply=True, timeout=5.0)
        self.deployment.wait_until(
            lambda: queue in self.queues(survivor), 30, f"{survivor} to consume {queue}"
        )

    def kill(self, name: str) -> list[int]:
        """Lose machine ``name``: SIGKILL to every process on it (worker, supervisors, tasks)."""
        return self.machines.kill(name)

    def partition(self, name: str) -> None:
        """Cut machine ``name`` off the network (its processes live on, unheard)."""
        self.machines.partition(name)

    def heal(self, name: str) -> None:
        self.machines.heal(name)

    def reset(self) -> None:
        """Before a test: every machine up, its link up, its worker answering and consuming only its own queue."""
        for name in self.names:
            self.machines.heal(name)
            if not self.answers(name):
                self.machines.kill(name)
                self.start_worker(name)
                self.wait_worker(name)
            for queue in self.queues(name) - {name}:
                self.app.control.cancel_consumer(
                    queue, destination=[worker_node(name)], reply=True, timeout=5.0
                )

    def report(self) -> str:
        parts = []
        for name in self.names:
            text = self.log(name).read_text(errors="replace") if self.log(name).exists() else "<no log>"
            parts.append(f"----- celery worker on {name} -----\n" + "\n".join(text.splitlines()[-60:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGTERM the workers (warm shutdown), then remove the machines (SIGKILL what is left)."""
        for name in self.names:
            for pid in self.machines.pids(name) if name in self.machines.machines else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        self.machines.remove()
        if self._app is not None:
            self._app.close()
