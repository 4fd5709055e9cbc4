"""The provider's Airflow plugin: REST API and UI in the api-server (Airflow 3.1+), and the "Engine run" link."""
