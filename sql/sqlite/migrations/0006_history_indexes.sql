-- ENGINE 0006: the indexes through which reads and the purge stay independent of how much history an Engine DB
-- holds (docs/schema.md, "Indexes the hot paths read"; docs/retention.md).
--   * IX_AUD_PIPELINES_RUN_LOG_LATEST: a pipeline's newest run (the pipelines overview, `status`, a gate's
--     latest finished run). The provider's own schema has had it since ENGINE 0001, so there this statement
--     changes nothing. An Engine DB that etl-craft made indexes its runs by PIPELINE_ID alone, so there the
--     newest run of a pipeline meant reading all of that pipeline's history.
--   * The reverse references of one run: the gate decisions that selected it or its task runs, the consumption
--     rows of it or of its task runs, its interventions. The purge reads them for every batch (and PostgreSQL's
--     foreign key checks of each delete read them too), so without them each batch scanned these tables whole.
-- Each is created only if no index of that name exists, on the provider's Engine DBs and on adopted ones alike
-- (docs/etl-craft-parity.md, "Sharing an Engine DB"): an index adds no rule and changes no row, etl-craft reads
-- no index by name and creates none of these names.
CREATE INDEX IF NOT EXISTS IX_AUD_PIPELINES_RUN_LOG_LATEST
    ON AUD_PIPELINES_RUN_LOG (PIPELINE_ID, PIPELINE_RUN_ID DESC);
CREATE INDEX IF NOT EXISTS IX_AUD_GATE_DECISIONS_SELECTED_RUN
    ON AUD_GATE_DECISIONS (SELECTED_PIPELINE_RUN_ID);
CREATE INDEX IF NOT EXISTS IX_AUD_GATE_DECISIONS_SELECTED_TASK_RUN
    ON AUD_GATE_DECISIONS (SELECTED_TASK_RUN_ID);
CREATE INDEX IF NOT EXISTS IX_AUD_DEPENDENCY_CONSUMPTION_RUN
    ON AUD_DEPENDENCY_CONSUMPTION (PIPELINE_RUN_ID);
CREATE INDEX IF NOT EXISTS IX_AUD_DEPENDENCY_CONSUMPTION_CONSUMED_RUN
    ON AUD_DEPENDENCY_CONSUMPTION (CONSUMED_PIPELINE_RUN_ID);
CREATE INDEX IF NOT EXISTS IX_AUD_DEPENDENCY_CONSUMPTION_CONSUMED_TASK_RUN
    ON AUD_DEPENDENCY_CONSUMPTION (CONSUMED_TASK_RUN_ID);
CREATE INDEX IF NOT EXISTS IX_AUD_RUN_INTERVENTIONS_RUN
    ON AUD_RUN_INTERVENTIONS (PIPELINE_RUN_ID);
