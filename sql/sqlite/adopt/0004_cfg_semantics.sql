-- ENGINE 0004 on an Engine DB that etl-craft made (docs/etl-craft-parity.md, "Sharing an Engine DB"). etl-craft's
-- tables already have every rule the provider's 0004 gives its own (required columns, one active row per edge,
-- CONSUME_REPAIRS and OUTPUT_REVISION defaults, RUN_DATE a DATE), so none of its tables is rebuilt here. The
-- file keeps both dialects at the same ENGINE version; its one statement changes nothing.
SELECT 1;
