"""A real window read through ``pg_logical_slot_peek_binary_changes`` into the columnar collector
gives the events the streaming collector gives for the same window from the replication protocol."""

from __future__ import annotations

import pyarrow as pa

from airflow_provider_cdc.cdc.events.settings import EventContext
from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.replication import ReplicationConnection
from airflow_provider_cdc.cdc.sources.postgres.stream import MARKER_PREFIX, WindowCollector
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef, quote_ident
from airflow_provider_cdc.cdc.sources.postgres.types import TypeCache
from airflow_provider_cdc.cdc.sources.postgres.window_batches import BatchWindowCollector
from tests.support.databases import stream_window
from tests.unit.cdc.postgres.test_window_batches import Flushes, assert_same

TABLES = ["public.items", "public.full_items"]
BIG = "(SELECT string_agg(md5(g::text || random()::text), '') FROM generate_series(1, 300) g)"  # TOASTed


def collect(db, cls, window, feed):
    out = Flushes()
    refs = [TableRef.parse(t) for t in TABLES]
    with db.connect() as catalog:
        tables = admin.describe_tables(catalog, refs)
        known = {(c.type.oid, c.type.modifier): c.type for t in tables.values() for c in t.columns}
        collector = cls(
            window=window,
            tables=tables,
            context=EventContext.of_window("t", db.name, window),
            topic_prefix="t",
            previous_commit_lsn=None,
            max_changes_per_chunk=64,
            flush=out,
            types=TypeCache(catalog, known),
        )
        feed(collector)
        result = collector.finish()
    return out.calls, result


def test_a_peeked_window_gives_the_streamed_events(db15):
    db = db15
    db.execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text, qty numeric(10,2), at timestamptz DEFAULT now());"
        "CREATE TABLE full_items (id int, body text);"
        "ALTER TABLE full_items REPLICA IDENTITY FULL;"
        "CREATE TABLE unrelated (id int PRIMARY KEY)"
    )
    start = db.setup_capture(TABLES).confirmed_flush_lsn
    with db.connect() as conn:
        conn.execute("INSERT INTO items (id, name, qty) SELECT g, 'item ' || g, g / 3.0 FROM generate_series(1, 300) g")
        conn.execute(f"INSERT INTO full_items SELECT g, {BIG} FROM generate_series(1, 3) g")
        with conn.transaction():
            conn.execute("UPDATE items SET qty = qty + 1 WHERE id % 7 = 0")
            conn.execute("SELECT pg_logical_emit_message(true, 'app.audit', 'in a transaction')")
            conn.execute("UPDATE items SET id = id + 1000 WHERE id = 5")  # a key change
            conn.execute("INSERT INTO unrelated VALUES (1)")
            conn.execute("UPDATE full_items SET id = id + 10 WHERE id = 1")  # body: unchanged TOAST
        conn.execute("SELECT pg_logical_emit_message(false, 'app.audit', 'on its own')")
        conn.execute("DELETE FROM items WHERE id BETWEEN 10 AND 60")
        conn.execute("ALTER TABLE items ADD COLUMN note text")
        conn.execute("INSERT INTO items (id, name, note) SELECT g, 'late', 'n' FROM generate_series(400, 450) g")
        conn.execute("TRUNCATE full_items")
        end = db.current_lsn()
        conn.execute("INSERT INTO items (id, name) VALUES (999, 'after the window')")
        conn.execute("SELECT pg_logical_emit_message(false, %s, 'end')", (MARKER_PREFIX,))
    window = stream_window(1, start, end)

    def peek(collector: BatchWindowCollector) -> None:
        with db.connect() as conn:
            rows = conn.execute(
                "SELECT (lsn - '0/0')::bigint, xid::text::bigint, data FROM pg_logical_slot_peek_binary_changes("
                "%s, NULL, NULL, 'proto_version', '1', 'publication_names', %s, 'messages', 'true')",
                (db.slot, quote_ident(db.publication)),
            ).fetchall()
        lsn, xid, data = (list(c) for c in zip(*rows))
        batch = pa.RecordBatch.from_arrays(
            [pa.array(lsn, pa.int64()), pa.array(xid, pa.int64()), pa.array(data, pa.binary())],
            names=["lsn", "xid", "data"],
        )
        collector.consume_batches(batch.slice(at, 100) for at in range(0, len(batch), 100))

    def stream(collector: WindowCollector) -> None:
        with ReplicationConnection(db.info) as replication:
            options = {"proto_version": "1", "publication_names": quote_ident(db.publication), "messages": "true"}
            replication.start_logical(db.slot, start, options)
            collector.consume(replication.frames(idle_timeout=30))

    streamed = collect(db, WindowCollector, window, stream)
    peeked = collect(db, BatchWindowCollector, window, peek)
    assert streamed[1].changes > 400 and streamed[1].chunks > 5 and streamed[1].key_changes == 1
    assert_same(streamed, peeked)
