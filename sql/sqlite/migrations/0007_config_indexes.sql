-- ENGINE 0007: the indexes through which a run's bookkeeping stays independent of how many pipelines and tasks
-- an Engine DB configures (docs/schema.md, "Indexes the hot paths read"). The only indexes that led with these
-- columns hold active rows alone, and these reads take retired rows too, so each read the whole table:
--   * IX_CFG_TASKS_PIPELINE: the tasks of one pipeline, active or retired. The finish reads the pipeline's
--     active tasks and those its run recorded, retired since (one condition over CFG_TASKS and
--     AUD_TASK_RUN_LOG), on SQLite and in PostgreSQL's ETL_CRAFT_FINISH alike.
--   * IX_CFG_PIPELINES_CODE: the rows of one pipeline code, active or retired: the run lifecycle's pipeline of
--     a code (the active row, else the newest retired one), the finish's keyed run, `status`.
-- Each is created only if no index of that name exists, on the provider's Engine DBs and on adopted ones alike
-- (docs/etl-craft-parity.md, "Sharing an Engine DB"): an index adds no rule and changes no row, etl-craft reads
-- no index by name and creates none of these names.
CREATE INDEX IF NOT EXISTS IX_CFG_TASKS_PIPELINE
    ON CFG_TASKS (PIPELINE_ID);
CREATE INDEX IF NOT EXISTS IX_CFG_PIPELINES_CODE
    ON CFG_PIPELINES (PIPELINE_CODE);
