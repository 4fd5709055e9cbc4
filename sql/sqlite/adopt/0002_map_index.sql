-- ENGINE 0002 on an Engine DB that etl-craft made: the MAP_INDEX column of mapped Airflow tasks (.expand()).
-- etl-craft's own unique indexes (one attempt number and one live attempt per task run) stay as they are,
-- so here a mapped task runs one live attempt per task run at a time (docs/etl-craft-parity.md).
ALTER TABLE AUD_TASK_ATTEMPTS ADD COLUMN MAP_INDEX INTEGER CHECK (MAP_INDEX >= 0);
