"""A lost or reset offset store is restored from the sink's commit log, never re-snapshotted.

The commit log is the durable record: every entry keeps the offset its window was planned from,
so the position, the completed snapshot and its tables, a running incremental snapshot and the
run records all come back from it. The tests delete the stored offset (or put back an older
document) between every two runs of a capture, also while an incremental snapshot is half done,
and end with the event log checked gapless and duplicate-free against the workload and the
replayed state equal to the source.
(The move to a new Airflow metadata database is the last step of the real-scheduler test in
tests/dags/test_run_types.py.)
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from airflow_provider_cdc.cdc.sinks.reader import committed_windows
from airflow_provider_cdc.operators.window import CdcWindowOperator
from airflow_provider_cdc.testing import shop
from tests.support.crash import CrashCapture, prepare_shop
from tests.support.oracle import assert_history, assert_same_state, events_of, replay, source_rows, workload_ops

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEYS = {"public.customers": ["id"], "public.orders": ["id"], "public.order_items": ["order_id", "line_no"]}


def check(db, sink: Path, prefix: str, rounds: list) -> None:
    with db.connect() as conn:
        for table, keys in KEYS.items():
            events = events_of(sink, prefix, table)
            assert_history(events, keys, ops=workload_ops(*rounds, table=table))
            assert_same_state(replay(events, keys), source_rows(conn, table, keys))


@pytest.mark.parametrize("loss", ["deleted", "reset"])
def test_a_lost_or_reset_offset_is_restored_from_the_commit_log(db15, spark, tmp_path, monkeypatch, loss):
    db = db15
    conn_id = prepare_shop(db, monkeypatch, "loss", customers=12, orders_per_customer=2)
    capture = CrashCapture(
        db,
        conn_id,
        "loss",
        tmp_path / "lake",
        KEYS,
        overrides={"incremental_chunk_size": 8, "incremental_chunks_per_run": 1},
    )
    documents: list[str] = []  # every stored offset, to put an older one back

    def lose() -> None:
        with db.connect() as conn:
            row = conn.execute("SELECT document::text FROM cdc_state.offsets WHERE capture = 'loss'").fetchone()
            if row is None:
                return
            documents.append(row[0])
            if loss == "deleted":
                conn.execute("DELETE FROM cdc_state.offsets WHERE capture = 'loss'")
            else:  # the document of two saves ago, as a restore from an old backup would leave it
                older = documents[max(0, len(documents) - 2)]
                revision = json.loads(row[0])["revision"]
                conn.execute(
                    "UPDATE cdc_state.offsets SET document = %s::jsonb WHERE capture = 'loss'",
                    (json.dumps({**json.loads(older), "revision": revision}),),
                )

    rounds: list = []

    def mutate() -> None:
        with db.connect() as conn:
            rounds.append(shop.mutate(conn, round_no=len(rounds) + 1))

    capture.run("setup")
    assert capture.run("snapshot") is not None
    lose()
    assert capture.run("snapshot") is None, "a second snapshot: the completed one was forgotten"
    for step in range(6):
        mutate()
        lose()
        signals = [{"type": "execute-snapshot", "data": {"data-collections": ["public.orders"]}}] if step == 1 else None
        summary = CdcWindowOperator(task_id="batch", capture=capture.capture(), signals=signals).execute({})
        assert summary["changes"] >= sum(sum(workload_ops(rounds[-1], table=t).values()) for t in KEYS)
    lose()
    summary = capture.run("batch")
    assert summary is not None

    offset = capture.stored_offset()
    assert offset is not None and offset.snapshot_completed
    assert sorted(map(tuple, offset.extra["tables"])) == sorted(tuple(t.split(".")) for t in KEYS)
    incremental = offset.incremental
    assert incremental is not None and incremental.idle, "the incremental snapshot did not finish"
    entries = committed_windows(str(capture.sink), "loss")
    assert [e.window.kind for e in entries].count("snapshot") == 1
    capture.verify()
    check(db, capture.sink, "loss", rounds)
    # The incremental snapshot went on where it was: every order read once, none twice.
    chunked = Counter(
        e["after"]["id"]
        for e in events_of(capture.sink, "loss", "public.orders")
        if e["op"] == "r" and e["source"]["snapshot"] == "incremental"
    )
    assert chunked and max(chunked.values()) == 1, chunked.most_common(3)
