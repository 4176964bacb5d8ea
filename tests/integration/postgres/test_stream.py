"""Stream windows against real PostgreSQL 15 and 18: bounds, chunks, transactions, re-runs."""

from __future__ import annotations

import threading

import pytest

from airflow_provider_cdc.cdc.basics.errors import PublicationError
from airflow_provider_cdc.cdc.sinks.reader import committed_windows, read_topic_arrow
from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
from tests.support.databases import stream_window
from tests.support.oracle import assert_same_state, events_of, replay, source_rows

TABLES = ["public.accounts", "public.transfers"]


def no_spark():
    raise AssertionError("a stream window on a local sink must not start Spark")


@pytest.fixture
def bank(db):
    db.execute(
        "CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2) NOT NULL);"
        "CREATE TABLE transfers (id bigserial PRIMARY KEY, src int, dst int, amount numeric(12,2),"
        " at timestamptz DEFAULT now(), memo text);"
        "CREATE TABLE unrelated (id int PRIMARY KEY, v text);"
    )
    status = db.setup_capture(TABLES)
    return db, status.confirmed_flush_lsn


def transfer(conn, src: int, dst: int, amount: str) -> None:
    with conn.transaction():
        conn.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", (amount, src))
        conn.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", (amount, dst))
        conn.execute("INSERT INTO transfers (src, dst, amount, memo) VALUES (%s, %s, %s, 'x')", (src, dst, amount))


def run_window(db, sink, seq, start, end, **options):
    return run_job(db.spec(TABLES, stream_window(seq, start, end), sink, **options), spark_provider=no_spark)


def test_windows_end_at_commit_boundaries_and_never_overlap(bank, tmp_path):
    db, start = bank
    with db.connect() as conn:
        conn.execute("INSERT INTO accounts SELECT g, 'owner ' || g, 100 FROM generate_series(1, 10) g")
        transfer(conn, 1, 2, "5.00")
        target = db.current_lsn()
        transfer(conn, 3, 4, "7.00")  # commits after the target: belongs to the next window
        end = db.current_lsn()
    first = run_window(db, tmp_path, 1, start, target)
    assert first.transactions == 2
    assert first.dataset("t.public.accounts").ops == {"c": 10, "u": 2}
    second = run_window(db, tmp_path, 2, target, end)
    assert second.transactions == 1
    assert second.dataset("t.public.accounts").ops == {"u": 2}
    assert second.dataset("t.public.transfers").ops == {"c": 1}
    with db.connect() as conn:
        for table in TABLES:
            assert_same_state(replay(events_of(tmp_path, "t", table), ["id"]), source_rows(conn, table, ["id"]))


def test_transaction_metadata_is_dense_and_ordered(bank, tmp_path):
    db, start = bank
    with db.connect() as conn:
        conn.execute("INSERT INTO accounts SELECT g, 'o', 100 FROM generate_series(1, 4) g")
        with conn.transaction():  # one transaction touching both tables several times
            for i in range(3):
                conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", (i + 1,))
                conn.execute("INSERT INTO transfers (src, dst, amount) VALUES (%s, 2, 1)", (i + 1,))
            conn.execute("DELETE FROM accounts WHERE id = 4")
        end = db.current_lsn()
    entry = run_window(db, tmp_path, 1, start, end, max_changes_per_chunk=2)
    assert entry.transactions == 2 and entry.stats["chunks"] >= 4
    tx = read_topic_arrow(str(tmp_path), "t", "t.transaction").to_pylist()
    assert [r["status"] for r in tx] == ["BEGIN", "END", "BEGIN", "END"]
    big_end = tx[3]
    assert big_end["event_count"] == 7
    assert {c["data_collection"]: c["event_count"] for c in big_end["data_collections"]} == {
        "public.accounts": 4,
        "public.transfers": 3,
    }
    events = [e for table in TABLES for e in events_of(tmp_path, "t", table) if e["transaction"]["id"] == big_end["id"]]
    assert sorted(e["transaction"]["total_order"] for e in events) == list(range(1, 8))
    for table, count in (("public.accounts", 4), ("public.transfers", 3)):
        orders = sorted(
            (e["transaction"]["total_order"], e["transaction"]["data_collection_order"])
            for e in events
            if f"{e['source']['schema']}.{e['source']['table']}" == table
        )
        assert [dco for _, dco in orders] == list(range(1, count + 1))  # dense, in total order
    assert all(e["transaction"]["id"] == f"{e['source']['txId']}:{e['source']['commit_lsn']}" for e in events)
    assert tx[2]["id"] == big_end["id"] and tx[2]["event_count"] is None


def test_chunk_size_does_not_change_the_output(bank, tmp_path):
    db, start = bank
    with db.connect() as conn:
        conn.execute("INSERT INTO accounts SELECT g, 'o' || g, g FROM generate_series(1, 300) g")
        for i in range(1, 40):
            transfer(conn, i, i + 1, "1.00")
        conn.execute("DELETE FROM accounts WHERE id > 250")
        end = db.current_lsn()
    small, large = tmp_path / "small", tmp_path / "large"
    run_window(db, small, 1, start, end, max_changes_per_chunk=7)
    run_window(db, large, 1, start, end, max_changes_per_chunk=100_000)
    for table in [*TABLES, "transaction"]:
        topic = f"t.{table}"
        a = read_topic_arrow(str(small), "t", topic).to_pylist()
        b = read_topic_arrow(str(large), "t", topic).to_pylist()
        key = (
            (lambda r: (r["id"], r["status"]))
            if table == "transaction"
            else (lambda r: (r["source"]["commit_lsn"], r["transaction"]["total_order"]))
        )
        assert sorted(a, key=key) == sorted(b, key=key)


def test_rerunning_a_window_replaces_its_output(bank, tmp_path):
    db, start = bank
    with db.connect() as conn:
        conn.execute("INSERT INTO accounts SELECT g, 'o', 1 FROM generate_series(1, 20) g")
        transfer(conn, 1, 2, "0.50")
        end = db.current_lsn()
    first = run_window(db, tmp_path, 1, start, end)
    rows_first = read_topic_arrow(str(tmp_path), "t", "t.public.accounts").to_pylist()
    second = run_window(db, tmp_path, 1, start, end)  # not acknowledged: the slot replays it
    rows_second = read_topic_arrow(str(tmp_path), "t", "t.public.accounts").to_pylist()
    assert rows_first == rows_second  # same rows, byte for byte (ts_ms is the planned time)
    assert [e.attempt for e in committed_windows(str(tmp_path), "t")] == [second.attempt]
    assert first.attempt != second.attempt


def test_window_with_nothing_captured(bank, tmp_path):
    db, start = bank
    db.execute("INSERT INTO unrelated SELECT g, 'x' FROM generate_series(1, 100) g")  # not captured
    end = db.current_lsn()
    entry = run_window(db, tmp_path, 1, start, end)
    assert entry.datasets == () and entry.transactions == 0
    assert entry.window.to_lsn == end
    assert committed_windows(str(tmp_path), "t")[0].window.to_lsn == end


def test_empty_range_window_reads_nothing(bank, tmp_path):
    db, start = bank
    entry = run_window(db, tmp_path, 1, start, start)
    assert entry.window.is_empty_range and entry.datasets == ()


def test_slot_is_not_acknowledged_by_the_job(bank, tmp_path):
    db, start = bank
    db.execute("INSERT INTO accounts VALUES (1, 'a', 1)")
    run_window(db, tmp_path, 1, start, db.current_lsn())
    assert db.slot_status().confirmed_flush_lsn == start  # acknowledging is the operator's job


def test_concurrent_writers_during_a_window(bank, tmp_path):
    """Transactions committing while the window is read are split exactly at the target."""
    db, start = bank
    db.execute("INSERT INTO accounts SELECT g, 'o', 1000 FROM generate_series(1, 50) g")
    stop = threading.Event()

    def writer():
        with db.connect() as conn:
            i = 0
            while not stop.is_set():
                transfer(conn, 1 + i % 50, 1 + (i + 7) % 50, "1.00")
                i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        boundaries = [start]
        for seq in range(1, 4):
            boundaries.append(db.current_lsn())
            run_window(db, tmp_path, seq, boundaries[-2], boundaries[-1])
    finally:
        stop.set()
        thread.join()
    final = db.current_lsn()
    run_window(db, tmp_path, 4, boundaries[-1], final)
    with db.connect() as conn:
        for table in TABLES:
            assert_same_state(replay(events_of(tmp_path, "t", table), ["id"]), source_rows(conn, table, ["id"]))
    tx = read_topic_arrow(str(tmp_path), "t", "t.transaction").to_pylist()
    ids = [r["id"] for r in tx if r["status"] == "END"]
    assert len(ids) == len(set(ids))  # no transaction in two windows


def test_publication_must_contain_the_tables(bank, tmp_path):
    db, start = bank
    db.execute(f"ALTER PUBLICATION {db.publication} DROP TABLE transfers")
    with pytest.raises(PublicationError, match="does not contain"):
        run_window(db, tmp_path, 1, start, db.current_lsn())
    assert committed_windows(str(tmp_path), "t") == []
