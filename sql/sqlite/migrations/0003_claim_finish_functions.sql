-- ENGINE 0003: a claim and a finish in one call. On PostgreSQL this migration adds the functions
-- ETL_CRAFT_CLAIM and ETL_CRAFT_FINISH, so that each takes one round trip. SQLite has no stored functions and
-- runs in-process, where a round trip costs nothing, so claims and finishes keep their transaction form here
-- and nothing changes. The file exists so that both dialects stay at the same ENGINE version (the ledger,
-- init-db's and migrate's messages, and the schema check agree). Its one statement changes nothing.
SELECT 1;
