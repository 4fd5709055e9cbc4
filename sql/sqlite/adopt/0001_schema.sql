-- Adopting an Engine DB that etl-craft made (docs/etl-craft-parity.md, "Sharing an Engine DB"): the
-- provider's own ENGINE ledger. etl-craft's migrate refuses SCHEMA_MIGRATIONS rows it has no file for, so the
-- provider records what it adds here. Nothing of etl-craft's is changed.
CREATE TABLE ETL_CRAFT_AIRFLOW_MIGRATIONS (
    VERSION    TEXT NOT NULL PRIMARY KEY,
    -- SHA-256 of the step applied, 64 lower-case hex digits.
    CHECKSUM   TEXT NOT NULL CHECK (length(CHECKSUM) = 64 AND CHECKSUM NOT GLOB '*[^0-9a-f]*'),
    APPLIED_AT TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000+00:00')
);
