"""Preflight checks and slot/publication administration against real PostgreSQL."""

from __future__ import annotations

import pytest
from psycopg import sql

from airflow_provider_cdc.cdc.basics.errors import (
    ConcurrentCaptureError,
    PublicationError,
    SlotConfigurationError,
    UnknownTableError,
)
from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo, connect
from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from tests.support.databases import snapshot_window, stream_window
from tests.support.oracle import assert_same_state, events_of, replay, source_rows


def refs(*names: str) -> list[TableRef]:
    return [TableRef.parse(n) for n in names]


def test_server_checks(db15):
    with db15.connect() as conn:
        info = admin.server_info(conn)
    assert admin.check_server(info) == []
    broken = admin.ServerInfo(130000, "replica", "1", "d", "LATIN1", "app", False, False, 0)
    problems = "\n".join(admin.check_server(broken))
    assert "wal_level is 'replica'" in problems and "restart the server" in problems
    assert 'ALTER ROLE "app" REPLICATION' in problems
    assert "PostgreSQL 13 is too old" in problems and "UTF8" in problems and "max_replication_slots" in problems


def test_replica_identity_rules(db):
    db.execute(
        "CREATE TABLE with_pk (id int PRIMARY KEY);"
        "CREATE TABLE full_ident (v text); ALTER TABLE full_ident REPLICA IDENTITY FULL;"
        "CREATE TABLE no_key (v text);"
        "CREATE TABLE nothing (id int PRIMARY KEY); ALTER TABLE nothing REPLICA IDENTITY NOTHING;"
        "CREATE TABLE by_index (a int NOT NULL, b int NOT NULL, v text);"
        "CREATE UNIQUE INDEX by_index_ab ON by_index (a, b);"
        "ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_ab;"
    )
    with db.connect() as conn:
        tables = admin.describe_tables(conn, refs("with_pk", "full_ident", "no_key", "nothing", "by_index"))
        problems = admin.check_tables(conn, tables.values())
    assert tables[TableRef("public", "by_index")].key_columns == ("a", "b")
    assert tables[TableRef("public", "full_ident")].key_columns == ()
    assert len(problems) == 2
    assert '"public"."no_key" has no primary key' in problems[0] and "REPLICA IDENTITY FULL" in problems[0]
    assert '"public"."nothing" has REPLICA IDENTITY NOTHING' in problems[1]


def test_unknown_tables_get_suggestions_and_views_are_refused(db15):
    db15.execute("CREATE TABLE customers (id int PRIMARY KEY); CREATE VIEW customer_view AS SELECT * FROM customers")
    with db15.connect() as conn:
        with pytest.raises(UnknownTableError, match=r'"public"."custmers" \(did you mean "public"."customers"\?\)'):
            admin.describe_tables(conn, refs("custmers"))
        with pytest.raises(UnknownTableError, match="quote mixed-case"):
            admin.describe_tables(conn, refs('"Customers"'))
        with pytest.raises(Exception, match=r'customer_view" \(a view\)'):
            admin.describe_tables(conn, refs("customer_view"))


def test_slot_of_another_plugin_or_database_is_refused(db15):
    db15.execute("CREATE TABLE t (id int PRIMARY KEY)")
    with db15.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (db15.slot,))
        with pytest.raises(SlotConfigurationError, match="uses plugin 'test_decoding'"):
            admin.ensure_slot(conn, db15.slot, db15.name)
        conn.execute("SELECT pg_drop_replication_slot(%s)", (db15.slot,))
        status, created = admin.ensure_slot(conn, db15.slot, db15.name)
        assert created and status.plugin == "pgoutput"
        assert admin.ensure_slot(conn, db15.slot, db15.name)[1] is False  # idempotent
        with pytest.raises(SlotConfigurationError, match="belongs to database"):
            admin.ensure_slot(conn, db15.slot, "another_db")


def test_publication_modes(db15):
    db15.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY)")
    with db15.connect() as conn:
        with pytest.raises(PublicationError, match="does not exist and publication_autocreate_mode is 'disabled'"):
            admin.ensure_publication(conn, "pub", refs("a"), "disabled")
        assert admin.ensure_publication(conn, "pub", refs("a"), "filtered") == "created"
        assert admin.ensure_publication(conn, "pub", refs("a"), "filtered") == "verified"
        with pytest.raises(PublicationError, match=r'does not contain "public"."b".*ALTER PUBLICATION'):
            admin.ensure_publication(conn, "pub", refs("a", "b"), "disabled")
        assert admin.ensure_publication(conn, "pub", refs("a", "b"), "filtered") == "altered"
        admin.verify_publication(conn, "pub", refs("a", "b"))
        conn.execute("ALTER PUBLICATION pub SET (publish = 'insert')")
        with pytest.raises(PublicationError, match="does not publish update, delete"):
            admin.verify_publication(conn, "pub", refs("a"))
        assert admin.ensure_publication(conn, "everything", refs("a", "b"), "all_tables") == "created"
        admin.verify_publication(conn, "everything", refs("a", "b"))


def test_capture_lock_is_exclusive_and_released(db15):
    with db15.connect() as first, db15.connect() as second:
        admin.try_capture_lock(first, "shop")
        with pytest.raises(ConcurrentCaptureError, match=f"pid {first.info.backend_pid}"):
            admin.try_capture_lock(second, "shop")
        admin.try_capture_lock(second, "other")  # captures are independent
        admin.release_capture_lock(first, "shop")
        admin.try_capture_lock(second, "shop")


def test_advance_never_goes_backwards(db15):
    db15.execute("CREATE TABLE t (id int PRIMARY KEY)")
    start = db15.setup_capture(["t"]).confirmed_flush_lsn
    db15.execute("INSERT INTO t VALUES (1)")
    target = db15.current_lsn()
    with db15.connect() as conn:
        assert admin.advance_slot(conn, db15.slot, target) == target
        assert admin.advance_slot(conn, db15.slot, start) == target  # no-op, no error
    status = db15.slot_status()
    assert status.confirmed_flush_lsn == target and status.pending_bytes >= 0


def test_least_privilege_role_runs_snapshot_and_stream(db, spark, tmp_path):
    """REPLICATION + LOGIN + SELECT on the tables is enough once the publication exists."""
    role, password = f"cdc_{db.name}"[:60], "s3cret-pw"
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a')")
    db.execute(
        sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(sql.Identifier(role), sql.Literal(password))
    )
    db.created_roles.append(role)
    db.execute(sql.SQL("GRANT SELECT ON t TO {}").format(sql.Identifier(role)))
    with db.connect() as conn:
        admin.ensure_publication(conn, db.publication, refs("t"))  # by the table owner
    info = PgConnectionInfo(db.cluster.host, db.cluster.port, db.name, role, password=password)
    with db.cluster.connect(db.name) as admin_conn:
        assert not admin_conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()[0]
    with connect(info) as conn:
        assert admin.check_server(admin.server_info(conn)) == []
        admin.ensure_slot(conn, db.slot, db.name)
    spec = db.spec(["t"], snapshot_window(1), tmp_path)
    spec = type(spec)(**{**spec.__dict__, "connection": info})
    snapshot = run_job(spec)
    db.execute("INSERT INTO t VALUES (2, 'b'); UPDATE t SET v = 'z' WHERE id = 1")
    with connect(info) as conn:
        admin.advance_slot(conn, db.slot, snapshot.window.to_lsn)
        end = admin.current_lsn(conn)
    spec = type(spec)(**{**spec.__dict__, "window": stream_window(2, snapshot.window.to_lsn, end)})
    run_job(spec)
    with db.connect() as conn:
        assert_same_state(replay(events_of(tmp_path, "t", "public.t"), ["id"]), source_rows(conn, "public.t", ["id"]))
    bad = PgConnectionInfo(db.cluster.host, db.cluster.port, db.name, role, password="wrong")
    with pytest.raises(Exception, match="password authentication failed") as failure:
        connect(bad)
    assert "wrong" not in str(failure.value) and password not in str(failure.value)


def test_table_patterns_resolve_against_the_catalog(db15):
    db15.execute(
        "CREATE TABLE orders (id int PRIMARY KEY); CREATE TABLE order_items (id int PRIMARY KEY);"
        "CREATE TABLE order_audit (id int PRIMARY KEY); CREATE TABLE customers (id int PRIMARY KEY);"
        "CREATE TABLE parted (id int, PRIMARY KEY (id)) PARTITION BY RANGE (id);"
        "CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (10);"
        "CREATE SCHEMA other; CREATE TABLE other.orders (id int PRIMARY KEY);"
    )
    with db15.connect() as conn:
        assert admin.resolve_tables(conn, (), ["public\\.order.*"], ["public\\.order_audit"]) == (
            TableRef("public", "order_items"),
            TableRef("public", "orders"),
        )
        assert admin.resolve_tables(conn, (), [".*\\.orders"]) == (
            TableRef("other", "orders"),
            TableRef("public", "orders"),
        )
        assert admin.resolve_tables(conn, (), ["public\\.parted.*"]) == (
            TableRef("public", "parted"),
        )  # not partitions
        assert admin.resolve_tables(conn, refs("customers", "orders"), (), ["public\\.customers"]) == (
            TableRef("public", "orders"),
        )
        with pytest.raises(UnknownTableError, match="leave nothing"):
            admin.resolve_tables(conn, (), ["nothing\\..*"])
