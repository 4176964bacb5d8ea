-- The YugabyteDB stand-in's SQL surface (tests only; docs/yugabytedb-standin.md).
-- Everything lives in schema yb_standin, which the database's search_path puts before pg_catalog,
-- so unqualified names (pg_replication_slots, pg_class, pg_current_wal_lsn(), ...) reach the shims.
-- State tables are UNLOGGED: never published, so the journal's FOR ALL TABLES publication skips them.

CREATE SCHEMA IF NOT EXISTS yb_standin;
GRANT USAGE ON SCHEMA yb_standin TO PUBLIC;

CREATE UNLOGGED TABLE IF NOT EXISTS yb_standin.settings (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    retention_ms bigint NOT NULL,
    active_window_ms bigint NOT NULL,
    advisory_locks boolean NOT NULL
);

-- The YB replica identity of each table that was ALTERed; absent = CHANGE ('c').
CREATE UNLOGGED TABLE IF NOT EXISTS yb_standin.identity (
    relid oid PRIMARY KEY,
    ident "char" NOT NULL CHECK (ident IN ('c', 'd', 'f', 'n'))
);

-- YSQL sharding of tables whose CREATE TABLE named it (PRIMARY KEY (a ASC), ((a, b) HASH, c)...,
-- rewritten by the proxy): how many key columns at the key's head are hash columns. Absent:
-- YSQL's default, the first key column HASH.
CREATE UNLOGGED TABLE IF NOT EXISTS yb_standin.sharding (
    relid oid PRIMARY KEY,
    num_hash_key_columns int NOT NULL
);

-- Committed transactions with at least one row change, in commit order, from the real slot.
CREATE UNLOGGED TABLE IF NOT EXISTS yb_standin.journal (
    jseq bigint PRIMARY KEY,
    commit_lsn pg_lsn NOT NULL,
    commit_time_us bigint NOT NULL,  -- Unix epoch microseconds
    ht bigint NOT NULL UNIQUE,
    messages bytea[] NOT NULL  -- real pgoutput payloads: Y/R for the relations touched, then I/U/D
);

CREATE UNLOGGED TABLE IF NOT EXISTS yb_standin.slots (
    slot_name name PRIMARY KEY,
    plugin name NOT NULL,
    lsn_type text NOT NULL CHECK (lsn_type IN ('SEQUENCE', 'HYBRID_TIME')),
    stream_id text NOT NULL,
    snapshot_ht bigint NOT NULL,
    boundary_lsn pg_lsn,  -- USE_SNAPSHOT: stream commits at or after this real LSN; else commits with HT > snapshot_ht
    created_ms bigint NOT NULL,
    last_poll_ms bigint,
    confirmed_flush bigint NOT NULL DEFAULT 2,
    restart_lsn bigint NOT NULL DEFAULT 1,
    restart_ht bigint,
    restart_jseq bigint NOT NULL DEFAULT 0,
    next_xid bigint NOT NULL DEFAULT 2,
    next_lsn bigint NOT NULL DEFAULT 2,
    assigned_jseq bigint NOT NULL DEFAULT 0
);

-- Per slot: the frozen replica identity of every table that existed at slot creation.
CREATE UNLOGGED TABLE IF NOT EXISTS yb_standin.slot_identity (
    slot_name name NOT NULL REFERENCES yb_standin.slots ON DELETE CASCADE,
    relid oid NOT NULL,
    ident "char" NOT NULL,
    PRIMARY KEY (slot_name, relid)
);

-- Per slot: the xid and LSNs a journal transaction got when first streamed (deterministic replays).
CREATE UNLOGGED TABLE IF NOT EXISTS yb_standin.slot_txn (
    slot_name name NOT NULL REFERENCES yb_standin.slots ON DELETE CASCADE,
    jseq bigint NOT NULL,
    xid bigint NOT NULL,
    begin_lsn bigint NOT NULL,
    commit_lsn bigint NOT NULL,
    PRIMARY KEY (slot_name, jseq)
);

GRANT SELECT ON ALL TABLES IN SCHEMA yb_standin TO PUBLIC;
GRANT INSERT, UPDATE, DELETE ON yb_standin.identity, yb_standin.slots, yb_standin.slot_identity,
    yb_standin.sharding TO PUBLIC;

CREATE OR REPLACE FUNCTION yb_standin.now_ms() RETURNS bigint LANGUAGE sql VOLATILE AS
$$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

CREATE OR REPLACE FUNCTION yb_standin.as_lsn(v bigint) RETURNS pg_lsn LANGUAGE sql IMMUTABLE AS
$$ SELECT '0/0'::pg_lsn + v::numeric $$;

-- 1. YB's current hybrid time: physical microseconds << 12. Returns only once the clock has moved
-- past the value, so a later call (or commit) always gets a larger one.
CREATE OR REPLACE FUNCTION yb_standin.yb_get_current_hybrid_time_lsn() RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE v bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
BEGIN
    LOOP
        EXIT WHEN (extract(epoch FROM clock_timestamp()) * 1000000)::bigint > v;
    END LOOP;
    RETURN v << 12;
END $$;

-- 2. Functions YSQL does not support.
CREATE OR REPLACE FUNCTION yb_standin.unsupported(fn text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is unsupported in YugabyteDB: changes are only streamed (START_REPLICATION)', fn
        USING ERRCODE = 'feature_not_supported',
              HINT = 'YSQL logical replication is streaming-only (yugabyte stand-in)';
END $$;

CREATE OR REPLACE FUNCTION yb_standin.pg_logical_slot_get_changes(
    slot_name name, upto_lsn pg_lsn, upto_nchanges integer, VARIADIC options text[] DEFAULT '{}',
    OUT lsn pg_lsn, OUT xid xid, OUT data text) RETURNS SETOF record LANGUAGE plpgsql AS
$$ BEGIN PERFORM yb_standin.unsupported('pg_logical_slot_get_changes'); END $$;
CREATE OR REPLACE FUNCTION yb_standin.pg_logical_slot_peek_changes(
    slot_name name, upto_lsn pg_lsn, upto_nchanges integer, VARIADIC options text[] DEFAULT '{}',
    OUT lsn pg_lsn, OUT xid xid, OUT data text) RETURNS SETOF record LANGUAGE plpgsql AS
$$ BEGIN PERFORM yb_standin.unsupported('pg_logical_slot_peek_changes'); END $$;
CREATE OR REPLACE FUNCTION yb_standin.pg_logical_slot_get_binary_changes(
    slot_name name, upto_lsn pg_lsn, upto_nchanges integer, VARIADIC options text[] DEFAULT '{}',
    OUT lsn pg_lsn, OUT xid xid, OUT data bytea) RETURNS SETOF record LANGUAGE plpgsql AS
$$ BEGIN PERFORM yb_standin.unsupported('pg_logical_slot_get_binary_changes'); END $$;
CREATE OR REPLACE FUNCTION yb_standin.pg_logical_slot_peek_binary_changes(
    slot_name name, upto_lsn pg_lsn, upto_nchanges integer, VARIADIC options text[] DEFAULT '{}',
    OUT lsn pg_lsn, OUT xid xid, OUT data bytea) RETURNS SETOF record LANGUAGE plpgsql AS
$$ BEGIN PERFORM yb_standin.unsupported('pg_logical_slot_peek_binary_changes'); END $$;
CREATE OR REPLACE FUNCTION yb_standin.pg_replication_slot_advance(
    slot_name name, upto_lsn pg_lsn, OUT slot_name name, OUT end_lsn pg_lsn) RETURNS record LANGUAGE sql AS
$$ SELECT NULL::name, NULL::pg_lsn FROM (SELECT yb_standin.unsupported('pg_replication_slot_advance')) x $$;
CREATE OR REPLACE FUNCTION yb_standin.pg_current_wal_lsn() RETURNS pg_lsn LANGUAGE plpgsql AS
$$ BEGIN PERFORM yb_standin.unsupported('pg_current_wal_lsn'); RETURN NULL; END $$;
CREATE OR REPLACE FUNCTION yb_standin.pg_current_wal_insert_lsn() RETURNS pg_lsn LANGUAGE plpgsql AS
$$ BEGIN PERFORM yb_standin.unsupported('pg_current_wal_insert_lsn'); RETURN NULL; END $$;
CREATE OR REPLACE FUNCTION yb_standin.pg_current_wal_flush_lsn() RETURNS pg_lsn LANGUAGE plpgsql AS
$$ BEGIN PERFORM yb_standin.unsupported('pg_current_wal_flush_lsn'); RETURN NULL; END $$;

-- 4. Replica identity as YB reports it: pg_class with relreplident replaced for user tables.
CREATE OR REPLACE FUNCTION yb_standin.is_user_table(rel oid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast', 'yb_standin')
           AND n.nspname NOT LIKE 'pg_temp%' AND n.nspname NOT LIKE 'pg_toast%'
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel
$$;

CREATE OR REPLACE FUNCTION yb_standin.yb_identity(rel oid) RETURNS "char" LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN yb_standin.is_user_table(rel)
                THEN coalesce((SELECT i.ident FROM yb_standin.identity i WHERE i.relid = rel), 'c')
                ELSE (SELECT c.relreplident FROM pg_catalog.pg_class c WHERE c.oid = rel) END
$$;

-- ALTER TABLE t REPLICA IDENTITY CHANGE|DEFAULT|FULL|NOTHING arrives here (rewritten by the proxy).
CREATE OR REPLACE FUNCTION yb_standin.set_replica_identity(rel regclass, ident text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE code "char" := lower(left(ident, 1));
BEGIN
    IF ident NOT IN ('CHANGE', 'DEFAULT', 'FULL', 'NOTHING') THEN
        RAISE EXCEPTION 'replica identity % is not supported', ident USING ERRCODE = 'feature_not_supported';
    END IF;
    EXECUTE format('ALTER TABLE %s REPLICA IDENTITY %s', rel, CASE WHEN code = 'n' THEN 'NOTHING' ELSE 'FULL' END);
    INSERT INTO yb_standin.identity VALUES (rel, code) ON CONFLICT (relid) DO UPDATE SET ident = excluded.ident;
END $$;

-- Tables created later: captured FULL underneath, CHANGE as seen by clients.
CREATE OR REPLACE FUNCTION yb_standin.on_create_table() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE r record; hash_columns text;
BEGIN
    FOR r IN SELECT objid FROM pg_event_trigger_ddl_commands() WHERE object_type = 'table' LOOP
        IF yb_standin.is_user_table(r.objid) THEN
            EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', r.objid::regclass);
            hash_columns := substring(current_query() FROM 'yb_standin:hash_columns=([0-9]+)');
            IF hash_columns IS NOT NULL THEN
                INSERT INTO yb_standin.sharding VALUES (r.objid, hash_columns::int)
                ON CONFLICT (relid) DO UPDATE SET num_hash_key_columns = excluded.num_hash_key_columns;
            END IF;
        END IF;
    END LOOP;
END $$;

-- 3. pg_replication_slots with YB's columns, for the stand-in's slots only.
CREATE OR REPLACE VIEW yb_standin.pg_replication_slots AS
SELECT s.slot_name,
       s.plugin,
       'logical'::text AS slot_type,
       d.oid AS datoid,
       d.datname AS database,
       false AS temporary,
       coalesce(yb_standin.now_ms() - s.last_poll_ms < st.active_window_ms, false) AS active,
       NULL::integer AS active_pid,
       NULL::xid AS xmin,
       NULL::xid AS catalog_xmin,
       yb_standin.as_lsn(s.restart_lsn) AS restart_lsn,
       yb_standin.as_lsn(s.confirmed_flush) AS confirmed_flush_lsn,
       'reserved'::text AS wal_status,
       NULL::bigint AS safe_wal_size,
       false AS two_phase,
       s.stream_id AS yb_stream_id,
       coalesce(s.restart_ht, s.snapshot_ht) AS yb_restart_commit_ht,
       s.lsn_type AS yb_lsn_type
FROM yb_standin.slots s
CROSS JOIN yb_standin.settings st
JOIN pg_catalog.pg_database d ON d.datname = current_database();
-- Like PostgreSQL's and YB's view, readable by every role (the slot health check runs as the capture role).
GRANT SELECT ON yb_standin.pg_replication_slots TO PUBLIC;

-- Registers a slot (both creation routes) and freezes every user table's identity for it.
CREATE OR REPLACE FUNCTION yb_standin.register_slot(
    p_name name, p_plugin name, p_lsn_type text, p_snapshot_ht bigint, p_boundary pg_lsn) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF p_plugin NOT IN ('yboutput', 'pgoutput', 'test_decoding', 'wal2json') THEN
        RAISE EXCEPTION 'could not access file "%": No such file or directory', p_plugin USING ERRCODE = 'undefined_file';
    END IF;
    IF p_lsn_type NOT IN ('SEQUENCE', 'HYBRID_TIME') THEN
        RAISE EXCEPTION 'invalid lsn_type %', p_lsn_type USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM yb_standin.slots WHERE slot_name = p_name) THEN
        RAISE EXCEPTION 'replication slot "%" already exists', p_name USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO yb_standin.slots (slot_name, plugin, lsn_type, stream_id, snapshot_ht, boundary_lsn, created_ms)
    VALUES (p_name, p_plugin, p_lsn_type, md5(p_name || clock_timestamp()::text), p_snapshot_ht, p_boundary,
            yb_standin.now_ms());
    INSERT INTO yb_standin.slot_identity
    SELECT p_name, c.oid, yb_standin.yb_identity(c.oid) FROM pg_class c WHERE yb_standin.is_user_table(c.oid);
END $$;

-- 8. The SQL route (NOEXPORT): named notation works for yb_lsn_type as on YB.
CREATE OR REPLACE FUNCTION yb_standin.create_slot_sql(p_name name, p_plugin name, p_temporary boolean, p_lsn_type text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_temporary THEN
        RAISE EXCEPTION 'temporary replication slot is not yet supported' USING ERRCODE = 'feature_not_supported';
    END IF;
    PERFORM yb_standin.register_slot(p_name, p_plugin, upper(p_lsn_type),
                                     yb_standin.yb_get_current_hybrid_time_lsn(), NULL);
END $$;

CREATE OR REPLACE FUNCTION yb_standin.pg_create_logical_replication_slot(
    slot_name name, plugin name, temporary boolean DEFAULT false, twophase boolean DEFAULT false,
    yb_lsn_type text DEFAULT 'SEQUENCE', OUT slot_name name, OUT lsn pg_lsn) RETURNS record
LANGUAGE sql AS $$
    SELECT $1, '0/2'::pg_lsn FROM (SELECT yb_standin.create_slot_sql($1, $2, $3, $5)) x
$$;

CREATE OR REPLACE FUNCTION yb_standin.pg_drop_replication_slot(slot_name name) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
#variable_conflict use_variable
DECLARE v_name name := $1; s record; st record;
BEGIN
    SELECT * INTO s FROM yb_standin.slots WHERE yb_standin.slots.slot_name = v_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'replication slot "%" does not exist', v_name USING ERRCODE = 'undefined_object';
    END IF;
    SELECT * INTO st FROM yb_standin.settings;
    IF s.last_poll_ms IS NOT NULL AND yb_standin.now_ms() - s.last_poll_ms < st.active_window_ms THEN
        RAISE EXCEPTION 'replication slot "%" is active', v_name USING ERRCODE = 'object_in_use',
            DETAIL = format('It was polled within the last %s ms (ysql_cdc_active_replication_slot_window_ms).',
                            st.active_window_ms);
    END IF;
    DELETE FROM yb_standin.slots WHERE yb_standin.slots.slot_name = v_name;
END $$;

-- 9. Publication refresh, tables not of interest, restart time without an ack (docs/yugabytedb-standin.md).
-- Flags as settings (YB names in the comments); times are the stand-in's milliseconds, which
-- yb_standin.pass_time() moves (every stored time goes back, as if that much time had passed).
ALTER TABLE yb_standin.settings
    -- cdcsdk_publication_list_refresh_interval_secs (900): the slot's table list is re-read on this grid
    ADD COLUMN IF NOT EXISTS pub_refresh_interval_ms bigint NOT NULL DEFAULT 900000,
    -- publication changes apply at commit (2026.1+, implicit publication) instead of at the refresh
    ADD COLUMN IF NOT EXISTS refresh_at_commit boolean NOT NULL DEFAULT false,
    -- cdcsdk_tablet_not_of_interest_timeout_secs (14400): polled once within this of slot creation, or unqualified
    ADD COLUMN IF NOT EXISTS not_of_interest_ms bigint NOT NULL DEFAULT 14400000,
    -- cdc_skip_unqualified_tables_for_polling (2025.2.7.0+ / 2026.1.2.0+): skip unqualified tables, not fail
    ADD COLUMN IF NOT EXISTS skip_unqualified boolean NOT NULL DEFAULT false,
    -- cdcsdk_update_restart_time_when_nothing_to_stream (true) / cdcsdk_update_restart_time_interval_secs (60)
    ADD COLUMN IF NOT EXISTS update_restart_time boolean NOT NULL DEFAULT true,
    ADD COLUMN IF NOT EXISTS restart_update_interval_ms bigint NOT NULL DEFAULT 60000;

-- Publication membership over time (YB reads a publication as of the slot's refresh time):
-- kept by an event trigger after every DDL that can change it.
CREATE UNLOGGED TABLE IF NOT EXISTS yb_standin.pub_history (
    pubname name NOT NULL,
    relid oid NOT NULL,  -- 0: the publication itself exists
    added_ms bigint NOT NULL,
    removed_ms bigint
);
CREATE INDEX IF NOT EXISTS pub_history_open ON yb_standin.pub_history (pubname, relid) WHERE removed_ms IS NULL;

-- Per slot: the publication refreshes applied (the first at slot creation); a journal transaction
-- after from_jseq sees the publications as of refresh_ms.
CREATE UNLOGGED TABLE IF NOT EXISTS yb_standin.slot_refresh (
    slot_name name NOT NULL REFERENCES yb_standin.slots ON DELETE CASCADE,
    refresh_ms bigint NOT NULL,
    from_jseq bigint NOT NULL,
    PRIMARY KEY (slot_name, refresh_ms)
);

-- Per slot: the tables polled at least once (of interest); the others become unqualified once
-- not_of_interest_ms has passed since slot creation.
CREATE UNLOGGED TABLE IF NOT EXISTS yb_standin.slot_polled (
    slot_name name NOT NULL REFERENCES yb_standin.slots ON DELETE CASCADE,
    relid oid NOT NULL,
    PRIMARY KEY (slot_name, relid)
);
GRANT SELECT ON yb_standin.pub_history, yb_standin.slot_refresh, yb_standin.slot_polled TO PUBLIC;

CREATE OR REPLACE FUNCTION yb_standin.sync_publications() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE now_ms bigint := yb_standin.now_ms();
BEGIN
    -- a publication or membership gone: closed; a new one: opened
    UPDATE yb_standin.pub_history h SET removed_ms = now_ms
    WHERE h.removed_ms IS NULL AND NOT EXISTS (
        SELECT 1 FROM pg_publication p WHERE p.pubname = h.pubname AND (h.relid = 0 OR EXISTS (
            SELECT 1 FROM pg_publication_tables t
            WHERE t.pubname = h.pubname AND format('%I.%I', t.schemaname, t.tablename)::regclass = h.relid)));
    INSERT INTO yb_standin.pub_history (pubname, relid, added_ms)
    SELECT m.pubname, m.relid, now_ms FROM (
        SELECT p.pubname, 0::oid AS relid FROM pg_publication p WHERE p.pubname <> 'yb_standin_all'
        UNION
        SELECT t.pubname, format('%I.%I', t.schemaname, t.tablename)::regclass::oid
        FROM pg_publication_tables t WHERE t.pubname <> 'yb_standin_all'
    ) m
    WHERE NOT EXISTS (SELECT 1 FROM yb_standin.pub_history h
                      WHERE h.pubname = m.pubname AND h.relid = m.relid AND h.removed_ms IS NULL);
END $$;

CREATE OR REPLACE FUNCTION yb_standin.on_publication_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM yb_standin.sync_publications();
END $$;

DROP EVENT TRIGGER IF EXISTS yb_standin_publications;
CREATE EVENT TRIGGER yb_standin_publications ON ddl_command_end
    WHEN TAG IN ('CREATE PUBLICATION', 'ALTER PUBLICATION', 'CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO',
                 'ALTER TABLE', 'CREATE SCHEMA')
    EXECUTE FUNCTION yb_standin.on_publication_ddl();
DROP EVENT TRIGGER IF EXISTS yb_standin_publications_dropped;
CREATE EVENT TRIGGER yb_standin_publications_dropped ON sql_drop
    EXECUTE FUNCTION yb_standin.on_publication_ddl();
SELECT yb_standin.sync_publications();

-- The tables of publications ``names`` as of ``at_ms`` (YB: InitVirtualWal and each refresh read
-- the publication with yb_read_time set to the refresh time).
CREATE OR REPLACE FUNCTION yb_standin.published_as_of(names text[], at_ms bigint) RETURNS SETOF oid
LANGUAGE sql STABLE AS $$
    SELECT DISTINCT h.relid FROM yb_standin.pub_history h
    WHERE h.pubname = ANY(names) AND h.relid <> 0 AND h.added_ms <= at_ms
      AND (h.removed_ms IS NULL OR h.removed_ms > at_ms)
$$;

-- Every stored time goes back ``ms``: to the emulation, that much time has passed (slot expiry and
-- activity, the refresh grid, the 4-hour rule).
-- Refreshes that fall due are applied at once, from the next journaled transaction on (call it
-- once everything committed so far is journaled).
CREATE OR REPLACE FUNCTION yb_standin.pass_time(ms bigint) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    UPDATE yb_standin.slots SET created_ms = created_ms - ms, last_poll_ms = last_poll_ms - ms;
    UPDATE yb_standin.slot_refresh SET refresh_ms = refresh_ms - ms;
    UPDATE yb_standin.pub_history SET added_ms = added_ms - ms, removed_ms = removed_ms - ms;
    INSERT INTO yb_standin.slot_refresh
    SELECT d.slot_name, d.due, (SELECT coalesce(max(jseq), 0) FROM yb_standin.journal)
    FROM (SELECT s.slot_name,
                 s.created_ms + (yb_standin.now_ms() - s.created_ms) / st.pub_refresh_interval_ms
                                * st.pub_refresh_interval_ms AS due
          FROM yb_standin.slots s CROSS JOIN yb_standin.settings st WHERE NOT st.refresh_at_commit) d
    WHERE d.due > (SELECT max(r.refresh_ms) FROM yb_standin.slot_refresh r WHERE r.slot_name = d.slot_name)
    ON CONFLICT DO NOTHING;
$$;

-- The first refresh of a slot is its creation (cdc_state: last_pub_refresh_time = consistent snapshot time).
CREATE OR REPLACE FUNCTION yb_standin.on_slot_created() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO yb_standin.slot_refresh VALUES (NEW.slot_name, NEW.created_ms, 0) ON CONFLICT DO NOTHING;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS slot_created ON yb_standin.slots;
CREATE TRIGGER slot_created AFTER INSERT ON yb_standin.slots FOR EACH ROW EXECUTE FUNCTION yb_standin.on_slot_created();

-- yb_table_properties(oid) (ybctype/pg_yb_utils: num_tablets, num_hash_key_columns, is_colocated,
-- tablegroup_oid, colocation_id). A table without a primary key is hash-sharded on ybrowid (one
-- hash column: a guess). Tablet counts are the stand-in's: one for range-sharded tables.
CREATE OR REPLACE FUNCTION yb_standin.yb_table_properties(
    rel oid, OUT num_tablets bigint, OUT num_hash_key_columns bigint, OUT is_colocated boolean,
    OUT tablegroup_oid oid, OUT colocation_id oid
) LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN h.n = 0 THEN 1 ELSE 3 END, h.n, false, NULL::oid, NULL::oid
    FROM (SELECT coalesce((SELECT s.num_hash_key_columns FROM yb_standin.sharding s WHERE s.relid = rel), 1)::bigint
          AS n) h
    WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = rel)
$$;
