"""What the test suite (``tests/``) and the benchmark (``bench/``) both run against, kept in one place.

* :mod:`harness.postgres` — a throwaway, TLS-enabled PostgreSQL cluster (initdb, pg_ctl) and its databases;
* :mod:`harness.engines` — Engine DB profiles (``craft-connector.yml``) on SQLite and on that cluster;
* :mod:`harness.airflow_home` — a throwaway ``AIRFLOW_HOME`` and the ``airflow`` command;
* :mod:`harness.statsd` — a StatsD listener of one's own, for Airflow's metrics;
* :mod:`harness.deployment` — a real Airflow deployment (api-server, scheduler, dag-processor, triggerer).

Nothing here imports pytest: the tests' fixtures (``tests/fixtures/``, ``tests/deployment/conftest.py``) are
thin wrappers, and the benchmark calls the same code directly. It runs from a checkout (the repository root
on ``sys.path``, as ``python -m bench`` and pytest's ``pythonpath`` have it) and is not in the wheel.
"""
