-- ENGINE 0002: mapped Airflow tasks (.expand()). A mapped task is one task run; each map index's tries are
-- its attempts, told apart by MAP_INDEX (NULL for an unmapped task). Attempt numbers and "one live
-- attempt" become per task run and map index. Existing rows keep MAP_INDEX NULL.
ALTER TABLE AUD_TASK_ATTEMPTS ADD COLUMN MAP_INDEX INTEGER CHECK (MAP_INDEX >= 0);

ALTER TABLE AUD_TASK_ATTEMPTS DROP CONSTRAINT UQ_AUD_TASK_ATTEMPTS_NUMBER;
-- One attempt per try of each map index (NULL, the unmapped case, counts as one index).
CREATE UNIQUE INDEX UX_AUD_TASK_ATTEMPTS_NUMBER
    ON AUD_TASK_ATTEMPTS (TASK_RUN_ID, (COALESCE(MAP_INDEX, -1)), ATTEMPT_NUMBER);

-- One live attempt per task run and map index.
DROP INDEX UX_AUD_TASK_ATTEMPTS_LIVE;
CREATE UNIQUE INDEX UX_AUD_TASK_ATTEMPTS_LIVE
    ON AUD_TASK_ATTEMPTS (TASK_RUN_ID, (COALESCE(MAP_INDEX, -1))) WHERE STATUS IN ('QUEUED', 'CLAIMED', 'RUNNING');
