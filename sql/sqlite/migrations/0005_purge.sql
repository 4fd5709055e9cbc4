-- ENGINE 0005: retention (docs/retention.md). `etl-craft-airflow purge` deletes finished runs older than a
-- cutoff, with everything that hangs off them, in short batches; this migration adds what the schema needs:
--   * AUD_ENGINE_PURGES, one row per purge: who, where, the cutoff and pipeline filter, the counts deleted per
--     table (updated in the same transaction as each batch's deletes, so they always match what is gone), and
--     a STATUS. A purge killed mid-way stays RUNNING with an old HEARTBEAT_AT; the next purge marks it
--     INTERRUPTED and carries on where it stopped (every committed batch is complete on its own).
--   * The append-only DELETE guards of AUD_GATE_DECISIONS and AUD_DEPENDENCY_CONSUMPTION let the purge, and
--     only the purge, delete: a DELETE passes only while a RUNNING purge row has BATCH_OPEN = 'Y', and only for
--     a row whose run (PIPELINE_RUN_ID) has finished. The purge sets BATCH_OPEN inside its own BEGIN IMMEDIATE
--     batch and sets it back before COMMIT: SQLite runs one writer at a time, so no other writer ever runs
--     while the marker is set, and a killed batch rolls back with its marker. Every UPDATE stays refused.
-- PostgreSQL uses a transaction-local setting instead (its 0005); the column exists on both for one schema.

CREATE TABLE AUD_ENGINE_PURGES (
    PURGE_ID               INTEGER PRIMARY KEY AUTOINCREMENT,
    STATUS                 TEXT NOT NULL
        CHECK (STATUS IN ('RUNNING', 'DONE', 'FAILED', 'INTERRUPTED')),
    REQUESTED_BY           TEXT,
    REQUESTED_BY_KIND      TEXT
        CHECK (REQUESTED_BY_KIND IN ('HUMAN', 'SCHEDULE', 'ORCHESTRATOR', 'WORKER', 'SYSTEM')),
    HOST                   TEXT,
    PID                    INTEGER,
    STARTED_AT             TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    HEARTBEAT_AT           TEXT,
    ENDED_AT               TEXT,
    CUTOFF                 TEXT NOT NULL,
    PIPELINE_CODE          TEXT,
    BATCH_SIZE             INTEGER NOT NULL CHECK (BATCH_SIZE >= 1),
    ARCHIVE_DIR            TEXT,
    BATCHES                INTEGER NOT NULL DEFAULT 0,
    RUNS_DELETED           INTEGER NOT NULL DEFAULT 0,
    TASK_RUNS_DELETED      INTEGER NOT NULL DEFAULT 0,
    ATTEMPTS_DELETED       INTEGER NOT NULL DEFAULT 0,
    GATE_DECISIONS_DELETED INTEGER NOT NULL DEFAULT 0,
    CONSUMPTIONS_DELETED   INTEGER NOT NULL DEFAULT 0,
    PAUSES_DELETED         INTEGER NOT NULL DEFAULT 0,
    INTERVENTIONS_DELETED  INTEGER NOT NULL DEFAULT 0,
    RESUMED_BY_PURGE_ID    INTEGER REFERENCES AUD_ENGINE_PURGES (PURGE_ID),
    MESSAGE                TEXT,
    BATCH_OPEN             CHAR(1) NOT NULL DEFAULT 'N' CHECK (BATCH_OPEN IN ('Y', 'N'))
);

CREATE INDEX IX_AUD_ENGINE_PURGES_STATUS ON AUD_ENGINE_PURGES (STATUS);

DROP TRIGGER TR_AUD_GATE_DECISIONS_NO_DELETE;
CREATE TRIGGER TR_AUD_GATE_DECISIONS_NO_DELETE
BEFORE DELETE ON AUD_GATE_DECISIONS
FOR EACH ROW WHEN NOT EXISTS (SELECT 1 FROM AUD_ENGINE_PURGES p WHERE p.STATUS = 'RUNNING' AND p.BATCH_OPEN = 'Y')
    OR NOT EXISTS (SELECT 1 FROM AUD_PIPELINES_RUN_LOG r
                    WHERE r.PIPELINE_RUN_ID = OLD.PIPELINE_RUN_ID AND r.STATUS NOT IN ('QUEUED', 'IN-PROGRESS'))
BEGIN
    SELECT RAISE(ABORT, 'AUD_GATE_DECISIONS is append-only: rows cannot be deleted (only etl-craft-airflow purge deletes)');
END;

DROP TRIGGER TR_AUD_DEPENDENCY_CONSUMPTION_NO_DELETE;
CREATE TRIGGER TR_AUD_DEPENDENCY_CONSUMPTION_NO_DELETE
BEFORE DELETE ON AUD_DEPENDENCY_CONSUMPTION
FOR EACH ROW WHEN NOT EXISTS (SELECT 1 FROM AUD_ENGINE_PURGES p WHERE p.STATUS = 'RUNNING' AND p.BATCH_OPEN = 'Y')
    OR NOT EXISTS (SELECT 1 FROM AUD_PIPELINES_RUN_LOG r
                    WHERE r.PIPELINE_RUN_ID = OLD.PIPELINE_RUN_ID AND r.STATUS NOT IN ('QUEUED', 'IN-PROGRESS'))
BEGIN
    SELECT RAISE(ABORT, 'AUD_DEPENDENCY_CONSUMPTION is append-only: rows cannot be deleted (only etl-craft-airflow purge deletes)');
END;
