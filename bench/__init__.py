"""``make bench``: what recording etl-craft runs costs (round trips, wall time, throughput, Airflow overhead).

Run ``python -m bench --help`` from the project root. The modules:

* :mod:`bench.counting` — DB-API proxies that count every round trip to the Engine DB, per operation;
* :mod:`bench.engines` — a throwaway PostgreSQL cluster, Engine DBs on both dialects, CFG_ seeding;
* :mod:`bench.bookkeeping` — part 1, the bookkeeping cost of one pipeline run;
* :mod:`bench.contention` — part 2, pipeline runs per second from 1…16 processes against a baseline;
* :mod:`bench.airflow_overhead` — part 3, ``dag.test()`` of a plain and a recorded 20-task DAG (subprocess);
* :mod:`bench.isolated` — runs a part that configures Airflow in a fresh interpreter (parts 3, 5, 9);
* :mod:`bench.report` — the printed tables and the targets;
* :mod:`bench.__main__` — the command line, which runs all three parts and writes ``bench/results.json``.

Nothing here imports Airflow at module level: part 3 must configure Airflow before its first import.
"""
