-- ENGINE 0006: every Engine DB reads a pipeline's newest run through one index (docs/etl-craft-parity.md,
-- "Sharing an Engine DB"; runs/queries.py). The provider's own schema has had IX_AUD_PIPELINES_RUN_LOG_LATEST
-- since ENGINE 0001, so on its Engine DBs this step changes nothing. An Engine DB that etl-craft made indexes
-- its runs by PIPELINE_ID alone, so there the newest run of a pipeline meant reading all of that pipeline's
-- history; adoption now adds this index beside etl-craft's own. etl-craft reads no index by name, and its own
-- migrations create none of this name.
CREATE INDEX IF NOT EXISTS IX_AUD_PIPELINES_RUN_LOG_LATEST
    ON AUD_PIPELINES_RUN_LOG (PIPELINE_ID, PIPELINE_RUN_ID DESC);
