"""One transaction far larger than a chunk (1 M rows in CI, ten chunks) flows through in chunks.

The window buffers at most ``max_changes_per_chunk`` changes, so memory stays bounded whatever
the transaction size; the transaction still gets one BEGIN/END pair and a dense total_order.
Compared with the source by aggregates (row-by-row Python comparison of millions of rows would
itself need the memory this test is about). Size: ``CDC_LARGE_TX_ROWS`` (the memory benchmark in
docs/benchmarks.md ran it at 5 000 000: ``CDC_LARGE_TX_ROWS=5000000 ./scripts/test.sh
tests/integration/postgres/test_large_transaction.py``).
"""

from __future__ import annotations

import os
import time

import pytest

from airflow_provider_cdc.cdc.sinks.reader import read_topic_spark
from tests.support.scenario import Scenario

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS = int(os.environ.get("CDC_LARGE_TX_ROWS", "1000000"))
CHUNK = 100_000 if ROWS <= 2_000_000 else 250_000


def test_a_huge_transaction_flows_in_chunks(db15, spark, tmp_path):
    from pyspark.sql import functions as F

    db = db15
    db.execute("CREATE TABLE big (id bigint PRIMARY KEY, v int NOT NULL, note text NOT NULL)")
    db.execute(f"INSERT INTO big SELECT g, 0, 'n' || g FROM generate_series(1, {ROWS}) g")
    scenario = Scenario(db, ["public.big"], tmp_path, spark=spark, chunk=CHUNK)
    started = time.monotonic()
    scenario.snapshot()
    snapshot_seconds = time.monotonic() - started
    db.execute("UPDATE big SET v = v + 1, note = note || '!'")  # one transaction, ROWS changes
    started = time.monotonic()
    window = scenario.window()
    window_seconds = time.monotonic() - started
    assert window.stats["changes"] == ROWS and window.transactions == 1
    assert window.stats["chunks"] >= ROWS // CHUNK
    events = read_topic_spark(spark, str(scenario.sink), "t", "t.public.big").filter(
        F.col("window_id") == window.window_id
    )
    orders = events.agg(
        F.count("*"),
        F.min("transaction.total_order"),
        F.max("transaction.total_order"),
        F.countDistinct("transaction.total_order"),
    ).first()
    assert tuple(orders) == (ROWS, 1, ROWS, ROWS)  # dense and unique across every chunk
    tx = read_topic_spark(spark, str(scenario.sink), "t", "t.transaction").filter(F.col("status") == "END").first()
    assert tx["event_count"] == ROWS
    started = time.monotonic()
    state = scenario.state("public.big")
    got = state.agg(F.count("*"), F.sum("v"), F.sum(F.length("note")), F.min("id"), F.max("id")).first()
    state_seconds = time.monotonic() - started
    with db.connect() as conn:
        want = conn.execute("SELECT count(*), sum(v), sum(length(note)), min(id), max(id) FROM big").fetchone()
    assert tuple(int(x) for x in got) == tuple(int(x) for x in want)
    print(f"rows {ROWS}: snapshot {snapshot_seconds:.0f}s, window {window_seconds:.0f}s, state {state_seconds:.0f}s")
