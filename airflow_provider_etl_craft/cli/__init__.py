"""The ``etl-craft-airflow`` command line."""
