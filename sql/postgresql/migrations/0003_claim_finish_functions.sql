-- ENGINE 0003: a claim and a finish in one call (SPEC §9), for PostgreSQL Engine DBs. No table changes.
--
-- ETL_CRAFT_CLAIM and ETL_CRAFT_FINISH check that the schema is current, take the pipeline lock, and do the
-- common case of a claim or a finish in one statement, which the provider sends as one round trip. They
-- cover only part of what the provider's transaction forms do (runs/claim.py, runs/finish.py). Those forms
-- remain the only full definition of the semantics. When a case needs anything else (a run to reopen, a
-- pause, pipeline dependencies, tasks Airflow never ran, live attempts, tasks marked by hand, an error to
-- explain), a function writes nothing and answers 'FULL', and the provider runs the transaction form.
-- Where a function writes, it writes exactly the rows the transaction form would write
-- (tests/integration/test_claim_finish_at_once.py compares the two).
--
-- Lock: the caller passes the advisory key of pipeline:<code> as engine/locks.py computes it, and the
-- lock_timeout to wait with. A function and the transaction form therefore take the same transaction lock and
-- exclude each other. The lock is released when the call's transaction ends. Each statement after the lock
-- runs with a new snapshot (VOLATILE functions, READ COMMITTED), so it sees what the previous holder
-- committed.
--
-- Time: the transaction form reads the clock after it has taken the lock, so a transition never records a time
-- earlier than the one before it under the same lock. A function cannot read the caller's clock after its
-- lock, so it records the later of the caller's reading sent with the call (P_NOW) and the server's
-- clock_timestamp() after the lock. On one host these are the same clock. Across hosts it orders a
-- pipeline's transitions even when a worker's clock runs behind the server's.
--
-- Schema: each function keeps the Engine schema as its search_path (SET search_path FROM CURRENT, the schema
-- this migration runs in). The caller names the function with that schema and sends nothing else: no
-- session state is left behind, also behind a transaction pooler. SECURITY INVOKER: a call has only the
-- privileges of the role that calls it.
--
-- Versions: a provider release calls these functions with the arguments, and reads the answer, of the
-- ENGINE migration that defines them. It passes the ENGINE versions it packages; an Engine DB that misses
-- one answers 'SCHEMA', and the provider's schema check names the migration to apply. A later migration may
-- CREATE OR REPLACE a function only if its arguments and its answer keep their meaning (a fix, a faster
-- plan). A change to either needs a new name (ETL_CRAFT_CLAIM_2, ...), because workers of an older release
-- keep calling the old name during a rolling upgrade. A release that changes a transaction form changes the
-- function to match, in a new migration of the same release, so the two forms still write the same rows.

-- Whether the Engine schema is current: every Engine table is present (P_TABLES, upper case) and every ENGINE
-- migration the caller packages (P_VERSIONS) is in the ledger. engine/schema.py's require_current uses the same rule.
CREATE FUNCTION ETL_CRAFT_SCHEMA_IS_CURRENT(P_VERSIONS TEXT[], P_TABLES TEXT[]) RETURNS BOOLEAN
LANGUAGE sql STABLE SECURITY INVOKER SET search_path FROM CURRENT AS $$
    SELECT (SELECT COUNT(DISTINCT upper(c.relname)) FROM pg_class c
              JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND upper(c.relname) = ANY (P_TABLES))
           = cardinality(P_TABLES)
       AND NOT EXISTS (SELECT 1 FROM unnest(P_VERSIONS) AS v (VERSION)
                        WHERE NOT EXISTS (SELECT 1 FROM SCHEMA_MIGRATIONS m
                                           WHERE m.SOURCE = 'ENGINE' AND m.VERSION = v.VERSION))
$$;

-- Claim the keyed run of a DAG run (runs/claim.py Claim). O_ACTION says what happened:
--   CREATED  a new IN-PROGRESS run O_PIPELINE_RUN_ID (the pipeline is active, not paused, has no active
--            pipeline dependency, and neither the keyed run nor any IN-PROGRESS run exists);
--   RESUMED  the keyed run O_PIPELINE_RUN_ID is IN-PROGRESS already (nothing written);
--   BLOCKED  another run is IN-PROGRESS: its row is O_PIPELINE_RUN_ID and the O_RUN_* columns (nothing written);
--   FULL     nothing written: the transaction form decides (the schema was found current);
--   SCHEMA   nothing written and no lock taken: the schema is not current.
-- P_TASK_CODES (NULL: not checked) must equal the pipeline's active task codes, otherwise the answer is FULL
-- and the transaction form raises the error. O_LENIENT holds the active tasks Gates.active_tasks calls lenient.
CREATE FUNCTION ETL_CRAFT_CLAIM(
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
    VALUES (V_PIPELINE_ID, V_NOW, NULL, 'IN-PROGRESS', P_RUN_DATE, P_BACKFILL, P_RUN_KEY, 'ORCHESTRATOR', P_RUN_KEY,
        P_ACTOR, P_ACTOR_KIND, NULL, NULL)
    RETURNING PIPELINE_RUN_ID INTO O_PIPELINE_RUN_ID;
    O_ACTION := 'CREATED';
END;
$$;

-- End the keyed run of a DAG run (runs/finish.py FinishRun, called without mapped tasks). O_ACTION:
--   FINISHED  the run ended O_STATUS, with O_SLA_STATUS and the task codes O_FAILED whose task runs are
--             FAILED or CANCELLED (every task of the pipeline in the DAG has a task run that Airflow's state,
--             P_STATES by task code, does not overrule, and no attempt of the run is live);
--   ENDED     the run had ended already: its O_STATUS and O_SLA_STATUS (nothing written);
--   FULL      nothing written: the transaction form decides (no keyed run, live attempts, tasks to record
--             or to mark as Airflow says);
--   SCHEMA    nothing written and no lock taken: the schema is not current.
-- P_NOT_DECIDING: task codes whose failure does not fail the run (besides EMAIL_ALERT handlers).
CREATE FUNCTION ETL_CRAFT_FINISH(
    P_LOCK_KEY BIGINT, P_LOCK_TIMEOUT TEXT, P_VERSIONS TEXT[], P_TABLES TEXT[], P_PIPELINE_CODE TEXT,
    P_RUN_KEY TEXT, P_STATES JSONB, P_NOT_DECIDING TEXT[], P_NOW TIMESTAMPTZ, P_ACTOR TEXT, P_ACTOR_KIND TEXT,
    OUT O_ACTION TEXT, OUT O_PIPELINE_RUN_ID BIGINT, OUT O_STATUS TEXT, OUT O_SLA_STATUS TEXT, OUT O_FAILED TEXT[])
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET search_path FROM CURRENT AS $$
DECLARE
    V_PIPELINE_ID BIGINT;
    V_STATUS TEXT;
    V_START_DATE TIMESTAMPTZ;
    V_REPAIR_PENDING TEXT;
    V_REVISION INTEGER;
    V_SLA_STATUS TEXT;
    V_SLA_HOURS DOUBLE PRECISION;
    V_UNSETTLED BOOLEAN;
    V_FAILING BOOLEAN;
    V_ALL_SKIPPED BOOLEAN;
    V_NEW_SLA TEXT;
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

    -- The keyed run and its pipeline, row-locked as the transaction form's _KEYED_RUN does: an attempt that
    -- is starting without the pipeline lock (it share-locks the run) either committed already or waits for us.
    SELECT r.PIPELINE_RUN_ID, r.PIPELINE_ID, r.STATUS, r.START_DATE, r.REPAIR_PENDING, r.OUTPUT_REVISION,
           r.SLA_STATUS, p.SLA_IN_HOURS
      INTO O_PIPELINE_RUN_ID, V_PIPELINE_ID, V_STATUS, V_START_DATE, V_REPAIR_PENDING, V_REVISION, V_SLA_STATUS,
           V_SLA_HOURS
      FROM AUD_PIPELINES_RUN_LOG r JOIN CFG_PIPELINES p ON p.PIPELINE_ID = r.PIPELINE_ID
     WHERE p.PIPELINE_CODE = P_PIPELINE_CODE AND r.RUN_KEY = P_RUN_KEY
     ORDER BY r.PIPELINE_RUN_ID DESC LIMIT 1 FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- no such run: the transaction form raises RUN_STATE
    END IF;
    IF V_STATUS <> 'IN-PROGRESS' THEN
        O_ACTION := 'ENDED';
        O_STATUS := V_STATUS;
        O_SLA_STATUS := V_SLA_STATUS;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID
                WHERE tr.PIPELINE_RUN_ID = O_PIPELINE_RUN_ID AND a.STATUS IN ('QUEUED', 'CLAIMED', 'RUNNING')) THEN
        RETURN;  -- live attempts: the transaction form closes them LOST
    END IF;

    -- Every task of the pipeline (active, or with a task run in this run), as finish.py's _TASKS_OF_RUN. A
    -- task without a task run that is not in the DAG (not in P_STATES) takes no part, as there.
    SELECT bool_or((task.TASK_RUN_ID IS NULL AND task.SEEN IS NOT NULL)
                   OR (task.STATE = 'success' AND task.STATUS NOT IN ('SUCCESS', 'IN-PROGRESS'))
                   OR (task.STATE = 'failed' AND task.STATUS = 'SUCCESS')),
           bool_or(task.STATUS IN ('FAILED', 'CANCELLED') AND task.HANDLER IS DISTINCT FROM 'EMAIL_ALERT'
                   AND task.TASK_CODE <> ALL (P_NOT_DECIDING)),
           COALESCE(bool_and(task.STATUS = 'SKIPPED') FILTER (WHERE task.TASK_RUN_ID IS NOT NULL), true),
           COALESCE(array_agg(task.TASK_CODE ORDER BY task.TASK_CODE)
                        FILTER (WHERE task.STATUS IN ('FAILED', 'CANCELLED')), '{}')
      INTO V_UNSETTLED, V_FAILING, V_ALL_SKIPPED, O_FAILED
      FROM (SELECT t.TASK_CODE, t.HANDLER, tr.TASK_RUN_ID, tr.STATUS, P_STATES -> t.TASK_CODE AS SEEN,
                   P_STATES ->> t.TASK_CODE AS STATE
              FROM CFG_TASKS t
              LEFT JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_ID = t.TASK_ID AND tr.PIPELINE_RUN_ID = O_PIPELINE_RUN_ID
             WHERE t.PIPELINE_ID = V_PIPELINE_ID AND (t.ACTIVE_FLAG = 'Y' OR tr.TASK_RUN_ID IS NOT NULL)) AS task;
    IF V_UNSETTLED THEN
        RETURN;  -- a task to record, or one marked by hand in Airflow: the transaction form follows Airflow
    END IF;
    O_STATUS := CASE WHEN V_FAILING THEN 'FAILED' WHEN V_ALL_SKIPPED THEN 'SKIPPED' ELSE 'SUCCESS' END;

    -- SLA_STATUS once, for a first (not repaired) run of a pipeline with an SLA. Hours are computed as
    -- finish.py's _sla does (microseconds / 1e6 / 3600 in double precision), so the boundary agrees.
    IF V_REPAIR_PENDING = 'N' AND V_SLA_HOURS IS NOT NULL AND V_START_DATE IS NOT NULL THEN
        V_NEW_SLA := CASE
            WHEN round(EXTRACT(EPOCH FROM V_NOW - V_START_DATE) * 1000000)::BIGINT::DOUBLE PRECISION / 1000000 / 3600
                 <= V_SLA_HOURS THEN 'MET'
            ELSE 'BREACHED' END;
    END IF;
    O_SLA_STATUS := COALESCE(V_SLA_STATUS, V_NEW_SLA);
    UPDATE AUD_PIPELINES_RUN_LOG SET STATUS = O_STATUS, END_DATE = V_NOW, ENDED_BY = P_ACTOR,
        ENDED_BY_KIND = P_ACTOR_KIND, SLA_STATUS = COALESCE(SLA_STATUS, V_NEW_SLA),
        OUTPUT_REVISION = V_REVISION + CASE WHEN V_REPAIR_PENDING = 'Y' THEN 1 ELSE 0 END, REPAIR_PENDING = 'N'
     WHERE PIPELINE_RUN_ID = O_PIPELINE_RUN_ID;
    IF O_STATUS = 'SUCCESS' THEN  -- what the run consumed: as gates.py's consume_run
        INSERT INTO AUD_DEPENDENCY_CONSUMPTION (PIPELINE_DEPENDENCY_ID, PIPELINE_ID, PIPELINE_RUN_ID,
            DEPENDS_ON_PIPELINE_ID, CONSUMED_PIPELINE_RUN_ID, CONSUMED_AT, CONSUMED_REVISION)
        SELECT g.PIPELINE_DEPENDENCY_ID, d.PIPELINE_ID, g.PIPELINE_RUN_ID, d.DEPENDS_ON_PIPELINE_ID,
               g.SELECTED_PIPELINE_RUN_ID, V_NOW, g.SELECTED_REVISION
          FROM AUD_GATE_DECISIONS g JOIN CFG_PIPELINE_DEPENDENCY d ON d.PIPELINE_DEPENDENCY_ID = g.PIPELINE_DEPENDENCY_ID
         WHERE g.PIPELINE_RUN_ID = O_PIPELINE_RUN_ID AND g.RESULT = 'SATISFIED' AND g.SELECTED_PIPELINE_RUN_ID IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM AUD_DEPENDENCY_CONSUMPTION c
                            WHERE c.PIPELINE_DEPENDENCY_ID = g.PIPELINE_DEPENDENCY_ID AND c.PIPELINE_RUN_ID = g.PIPELINE_RUN_ID);
    END IF;
    -- The change notice deferred waits listen for, sent at COMMIT: the channel and payload of
    -- PostgresDialect.change_notice (CHANGE_CHANNEL, "<schema>:<PIPELINE_ID>"; this function's
    -- search_path is the Engine schema).
    PERFORM pg_notify('etl_craft_changes', current_schema() || ':' || V_PIPELINE_ID);
    O_ACTION := 'FINISHED';
END;
$$;
