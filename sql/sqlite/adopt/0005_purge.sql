-- ENGINE 0005 on an Engine DB that etl-craft made (docs/retention.md, docs/etl-craft-parity.md): only the
-- purge audit table, with etl-craft's time text. etl-craft's own guards already let a write through when its
-- etl_craft_purpose() function answers 'retention', which the provider's connection answers inside a purge
-- batch, so none of etl-craft's triggers is changed.
CREATE TABLE AUD_ENGINE_PURGES (
    PURGE_ID               INTEGER PRIMARY KEY AUTOINCREMENT,
    STATUS                 TEXT NOT NULL
        CHECK (STATUS IN ('RUNNING', 'DONE', 'FAILED', 'INTERRUPTED')),
    REQUESTED_BY           TEXT,
    REQUESTED_BY_KIND      TEXT
        CHECK (REQUESTED_BY_KIND IN ('HUMAN', 'SCHEDULE', 'ORCHESTRATOR', 'WORKER', 'SYSTEM')),
    HOST                   TEXT,
    PID                    INTEGER,
    STARTED_AT             TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000+00:00'),
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
