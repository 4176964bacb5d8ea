"""Incremental (watermark) snapshots while capture continues, end to end through the job."""

from __future__ import annotations

import random
import threading
from dataclasses import replace

import pytest

from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.incremental import IncrementalState, Signal, apply_signal
from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from tests.support.databases import snapshot_window, stream_window
from tests.support.oracle import assert_same_state, events_of, replay, source_rows
from tests.support.scenario import no_spark

ITEMS = TableRef("public", "items")


class Capture:
    """A capture driven window by window, threading the incremental state like the operator."""

    def __init__(self, db, root, *, chunk_size=100, chunks_per_run=3, signal_table=None, watermarks="message"):
        self.db, self.sink = db, root / "lake"
        self.state: IncrementalState | None = None
        self.seq = 0
        self.position = None
        self.options = {"incremental_chunk_size": chunk_size, "incremental_chunks_per_run": chunks_per_run}
        self.signal_table, self.watermarks = signal_table, watermarks
        self.tables = ["public.items"]
        self.position = db.setup_capture(self.tables + ([signal_table] if signal_table else [])).confirmed_flush_lsn
        self.entries = []

    def spec(self, window):
        spec = self.db.spec(self.tables, window, self.sink, **self.options)
        signal = TableRef.parse(self.signal_table) if self.signal_table else None
        return replace(spec, incremental=self.state, signal_table=signal, incremental_watermarks=self.watermarks)

    def snapshot(self):
        self.seq += 1
        entry = run_job(self.spec(snapshot_window(self.seq)))
        self._acknowledge(entry.window.to_lsn)
        return entry

    def window(self):
        self.seq += 1
        end = self.db.current_lsn()
        entry = run_job(self.spec(stream_window(self.seq, self.position, end)), spark_provider=no_spark)
        self.state = IncrementalState.from_dict(entry.stats["incremental"])
        self._acknowledge(end)
        self.entries.append(entry)
        return entry

    def signal(self, kind, data, captured=(ITEMS,)):
        state, _ = apply_signal(self.state or IncrementalState(), Signal("s", kind, data, "test"), list(captured))
        self.state = state

    def _acknowledge(self, lsn):
        with self.db.connect() as conn:
            admin.advance_slot(conn, self.db.slot, lsn)
        self.position = lsn

    def events(self):
        return events_of(self.sink, "t", "public.items")

    def assert_matches_source(self):
        with self.db.connect() as conn:
            source = source_rows(conn, "public.items", ["id"])
        assert_same_state(replay(self.events(), ["id"]), source)


def _create(db, rows):
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, note text)")
    db.execute("INSERT INTO items SELECT g, 0, 'n' || g FROM generate_series(1, %s) g", (rows,))


def _incremental_rows(events):
    return [e for e in events if e["op"] == "r" and e["source"]["snapshot"] == "incremental"]


def test_chunks_are_read_after_one_window_and_emitted_by_the_next(db15, tmp_path):
    _create(db15, 1000)
    capture = Capture(db15, tmp_path, chunk_size=300, chunks_per_run=2)
    capture.snapshot()
    capture.signal("execute-snapshot", {"data-collections": ["public.items"]})
    first = capture.window()
    assert first.stats["incremental_run"]["staged_chunks"] == 2
    assert not _incremental_rows(capture.events())  # staged, not yet emitted
    db15.execute("UPDATE items SET v = 1 WHERE id = 5")  # after the chunk's high watermark
    db15.execute("DELETE FROM items WHERE id = 10")
    second = capture.window()
    rows = _incremental_rows(capture.events())
    assert sorted(e["after"]["id"] for e in rows) == list(range(1, 601))
    assert {e["window_id"] for e in rows} == {second.window_id}
    assert all(e["source"]["lsn"] == e["source"]["commit_lsn"] for e in rows)
    assert second.stats["incremental_run"]["staged_chunks"] == 2  # chunks 3 and 4 (rows 601-1000)
    capture.window()
    capture.window()
    rows = _incremental_rows(capture.events())
    ids = [e["after"]["id"] for e in rows]
    # Every row once, up to the last key (10 and 5 changed after their chunk's high watermark:
    # their r comes first, the stream's d and u follow).
    assert sorted(ids) == list(range(1, 1001))
    assert capture.state.idle and capture.state.history[-1].status == "done"
    capture.assert_matches_source()


def test_concurrent_writes_during_the_incremental_snapshot_leave_the_source_state(db15, tmp_path):
    _create(db15, 3000)
    capture = Capture(db15, tmp_path, chunk_size=250, chunks_per_run=3)
    capture.snapshot()
    capture.signal("execute-snapshot", {"data-collections": ["public.items"]})
    stop = threading.Event()

    def hammer():
        rng = random.Random(7)
        next_id = 3001
        with db15.connect() as conn:
            while not stop.is_set():
                roll = rng.random()
                key = rng.randint(1, next_id)
                if roll < 0.5:
                    conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", (key,))
                elif roll < 0.75:
                    conn.execute("DELETE FROM items WHERE id = %s", (key,))
                else:
                    conn.execute("INSERT INTO items VALUES (%s, 0, 'new') ON CONFLICT DO NOTHING", (next_id,))
                    next_id += 1

    writer = threading.Thread(target=hammer)
    writer.start()
    try:
        for _ in range(8):
            capture.window()
    finally:
        stop.set()
        writer.join()
    capture.window()
    capture.window()
    assert capture.state.idle
    capture.assert_matches_source()
    superseded = sum(e.stats["incremental_run"]["superseded_rows"] for e in capture.entries)
    assert superseded > 0  # the hammer did change keys inside watermark windows
    for entry in capture.entries:  # no key twice as a snapshot row within a window
        ids = [e["after"]["id"] for e in _incremental_rows(capture.events()) if e["window_id"] == entry.window_id]
        assert len(ids) == len(set(ids))
    capture.assert_matches_source()


@pytest.mark.parametrize("watermarks", ["insert_insert", "insert_delete"])
def test_signal_table_triggers_and_watermark_rows(db15, tmp_path, watermarks):
    _create(db15, 500)
    db15.execute("CREATE TABLE dbz_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data text)")
    capture = Capture(
        db15, tmp_path, chunk_size=200, chunks_per_run=5, signal_table="public.dbz_signal", watermarks=watermarks
    )
    capture.snapshot()
    db15.execute(
        "INSERT INTO dbz_signal VALUES ('sig-1', 'execute-snapshot', %s)",
        (
            '{"data-collections": ["public\\\\.items"], "additional-conditions": '
            '[{"data-collection": "public.items", "filter": "id > 100"}]}',
        ),
    )
    db15.execute("INSERT INTO dbz_signal VALUES ('sig-2', 'log', '{\"message\": \"at {}\"}')")
    first = capture.window()
    notes = first.stats["incremental_run"]["notes"]
    assert any("incremental snapshot of public.items" in n for n in notes), notes
    assert any(n.endswith(f"at {first.window.to_lsn} (commit " + n.split("(commit ")[-1]) for n in notes if "log" in n)
    capture.window()
    rows = _incremental_rows(capture.events())
    assert sorted(e["after"]["id"] for e in rows) == list(range(101, 501))
    with db15.connect() as conn:
        kinds = [r[0] for r in conn.execute("SELECT type FROM dbz_signal ORDER BY id").fetchall()]
    opened = kinds.count("snapshot-window-open")
    assert opened == (0 if watermarks == "insert_delete" else 2)
    assert kinds.count("snapshot-window-close") == (2 if watermarks == "insert_insert" else 0)
    assert not events_of(capture.sink, "t", "public.dbz_signal")  # signals are not captured data


def test_stop_pause_and_resume(db15, tmp_path):
    _create(db15, 1000)
    capture = Capture(db15, tmp_path, chunk_size=100, chunks_per_run=1)
    capture.snapshot()
    capture.signal("execute-snapshot", {"data-collections": ["public.items"]})
    capture.window()  # chunk 1 staged
    capture.signal("pause-snapshot", {})
    paused = capture.window()  # emits chunk 1, reads nothing
    assert paused.stats["incremental_run"]["staged_chunks"] == 0
    assert len(_incremental_rows(capture.events())) == 100
    capture.signal("resume-snapshot", {})
    capture.window()  # chunk 2 staged
    capture.signal("stop-snapshot", {"type": "incremental"})
    capture.window()  # chunk 2 dropped with the stop, nothing read
    assert len(_incremental_rows(capture.events())) == 100
    assert capture.state.idle and capture.state.history[-1].status == "stopped"


def test_a_failing_table_does_not_block_the_others(db15, tmp_path):
    _create(db15, 300)
    db15.execute("CREATE TABLE other (id int PRIMARY KEY, w int)")
    db15.execute("INSERT INTO other SELECT g, g FROM generate_series(1, 50) g")
    capture = Capture(db15, tmp_path, chunk_size=100, chunks_per_run=5)
    capture.tables = ["public.items", "public.other"]
    db15.setup_capture(capture.tables)
    capture.snapshot()
    conditions = [{"data-collection": "public.items", "filter": "no_such_column > 1"}]
    capture.signal(
        "execute-snapshot",
        {"data-collections": ["public.items", "public.other"], "additional-conditions": conditions},
        captured=[ITEMS, TableRef("public", "other")],
    )
    first = capture.window()
    notes = first.stats["incremental_run"]["notes"]
    assert any('public"' in n and "failed" in n and "no_such_column" in n for n in notes), notes
    history = {t.table.name: t for t in capture.state.history}
    assert history["items"].status == "failed" and "no_such_column" in history["items"].error
    assert history["other"].status == "done" and history["other"].rows == 50
    capture.window()
    other = events_of(capture.sink, "t", "public.other")
    assert sorted(e["after"]["id"] for e in other if e["source"]["snapshot"] == "incremental") == list(range(1, 51))


def test_a_surrogate_key_chunks_a_table_without_primary_key(db15, tmp_path):
    db15.execute("CREATE TABLE items (id int NOT NULL, v int NOT NULL, note text)")
    db15.execute("ALTER TABLE items REPLICA IDENTITY FULL")
    db15.execute("INSERT INTO items SELECT g, 0, 'n' || g FROM generate_series(1, 250) g")
    capture = Capture(db15, tmp_path, chunk_size=100, chunks_per_run=3)
    capture.snapshot()
    capture.signal("execute-snapshot", {"data-collections": ["public.items"], "surrogate-key": "id"})
    capture.window()
    db15.execute("UPDATE items SET v = 1 WHERE id = 3")
    capture.window()
    rows = _incremental_rows(capture.events())
    assert sorted(e["after"]["id"] for e in rows) == list(range(1, 251))
    missing = apply_signal(
        IncrementalState(), Signal("s", "execute-snapshot", {"data-collections": ["public.items"]}, "t"), [ITEMS]
    )[0]
    capture.state = missing  # no surrogate key and no primary key: the table fails, clearly
    capture.window()
    assert "has no primary key" in capture.state.history[-1].error


def test_char_keys_null_surrogate_keys_and_conditions_page_exactly(db15, tmp_path):
    # char(n) keys: bounds cast to char(1) would page the first letter forever.
    db15.execute("CREATE TABLE codes (code char(3) PRIMARY KEY, v int)")
    db15.execute("INSERT INTO codes VALUES ('A01', 1), ('A02', 2), ('A03', 3), ('B01', 4), ('B2', 5)")
    # A NULL surrogate key: those rows cannot be paged, the others must all be read.
    db15.execute("CREATE TABLE loose (sk int, v int)")
    db15.execute("ALTER TABLE loose REPLICA IDENTITY FULL")
    db15.execute("INSERT INTO loose SELECT g, g FROM generate_series(1, 7) g UNION ALL SELECT NULL, 0")
    _create(db15, 9)
    capture = Capture(db15, tmp_path, chunk_size=2, chunks_per_run=30)
    capture.tables = ["public.codes", "public.loose", "public.items"]
    db15.setup_capture(capture.tables)
    capture.snapshot()
    refs = [TableRef("public", n) for n in ("codes", "loose", "items")]
    # An OR in a filter stays inside the filter's parentheses: it cannot widen the key bounds.
    conditions = [{"data-collection": "public.items", "filter": "id >= 1 OR id < 1"}]
    data = {"data-collections": ["public.codes", "public.items"], "additional-conditions": conditions}
    capture.signal("execute-snapshot", data, refs)
    capture.signal("execute-snapshot", {"data-collections": ["public.loose"], "surrogate-key": "sk"}, refs)
    capture.window()
    capture.window()
    history = {t.table.name: t for t in capture.state.history}
    assert {n: t.status for n, t in history.items()} == {"codes": "done", "loose": "done", "items": "done"}

    def read(table):
        return [e["after"] for e in _incremental_rows(events_of(capture.sink, "t", f"public.{table}"))]

    assert sorted(r["code"] for r in read("codes")) == ["A01", "A02", "A03", "B01", "B2 "]
    assert sorted(r["sk"] for r in read("loose")) == list(range(1, 8))
    assert sorted(r["id"] for r in read("items")) == list(range(1, 10))  # each once


def test_a_filter_selects_rows_by_its_columns_and_a_server_error_is_reported_without_its_text(db15, tmp_path):
    _create(db15, 40)
    capture = Capture(db15, tmp_path, chunk_size=7, chunks_per_run=20)
    capture.snapshot()
    filtered = {
        "data-collections": ["public.items"],
        "additional-conditions": [
            {"data-collection": "public.items", "filter": "(id BETWEEN 5 AND 30 AND NOT id IN (7, 8)) OR id > 38"}
        ],
    }
    capture.signal("execute-snapshot", filtered)
    capture.window()
    capture.window()
    expected = [i for i in range(1, 41) if (5 <= i <= 30 and i not in (7, 8)) or i > 38]
    assert sorted(e["after"]["id"] for e in _incremental_rows(capture.events())) == expected
    # A value the column's type refuses: the server's own message is left out, its SQLSTATE kept.
    marker = "zz-marker-value"
    bad = {
        "data-collections": ["public.items"],
        "additional-conditions": [
            {"data-collection": "public.items", "filter": {"column": "id", "op": "=", "value": marker}}
        ],
    }
    capture.signal("execute-snapshot", bad)
    entry = capture.window()
    failed = capture.state.history[-1]
    assert failed.status == "failed" and "SQLSTATE 22P02" in failed.error, failed
    notes = entry.stats["incremental_run"]["notes"]
    assert not any("invalid input syntax" in text for text in (failed.error, *notes)), (failed.error, notes)


def test_a_commit_held_back_by_a_synchronous_standby_is_never_overwritten_by_a_chunk(db15, tmp_path):
    """A commit in WAL (and pg_xact) but invisible while it waits for a synchronous standby lands
    in the window that holds its commit record. A chunk read in a *later* window still does not
    see it, and no later stream event would supersede the chunk's old row: it must not be kept."""
    _create(db15, 50)
    capture = Capture(db15, tmp_path, chunk_size=100, chunks_per_run=1)
    capture.snapshot()
    capture.signal("execute-snapshot", {"data-collections": ["public.items"]})
    db15.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
    db15.execute("SELECT pg_reload_conf()")
    writer = threading.Thread(target=db15.execute, args=("UPDATE items SET v = 99 WHERE id = 5",))
    try:
        writer.start()
        with db15.connect() as conn:
            for _ in range(200):
                waiting = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").fetchone()
                if waiting[0]:
                    break
                threading.Event().wait(0.05)
            else:
                pytest.fail("the update never waited for the standby")
        first = capture.window()  # holds the commit record; its chunk is not kept
        second = capture.window()  # the commit is in no later window; still invisible
        for entry in (first, second):
            assert entry.stats["incremental_run"]["staged_chunks"] == 0, entry.stats["incremental_run"]
            assert any("not kept" in n for n in entry.stats["incremental_run"]["notes"])
    finally:
        db15.execute("ALTER SYSTEM RESET synchronous_standby_names")
        db15.execute("SELECT pg_reload_conf()")
        writer.join(30)
    assert not writer.is_alive()
    for _ in range(3):
        capture.window()
    assert capture.state.history[-1].status == "done"
    capture.assert_matches_source()
