"""Crash safety with the lake on S3: runs killed (SIGKILL) at fault points, every sink format.

The crash harness (``tests/support/crash.py``) with its sink under an ``s3://`` prefix of the
suite's S3 server (SeaweedFS). The child processes that are killed, and the next run in this
process, reach the store through an Airflow ``aws`` connection (``object_store_conn_id``), as a
deployment's workers do; ``verify`` reads the commit log and every landed dataset back from the
bucket (and, for Iceberg and Delta, every table whole with its own library). Iceberg's catalog is
a pyiceberg SQL catalog in the suite's PostgreSQL (a bucket has no catalog of its own).

Per format, a CI-sized sample of stream-window kills, each followed by the next run and the
harness's checks (nothing lost, nothing duplicated, the state equals the source, the offset at
the last committed window): after the commit-log entry was published (``sink.committed``);
for Iceberg and Delta between the window's table commits (``sink.table_committed``); for
Parquet mid-window, after a chunk's files landed (``window.chunk_written``). Every fault point,
random kills and snapshot kills included:

    CDC_S3_CRASH_FULL=1 ./scripts/test.sh tests/integration/object_store/test_crash_s3.py
"""

from __future__ import annotations

import os
import random

import pytest

from airflow_provider_cdc.cdc.basics.naming import commit_log_directory
from airflow_provider_cdc.cdc.sinks import object_store
from tests.support import crash as harness
from tests.support.crash import CrashCapture, prepare_shop
from tests.support.crash_sources import PostgresCrashSource
from tests.support.s3_server import BUCKET

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEYS = {"public.customers": ["id"], "public.orders": ["id"], "public.order_items": ["order_id", "line_no"]}
FULL = bool(os.environ.get("CDC_S3_CRASH_FULL"))

# A stream window commits customers, order_items, orders, then the transaction table, then the log.
STREAM_FAULTS = {
    "parquet": [("window.chunk_written", 2), ("sink.committed", 1)]
    + ([("window.chunk_written", 1), ("window.read_done", 1), ("operator.offset_saved", 1)] if FULL else []),
    "iceberg": [("sink.table_committed", 2), ("sink.committed", 1)]
    + ([("sink.table_committed", 1), ("sink.table_committed", 4), ("operator.offset_saved", 1)] if FULL else []),
    "delta": [("sink.table_committed", 2), ("sink.committed", 1)]
    + ([("sink.table_committed", 1), ("sink.table_committed", 4), ("operator.offset_saved", 1)] if FULL else []),
}
# Only in the full run: a first snapshot killed (Spark's tasks write it to the bucket).
SNAPSHOT_FAULTS = {
    "parquet": [("snapshot.table_written", 2), ("sink.committed", 1)],
    "iceberg": [("sink.table_committed", 1), ("sink.table_committed", 3), ("sink.committed", 1)],
    "delta": [("sink.table_committed", 1), ("sink.table_committed", 3), ("sink.committed", 1)],
}


@pytest.fixture
def s3_capture(db15, spark, s3_server, s3_prefix_without_access, monkeypatch):
    """A capture factory: the shop database, its lake under ``s3_prefix``, the access only from
    an ``aws`` connection (the fixture's own access is switched off)."""
    conn_id = prepare_shop(db15, monkeypatch, "s3crash", customers=20, orders_per_customer=2)
    store = harness.object_store_connection(monkeypatch, s3_server)

    def make(sink_format: str, prefix: str = "lake", *, chunk: int = 100_000) -> CrashCapture:
        overrides = {**store, "sink_format": sink_format}
        if sink_format == "iceberg":  # a SQL catalog in the suite's PostgreSQL
            cluster = db15.cluster
            uri = (
                f"postgresql+psycopg://{cluster.superuser}:{cluster.password}@{cluster.host}:{cluster.port}/{db15.name}"
            )
            overrides["table_catalog"] = {"type": "sql", "uri": uri}
        sink = f"{s3_prefix_without_access}/{prefix}"
        return CrashCapture(db15, conn_id, prefix, sink, KEYS, chunk=chunk, overrides=overrides)

    return make


class Workload(harness.Workload):
    def __init__(self, db):
        super().__init__(PostgresCrashSource(db, conn_id=""))


def _landed_in_the_bucket(s3_server, capture: CrashCapture) -> list[str]:
    _, key = object_store.split_bucket(str(capture.sink))
    return s3_server.keys(BUCKET, key + "/")


@pytest.mark.parametrize("sink_format", ["parquet", "iceberg", "delta"])
def test_stream_windows_killed_on_s3_lose_and_duplicate_nothing(db15, s3_server, s3_capture, sink_format):
    capture = s3_capture(sink_format, chunk=10)
    capture.run("setup")
    capture.run("snapshot")
    workload = Workload(db15)
    cycles = [{"fault": harness.fault(p, n)} for p, n in STREAM_FAULTS[sink_format]]
    cycles += [{"random": True}, {"random": True}] if FULL else []  # killed wherever the window then is
    seen = harness.stream_crashes(capture, workload, cycles, random.Random(20261127), writer_rounds=1)
    assert seen.outcomes["killed"] >= len(STREAM_FAULTS[sink_format])
    assert seen.counts is not None and seen.counts["change_events"] > 0
    # The commit log is in the bucket, one entry per window (published by a conditional PUT).
    log = commit_log_directory(capture.prefix)
    entries = [k for k in _landed_in_the_bucket(s3_server, capture) if f"/{log}/" in k]
    assert len(entries) >= seen.counts["windows"], entries


@pytest.mark.skipif(not FULL, reason="the full S3 crash run: CDC_S3_CRASH_FULL=1")
@pytest.mark.parametrize("sink_format", ["parquet", "iceberg", "delta"])
def test_snapshots_killed_on_s3_are_replaced_by_the_next_run(db15, s3_capture, sink_format):
    workload = Workload(db15)
    for i, (point, nth) in enumerate(SNAPSHOT_FAULTS[sink_format]):
        capture = s3_capture(sink_format, f"snap{i}")
        outcome = harness.snapshot_crash(capture, workload, {"point": point, "nth": nth})
        assert outcome["killed"], (point, nth)
        capture.source.forget(capture)
