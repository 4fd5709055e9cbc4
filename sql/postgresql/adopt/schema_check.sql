-- The provider's schema check (ENGINE 0003's ETL_CRAFT_SCHEMA_IS_CURRENT: same arguments, same answer) on an
-- Engine DB that etl-craft made, where the provider's ENGINE versions are in ETL_CRAFT_AIRFLOW_MIGRATIONS
-- and SCHEMA_MIGRATIONS holds etl-craft's. Re-created after every ENGINE step applied to such a database.
CREATE OR REPLACE FUNCTION ETL_CRAFT_SCHEMA_IS_CURRENT(P_VERSIONS TEXT[], P_TABLES TEXT[]) RETURNS BOOLEAN
LANGUAGE sql STABLE SECURITY INVOKER SET search_path FROM CURRENT AS $$
    SELECT (SELECT COUNT(DISTINCT upper(c.relname)) FROM pg_class c
              JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND upper(c.relname) = ANY (P_TABLES))
           = cardinality(P_TABLES)
       AND NOT EXISTS (SELECT 1 FROM unnest(P_VERSIONS) AS v (VERSION)
                        WHERE NOT EXISTS (SELECT 1 FROM ETL_CRAFT_AIRFLOW_MIGRATIONS m WHERE m.VERSION = v.VERSION))
$$;
