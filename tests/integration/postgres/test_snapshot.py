"""Initial snapshots with real Spark: consistency with the stream, values, identifiers."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
from tests.support.databases import snapshot_window, stream_window
from tests.support.oracle import assert_same_state, events_of, normalise, replay, source_rows

pytestmark = pytest.mark.spark

TYPES_TABLE = """
CREATE TABLE typed (
    id bigint PRIMARY KEY,
    small smallint, regular integer, big bigint,
    exact numeric(14,4), loose numeric, money_like numeric(38,2),
    label text, code varchar(12), flag boolean,
    at timestamp, at_tz timestamptz, at_ms timestamp(3), day date,
    uid uuid, doc jsonb, raw bytea, ratio double precision
)
"""

VALUE_ROWS = [
    "(%s, 1, 2, 3, 1.5, 1.5, 1.50, 'plain', 'c', true, '2024-01-02 03:04:05', '2024-01-02 03:04:05+00',"
    " '2024-01-02 03:04:05.123', '2024-01-02', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"a\": 1}', '\\x00ff', 0.25)",
    "(%s, -32768, -2147483648, -9223372036854775808, -9999999999.9999, 0.000000000000000000001,"
    " 999999999999999999999999999999999999.99, '', '', false, '1970-01-01 00:00:00', '1999-12-31 23:59:59.999999-08',"
    " '2000-02-29 00:00:00.001', '0001-01-01', '00000000-0000-0000-0000-000000000000', '[]', '\\x', -1e300)",
    "(%s, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null)",
    '(%s, 32767, 2147483647, 9223372036854775807, 0, 12345678901234567890.123456789, 0, \'line1\nline2, "quoted"'
    " and ''single''\ttab \\ backslash', 'ünï✓', true, '9999-12-31 23:59:59.999999', '2262-04-11 23:47:16.854775+00',"
    " '2024-06-30 12:00:00', '9999-12-31', 'ffffffff-ffff-ffff-ffff-ffffffffffff',"
    ' \'{"nested": {"k": [1, "two", null, true]}, "emoji": "🎉"}\', \'\\x0a0d2c22\', 3.141592653589793)',
]


def no_rows_differ(a: dict, b: dict) -> None:
    assert {k: normalise(v) for k, v in a.items()} == {k: normalise(v) for k, v in b.items()}


def test_snapshot_with_concurrent_writes_then_two_windows(db, spark, tmp_path):
    """The union of snapshot rows and change events reproduces the source exactly."""
    db.execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text, qty int, updated timestamptz DEFAULT now());"
        "CREATE TABLE events (id bigserial PRIMARY KEY, item_id int, note text);"
    )
    tables = ["public.items", "public.events"]
    db.execute("INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, 3000) g")
    db.setup_capture(tables)
    stop = threading.Event()
    writes = {"n": 0}

    def writer():
        with db.connect() as conn:
            i = 0
            while not stop.is_set():
                with conn.transaction():
                    conn.execute("UPDATE items SET qty = qty + 1, updated = now() WHERE id = %s", (1 + i % 3000,))
                    conn.execute("INSERT INTO events (item_id, note) VALUES (%s, 'during snapshot')", (i,))
                    if i % 10 == 0:
                        conn.execute("DELETE FROM items WHERE id = %s", (3000 - i // 10,))
                i += 1
                writes["n"] = i

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.3)
        snapshot = run_job(db.spec(tables, snapshot_window(1), tmp_path, snapshot_partition_bytes=1 << 20))
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join()
    assert writes["n"] > 10, "the writer did not overlap the snapshot"
    consistent_point = snapshot.window.to_lsn
    with db.connect() as conn:
        admin.advance_slot(conn, db.slot, consistent_point)
        conn.execute("UPDATE items SET name = name || '!' WHERE id % 7 = 0")
    middle = db.current_lsn()
    run_job(db.spec(tables, stream_window(2, consistent_point, middle), tmp_path))
    with db.connect() as conn:
        conn.execute("DELETE FROM items WHERE id % 11 = 0")
        conn.execute("INSERT INTO items SELECT g, 'new', 0 FROM generate_series(5001, 5100) g")
    end = db.current_lsn()
    run_job(db.spec(tables, stream_window(3, middle, end), tmp_path))
    with db.connect() as conn:
        for table in tables:
            assert_same_state(replay(events_of(tmp_path, "t", table), ["id"]), source_rows(conn, table, ["id"]))
    read = [e for e in events_of(tmp_path, "t", "public.items") if e["op"] == "r"]
    assert read and all(e["source"]["snapshot"] == "true" and e["source"]["lsn"] == consistent_point for e in read)
    assert all(e["before"] is None and e["transaction"] is None for e in read)
    assert all(e["source"]["txId"] is None and e["source"]["xmin"] > 0 for e in read)
    assert {e["source"]["sequence"] for e in read} == {f'[null,"{int(consistent_point)}"]'}
    streamed = [e for e in events_of(tmp_path, "t", "public.items") if e["op"] != "r"]
    assert all(e["source"]["sequence"].endswith(f',"{e["source"]["lsn"]}"]') for e in streamed)


def test_snapshot_and_stream_give_identical_values(db, spark, tmp_path):
    db.execute(TYPES_TABLE)
    with db.connect() as conn:
        for i, row in enumerate(VALUE_ROWS):
            conn.execute(f"INSERT INTO typed VALUES {row}", (i,))
    db.setup_capture(["public.typed"])
    snapshot = run_job(db.spec(["public.typed"], snapshot_window(1), tmp_path))
    with db.connect() as conn:
        for i, row in enumerate(VALUE_ROWS):
            conn.execute(f"INSERT INTO typed VALUES {row}", (100 + i,))
    end = db.current_lsn()
    run_job(db.spec(["public.typed"], stream_window(2, snapshot.window.to_lsn, end), tmp_path))
    events = events_of(tmp_path, "t", "public.typed")
    by_id = {e["after"]["id"]: e for e in events}
    assert len(by_id) == 2 * len(VALUE_ROWS)
    for i in range(len(VALUE_ROWS)):
        from_snapshot, from_stream = by_id[i], by_id[100 + i]
        assert from_snapshot["op"] == "r" and from_stream["op"] == "c"
        no_rows_differ({**from_snapshot["after"], "id": 0}, {**from_stream["after"], "id": 0})
    with db.connect() as conn:
        assert_same_state(replay(events, ["id"]), source_rows(conn, "public.typed", ["id"]))
    schema = read_topic_arrow(str(tmp_path), "t", "t.public.typed").schema
    after = schema.field("after").type
    assert str(after.field("exact").type) == "decimal128(14, 4)"
    assert str(after.field("loose").type) == "string"  # unconstrained numeric keeps its exact text
    assert str(after.field("at").type) == "timestamp[us]"
    assert str(after.field("at_tz").type) == "timestamp[us, tz=UTC]"
    assert str(after.field("raw").type) == "binary"


def test_hostile_identifiers_are_quoted_end_to_end(db, spark, tmp_path):
    schema, table = 'Odd "Schema".x', "ta.ble; DROP TABLE victims; --"
    db.execute(
        'CREATE SCHEMA "Odd ""Schema"".x";'
        'CREATE TABLE "Odd ""Schema"".x"."ta.ble; DROP TABLE victims; --" '
        '("Key Col" int PRIMARY KEY, "sélect" text, "a""b" int);'
        "CREATE TABLE victims (id int);"
    )
    qualified = '"Odd ""Schema"".x"."ta.ble; DROP TABLE victims; --"'
    db.execute(f"INSERT INTO {qualified} VALUES (1, 'one', 1), (2, 'two', 2)")
    db.setup_capture([qualified])
    snapshot = run_job(db.spec([qualified], snapshot_window(1), tmp_path, prefix="odd"))
    db.execute(f'UPDATE {qualified} SET "sélect" = \'uno\' WHERE "Key Col" = 1')
    db.execute(f'DELETE FROM {qualified} WHERE "Key Col" = 2')
    run_job(db.spec([qualified], stream_window(2, snapshot.window.to_lsn, db.current_lsn()), tmp_path, prefix="odd"))
    events = events_of(tmp_path, "odd", f"{schema}.{table}")
    assert [e["op"] for e in sorted(events, key=lambda e: (e["op"] != "r", e["source"]["commit_lsn"]))] == [
        "r",
        "r",
        "u",
        "d",
    ]
    assert {e["source"]["table"] for e in events} == {table}
    assert all("Key Col" in e for e in events)  # key column flat, name kept
    with db.connect() as conn:
        assert conn.execute("SELECT to_regclass('public.victims') IS NOT NULL").fetchone()[0]
        assert_same_state(replay(events, ["Key Col"]), source_rows(conn, (schema, table), ["Key Col"]))


def test_empty_tables_and_many_partitions(db, spark, tmp_path):
    db.execute("CREATE TABLE empty (id int PRIMARY KEY); CREATE TABLE wide (id int PRIMARY KEY, pad text)")
    db.execute("INSERT INTO wide SELECT g, repeat('x', 500) FROM generate_series(1, 20000) g")
    db.setup_capture(["public.empty", "public.wide"])
    entry = run_job(
        db.spec(["public.empty", "public.wide"], snapshot_window(1), tmp_path, snapshot_partition_bytes=1 << 20)
    )
    assert entry.dataset("t.public.wide").events == 20000
    assert entry.dataset("t.public.empty") is None
    ids = [e["after"]["id"] for e in events_of(tmp_path, "t", "public.wide")]
    assert sorted(ids) == list(range(1, 20001))  # every row exactly once across partitions
    assert entry.stats["rows"] == {"t.public.empty": 0, "t.public.wide": 20000}


def test_a_bad_value_in_a_spark_task_fails_terminally_and_commits_nothing(db15, spark, tmp_path):
    from airflow_provider_cdc.cdc.sinks.reader import committed_windows
    from airflow_provider_cdc.cdc.sources.postgres.types import ValueConversionError

    db15.execute("CREATE TABLE prices (id int PRIMARY KEY, amount numeric(10,2)); INSERT INTO prices VALUES (1, 'NaN')")
    db15.setup_capture(["public.prices"])
    with pytest.raises(ValueConversionError, match=r"column 'amount' of public\.prices: value 'NaN'") as failure:
        run_job(db15.spec(["public.prices"], snapshot_window(1), tmp_path))
    assert failure.value.terminal
    assert committed_windows(str(tmp_path), "t") == []


ROUTES_TABLE = """
CREATE SCHEMA ext;
CREATE EXTENSION ltree SCHEMA ext;
CREATE EXTENSION hstore SCHEMA ext;
CREATE TABLE routes (
    id int PRIMARY KEY, flag boolean, ip inet, ch "char", padded char(4), path ext.ltree, pairs ext.hstore,
    amount numeric(6,2), ints int[], doc jsonb, at timestamptz, uid uuid, listed_flag boolean, listed_at timestamptz
)
"""
ROUTES_ROWS = [
    "(%s, true, '10.0.0.1', 'x', 'ab', 'a.b', 'k=>v', 1.5, '{1,NULL}', '{\"a\": [1]}', '2024-01-02 03:04:05+02',"
    " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', false, 'infinity')",
    "(%s, null, null, null, null, null, null, null, null, null, null, null, null, null)",
    "(%s, false, '::1/128', '', '', 'z', '', -0.5, '{}', 'null', '2000-02-29 23:59:59.5+00',"
    " '00000000-0000-0000-0000-000000000000', true, '1970-01-01 00:00:00+00')",
]


def test_every_text_route_reads_what_the_stream_sends_with_select_alone(db15, spark, tmp_path):
    """Columns read as text take three routes (as they are, ``::text``, ``format('%s', ...)`` for
    types whose cast to text differs from their output, ``column_text_list`` included): each gives
    the stream's value and PostgreSQL's own text output, and a role with nothing but ``SELECT``
    on the table (no ``USAGE`` on the extensions' schema) can take the snapshot."""
    from dataclasses import replace

    from airflow_provider_cdc.cdc.events.columns import ColumnRules
    from airflow_provider_cdc.cdc.sources.postgres.connection import connect
    from airflow_provider_cdc.cdc.sources.postgres.events import EventSettings

    db = db15
    db.execute(ROUTES_TABLE)
    with db.connect() as conn:
        for i, row in enumerate(ROUTES_ROWS):
            conn.execute(f"INSERT INTO routes VALUES {row}", (i,))
        role, password = f"snap_{db.name}"[:63], "pw-" + db.name
        conn.execute(f"CREATE ROLE \"{role}\" LOGIN REPLICATION PASSWORD '{password}'")
        conn.execute(f'GRANT SELECT ON routes TO "{role}"')
    db.created_roles.append(role)
    db.setup_capture(["public.routes"])
    settings = EventSettings(columns=ColumnRules.from_options(as_text=[r"public\.routes\.listed_.*"]))
    spec = replace(db.spec(["public.routes"], snapshot_window(1), tmp_path), events=settings)
    snapshot = run_job(replace(spec, connection=replace(db.info, user=role, password=password)))
    with db.connect() as conn:
        for i, row in enumerate(ROUTES_ROWS):
            conn.execute(f"INSERT INTO routes VALUES {row}", (100 + i,))
    stream = replace(db.spec(["public.routes"], stream_window(2, snapshot.window.to_lsn, db.current_lsn()), tmp_path))
    run_job(replace(stream, events=settings))
    by_id = {e["after"]["id"]: e["after"] for e in events_of(tmp_path, "t", "public.routes")}
    texts = ["ip", "ch", "padded", "path", "doc", "listed_flag", "listed_at"]  # captured as their text form
    with connect(db.info) as conn:  # the capture's session settings
        expected = {
            row[0]: dict(zip(texts, row[1:]))
            for row in conn.execute(
                "SELECT id, "
                + ", ".join(f"CASE WHEN {c} IS NOT NULL THEN format('%s', {c}) END" for c in texts)
                + " FROM public.routes WHERE id < 100"
            ).fetchall()
        }
    for i in range(len(ROUTES_ROWS)):
        no_rows_differ({**by_id[i], "id": 0}, {**by_id[100 + i], "id": 0})
        assert {c: by_id[i][c] for c in texts} == expected[i]
    assert [by_id[i]["listed_flag"] for i in range(3)] == ["f", None, "t"]  # boolean's output, not 'false'
    assert by_id[0]["ip"] == "10.0.0.1" and by_id[0]["padded"] == "ab  "
    assert by_id[0]["listed_at"] == "infinity" and by_id[2]["listed_at"] == "1970-01-01 00:00:00+00"
