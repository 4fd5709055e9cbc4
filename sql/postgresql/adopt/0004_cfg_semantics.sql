-- ENGINE 0004 on an Engine DB that etl-craft made (docs/etl-craft-parity.md, "Sharing an Engine DB"). etl-craft's
-- tables already have every rule the provider's 0004 gives its own (required columns, one active row per edge,
-- CONSUME_REPAIRS and OUTPUT_REVISION defaults, RUN_DATE a DATE), so none of its tables is altered here: only
-- the provider's one-call claim takes 0004's form.

-- ETL_CRAFT_CLAIM (ENGINE 0003) wrote its TIMESTAMPTZ argument P_RUN_DATE into RUN_DATE. Into a DATE column
-- PostgreSQL would convert it in the session's TimeZone; this replacement stores the UTC date, as the
-- transaction form does. Its arguments and its answer keep their meaning (0003's rule for a CREATE OR
-- REPLACE), so workers of the previous release keep calling it during a rolling upgrade. The rest of the body
-- is 0003's, unchanged.
CREATE OR REPLACE FUNCTION ETL_CRAFT_CLAIM(
    P_LOCK_KEY BIGINT, P_LOCK_TIMEOUT TEXT, P_VERSIONS TEXT[], P_TABLES TEXT[], P_PIPELINE_CODE TEXT,
    P_TASK_CODES TEXT[], P_RUN_KEY TEXT, P_NOW TIMESTAMPTZ, P_RUN_DATE TIMESTAMPTZ, P_BACKFILL TEXT,
    P_ACTOR TEXT, P_ACTOR_KIND TEXT,
    OUT O_ACTION TEXT, OUT O_LENIENT TEXT[], OUT O_PIPELINE_RUN_ID BIGINT, OUT O_RUN_PIPELINE_ID BIGINT,
    OUT O_RUN_STATUS TEXT, OUT O_RUN_KEY TEXT, OUT O_RUN_START_DATE TIMESTAMPTZ, OUT O_RUN_END_DATE TIMESTAMPTZ,
    OUT O_RUN_REPAIR_PENDING TEXT, OUT O_RUN_OUTPUT_REVISION INTEGER)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET search_path FROM CURRENT AS $$
DECLARE
    V_PIPELINE_ID BIGINT;
    V_MINE_ID BIGINT;
    V_MINE_STATUS TEXT;
    V_NOW TIMESTAMPTZ;
BEGIN
    O_ACTION := 'SCHEMA';
    IF NOT ETL_CRAFT_SCHEMA_IS_CURRENT(P_VERSIONS, P_TABLES) THEN
        RETURN;
    END IF;
    O_ACTION := 'FULL';
    PERFORM set_config('lock_timeout', P_LOCK_TIMEOUT, true);
    PERFORM pg_advisory_xact_lock(P_LOCK_KEY);
    PERFORM set_config('lock_timeout', '0', true);
    V_NOW := GREATEST(P_NOW, clock_timestamp());

    SELECT p.PIPELINE_ID INTO V_PIPELINE_ID FROM CFG_PIPELINES p
     WHERE p.PIPELINE_CODE = P_PIPELINE_CODE AND p.ACTIVE_FLAG = 'Y';
    IF NOT FOUND THEN
        RETURN;  -- retired or unknown: the transaction form says which
    END IF;
    IF P_TASK_CODES IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM CFG_TASKS t
                    WHERE t.PIPELINE_ID = V_PIPELINE_ID AND t.ACTIVE_FLAG = 'Y' AND t.TASK_CODE <> ALL (P_TASK_CODES))
           OR EXISTS (SELECT 1 FROM unnest(P_TASK_CODES) AS c (TASK_CODE)
                       WHERE NOT EXISTS (SELECT 1 FROM CFG_TASKS t WHERE t.PIPELINE_ID = V_PIPELINE_ID
                                            AND t.ACTIVE_FLAG = 'Y' AND t.TASK_CODE = c.TASK_CODE)) THEN
            RETURN;  -- the DAG's task codes differ: the transaction form names them
        END IF;
        SELECT COALESCE(array_agg(t.TASK_CODE ORDER BY t.TASK_CODE), '{}') INTO O_LENIENT FROM CFG_TASKS t
         WHERE t.PIPELINE_ID = V_PIPELINE_ID AND t.ACTIVE_FLAG = 'Y'
           AND (t.RUN_CONDITION IN ('ANY', 'N')
                OR EXISTS (SELECT 1 FROM CFG_TASK_DEPENDENCY d WHERE d.TASK_ID = t.TASK_ID AND d.ACTIVE_FLAG = 'Y'
                              AND d.DEPENDENCY_TYPE IN ('FAILURE', 'ALWAYS')));
    END IF;

    SELECT r.PIPELINE_RUN_ID, r.STATUS INTO V_MINE_ID, V_MINE_STATUS FROM AUD_PIPELINES_RUN_LOG r
     WHERE r.PIPELINE_ID = V_PIPELINE_ID AND r.RUN_KEY = P_RUN_KEY;
    IF V_MINE_STATUS = 'IN-PROGRESS' THEN
        O_ACTION := 'RESUMED';
        O_PIPELINE_RUN_ID := V_MINE_ID;
        RETURN;
    END IF;
    SELECT r.PIPELINE_RUN_ID, r.PIPELINE_ID, r.STATUS, r.RUN_KEY, r.START_DATE, r.END_DATE, r.REPAIR_PENDING,
           r.OUTPUT_REVISION
      INTO O_PIPELINE_RUN_ID, O_RUN_PIPELINE_ID, O_RUN_STATUS, O_RUN_KEY, O_RUN_START_DATE, O_RUN_END_DATE,
           O_RUN_REPAIR_PENDING, O_RUN_OUTPUT_REVISION
      FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_ID = V_PIPELINE_ID AND r.STATUS = 'IN-PROGRESS'
     ORDER BY r.PIPELINE_RUN_ID LIMIT 1;
    IF FOUND THEN
        O_ACTION := 'BLOCKED';
        RETURN;
    END IF;
    IF V_MINE_ID IS NOT NULL
       OR EXISTS (SELECT 1 FROM AUD_PIPELINE_PAUSES pp WHERE pp.PIPELINE_ID = V_PIPELINE_ID AND pp.RESUMED_AT IS NULL)
       OR EXISTS (SELECT 1 FROM CFG_PIPELINE_DEPENDENCY d JOIN CFG_PIPELINES up ON up.PIPELINE_ID = d.DEPENDS_ON_PIPELINE_ID
                   WHERE d.PIPELINE_ID = V_PIPELINE_ID AND d.ACTIVE_FLAG = 'Y') THEN
        RETURN;  -- a reopen, a pause or dependencies to judge: the transaction form decides
    END IF;
    INSERT INTO AUD_PIPELINES_RUN_LOG (PIPELINE_ID, START_DATE, END_DATE, STATUS, RUN_DATE, BACKFILL, RUN_KEY,
        TRIGGER_KIND, OWNER_ID, STARTED_BY, STARTED_BY_KIND, ENDED_BY, ENDED_BY_KIND)
    VALUES (V_PIPELINE_ID, V_NOW, NULL, 'IN-PROGRESS', (P_RUN_DATE AT TIME ZONE 'UTC')::DATE, P_BACKFILL, P_RUN_KEY,
        'ORCHESTRATOR', P_RUN_KEY,
        P_ACTOR, P_ACTOR_KIND, NULL, NULL)
    RETURNING PIPELINE_RUN_ID INTO O_PIPELINE_RUN_ID;
    O_ACTION := 'CREATED';
END;
$$;
