-- The SQL Server CDC surface, emulated in a PostgreSQL 15 database (tests only).
-- Installed once per stand-in database by catalog.install(). Objects live where T-SQL names them:
-- sys.*, cdc.*, "INFORMATION_SCHEMA".*, user tables in dbo (or any other schema);
-- the stand-in's own state lives in schema standin. search_path = dbo, sys, pg_catalog, so
-- unqualified T-SQL built-ins (DB_NAME(), OBJECT_ID(), ...) resolve to the sys.* emulations.

CREATE SCHEMA standin;
CREATE SCHEMA sys;
CREATE SCHEMA cdc;
CREATE SCHEMA dbo;
CREATE SCHEMA "INFORMATION_SCHEMA";

-- ---------------------------------------------------------------- state of the emulated server
CREATE TABLE standin.settings (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    server_name text NOT NULL,
    database_guid uuid NOT NULL,
    is_cdc_enabled boolean NOT NULL DEFAULT false,
    allow_snapshot_isolation boolean NOT NULL DEFAULT false,
    is_read_committed_snapshot_on boolean NOT NULL DEFAULT false,
    agent_running boolean NOT NULL DEFAULT true,       -- sys.dm_server_services: SQL Server Agent
    capture_job_running boolean NOT NULL DEFAULT true,  -- sp_cdc_start_job / sp_cdc_stop_job
    next_object_id integer NOT NULL DEFAULT 1000000
);

-- Declared SQL Server type of every column created through the stand-in.
CREATE TABLE standin.declared_columns (
    relid oid NOT NULL,
    column_name text NOT NULL,
    declared text NOT NULL,
    type_name text NOT NULL,
    max_length integer NOT NULL,
    "precision" integer NOT NULL,
    scale integer NOT NULL,
    char_max_length integer,
    datetime_precision integer,
    normalize text,
    is_identity boolean NOT NULL DEFAULT false,
    PRIMARY KEY (relid, column_name)
);

CREATE SEQUENCE standin.dbts START 2000;  -- @@DBTS: rowversion values

-- msdb.dbo.cdc_jobs (reached as msdb.dbo.cdc_jobs; the translator maps msdb.dbo.X to standin.msdb_X)
CREATE TABLE standin.msdb_cdc_jobs (
    database_id integer NOT NULL DEFAULT 5,
    job_type varchar(20) NOT NULL,
    job_id uuid NOT NULL DEFAULT gen_random_uuid(),
    maxtrans integer,
    maxscans integer,
    continuous boolean,
    pollinginterval bigint,
    retention bigint,
    threshold bigint
);

-- sys.dm_cdc_log_scan_sessions: one row per capture scan that found work (the capture job writes it)
CREATE TABLE standin.log_scan_sessions (
    session_id serial PRIMARY KEY,
    start_time timestamp(3) NOT NULL,
    end_time timestamp(3) NOT NULL,
    duration integer NOT NULL,
    scan_phase varchar(200) NOT NULL DEFAULT 'Done',
    error_count integer NOT NULL DEFAULT 0,
    start_lsn varchar(23),
    current_lsn varchar(23),
    end_lsn varchar(23),
    tran_count bigint NOT NULL,
    last_commit_lsn varchar(23),
    last_commit_time timestamp(3),
    log_record_count bigint NOT NULL,
    schema_change_count integer NOT NULL DEFAULT 0,
    command_count bigint NOT NULL,
    first_begin_cdc_lsn varchar(23),
    last_commit_cdc_lsn varchar(23),
    last_commit_cdc_time timestamp(3),
    latency integer NOT NULL,
    empty_scan_count integer NOT NULL DEFAULT 0,
    failed_sessions_count integer NOT NULL DEFAULT 0
);

-- ---------------------------------------------------------------- errors
-- SQL Server errors surface through pyodbc as (SQLSTATE, "...<message> (<number>)..."): the
-- stand-in raises them with SQLSTATE 42000 (what SQL Server's ODBC driver reports for these)
-- and the message ending in "(<number>)".
CREATE FUNCTION standin.raise_error(number integer, message text, sqlstate text DEFAULT '42000')
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = sqlstate, MESSAGE = format('%s (%s)', message, number),
        HINT = format('SQL Server error %s', number);
END $$;

-- ---------------------------------------------------------------- LSN arithmetic (binary(10))
-- MIN/MAX over binary, as T-SQL has them (PostgreSQL has no max(bytea)).
CREATE FUNCTION standin.bytea_larger(a bytea, b bytea) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN a >= b THEN a ELSE b END
$$;
CREATE FUNCTION standin.bytea_smaller(a bytea, b bytea) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN a <= b THEN a ELSE b END
$$;
CREATE AGGREGATE sys.max(bytea) (SFUNC = standin.bytea_larger, STYPE = bytea, COMBINEFUNC = standin.bytea_larger, PARALLEL = SAFE);
CREATE AGGREGATE sys.min(bytea) (SFUNC = standin.bytea_smaller, STYPE = bytea, COMBINEFUNC = standin.bytea_smaller, PARALLEL = SAFE);

CREATE FUNCTION standin.lsn_to_numeric(lsn bytea) RETURNS numeric LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT sum(get_byte(lsn, i)::numeric * (256::numeric ^ (length(lsn) - 1 - i)))
    FROM generate_series(0, length(lsn) - 1) AS i
$$;
CREATE FUNCTION standin.numeric_to_lsn(value numeric) RETURNS bytea LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    result bytea := '\x00000000000000000000'::bytea;
    v numeric := value;
BEGIN
    IF v < 0 OR v >= 256::numeric ^ 10 THEN
        PERFORM standin.raise_error(8115, 'Arithmetic overflow error converting expression to data type binary.');
    END IF;
    FOR i IN REVERSE 9..0 LOOP
        result := set_byte(result, i, (v % 256)::integer);
        v := trunc(v / 256);
    END LOOP;
    RETURN result;
END $$;
CREATE FUNCTION standin.lsn_from_pg(pos pg_lsn, slot integer DEFAULT 0) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT standin.numeric_to_lsn((pos - '0/0'::pg_lsn) * 65536 + slot)
$$;
CREATE FUNCTION standin.lsn_string(lsn bytea) RETURNS varchar LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT substr(encode(lsn, 'hex'), 1, 8) || ':' || substr(encode(lsn, 'hex'), 9, 8) || ':' || substr(encode(lsn, 'hex'), 17, 4)
$$;

-- ---------------------------------------------------------------- temporal rounding on write
-- datetime: 1/300 s ticks, kept as the millisecond value SQL Server prints (.000/.003/.007).
CREATE FUNCTION standin.round_datetime(ts timestamp) RETURNS timestamp(3) LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (date_trunc('second', ts)
            + make_interval(secs => round(round(extract(epoch FROM ts - date_trunc('second', ts)) * 300) * 10 / 3.0) / 1000.0))::timestamp(3)
$$;
-- smalldatetime: minutes; 29.998 s and less round down, 29.999 s and more round up.
CREATE FUNCTION standin.round_smalldatetime(ts timestamp) RETURNS timestamp(0) LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (date_trunc('minute', ts)
            + CASE WHEN extract(second FROM ts) >= 29.999 THEN interval '1 minute' ELSE interval '0' END)::timestamp(0)
$$;
CREATE FUNCTION standin.to_datetime(ts timestamp) RETURNS timestamp(3) LANGUAGE sql STABLE STRICT AS $$
    SELECT standin.round_datetime(ts)
$$;

-- Statement boundaries for the capture job (capture.py): SQL Server numbers a transaction's changes
-- with __$command_id per statement; PostgreSQL's logical decoding does not show statements, so a
-- statement-level trigger on every stand-in table writes a transactional logical message before each
-- INSERT/UPDATE/DELETE. SECURITY DEFINER: pg_logical_emit_message is not granted to PUBLIC.
CREATE FUNCTION standin.statement_marker() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pg_logical_emit_message(true, 'standin.statement', '');
    RETURN NULL;
END $$;

-- Computed columns (<col> AS (<expr>), translate.py) are stored generated columns.
CREATE FUNCTION standin.is_computed(rel oid, col text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT a.attgenerated <> '' FROM pg_attribute a WHERE a.attrelid = rel AND a.attname = col), false)
$$;

-- Rebuilds a table's write-time normalizer (trigger) from its declared columns.
CREATE FUNCTION standin.refresh_normalizer(rel regclass) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    body text := '';
    col record;
    fn text := format('standin.%I', 'normalize_' || rel::oid);
BEGIN
    FOR col IN SELECT * FROM standin.declared_columns WHERE relid = rel::oid AND normalize IS NOT NULL LOOP
        body := body || CASE col.normalize
            WHEN 'datetime' THEN format('NEW.%1$I := standin.round_datetime(NEW.%1$I);', col.column_name)
            WHEN 'smalldatetime' THEN format('NEW.%1$I := standin.round_smalldatetime(NEW.%1$I);', col.column_name)
            WHEN 'rowversion' THEN format('NEW.%1$I := int8send(nextval(''standin.dbts''));', col.column_name)
            WHEN 'tinyint' THEN format('IF NEW.%1$I NOT BETWEEN 0 AND 255 THEN PERFORM standin.raise_error(220, ''Arithmetic overflow error for data type tinyint, value = '' || NEW.%1$I || ''.''); END IF;', col.column_name)
            WHEN 'binary' THEN format('IF length(NEW.%1$I) > %2$s THEN PERFORM standin.raise_error(2628, ''String or binary data would be truncated in table, column %1$s.''); END IF; NEW.%1$I := NEW.%1$I || decode(repeat(''00'', greatest(%2$s - length(NEW.%1$I), 0)), ''hex'');', col.column_name, col.max_length)
            WHEN 'varbinary' THEN format('IF length(NEW.%1$I) > %2$s THEN PERFORM standin.raise_error(2628, ''String or binary data would be truncated in table, column %1$s.''); END IF;', col.column_name, col.max_length)
            ELSE '' END;
    END LOOP;
    EXECUTE format('DROP TRIGGER IF EXISTS standin_normalize ON %s', rel);
    EXECUTE format('CREATE OR REPLACE TRIGGER standin_statement BEFORE INSERT OR UPDATE OR DELETE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION standin.statement_marker()', rel);
    IF body <> '' THEN
        EXECUTE format('CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN %s RETURN NEW; END $f$', fn, body);
        EXECUTE format('CREATE TRIGGER standin_normalize BEFORE INSERT OR UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s()', rel, fn);
    END IF;
END $$;

-- ---------------------------------------------------------------- CDC metadata tables
CREATE TABLE cdc.change_tables (
    object_id integer PRIMARY KEY,
    version integer NOT NULL DEFAULT 0,
    source_object_id integer NOT NULL,
    capture_instance varchar(128) NOT NULL UNIQUE,
    start_lsn bytea,
    end_lsn bytea,
    supports_net_changes boolean NOT NULL DEFAULT false,
    has_drop_pending boolean,
    role_name varchar(128),
    index_name varchar(128),
    filegroup_name varchar(128),
    create_date timestamp(3) NOT NULL,
    partition_switch boolean NOT NULL DEFAULT true
);
CREATE TABLE cdc.captured_columns (
    object_id integer NOT NULL,
    column_name varchar(128) NOT NULL,
    column_id integer,
    column_type varchar(128) NOT NULL,
    column_ordinal integer NOT NULL,
    is_computed boolean,
    masking_function varchar(4000)
);
CREATE TABLE cdc.index_columns (
    object_id integer NOT NULL,
    column_name varchar(128) NOT NULL,
    index_ordinal smallint NOT NULL,
    column_id integer NOT NULL
);
CREATE TABLE cdc.lsn_time_mapping (
    start_lsn bytea PRIMARY KEY,
    tran_begin_time timestamp(3),
    tran_end_time timestamp(3),
    tran_id bytea,
    tran_begin_lsn bytea
);
CREATE TABLE cdc.ddl_history (
    source_object_id integer,
    object_id integer,
    required_column_update boolean,
    ddl_command text,
    ddl_lsn bytea,
    ddl_time timestamp(3)
);
-- Source relation of each capture instance, by PostgreSQL oid (object ids are oids).
CREATE VIEW standin.capture_instances AS
    SELECT ct.*, ct.source_object_id::oid::regclass AS source_rel, format('cdc.%I', ct.capture_instance || '_CT') AS change_table
    FROM cdc.change_tables ct;

-- ---------------------------------------------------------------- CDC functions
CREATE FUNCTION sys.fn_cdc_get_max_lsn() RETURNS bytea LANGUAGE sql STABLE AS $$
    SELECT sys.max(start_lsn) FROM cdc.lsn_time_mapping
$$;
CREATE FUNCTION sys.fn_cdc_get_min_lsn(capture_instance text) RETURNS bytea LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT ct.start_lsn FROM cdc.change_tables ct
                     WHERE lower(ct.capture_instance) = lower(fn_cdc_get_min_lsn.capture_instance)
                       AND standin.can_read_instance(ct.capture_instance)),
                    '\x00000000000000000000'::bytea)
$$;
CREATE FUNCTION sys.fn_cdc_increment_lsn(lsn bytea) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT standin.numeric_to_lsn(standin.lsn_to_numeric(lsn) + 1)
$$;
CREATE FUNCTION sys.fn_cdc_decrement_lsn(lsn bytea) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT standin.numeric_to_lsn(standin.lsn_to_numeric(lsn) - 1)
$$;
CREATE FUNCTION sys.fn_cdc_map_lsn_to_time(lsn bytea) RETURNS timestamp(3) LANGUAGE sql STABLE AS $$
    SELECT tran_end_time FROM cdc.lsn_time_mapping WHERE start_lsn = lsn
$$;
CREATE FUNCTION sys.fn_cdc_map_time_to_lsn(relational_operator text, tracking_time timestamp) RETURNS bytea
LANGUAGE plpgsql STABLE AS $$
DECLARE
    op text := lower(relational_operator);
    t timestamp := standin.round_datetime(tracking_time);  -- the parameter is a datetime
BEGIN
    IF op = 'largest less than' THEN
        RETURN (SELECT sys.max(start_lsn) FROM cdc.lsn_time_mapping WHERE tran_end_time < t);
    ELSIF op = 'largest less than or equal' THEN
        RETURN (SELECT sys.max(start_lsn) FROM cdc.lsn_time_mapping WHERE tran_end_time <= t);
    ELSIF op = 'smallest greater than' THEN
        RETURN (SELECT sys.min(start_lsn) FROM cdc.lsn_time_mapping WHERE tran_end_time > t);
    ELSIF op = 'smallest greater than or equal' THEN
        RETURN (SELECT sys.min(start_lsn) FROM cdc.lsn_time_mapping WHERE tran_end_time >= t);
    END IF;
    PERFORM standin.raise_error(313, 'An insufficient number of arguments were supplied for the procedure or function sys.fn_cdc_map_time_to_lsn.');
    RETURN NULL;
END $$;
CREATE FUNCTION sys.fn_cdc_get_column_ordinal(capture_instance text, column_name text) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT cc.column_ordinal FROM cdc.captured_columns cc JOIN cdc.change_tables ct USING (object_id)
    WHERE lower(ct.capture_instance) = lower($1) AND cc.column_name = $2
$$;
CREATE FUNCTION sys.fn_cdc_is_bit_set("position" integer, update_mask bytea) RETURNS boolean LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT $1 BETWEEN 1 AND length($2) * 8
       AND get_bit($2, (length($2) - 1 - ($1 - 1) / 8) * 8 + ($1 - 1) % 8) = 1  -- get_bit counts from a byte's low bit
$$;
CREATE FUNCTION sys.fn_cdc_has_column_changed(capture_instance text, column_name text, update_mask bytea) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT sys.fn_cdc_is_bit_set(sys.fn_cdc_get_column_ordinal($1, $2), $3)
$$;

-- Update mask over captured-column ordinals: bit n-1 from the right, last byte first (SQL Server's layout).
CREATE FUNCTION standin.update_mask(ncols integer, changed integer[]) RETURNS bytea LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    nbytes integer := greatest((ncols + 7) / 8, 1);
    mask bytea := decode(repeat('00', nbytes), 'hex');
    ordinal integer;
BEGIN
    FOREACH ordinal IN ARRAY coalesce(changed, '{}') LOOP
        mask := set_bit(mask, (nbytes - 1 - (ordinal - 1) / 8) * 8 + 7 - (ordinal - 1) % 8, 1);
    END LOOP;
    RETURN mask;
END $$;

-- Error 313 when the query range is outside the capture instance's validity interval.
CREATE FUNCTION standin.check_change_range(ci text, from_lsn bytea, to_lsn bytea, row_filter_option text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    low bytea := (SELECT start_lsn FROM cdc.change_tables WHERE capture_instance = ci);
    high bytea := sys.fn_cdc_get_max_lsn();
BEGIN
    -- cdc.fn_cdc_get_all_changes_<ci>: the caller must be able to read the instance (standin.can_read_instance);
    -- "When the caller does not have permission to view the source data, the function returns error 229
    -- ("The SELECT permission was denied on the object 'fn_cdc_get_all_changes_...', database
    -- '<DatabaseName>', schema 'cdc'.")" (learn.microsoft.com/en-us/sql/relational-databases/system-functions/
    -- cdc-fn-cdc-get-all-changes-capture-instance-transact-sql, Permissions).
    IF NOT standin.can_read_instance(ci) THEN
        PERFORM standin.raise_error(229, format('The SELECT permission was denied on the object ''%s'', database ''%s'', schema ''cdc''.',
                                                lower('fn_cdc_get_all_changes_' || ci), current_database()));
    END IF;
    IF from_lsn IS NULL OR to_lsn IS NULL OR high IS NULL OR low IS NULL
       OR from_lsn < low OR to_lsn > high OR from_lsn > to_lsn
       OR lower(row_filter_option) NOT IN ('all', 'all update old') THEN
        PERFORM standin.raise_error(313, format('An insufficient number of arguments were supplied for the procedure or function cdc.fn_cdc_get_all_changes_%s.', ci));
    END IF;
END $$;

-- ---------------------------------------------------------------- permissions (HAS_PERMS_BY_NAME)
-- Who may read an instance's change data (sys.fn_cdc_get_min_lsn, cdc.fn_cdc_get_all_changes_<ci>,
-- sys.sp_cdc_help_change_data_capture): "Requires membership in the sysadmin fixed server role or
-- db_owner fixed database role. For all other users, requires SELECT permission on all captured
-- columns in the source table and, if a gating role for the capture instance was defined, membership
-- in that database role." (learn.microsoft.com/en-us/sql/relational-databases/system-functions/
-- sys-fn-cdc-get-min-lsn-transact-sql, Permissions; the same rule: "Security Model", Change Enumeration
-- and Metadata Queries, learn.microsoft.com/en-us/previous-versions/sql/sql-server-2008-r2/cc645961(v=sql.105)).
-- Superusers stand for sysadmin/db_owner; SELECT on a column is PostgreSQL's column privilege (a
-- table-level grant includes every column). Reading the change table cdc.<ci>_CT itself is a
-- separate, ordinary SELECT permission (the cdc schema grant).
CREATE FUNCTION standin.can_read_instance(ci text) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM cdc.change_tables WHERE capture_instance = ci;
    IF NOT FOUND THEN RETURN false; END IF;
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN RETURN true; END IF;
    IF EXISTS (SELECT 1 FROM cdc.captured_columns cc
               JOIN pg_attribute a ON a.attrelid = r.source_object_id::oid AND a.attname = cc.column_name
                                  AND NOT a.attisdropped
               WHERE cc.object_id = r.object_id AND NOT has_column_privilege(a.attrelid, a.attnum, 'SELECT')) THEN
        RETURN false;
    END IF;
    RETURN r.role_name IS NULL
        OR (EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r.role_name) AND pg_has_role(current_user, r.role_name, 'MEMBER'));
END $$;
-- Gating roles sp_cdc_enable_table created: "If the role doesn't exist, an attempt is made to create a
-- database role with the specified name. The role name is trimmed of white space at the right of the
-- string before attempting to create the role." (learn.microsoft.com/en-us/sql/relational-databases/
-- system-stored-procedures/sys-sp-cdc-enable-table-transact-sql, @role_name). PostgreSQL roles are
-- the cluster's: SqlServerStandIn.stop() drops these with the database.
CREATE TABLE standin.created_roles (role_name text PRIMARY KEY);
CREATE FUNCTION standin.ensure_gating_role(role_name text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    trimmed text := rtrim(role_name);
BEGIN
    IF trimmed IS NULL OR trimmed = '' THEN RETURN NULL; END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = trimmed) THEN
        EXECUTE format('CREATE ROLE %I NOLOGIN', trimmed);
        INSERT INTO standin.created_roles VALUES (trimmed) ON CONFLICT DO NOTHING;
    END IF;
    RETURN trimmed;
END $$;
-- ALTER ROLE <role> ADD | DROP MEMBER <principal> (translate.py; grammar:
-- learn.microsoft.com/en-us/sql/t-sql/statements/alter-role-transact-sql): PostgreSQL role membership.
CREATE PROCEDURE standin.role_member(role_name text, is_add boolean, principal text) LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = role_name) THEN
        PERFORM standin.raise_error(15151, format('Cannot alter the role ''%s'', because it does not exist or you do not have permission.', role_name));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = principal) THEN
        PERFORM standin.raise_error(15151, format('Cannot add the principal ''%s'', because it does not exist or you do not have permission.', principal));
    END IF;
    IF is_add THEN
        EXECUTE format('GRANT %I TO %I', role_name, principal);
    ELSE
        EXECUTE format('REVOKE %I FROM %I', role_name, principal);
    END IF;
END $$;

-- GRANT / REVOKE <permission> ON SCHEMA::<schema> TO|FROM <principal> (translate.py). SQL Server
-- checks a schema-scope permission on every object in the schema, present and future, and a REVOKE
-- at schema scope takes away only that grant, never object-level grants
-- (https://learn.microsoft.com/en-us/sql/t-sql/statements/grant-schema-permissions-transact-sql,
-- .../revoke-schema-permissions-transact-sql). Emulated with one NOLOGIN role per (database,
-- schema, permission) that holds the permission on every table and view of the schema (and, by
-- default privileges, on those its owner creates later: new change tables); the grant is membership
-- of that role, the revoke ends it. Named ssg_<md5(database)[:8]>_<md5(schema/permission)[:8]>;
-- SqlServerStandIn.stop() drops them with the database.
CREATE FUNCTION standin.schema_permission_role(schema_name text, permission text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT 'ssg_' || substr(md5(current_database()), 1, 8) || '_' || substr(md5(schema_name || '/' || upper(permission)), 1, 8)
$$;
CREATE PROCEDURE standin.schema_permission(is_grant boolean, schema_name text, permissions text[], principals text[])
LANGUAGE plpgsql AS $$
DECLARE
    nsp text := (SELECT nspname FROM pg_namespace WHERE lower(nspname) = lower(schema_name)
                 ORDER BY nspname = schema_name DESC LIMIT 1);
    owner text := (SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = nsp);
    perm text;
    holder text;
    principal text;
BEGIN
    IF nsp IS NULL THEN
        PERFORM standin.raise_error(15151, format('Cannot find the schema ''%s'', because it does not exist or you do not have permission.', schema_name));
    END IF;
    FOREACH perm IN ARRAY permissions LOOP
        perm := upper(perm);
        IF perm NOT IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE', 'REFERENCES') THEN
            PERFORM standin.raise_error(102, format('permission %s on a schema is not emulated (standin)', perm));
        END IF;
        holder := standin.schema_permission_role(nsp, perm);
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = holder) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', holder);
        END IF;
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', nsp, holder);
        EXECUTE format('GRANT %s ON ALL TABLES IN SCHEMA %I TO %I', perm, nsp, holder);
        EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE %s IN SCHEMA %I GRANT %s ON TABLES TO %I', owner, nsp, perm, holder);
        FOREACH principal IN ARRAY principals LOOP
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = principal) THEN
                PERFORM standin.raise_error(15151, format('Cannot find the user ''%s'', because it does not exist or you do not have permission.', principal));
            END IF;
            IF is_grant THEN
                EXECUTE format('GRANT %I TO %I', holder, principal);
            ELSE
                EXECUTE format('REVOKE %I FROM %I', holder, principal);
            END IF;
        END LOOP;
    END LOOP;
END $$;

-- GRANT / REVOKE VIEW SERVER STATE TO|FROM <login>: recorded for HAS_PERMS_BY_NAME only; nothing
-- (sys.dm_server_services included) is gated by it (docs/sqlserver-standin.md, Permissions).
CREATE TABLE standin.server_permissions (principal text NOT NULL, permission text NOT NULL, PRIMARY KEY (principal, permission));
-- SQL Server grants VIEW ANY DATABASE to the server role public by default (Learn, "Server-level roles":
-- public; GRANT Server Permissions).
INSERT INTO standin.server_permissions VALUES ('public', 'VIEW ANY DATABASE');
CREATE PROCEDURE standin.server_permission(is_grant boolean, p_permission text, principals text[])
LANGUAGE plpgsql AS $$
DECLARE
    who text;
BEGIN
    FOREACH who IN ARRAY principals LOOP
        IF who <> 'public' AND NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = who) THEN
            PERFORM standin.raise_error(15151, format('Cannot find the login ''%s'', because it does not exist or you do not have permission.', who));
        END IF;
        IF is_grant THEN
            INSERT INTO standin.server_permissions VALUES (who, upper(p_permission)) ON CONFLICT DO NOTHING;
        ELSE
            DELETE FROM standin.server_permissions sp WHERE sp.principal = who AND sp.permission = upper(p_permission);
        END IF;
    END LOOP;
END $$;

-- ---------------------------------------------------------------- T-SQL built-ins
CREATE FUNCTION sys.db_name() RETURNS varchar(128) LANGUAGE sql STABLE AS $$ SELECT current_database()::varchar $$;
CREATE FUNCTION sys.db_name(database_id integer) RETURNS varchar(128) LANGUAGE sql STABLE AS $$
    SELECT name FROM sys.databases WHERE databases.database_id = $1
$$;
CREATE FUNCTION sys.db_id() RETURNS integer LANGUAGE sql STABLE AS $$ SELECT 5 $$;
CREATE FUNCTION sys.db_id(name text) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT database_id FROM sys.databases WHERE databases.name = $1
$$;
-- 'schema.name' / '[schema].[name]' / 'name' -> the relation, matched case-insensitively like
-- SQL Server's default collation (a database prefix is ignored).
CREATE FUNCTION standin.resolve_object(name text) RETURNS oid LANGUAGE plpgsql STABLE AS $$
DECLARE
    parts text[] := string_to_array(replace(replace(replace(name, '[', ''), ']', ''), '"', ''), '.');
    obj text := parts[array_length(parts, 1)];
    sch text := coalesce(parts[array_length(parts, 1) - 1], 'dbo');
BEGIN
    RETURN (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE lower(c.relname) = lower(obj) AND lower(n.nspname) = lower(sch) AND c.relkind IN ('r', 'p', 'v')
            ORDER BY c.relname = obj DESC LIMIT 1);
END $$;
CREATE FUNCTION sys.object_id(name text, type text DEFAULT NULL) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT standin.resolve_object(name)::integer
$$;
CREATE FUNCTION sys.object_name(object_id integer, database_id integer DEFAULT NULL) RETURNS varchar(128) LANGUAGE sql STABLE AS $$
    SELECT relname::varchar FROM pg_class WHERE oid = $1::oid
$$;
CREATE FUNCTION sys.object_schema_name(object_id integer, database_id integer DEFAULT NULL) RETURNS varchar(128) LANGUAGE sql STABLE AS $$
    SELECT n.nspname::varchar FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1::oid
$$;
CREATE FUNCTION sys.schema_name(schema_id integer DEFAULT NULL) RETURNS varchar(128) LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT nspname::varchar FROM pg_namespace WHERE oid = $1::oid), 'dbo')
$$;
CREATE FUNCTION sys.suser_sname() RETURNS varchar(128) LANGUAGE sql STABLE AS $$ SELECT session_user::varchar $$;
CREATE FUNCTION sys.user_name() RETURNS varchar(128) LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN 'dbo' ELSE current_user END::varchar
$$;
CREATE FUNCTION sys.is_member(role text) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN 1
                WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = role) THEN NULL
                WHEN pg_has_role(current_user, role, 'MEMBER') THEN 1 ELSE 0 END
$$;
CREATE FUNCTION sys.is_srvrolemember(role text) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN lower(role) = 'sysadmin' AND (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN 1 ELSE 0 END
$$;
-- HAS_PERMS_BY_NAME(securable, class, permission[, sub_securable, sub_class])
CREATE FUNCTION sys.has_perms_by_name(securable text, securable_class text, permission text,
                                      sub_securable text DEFAULT NULL, sub_securable_class text DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql STABLE AS $$
DECLARE
    cleaned text := replace(replace(securable, '[', ''), ']', '');
    rel oid;
BEGIN
    IF upper(securable_class) = 'OBJECT' THEN
        rel := standin.resolve_object(securable);
        IF rel IS NULL THEN RETURN NULL; END IF;
        IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN RETURN 1; END IF;
        IF sub_securable IS NOT NULL THEN
            RETURN has_column_privilege(rel, sub_securable, upper(permission))::integer;
        END IF;
        RETURN has_table_privilege(rel, upper(permission))::integer;
    END IF;
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN RETURN 1; END IF;
    IF upper(securable_class) = 'SCHEMA' THEN
        IF upper(permission) = 'SELECT' THEN  -- SELECT on a schema: every table in it
            RETURN (SELECT coalesce(bool_and(has_table_privilege(c.oid, 'SELECT')), true)::integer
                    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE n.nspname = cleaned AND c.relkind IN ('r', 'v'));
        END IF;
        RETURN has_schema_privilege(cleaned, CASE WHEN upper(permission) = 'EXECUTE' THEN 'USAGE' ELSE upper(permission) END)::integer;
    ELSIF upper(securable_class) IN ('DATABASE') THEN
        RETURN has_database_privilege(current_database(), CASE WHEN upper(permission) IN ('CONNECT') THEN 'CONNECT' ELSE 'CREATE' END)::integer;
    ELSIF securable_class IS NULL OR upper(securable_class) = 'SERVER' THEN  -- server permissions (recorded only)
        RETURN EXISTS (SELECT 1 FROM standin.server_permissions sp
                       WHERE sp.principal = current_user AND sp.permission = upper(has_perms_by_name.permission))::integer;
    END IF;
    RETURN NULL;
END $$;
CREATE FUNCTION sys.serverproperty(property text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE lower(property)
        WHEN 'productversion' THEN '16.0.4135.4'
        WHEN 'productmajorversion' THEN '16'
        WHEN 'productlevel' THEN 'RTM'
        WHEN 'edition' THEN 'Developer Edition (64-bit)'
        WHEN 'engineedition' THEN '3'
        WHEN 'servername' THEN (SELECT server_name FROM standin.settings)
        WHEN 'machinename' THEN (SELECT server_name FROM standin.settings)
        WHEN 'collation' THEN 'SQL_Latin1_General_CP1_CI_AS'
        WHEN 'ishadrenabled' THEN '0'
        END
$$;
CREATE FUNCTION sys.atat_servername() RETURNS varchar(128) LANGUAGE sql STABLE AS $$ SELECT server_name::varchar FROM standin.settings $$;
CREATE FUNCTION sys.atat_version() RETURNS varchar(300) LANGUAGE sql STABLE AS $$
    SELECT ('Microsoft SQL Server 2022 (RTM-CU15) (KB5041321) - 16.0.4135.4 (X64) ' || chr(10)
            || '	Jul 10 2024 14:09:09 ' || chr(10) || '	Copyright (C) 2022 Microsoft Corporation' || chr(10)
            || '	Developer Edition (64-bit) on Linux (stand-in: PostgreSQL ' || current_setting('server_version') || ')')::varchar
$$;
CREATE FUNCTION sys.atat_spid() RETURNS smallint LANGUAGE sql STABLE AS $$ SELECT (pg_backend_pid() % 32000)::smallint $$;
CREATE FUNCTION sys.atat_trancount() RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pg_current_xact_id_if_assigned() IS NULL AND now() = statement_timestamp() THEN 0 ELSE 1 END
$$;
CREATE FUNCTION sys.atat_dbts() RETURNS bytea LANGUAGE sql STABLE AS $$
    SELECT int8send(last_value) FROM standin.dbts
$$;
CREATE FUNCTION sys.atat_language() RETURNS varchar(128) LANGUAGE sql STABLE AS $$ SELECT 'us_english'::varchar $$;
-- Server-local clock in SQL Server's types; clock.sql (loaded after this file) replaces these with
-- the stand-in's settable zone and clock.
CREATE FUNCTION sys.getdate() RETURNS timestamp(3) LANGUAGE sql STABLE AS $$ SELECT standin.round_datetime(clock_timestamp()::timestamp) $$;
CREATE FUNCTION sys.getutcdate() RETURNS timestamp(3) LANGUAGE sql STABLE AS $$ SELECT standin.round_datetime((clock_timestamp() AT TIME ZONE 'UTC')::timestamp) $$;
CREATE FUNCTION sys.sysdatetime() RETURNS timestamp(6) LANGUAGE sql STABLE AS $$ SELECT clock_timestamp()::timestamp $$;
CREATE FUNCTION sys.sysutcdatetime() RETURNS timestamp(6) LANGUAGE sql STABLE AS $$ SELECT (clock_timestamp() AT TIME ZONE 'UTC')::timestamp $$;
CREATE FUNCTION sys.sysdatetimeoffset() RETURNS timestamptz LANGUAGE sql STABLE AS $$ SELECT clock_timestamp() $$;
CREATE FUNCTION sys.todatetimeoffset(ts timestamp, offset_minutes integer) RETURNS timestamptz LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (ts - make_interval(mins => offset_minutes)) AT TIME ZONE 'UTC'
$$;
CREATE FUNCTION sys.tz_offset_minutes(ts timestamptz) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT (extract(timezone FROM ts) / 60)::integer
$$;
CREATE FUNCTION sys.newid() RETURNS uuid LANGUAGE sql VOLATILE AS $$ SELECT gen_random_uuid() $$;

-- CONVERT(varchar, value, style) for the styles a CDC reader uses to keep full precision.
-- 121: yyyy-mm-dd hh:mi:ss.fffffff (fraction digits of the type's scale); 126: yyyy-mm-ddThh:mi:ss.fffffff
-- (datetime: .mmm, omitted when zero); 127: as 126 with Z/offset for datetimeoffset;
-- 120: yyyy-mm-dd hh:mi:ss; 23: yyyy-mm-dd; 108: hh:mi:ss.
CREATE FUNCTION standin.fraction(us integer, digits integer) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN digits <= 0 THEN '' ELSE '.' || substr(lpad(us::text, 6, '0') || '0', 1, digits) END
$$;
CREATE FUNCTION standin.convert_temporal(ts timestamp, style integer, digits integer, is_datetime boolean, tz_offset_minutes integer)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    us integer := (extract(microseconds FROM ts)::bigint % 1000000)::integer;
    base text := to_char(ts, 'YYYY-MM-DD');
    clock text := to_char(ts, 'HH24:MI:SS');
    frac text;
    tz text := '';
BEGIN
    IF ts IS NULL THEN RETURN NULL; END IF;
    IF is_datetime THEN
        frac := '.' || lpad((us / 1000)::text, 3, '0');  -- datetime always prints 3 digits in 121
    ELSE
        frac := standin.fraction(us, digits);
    END IF;
    IF tz_offset_minutes IS NOT NULL THEN
        tz := CASE WHEN tz_offset_minutes >= 0 THEN '+' ELSE '-' END
              || lpad((abs(tz_offset_minutes) / 60)::text, 2, '0') || ':' || lpad((abs(tz_offset_minutes) % 60)::text, 2, '0');
    END IF;
    IF style IN (121, 21) THEN
        RETURN base || ' ' || clock || frac || CASE WHEN tz <> '' THEN ' ' || tz ELSE '' END;
    ELSIF style IN (126, 127) THEN
        IF is_datetime AND us = 0 THEN frac := ''; END IF;  -- 126 drops a zero fraction for datetime (documented)
        IF style = 127 AND tz_offset_minutes = 0 THEN tz := 'Z'; END IF;
        RETURN base || 'T' || clock || frac || tz;
    ELSIF style IN (120, 20) THEN
        RETURN base || ' ' || clock || CASE WHEN tz <> '' THEN ' ' || tz ELSE '' END;
    ELSIF style = 23 THEN
        RETURN base;
    ELSIF style IN (108, 8) THEN
        RETURN clock;
    END IF;
    PERFORM standin.raise_error(281, format('%s is not a valid style number when converting from datetime to a character string.', style));
    RETURN NULL;
END $$;
CREATE FUNCTION sys.convert_style(value timestamp, style integer, digits integer DEFAULT 7, is_datetime boolean DEFAULT false) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT standin.convert_temporal(value, style, digits, is_datetime, NULL) $$;
CREATE FUNCTION sys.convert_style(value timestamptz, style integer, digits integer DEFAULT 7, is_datetime boolean DEFAULT false) RETURNS text
LANGUAGE sql STABLE AS $$
    -- the stand-in keeps no per-value offset: values print in UTC (+00:00)
    SELECT standin.convert_temporal((value AT TIME ZONE 'UTC')::timestamp, style, digits, false, 0)
$$;
CREATE FUNCTION sys.convert_style(value date, style integer, digits integer DEFAULT 0, is_datetime boolean DEFAULT false) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN style IN (120, 121, 126, 127, 23, 20, 21) THEN to_char(value, 'YYYY-MM-DD')
                ELSE standin.convert_temporal(value::timestamp, style, 0, false, NULL) END
$$;
CREATE FUNCTION sys.convert_style(value time, style integer, digits integer DEFAULT 7, is_datetime boolean DEFAULT false) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN style IN (108, 8, 20, 120) THEN to_char(value, 'HH24:MI:SS')
                ELSE to_char(value, 'HH24:MI:SS') || standin.fraction((extract(microseconds FROM value)::bigint % 1000000)::integer, digits) END
$$;
-- binary -> hex text: style 1 keeps the 0x prefix, style 2 drops it (uppercase, like SQL Server).
CREATE FUNCTION sys.convert_style(value bytea, style integer, digits integer DEFAULT 0, is_datetime boolean DEFAULT false) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE style WHEN 1 THEN '0x' || upper(encode(value, 'hex')) WHEN 2 THEN upper(encode(value, 'hex'))
                      ELSE convert_from(value, 'UTF8') END
$$;
CREATE FUNCTION sys.convert_style(value numeric, style integer, digits integer DEFAULT 0, is_datetime boolean DEFAULT false) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT value::text $$;
CREATE FUNCTION sys.convert_style(value text, style integer, digits integer DEFAULT 0, is_datetime boolean DEFAULT false) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT value $$;
-- CONVERT(binary(10), '0x...', 1): hex text -> binary
CREATE FUNCTION sys.convert_to_binary(value text, style integer) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN style = 1 THEN decode(substr(value, 3), 'hex') WHEN style = 2 THEN decode(value, 'hex')
                ELSE convert_to(value, 'UTF8') END
$$;

-- ---------------------------------------------------------------- catalog views
CREATE VIEW sys.databases AS
    SELECT name::varchar(128), database_id, source_database_id, owner_sid, create_date, compatibility_level,
           collation_name, user_access, user_access_desc, is_read_only, state, state_desc,
           snapshot_isolation_state, snapshot_isolation_state_desc, is_read_committed_snapshot_on,
           recovery_model, recovery_model_desc, is_cdc_enabled, is_broker_enabled
    FROM (
        SELECT current_database() AS name, 5 AS database_id, NULL::integer AS source_database_id, '\x01'::bytea AS owner_sid,
               (SELECT (pg_stat_file('PG_VERSION')).modification)::timestamp(3) AS create_date,
               160::smallint AS compatibility_level, 'SQL_Latin1_General_CP1_CI_AS'::varchar(128) AS collation_name,
               0::smallint AS user_access, 'MULTI_USER'::varchar(60) AS user_access_desc, false AS is_read_only,
               0::smallint AS state, 'ONLINE'::varchar(60) AS state_desc,
               s.allow_snapshot_isolation::integer::smallint AS snapshot_isolation_state,
               (CASE WHEN s.allow_snapshot_isolation THEN 'ON' ELSE 'OFF' END)::varchar(60) AS snapshot_isolation_state_desc,
               s.is_read_committed_snapshot_on, 1::smallint AS recovery_model, 'FULL'::varchar(60) AS recovery_model_desc,
               s.is_cdc_enabled, false AS is_broker_enabled
        FROM standin.settings s
        UNION ALL
        SELECT d.name, d.id, NULL, '\x01'::bytea, '2003-04-08 09:13:36.390'::timestamp(3), 160::smallint,
               'SQL_Latin1_General_CP1_CI_AS', 0::smallint, 'MULTI_USER', false, 0::smallint, 'ONLINE',
               (d.name IN ('master', 'msdb'))::integer::smallint,
               CASE WHEN d.name IN ('master', 'msdb') THEN 'ON' ELSE 'OFF' END, false,
               CASE WHEN d.name = 'model' THEN 1 ELSE 3 END::smallint, CASE WHEN d.name = 'model' THEN 'FULL' ELSE 'SIMPLE' END,
               false, d.name = 'msdb'
        FROM (VALUES ('master', 1), ('tempdb', 2), ('model', 3), ('msdb', 4)) AS d(name, id)
    ) AS all_databases;

-- A database other than master and tempdb shows only to its owner, or with VIEW ANY DATABASE
-- (learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sys-database-recovery-status-transact-sql);
-- the server role public holds VIEW ANY DATABASE unless it is revoked (standin.server_permissions' 'public' row).
CREATE VIEW sys.database_recovery_status AS
    SELECT 5 AS database_id, database_guid, database_guid AS family_guid, NULL::bytea AS last_log_backup_lsn,
           NULL::uuid AS recovery_fork_guid, NULL::uuid AS first_recovery_fork_guid, NULL::bytea AS fork_point_lsn
    FROM standin.settings
    WHERE (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       OR EXISTS (SELECT 1 FROM standin.server_permissions sp
                  WHERE sp.permission = 'VIEW ANY DATABASE' AND sp.principal IN (current_user, 'public'));

CREATE VIEW standin.user_namespaces AS
    SELECT oid, nspname FROM pg_namespace
    WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast', 'standin', 'sys', 'INFORMATION_SCHEMA', 'public')
      AND nspname NOT LIKE 'pg_temp%' AND nspname NOT LIKE 'pg_toast_temp%';

CREATE VIEW sys.schemas AS
    SELECT nspname::varchar(128) AS name, oid::integer AS schema_id, 1 AS principal_id FROM pg_namespace
    WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast', 'standin', 'public', 'INFORMATION_SCHEMA')
      AND nspname NOT LIKE 'pg_temp%' AND nspname NOT LIKE 'pg_toast_temp%';

CREATE VIEW sys.objects AS
    SELECT c.relname::varchar(128) AS name, c.oid::integer AS object_id, NULL::integer AS principal_id,
           c.relnamespace::integer AS schema_id, 0 AS parent_object_id,
           (CASE c.relkind WHEN 'v' THEN 'V ' ELSE 'U ' END)::char(2) AS type,
           (CASE c.relkind WHEN 'v' THEN 'VIEW' ELSE 'USER_TABLE' END)::varchar(60) AS type_desc,
           (n.nspname = 'cdc') AS is_ms_shipped
    FROM pg_class c JOIN standin.user_namespaces n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p', 'v');

CREATE VIEW sys.tables AS
    SELECT c.relname::varchar(128) AS name, c.oid::integer AS object_id, NULL::integer AS principal_id,
           c.relnamespace::integer AS schema_id, 0 AS parent_object_id, 'U '::char(2) AS type,
           'USER_TABLE'::varchar(60) AS type_desc, (n.nspname = 'cdc') AS is_ms_shipped,
           EXISTS (SELECT 1 FROM cdc.change_tables ct WHERE ct.source_object_id = c.oid::integer) AS is_tracked_by_cdc,
           (c.relpersistence = 't') AS is_memory_optimized, 0::smallint AS temporal_type
    FROM pg_class c JOIN standin.user_namespaces n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p');

CREATE VIEW sys.types AS
    SELECT t.name::varchar(128), t.system_type_id::smallint AS system_type_id, t.user_type_id, 4 AS schema_id,
           t.max_length::smallint, t.precision::smallint AS "precision", t.scale::smallint, true AS is_nullable,
           (t.user_type_id <> t.system_type_id) AS is_user_defined
    FROM (VALUES ('image', 34, 34, 16, 0, 0), ('text', 35, 35, 16, 0, 0), ('uniqueidentifier', 36, 36, 16, 0, 0),
                 ('date', 40, 40, 3, 10, 0), ('time', 41, 41, 5, 16, 7), ('datetime2', 42, 42, 8, 27, 7),
                 ('datetimeoffset', 43, 43, 10, 34, 7), ('tinyint', 48, 48, 1, 3, 0), ('smallint', 52, 52, 2, 5, 0),
                 ('int', 56, 56, 4, 10, 0), ('smalldatetime', 58, 58, 4, 16, 0), ('real', 59, 59, 4, 24, 0),
                 ('money', 60, 60, 8, 19, 4), ('datetime', 61, 61, 8, 23, 3), ('float', 62, 62, 8, 53, 0),
                 ('sql_variant', 98, 98, 8016, 0, 0), ('ntext', 99, 99, 16, 0, 0), ('bit', 104, 104, 1, 1, 0),
                 ('decimal', 106, 106, 17, 38, 38), ('numeric', 108, 108, 17, 38, 38), ('smallmoney', 122, 122, 4, 10, 4),
                 ('bigint', 127, 127, 8, 19, 0), ('hierarchyid', 240, 128, 892, 0, 0), ('geometry', 240, 129, -1, 0, 0),
                 ('geography', 240, 130, -1, 0, 0), ('varbinary', 165, 165, 8000, 0, 0), ('varchar', 167, 167, 8000, 0, 0),
                 ('binary', 173, 173, 8000, 0, 0), ('char', 175, 175, 8000, 0, 0), ('timestamp', 189, 189, 8, 0, 0),
                 ('nvarchar', 231, 231, 8000, 0, 0), ('nchar', 239, 239, 8000, 0, 0), ('xml', 241, 241, -1, 0, 0),
                 ('sysname', 231, 256, 256, 0, 0))
         AS t(name, system_type_id, user_type_id, max_length, precision, scale);

-- Columns of tables created through the stand-in report their declared SQL Server type; others
-- (the emulation's own tables) a best-effort mapping of the PostgreSQL type.
CREATE VIEW standin.all_columns AS
    SELECT c.oid AS relid, n.nspname AS schema_name, c.relname AS table_name, a.attname AS column_name, a.attnum AS column_id,
           NOT a.attnotnull AS is_nullable, coalesce(d.is_identity, a.attidentity <> '') AS is_identity,
           coalesce(d.type_name, CASE t.typname WHEN 'int4' THEN 'int' WHEN 'int8' THEN 'bigint' WHEN 'int2' THEN 'smallint'
                WHEN 'bool' THEN 'bit' WHEN 'bytea' THEN 'varbinary' WHEN 'timestamp' THEN 'datetime' WHEN 'numeric' THEN 'numeric'
                WHEN 'uuid' THEN 'uniqueidentifier' WHEN 'float8' THEN 'float' WHEN 'float4' THEN 'real' ELSE 'nvarchar' END) AS type_name,
           coalesce(d.declared, format_type(a.atttypid, a.atttypmod)) AS declared,
           coalesce(d.max_length, CASE WHEN a.attlen > 0 THEN a.attlen ELSE -1 END) AS max_length,
           coalesce(d.precision, 0) AS "precision", coalesce(d.scale, 0) AS scale,
           d.char_max_length, d.datetime_precision, pg_get_expr(ad.adbin, ad.adrelid) AS column_default
    FROM pg_class c
    JOIN standin.user_namespaces n ON n.oid = c.relnamespace
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    JOIN pg_type t ON t.oid = a.atttypid
    LEFT JOIN standin.declared_columns d ON d.relid = c.oid AND d.column_name = a.attname
    LEFT JOIN pg_attrdef ad ON ad.adrelid = c.oid AND ad.adnum = a.attnum
    WHERE c.relkind IN ('r', 'p', 'v');

CREATE VIEW sys.columns AS
    SELECT ac.relid::integer AS object_id, ac.column_name::varchar(128) AS name, ac.column_id::integer AS column_id,
           ty.system_type_id::smallint AS system_type_id, ty.user_type_id, ac.max_length::smallint AS max_length,
           ac.precision::smallint AS "precision", ac.scale::smallint AS scale,
           (CASE WHEN ac.type_name IN ('char', 'varchar', 'nchar', 'nvarchar', 'text', 'ntext', 'sql_variant')
                 THEN 'SQL_Latin1_General_CP1_CI_AS' END)::varchar(128) AS collation_name,
           ac.is_nullable, false AS is_ansi_padded, false AS is_rowguidcol, ac.is_identity,
           standin.is_computed(ac.relid, ac.column_name) AS is_computed,
           false AS is_filestream, false AS is_replicated, false AS is_non_sql_subscribed, false AS is_merge_published,
           false AS is_dts_replicated, false AS is_xml_document, 0 AS xml_collection_id, 0 AS default_object_id,
           0 AS rule_object_id, false AS is_sparse, false AS is_column_set
    FROM standin.all_columns ac
    JOIN sys.types ty ON ty.name = ac.type_name;

CREATE VIEW "INFORMATION_SCHEMA"."TABLES" AS
    SELECT current_database()::varchar(128) AS "TABLE_CATALOG", n.nspname::varchar(128) AS "TABLE_SCHEMA",
           c.relname::varchar(128) AS "TABLE_NAME",
           (CASE c.relkind WHEN 'v' THEN 'VIEW' ELSE 'BASE TABLE' END)::varchar(10) AS "TABLE_TYPE"
    FROM pg_class c JOIN standin.user_namespaces n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p', 'v');

CREATE VIEW "INFORMATION_SCHEMA"."COLUMNS" AS
    SELECT current_database()::varchar(128) AS "TABLE_CATALOG", ac.schema_name::varchar(128) AS "TABLE_SCHEMA",
           ac.table_name::varchar(128) AS "TABLE_NAME", ac.column_name::varchar(128) AS "COLUMN_NAME",
           ac.column_id::integer AS "ORDINAL_POSITION", ac.column_default::varchar(4000) AS "COLUMN_DEFAULT",
           (CASE WHEN ac.is_nullable THEN 'YES' ELSE 'NO' END)::varchar(3) AS "IS_NULLABLE",
           ac.type_name::varchar(128) AS "DATA_TYPE",
           ac.char_max_length AS "CHARACTER_MAXIMUM_LENGTH",
           (CASE WHEN ac.char_max_length IS NULL THEN NULL
                 WHEN ac.char_max_length = -1 THEN -1
                 WHEN ac.type_name IN ('nchar', 'nvarchar') THEN ac.char_max_length * 2
                 WHEN ac.type_name = 'ntext' THEN 2147483646 ELSE ac.char_max_length END) AS "CHARACTER_OCTET_LENGTH",
           (CASE WHEN ac.type_name IN ('tinyint', 'smallint', 'int', 'bigint', 'decimal', 'numeric', 'money', 'smallmoney', 'real', 'float')
                 THEN ac.precision END)::smallint AS "NUMERIC_PRECISION",
           (CASE WHEN ac.type_name IN ('real', 'float') THEN 2
                 WHEN ac.type_name IN ('tinyint', 'smallint', 'int', 'bigint', 'decimal', 'numeric', 'money', 'smallmoney') THEN 10 END)::smallint AS "NUMERIC_PRECISION_RADIX",
           (CASE WHEN ac.type_name IN ('tinyint', 'smallint', 'int', 'bigint', 'decimal', 'numeric', 'money', 'smallmoney')
                 THEN ac.scale END) AS "NUMERIC_SCALE",
           ac.datetime_precision::smallint AS "DATETIME_PRECISION",
           (CASE WHEN ac.type_name IN ('char', 'varchar', 'text') THEN 'iso_1' WHEN ac.type_name IN ('nchar', 'nvarchar', 'ntext') THEN 'UNICODE' END)::varchar(128) AS "CHARACTER_SET_NAME",
           (CASE WHEN ac.type_name IN ('char', 'varchar', 'nchar', 'nvarchar', 'text', 'ntext') THEN 'SQL_Latin1_General_CP1_CI_AS' END)::varchar(128) AS "COLLATION_NAME"
    FROM standin.all_columns ac;

CREATE VIEW "INFORMATION_SCHEMA"."TABLE_CONSTRAINTS" AS
    SELECT current_database()::varchar(128) AS "CONSTRAINT_CATALOG", n.nspname::varchar(128) AS "CONSTRAINT_SCHEMA",
           con.conname::varchar(128) AS "CONSTRAINT_NAME", current_database()::varchar(128) AS "TABLE_CATALOG",
           n.nspname::varchar(128) AS "TABLE_SCHEMA", c.relname::varchar(128) AS "TABLE_NAME",
           (CASE con.contype WHEN 'p' THEN 'PRIMARY KEY' WHEN 'u' THEN 'UNIQUE' WHEN 'f' THEN 'FOREIGN KEY' ELSE 'CHECK' END)::varchar(11) AS "CONSTRAINT_TYPE",
           'NO'::varchar(2) AS "IS_DEFERRABLE", 'NO'::varchar(2) AS "INITIALLY_DEFERRED"
    FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid JOIN standin.user_namespaces n ON n.oid = c.relnamespace
    WHERE con.contype IN ('p', 'u', 'f', 'c');

CREATE VIEW "INFORMATION_SCHEMA"."KEY_COLUMN_USAGE" AS
    SELECT current_database()::varchar(128) AS "CONSTRAINT_CATALOG", n.nspname::varchar(128) AS "CONSTRAINT_SCHEMA",
           con.conname::varchar(128) AS "CONSTRAINT_NAME", current_database()::varchar(128) AS "TABLE_CATALOG",
           n.nspname::varchar(128) AS "TABLE_SCHEMA", c.relname::varchar(128) AS "TABLE_NAME",
           a.attname::varchar(128) AS "COLUMN_NAME", k.ordinality::integer AS "ORDINAL_POSITION"
    FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid JOIN standin.user_namespaces n ON n.oid = c.relnamespace
    CROSS JOIN LATERAL unnest(con.conkey) WITH ORDINALITY AS k(attnum, ordinality)
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
    WHERE con.contype IN ('p', 'u', 'f');

CREATE VIEW sys.indexes AS
    SELECT i.indrelid::integer AS object_id, ic.relname::varchar(128) AS name,
           (row_number() OVER (PARTITION BY i.indrelid ORDER BY i.indisprimary DESC, ic.relname))::integer AS index_id,
           (CASE WHEN i.indisprimary THEN 1 ELSE 2 END)::smallint AS type,
           (CASE WHEN i.indisprimary THEN 'CLUSTERED' ELSE 'NONCLUSTERED' END)::varchar(60) AS type_desc,
           i.indisunique AS is_unique, i.indisprimary AS is_primary_key,
           EXISTS (SELECT 1 FROM pg_constraint con WHERE con.conindid = i.indexrelid AND con.contype = 'u') AS is_unique_constraint,
           false AS is_disabled, false AS is_hypothetical
    FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_class c ON c.oid = i.indrelid
    JOIN standin.user_namespaces n ON n.oid = c.relnamespace;

CREATE VIEW sys.index_columns AS
    SELECT ix.object_id, ix.index_id, k.ordinality::integer AS index_column_id, k.attnum::integer AS column_id,
           k.ordinality::smallint AS key_ordinal, 0::smallint AS partition_ordinal, false AS is_descending_key,
           false AS is_included_column
    FROM sys.indexes ix JOIN pg_class ic ON ic.relname = ix.name AND ic.relkind = 'i'
    JOIN pg_index i ON i.indexrelid = ic.oid AND i.indrelid = ix.object_id::oid
    CROSS JOIN LATERAL unnest(i.indkey::smallint[]) WITH ORDINALITY AS k(attnum, ordinality);

-- sys.dm_server_services needs VIEW SERVER STATE (Learn, sys.dm_server_services, "Permissions");
-- without it SQL Server fails the query with error 300 (then 297). sysadmin (the superuser) has it.
CREATE FUNCTION standin.require_view_server_state() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AND NOT EXISTS (
        SELECT 1 FROM standin.server_permissions sp WHERE sp.principal = current_user AND sp.permission = 'VIEW SERVER STATE'
    ) THEN
        PERFORM standin.raise_error(300, 'VIEW SERVER STATE permission was denied on object ''server'', database ''master''.');
    END IF;
    RETURN true;
END $$;

CREATE VIEW sys.dm_server_services AS
    SELECT 'SQL Server (MSSQLSERVER)'::varchar(256) AS servicename, 2 AS startup_type, 'Automatic'::varchar(256) AS startup_type_desc,
           4 AS status, 'Running'::varchar(256) AS status_desc, 1 AS process_id
    UNION ALL
    SELECT 'SQL Server Agent (MSSQLSERVER)', 2, 'Automatic',
           CASE WHEN agent_running THEN 4 ELSE 1 END, CASE WHEN agent_running THEN 'Running' ELSE 'Stopped' END,
           CASE WHEN agent_running THEN 2 END
    FROM standin.settings WHERE standin.require_view_server_state();

CREATE VIEW sys.dm_cdc_log_scan_sessions AS SELECT * FROM standin.log_scan_sessions;
CREATE VIEW sys.dm_cdc_errors AS
    SELECT NULL::integer AS session_id, NULL::integer AS phase_number, NULL::timestamp(3) AS entry_time,
           NULL::integer AS error_number, NULL::integer AS error_severity, NULL::integer AS error_state,
           NULL::varchar(1024) AS error_message, NULL::varchar(23) AS start_lsn, NULL::varchar(23) AS begin_lsn,
           NULL::varchar(23) AS sequence_value
    WHERE false;

-- ---------------------------------------------------------------- CDC procedures
CREATE PROCEDURE sys.sp_cdc_enable_db() LANGUAGE plpgsql AS $$
BEGIN
    UPDATE standin.settings SET is_cdc_enabled = true;
    IF NOT EXISTS (SELECT 1 FROM standin.msdb_cdc_jobs) THEN
        INSERT INTO standin.msdb_cdc_jobs (job_type, maxtrans, maxscans, continuous, pollinginterval, retention, threshold)
        VALUES ('capture', 500, 10, true, 5, 0, 0), ('cleanup', 0, 0, false, 0, 4320, 5000);
    END IF;
END $$;

CREATE FUNCTION standin.new_object_id() RETURNS integer LANGUAGE sql AS $$
    UPDATE standin.settings SET next_object_id = next_object_id + 1 RETURNING next_object_id
$$;

CREATE PROCEDURE sys.sp_cdc_enable_table(
    source_schema text, source_name text, role_name text,
    capture_instance text DEFAULT NULL, supports_net_changes integer DEFAULT NULL, index_name text DEFAULT NULL,
    captured_column_list text DEFAULT NULL, filegroup_name text DEFAULT NULL, allow_partition_switch integer DEFAULT 1)
LANGUAGE plpgsql AS $$
DECLARE
    rel regclass := to_regclass(format('%I.%I', source_schema, source_name));
    ci text := coalesce(capture_instance, source_schema || '_' || source_name);
    ct_oid integer;
    ct_name text;
    cols text := '';
    wanted text[];
    col record;
    ordinal integer := 0;
    key_index text;
BEGIN
    IF NOT (SELECT is_cdc_enabled FROM standin.settings) THEN
        PERFORM standin.raise_error(22901, format('The database ''%s'' is not enabled for Change Data Capture. Ensure that the correct database context is set and retry the operation. To report on the databases enabled for Change Data Capture, query the is_cdc_enabled column in the sys.databases catalog view.', current_database()));
    END IF;
    IF rel IS NULL THEN
        PERFORM standin.raise_error(22931, format('Source table ''%s.%s'' does not exist in the current database. Ensure that the correct database context is set. Specify a valid schema and table name for the database.', source_schema, source_name));
    END IF;
    IF EXISTS (SELECT 1 FROM cdc.change_tables WHERE lower(change_tables.capture_instance) = lower(ci)) THEN
        PERFORM standin.raise_error(22926, format('Could not create a capture instance because the capture instance name ''%s'' already exists in the current database. Specify an explicit unique name for the parameter @capture_instance.', ci));
    END IF;
    IF (SELECT count(*) FROM cdc.change_tables WHERE source_object_id = rel::oid::integer) >= 2 THEN
        PERFORM standin.raise_error(22962, format('Two capture instances already exist for source table ''%s.%s''. A table can have at most two capture instances. If the current tracking options are not appropriate, disable change tracking for the obsolete instance by using sys.sp_cdc_disable_table and retry the operation.', source_schema, source_name));
    END IF;
    IF captured_column_list IS NOT NULL THEN
        wanted := ARRAY(SELECT btrim(btrim(x), '[]"') FROM unnest(string_to_array(captured_column_list, ',')) AS x);
    END IF;
    SELECT ic.relname INTO key_index FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
    WHERE i.indrelid = rel AND (CASE WHEN index_name IS NULL THEN i.indisprimary ELSE ic.relname = index_name END);
    IF coalesce(supports_net_changes, CASE WHEN key_index IS NULL THEN 0 ELSE 1 END) = 1 AND key_index IS NULL THEN
        PERFORM standin.raise_error(22939, format('The parameter @supports_net_changes is set to 1, but the source table does not have a primary key defined and no alternate unique index has been specified.'));
    END IF;
    role_name := standin.ensure_gating_role(role_name);
    -- Before-images of updates and deletes need every column in the WAL.
    EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', rel);
    ct_name := ci || '_CT';
    ct_oid := NULL;
    FOR col IN SELECT ac.*, format_type(a.atttypid, a.atttypmod) AS pg_type
               FROM standin.all_columns ac JOIN pg_attribute a ON a.attrelid = ac.relid AND a.attname = ac.column_name
               WHERE ac.relid = rel::oid ORDER BY ac.column_id LOOP
        CONTINUE WHEN wanted IS NOT NULL AND NOT col.column_name = ANY (wanted);
        cols := cols || format(', %I %s', col.column_name, col.pg_type);
    END LOOP;
    EXECUTE format('CREATE TABLE cdc.%I ("__$start_lsn" bytea NOT NULL, "__$end_lsn" bytea, "__$seqval" bytea NOT NULL, '
                   '"__$operation" integer NOT NULL, "__$update_mask" bytea%s, "__$command_id" integer)', ct_name, cols);
    EXECUTE format('CREATE INDEX %I ON cdc.%I ("__$start_lsn", "__$seqval", "__$operation")', ct_name || '_idx', ct_name);
    ct_oid := to_regclass(format('cdc.%I', ct_name))::oid::integer;
    -- change table columns report SQL Server types too (rowversion is binary(8) there)
    INSERT INTO standin.declared_columns
    SELECT ct_oid::oid, v.column_name, v.declared, v.type_name, v.max_length, v.precision, v.scale, NULL, NULL, NULL, false
    FROM (VALUES ('__$start_lsn', 'binary(10)', 'binary', 10, 0, 0), ('__$end_lsn', 'binary(10)', 'binary', 10, 0, 0),
                 ('__$seqval', 'binary(10)', 'binary', 10, 0, 0), ('__$operation', 'int', 'int', 4, 10, 0),
                 ('__$update_mask', 'varbinary(128)', 'varbinary', 128, 0, 0), ('__$command_id', 'int', 'int', 4, 10, 0))
         AS v(column_name, declared, type_name, max_length, precision, scale);
    INSERT INTO standin.declared_columns
    SELECT ct_oid::oid, d.column_name,
           CASE WHEN d.type_name = 'timestamp' THEN 'binary(8)' ELSE d.declared END,
           CASE WHEN d.type_name = 'timestamp' THEN 'binary' ELSE d.type_name END,
           d.max_length, d.precision, d.scale, d.char_max_length, d.datetime_precision, NULL, false
    FROM standin.declared_columns d
    WHERE d.relid = rel::oid AND (wanted IS NULL OR d.column_name = ANY (wanted));
    INSERT INTO cdc.change_tables (object_id, source_object_id, capture_instance, start_lsn, supports_net_changes,
                                   has_drop_pending, role_name, index_name, filegroup_name, create_date, partition_switch)
    VALUES (ct_oid, rel::oid::integer, ci, standin.lsn_from_pg(pg_current_wal_insert_lsn()),
            coalesce(supports_net_changes, CASE WHEN key_index IS NULL THEN 0 ELSE 1 END) = 1, NULL,
            role_name, key_index, filegroup_name, standin.round_datetime(clock_timestamp()::timestamp), allow_partition_switch = 1);
    FOR col IN SELECT ac.column_name, ac.column_id, ac.declared, ac.type_name
               FROM standin.all_columns ac WHERE ac.relid = rel::oid ORDER BY ac.column_id LOOP
        CONTINUE WHEN wanted IS NOT NULL AND NOT col.column_name = ANY (wanted);
        ordinal := ordinal + 1;
        INSERT INTO cdc.captured_columns (object_id, column_name, column_id, column_type, column_ordinal, is_computed)
        VALUES (ct_oid, col.column_name, col.column_id, col.type_name, ordinal, standin.is_computed(rel::oid, col.column_name));
    END LOOP;
    IF key_index IS NOT NULL THEN
        INSERT INTO cdc.index_columns (object_id, column_name, index_ordinal, column_id)
        SELECT ct_oid, a.attname, k.ordinality, a.attnum
        FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
        CROSS JOIN LATERAL unnest(i.indkey::smallint[]) WITH ORDINALITY AS k(attnum, ordinality)
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
        WHERE i.indrelid = rel AND ic.relname = key_index;
    END IF;
    PERFORM standin.create_change_function(ci);
END $$;

-- cdc.fn_cdc_get_all_changes_<ci>: named in lower case (T-SQL names are case-insensitive; the
-- translator lower-cases the function name).
CREATE FUNCTION standin.create_change_function(ci text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    ct text := format('cdc.%I', ci || '_CT');
    out_cols text := '"__$start_lsn" bytea, "__$seqval" bytea, "__$operation" integer, "__$update_mask" bytea';
    sel_cols text := 'c."__$start_lsn", c."__$seqval", c."__$operation", c."__$update_mask"';
    col record;
BEGIN
    FOR col IN SELECT cc.column_name, format_type(a.atttypid, a.atttypmod) AS pg_type
               FROM cdc.captured_columns cc JOIN cdc.change_tables t USING (object_id)
               JOIN pg_attribute a ON a.attrelid = t.object_id::oid AND a.attname = cc.column_name
               WHERE t.capture_instance = ci ORDER BY cc.column_ordinal LOOP
        out_cols := out_cols || format(', %I %s', col.column_name, col.pg_type);
        sel_cols := sel_cols || format(', c.%I', col.column_name);
    END LOOP;
    EXECUTE format($f$
        CREATE FUNCTION cdc.%I(from_lsn bytea, to_lsn bytea, row_filter_option text) RETURNS TABLE (%s)
        LANGUAGE plpgsql STABLE AS $body$
        BEGIN
            PERFORM standin.check_change_range(%L, from_lsn, to_lsn, row_filter_option);
            RETURN QUERY SELECT %s FROM %s c
                WHERE c."__$start_lsn" BETWEEN from_lsn AND to_lsn
                  AND (c."__$operation" <> 3 OR lower(row_filter_option) = 'all update old')
                ORDER BY c."__$start_lsn", c."__$command_id", c."__$seqval", c."__$operation";
        END $body$ $f$, lower('fn_cdc_get_all_changes_' || ci), out_cols, ci, sel_cols, ct);
END $$;

CREATE PROCEDURE sys.sp_cdc_disable_table(source_schema text, source_name text, capture_instance text)
LANGUAGE plpgsql AS $$
DECLARE
    rel regclass := to_regclass(format('%I.%I', source_schema, source_name));
    r record;
BEGIN
    IF rel IS NULL THEN
        PERFORM standin.raise_error(22931, format('Source table ''%s.%s'' does not exist in the current database.', source_schema, source_name));
    END IF;
    FOR r IN SELECT * FROM cdc.change_tables ct WHERE ct.source_object_id = rel::oid::integer
             AND (lower(sp_cdc_disable_table.capture_instance) = 'all' OR lower(ct.capture_instance) = lower(sp_cdc_disable_table.capture_instance)) LOOP
        EXECUTE format('DROP FUNCTION IF EXISTS cdc.%I(bytea, bytea, text)', lower('fn_cdc_get_all_changes_' || r.capture_instance));
        DELETE FROM standin.declared_columns WHERE relid = r.object_id::oid;
        EXECUTE format('DROP TABLE cdc.%I', r.capture_instance || '_CT');
        DELETE FROM cdc.captured_columns WHERE object_id = r.object_id;
        DELETE FROM cdc.index_columns WHERE object_id = r.object_id;
        DELETE FROM cdc.change_tables WHERE object_id = r.object_id;
    END LOOP;
    IF NOT FOUND AND lower(capture_instance) <> 'all' THEN
        -- sys.messages 22960 (Learn, "Database engine events and errors (21000 to 25999)")
        PERFORM standin.raise_error(22960, format('Change data capture instance ''%s'' has not been enabled for the source table ''%s.%s''. Use sys.sp_cdc_help_change_data_capture to verify the capture instance name and retry the operation.', capture_instance, source_schema, source_name));
    END IF;
END $$;

CREATE PROCEDURE sys.sp_cdc_disable_db() LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT ct.capture_instance, n.nspname, c.relname FROM cdc.change_tables ct
             JOIN pg_class c ON c.oid = ct.source_object_id::oid JOIN pg_namespace n ON n.oid = c.relnamespace LOOP
        CALL sys.sp_cdc_disable_table(r.nspname, r.relname, r.capture_instance);
    END LOOP;
    DELETE FROM cdc.lsn_time_mapping;
    DELETE FROM standin.msdb_cdc_jobs;
    UPDATE standin.settings SET is_cdc_enabled = false;
END $$;

CREATE FUNCTION sys.sp_cdc_help_change_data_capture(source_schema text DEFAULT NULL, source_name text DEFAULT NULL)
RETURNS TABLE (source_schema varchar(128), source_table varchar(128), capture_instance varchar(128), object_id integer,
               source_object_id integer, start_lsn bytea, end_lsn bytea, supports_net_changes boolean,
               has_drop_pending boolean, role_name varchar(128), index_name varchar(128), filegroup_name varchar(128),
               create_date timestamp(3), index_column_list text, captured_column_list text)
LANGUAGE sql STABLE AS $$
    SELECT n.nspname::varchar, c.relname::varchar, ct.capture_instance, ct.object_id, ct.source_object_id, ct.start_lsn,
           ct.end_lsn, ct.supports_net_changes, ct.has_drop_pending, ct.role_name, ct.index_name, ct.filegroup_name,
           ct.create_date,
           (SELECT string_agg(quote_ident(ic.column_name), ', ' ORDER BY ic.index_ordinal) FROM cdc.index_columns ic WHERE ic.object_id = ct.object_id),
           (SELECT string_agg(quote_ident(cc.column_name), ', ' ORDER BY cc.column_ordinal) FROM cdc.captured_columns cc WHERE cc.object_id = ct.object_id)
    FROM cdc.change_tables ct JOIN pg_class c ON c.oid = ct.source_object_id::oid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE standin.can_read_instance(ct.capture_instance)
      AND ($1 IS NULL OR n.nspname = $1) AND ($2 IS NULL OR c.relname = $2)
    ORDER BY ct.capture_instance
$$;

-- sys.sp_cdc_help_jobs: "Requires membership in the db_owner fixed database role."
-- (learn.microsoft.com/en-us/sql/relational-databases/system-stored-procedures/sys-sp-cdc-help-jobs-transact-sql,
-- Permissions). Refused with 22904 "Caller is not authorized to initiate the requested action. DBO
-- privileges are required." (sys.messages text; that this procedure raises 22904 is a guess).
CREATE FUNCTION sys.sp_cdc_help_jobs() RETURNS TABLE (job_id uuid, job_type varchar(20), job_name varchar(128), maxtrans integer,
    maxscans integer, continuous boolean, pollinginterval bigint, retention bigint, threshold bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = dbo, sys, pg_catalog AS $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = session_user) THEN
        PERFORM standin.raise_error(22904, 'Caller is not authorized to initiate the requested action. DBO privileges are required.');
    END IF;
    RETURN QUERY
    SELECT j.job_id, j.job_type, ('cdc.' || current_database() || '_' || j.job_type)::varchar, j.maxtrans, j.maxscans,
           j.continuous, j.pollinginterval, j.retention, j.threshold
    FROM standin.msdb_cdc_jobs j ORDER BY j.job_type;
END $$;

CREATE PROCEDURE sys.sp_cdc_start_job(job_type text DEFAULT 'capture') LANGUAGE plpgsql AS $$
BEGIN
    IF lower(job_type) = 'capture' THEN UPDATE standin.settings SET capture_job_running = true; END IF;
END $$;
CREATE PROCEDURE sys.sp_cdc_stop_job(job_type text DEFAULT 'capture') LANGUAGE plpgsql AS $$
BEGIN
    IF lower(job_type) = 'capture' THEN UPDATE standin.settings SET capture_job_running = false; END IF;
END $$;

-- Application locks (sys.sp_getapplock / sp_releaseapplock): PostgreSQL's advisory locks behave the
-- same way (@LockOwner = 'Session': session-level, held until released or the session ends;
-- 'Transaction': until the transaction ends; re-entrant). Return codes
-- (learn.microsoft.com/en-us/sql/relational-databases/system-stored-procedures/sp-getapplock-transact-sql,
-- "Return code values"): 0 granted synchronously, 1 granted after waiting, -1 timed out, -999 parameter
-- validation or other call error (-2 cancelled and -3 deadlock victim are not emulated). @LockTimeout
-- defaults to @@LOCK_TIMEOUT, -1 (wait forever); 0 = do not wait. Lock modes Shared and Exclusive only.
-- Reached from a batch only (translate.py, translate_batch: EXEC @r = sys.sp_getapplock ...).
CREATE FUNCTION sys.sp_getapplock(resource text, lockmode text, lockowner text DEFAULT 'Transaction',
                                  locktimeout integer DEFAULT -1, dbprincipal text DEFAULT 'public')
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    key bigint := hashtextextended('applock:' || resource, 0);
    shared boolean := lower(lockmode) = 'shared';
    session boolean := lower(coalesce(lockowner, 'Transaction')) = 'session';
    deadline timestamptz;
BEGIN
    IF resource IS NULL OR lower(lockmode) NOT IN ('shared', 'exclusive')
       OR lower(coalesce(lockowner, 'Transaction')) NOT IN ('session', 'transaction') THEN
        RETURN -999;
    END IF;
    IF standin.try_applock(key, shared, session) THEN RETURN 0; END IF;
    IF coalesce(locktimeout, -1) = 0 THEN RETURN -1; END IF;
    deadline := CASE WHEN coalesce(locktimeout, -1) < 0 THEN NULL
                     ELSE clock_timestamp() + make_interval(secs => locktimeout / 1000.0) END;
    LOOP
        PERFORM pg_sleep(0.01);
        IF standin.try_applock(key, shared, session) THEN RETURN 1; END IF;
        IF deadline IS NOT NULL AND clock_timestamp() >= deadline THEN RETURN -1; END IF;
    END LOOP;
END $$;
CREATE FUNCTION standin.try_applock(key bigint, shared boolean, session boolean) RETURNS boolean LANGUAGE sql AS $$
    SELECT CASE WHEN session AND shared THEN pg_try_advisory_lock_shared(key)
                WHEN session THEN pg_try_advisory_lock(key)
                WHEN shared THEN pg_try_advisory_xact_lock_shared(key)
                ELSE pg_try_advisory_xact_lock(key) END
$$;
-- T-SQL batch variables (translate.py, translate_batch): session settings standin.v_<name>, 'N' for
-- NULL, 'V' || value otherwise.
CREATE FUNCTION standin.set_batch_variable(name text, value text) RETURNS void LANGUAGE sql AS $$
    SELECT set_config('standin.v_' || name, CASE WHEN value IS NULL THEN 'N' ELSE 'V' || value END, false)
$$;
CREATE FUNCTION standin.batch_variable(name text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN left(current_setting('standin.v_' || name, true), 1) = 'V'
                THEN substr(current_setting('standin.v_' || name, true), 2) END
$$;
CREATE PROCEDURE sys.sp_releaseapplock(resource text, lockowner text DEFAULT 'Transaction', dbprincipal text DEFAULT 'public')
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_advisory_unlock(hashtextextended('applock:' || resource, 0)) THEN
        RAISE EXCEPTION 'Cannot release the application lock (Database Principal: ''public'', Resource: ''%'') because it is not currently held. (1223)', resource
            USING ERRCODE = '42000';
    END IF;
END $$;

-- Purges change rows below low_water_mark and raises the instance's start_lsn (sys.sp_cdc_cleanup_change_table).
CREATE PROCEDURE sys.sp_cdc_cleanup_change_table(capture_instance text, low_water_mark bytea, threshold bigint DEFAULT 5000)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM cdc.change_tables ct WHERE lower(ct.capture_instance) = lower(sp_cdc_cleanup_change_table.capture_instance);
    IF NOT FOUND THEN
        PERFORM standin.raise_error(22964, format('Capture instance ''%s'' does not exist.', capture_instance));
    END IF;
    IF low_water_mark IS NULL OR low_water_mark > sys.fn_cdc_get_max_lsn() THEN
        PERFORM standin.raise_error(22957, 'LSN %s, specified as the new low endpoint for the change table associated with capture instance is not within the Change Data Capture timeline.');
    END IF;
    IF low_water_mark > r.start_lsn THEN
        EXECUTE format('DELETE FROM cdc.%I WHERE "__$start_lsn" < $1', r.capture_instance || '_CT') USING low_water_mark;
        UPDATE cdc.change_tables SET start_lsn = low_water_mark WHERE object_id = r.object_id;
    END IF;
END $$;

-- The cleanup job: low water mark = the newest commit older than the retention; every instance's
-- rows below it are purged and its start_lsn raised; lsn_time_mapping rows below it go too.
CREATE FUNCTION standin.cleanup(retention_minutes integer) RETURNS bytea LANGUAGE plpgsql AS $$
DECLARE
    cutoff timestamp := sys.getdate()::timestamp - make_interval(mins => retention_minutes);
    lwm bytea := sys.fn_cdc_map_time_to_lsn('largest less than or equal', cutoff);
    r record;
BEGIN
    IF lwm IS NULL THEN RETURN NULL; END IF;
    FOR r IN SELECT * FROM cdc.change_tables LOOP
        IF lwm > r.start_lsn THEN
            EXECUTE format('DELETE FROM cdc.%I WHERE "__$start_lsn" < $1', r.capture_instance || '_CT') USING lwm;
            UPDATE cdc.change_tables SET start_lsn = lwm WHERE object_id = r.object_id;
        END IF;
    END LOOP;
    DELETE FROM cdc.lsn_time_mapping WHERE start_lsn < lwm;
    RETURN lwm;
END $$;
