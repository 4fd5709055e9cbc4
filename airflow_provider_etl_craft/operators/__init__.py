"""Operators.

One vocabulary for the Engine DB an operator, ``@etl_craft_task`` or ``etl_craft_pipeline`` talks to:
``etl_craft_conn_id``, ``etl_craft_profile`` and ``etl_craft_lock_timeout``, the same names with the same
meaning everywhere (the lock is the one the operator takes: ``pipeline:<code>`` for a claim, a finish or a
recorded task, ``migrate`` for init-db). The prefix is needed where recording is mixed into an operator of
yours (:func:`~airflow_provider_etl_craft.operators.task_run.recorded`, ``@etl_craft_task``): the wrapped
operator's own arguments share its keyword space, and a plain ``profile`` is taken there already (the dbt
operators of airflow-dbt-python take ``profile``), so the prefixed names are the canonical ones on every
face, as ``etl_craft_conn_id`` already was. The unprefixed ``profile=`` / ``lock_timeout=`` of 0.1 still
work for one release, with a warning (:mod:`~airflow_provider_etl_craft.operators._renamed`,
docs/changelog.md).
"""
