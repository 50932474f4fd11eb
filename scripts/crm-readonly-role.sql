-- crm-readonly-role.sql: the second safety layer of gpuhost's `crm` MCP
-- connector. The connector already runs every query template inside a
-- READ ONLY transaction with a statement_timeout; this role makes sure
-- that even a careless template (or a bug in that first layer) cannot
-- change anything, because the role simply has no privilege to.
--
-- Run it as a superuser (or the owner of the CRM tables) in the CRM
-- database:
--
--   psql -d crm -v ON_ERROR_STOP=1 -f scripts/crm-readonly-role.sql
--
-- It is idempotent: run it again after adding tables. The role is created
-- NOLOGIN, so the script never carries a password. Enable it with a password
-- of your own, typed once and kept out of the repository:
--
--   ALTER ROLE gpuhost_crm_ro LOGIN PASSWORD 'choose-a-long-random-password';
--
-- then put the DSN in the environment variable named by `dsn_env`
-- (e.g. GPUHOST_CRM_DSN=postgres://gpuhost_crm_ro:...@db:5432/crm).
--
-- Adjust the schema name below if the CRM tables are not in `public`.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'gpuhost_crm_ro') THEN
        CREATE ROLE gpuhost_crm_ro NOLOGIN;
    END IF;
END
$$;

-- No attributes that could widen what the role may do.
ALTER ROLE gpuhost_crm_ro NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS;

-- Start from nothing: drop every privilege the role may hold here.
DO $$
BEGIN
    EXECUTE format('REVOKE ALL ON DATABASE %I FROM gpuhost_crm_ro', current_database());
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO gpuhost_crm_ro', current_database());
END
$$;
REVOKE ALL ON SCHEMA public FROM gpuhost_crm_ro;
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM gpuhost_crm_ro;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM gpuhost_crm_ro;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM gpuhost_crm_ro;

-- Then grant exactly what reading needs: look into the schema, SELECT rows.
GRANT USAGE ON SCHEMA public TO gpuhost_crm_ro;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO gpuhost_crm_ro;

-- Belt and braces: every session of the role starts read-only and with a
-- statement timeout, even when a client forgets to ask for it.
ALTER ROLE gpuhost_crm_ro SET default_transaction_read_only = on;
ALTER ROLE gpuhost_crm_ro SET statement_timeout = '30s';
