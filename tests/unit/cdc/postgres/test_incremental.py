"""Incremental snapshot state, signals, visibility and the supersede rule (no database)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.sources.postgres.chunks import ChunkKeyWatch, emit_chunk, surviving_rows
from airflow_provider_cdc.cdc.sources.postgres.events import SOURCE_BLOCK, EventContext
from airflow_provider_cdc.cdc.sources.postgres.incremental import (
    IncrementalState,
    Signal,
    SignalError,
    StagedChunk,
    XidSnapshot,
    apply_signal,
)
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.offset import OffsetIdentity, PostgresOffset
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from airflow_provider_cdc.operators.window import airflow_signals, check_covers_staged_chunks, incremental_update

ORDERS, ITEMS = TableRef("public", "orders"), TableRef("public", "items")
CAPTURED = [ORDERS, ITEMS]


def signal(kind, data=None, id="s1"):
    return Signal(id, kind, data or {}, "test")


# -- visibility ---------------------------------------------------------------------------------


def _reference_sees(snapshot: XidSnapshot, xid64: int) -> bool:
    """PostgreSQL's rule on full 64-bit ids."""
    return xid64 < snapshot.xmin or (xid64 < snapshot.xmax and xid64 not in snapshot.xip)


@given(
    base=st.integers(3, 2**40),
    offsets=st.lists(st.integers(0, 200), min_size=0, max_size=10),
    span=st.integers(0, 200),
    probe=st.integers(-1000, 1000),
)
def test_visibility_of_32_bit_wal_ids_matches_postgresql_on_64_bit_ids(base, offsets, span, probe):
    xmin = base
    xmax = base + span
    xip = tuple(sorted({xmin + o for o in offsets if xmin + o < xmax} | ({xmin} if span else set())))
    snapshot = XidSnapshot(xmin, xmax, xip)
    xid64 = max(3, base + probe)
    assert bool(snapshot.sees(np.array([xid64 & 0xFFFFFFFF]))[0]) == _reference_sees(snapshot, xid64)


def test_snapshot_text_round_trip():
    text = "100:110:101,105"
    assert XidSnapshot.parse(text).to_text() == text
    assert XidSnapshot.parse("7:7:") == XidSnapshot(7, 7, ())
    with pytest.raises(Exception, match="not a transaction snapshot"):
        XidSnapshot.parse("garbage")


# -- signals ------------------------------------------------------------------------------------


def test_execute_snapshot_matches_regular_expressions_and_keeps_conditions():
    data = {
        "data-collections": ["public\\.ord.*", "public.items"],
        "additional-conditions": [{"data-collection": "public.orders", "filter": "id > 10"}],
        "surrogate-key": "created",
    }
    state, note = apply_signal(IncrementalState(), signal("execute-snapshot", data), CAPTURED)
    assert [t.table for t in state.tables] == [ORDERS, ITEMS]
    assert state.tables[0].condition == "id > 10" and state.tables[1].condition is None
    assert {t.surrogate_key for t in state.tables} == {"created"}
    again, note = apply_signal(state, signal("execute-snapshot", {"data-collections": ["public.orders"]}), CAPTURED)
    assert again == state and "already in progress" in note


@pytest.mark.parametrize(
    ("kind", "data", "problem"),
    [
        ("execute-snapshot", {}, "data-collections is required"),
        ("execute-snapshot", {"data-collections": ["public.nope"]}, "matches no table"),
        ("execute-snapshot", {"data-collections": ["("]}, "not a regular expression this capture accepts"),
        ("execute-snapshot", {"data-collections": ["public.orders"], "type": "blocking"}, "not supported"),
        ("execute-snapshot", {"data-collections": "public.orders", "additional-conditions": [{}]}, "filter"),
        ("stop-snapshot", {}, "type"),
        ("frobnicate", {}, "unknown signal type"),
    ],
)
def test_bad_signals_are_refused_with_the_reason(kind, data, problem):
    with pytest.raises(SignalError, match=problem):
        apply_signal(IncrementalState(), signal(kind, data), CAPTURED)


def test_signal_data_must_be_a_json_object():
    with pytest.raises(SignalError, match="not JSON"):
        Signal.parse("1", "log", "{nope", origin="signal table")
    with pytest.raises(SignalError, match="JSON object"):
        Signal.parse("1", "log", "[1]", origin="signal table")
    assert Signal.parse("1", "log", None, origin="signal table").data == {}


def test_stop_pause_resume_and_log():
    state, _ = apply_signal(
        IncrementalState(), signal("execute-snapshot", {"data-collections": ["public.*"]}), CAPTURED
    )
    state, _ = apply_signal(state, signal("pause-snapshot"), CAPTURED)
    assert state.paused
    state, _ = apply_signal(state, signal("resume-snapshot"), CAPTURED)
    assert not state.paused
    state, _ = apply_signal(
        state, signal("stop-snapshot", {"type": "incremental", "data-collections": ["public.items"]}), CAPTURED
    )
    assert [t.table for t in state.active] == [ORDERS] and state.history[-1].status == "stopped"
    _, note = apply_signal(state, signal("log", {"message": "at {}"}), CAPTURED, position="0/10")
    assert note.endswith("at 0/10")


def test_state_survives_the_offset_document():
    state, _ = apply_signal(
        IncrementalState(), signal("execute-snapshot", {"data-collections": ["public.orders"]}), CAPTURED
    )
    chunk = StagedChunk("w-1", ORDERS, "s1", "p", 3, 10, 20, XidSnapshot(5, 9, (6,)).to_text(), ("id",), ("id",), 123)
    state = IncrementalState(tables=state.tables, staged=(chunk,), applied_signals=("a",), unresolved_xids=(7,))
    offset = PostgresOffset(identity=OffsetIdentity("t", "1", "db", "slot"), incremental=state)
    assert PostgresOffset.from_json(offset.to_json()).incremental == state


def test_a_window_must_cover_the_high_watermarks_of_the_chunks_it_emits():
    chunk = StagedChunk("w-1", ORDERS, "s1", "p", 3, 10, 20, XidSnapshot(5, 9, ()).to_text(), ("id",), ("id",), 1)
    offset = PostgresOffset(
        identity=OffsetIdentity("t", "1", "db", "slot"), incremental=IncrementalState(staged=(chunk,))
    )
    check_covers_staged_chunks(Window(2, "stream", Lsn(5), Lsn(20), 0), offset)
    check_covers_staged_chunks(Window(2, "stream", Lsn(5), Lsn(19), 0), None)
    with pytest.raises(CdcConfigurationError, match="upto_lsn 0/13 is before 0/14, the high watermark"):
        check_covers_staged_chunks(Window(2, "stream", Lsn(5), Lsn(19), 0), offset)


# -- Airflow-side signals -----------------------------------------------------------------------


class _Run:
    dag_id, run_id = "d", "r1"

    def __init__(self, conf):
        self.conf = conf


def test_airflow_signals_are_applied_once_across_retries():
    context = {
        "dag_run": _Run({"cdc_signals": {"type": "execute-snapshot", "data": {"data-collections": ["public.orders"]}}})
    }
    signals = airflow_signals(None, context, "window", run_conf_types=("execute-snapshot",), capture="t")
    assert [s.id for s in signals] == ["airflow:d:r1:window:conf:0"]
    offset = PostgresOffset(identity=OffsetIdentity("t", "1", "db", "slot"))
    state, _, notes = incremental_update(offset, signals, [], CAPTURED)
    retried, _, notes = incremental_update(PostgresOffset(offset.identity, incremental=state), signals, [], CAPTURED)
    assert retried == state and "already applied" in notes[0]


@pytest.mark.parametrize(
    ("value", "problem"),
    [("{nope", "not valid JSON"), ("[1]", "signal object"), ([{"type": "log", "extra": 1}], "unknown keys")],
)
def test_bad_airflow_signals_fail_clearly(value, problem):
    with pytest.raises(SignalError, match=problem):
        airflow_signals(value, {}, "window")


_START = {"type": "execute-snapshot", "data": {"data-collections": ["public.orders"]}}


@pytest.mark.parametrize(
    ("allowed", "signal", "problem"),
    [
        ((), _START, "takes no signals from DAG run conf"),
        (("stop-snapshot",), _START, "takes only stop-snapshot signals"),
        (
            ("execute-snapshot",),
            {
                **_START,
                "data": {**_START["data"], "additional-conditions": [{"data-collection": "x", "filter": "1=1"}]},
            },
            "additional-conditions are never taken from DAG run conf",
        ),
        (("execute-snapshot",), {**_START, "data": {**_START["data"], "surrogate-key": "id"}}, "surrogate-key"),
        (("log",), [{"type": "log", "data": {"message": "m"}}] * 21, "at most 20"),
    ],
)
def test_dag_run_conf_sends_only_the_signal_types_the_capture_allows_and_never_sql(allowed, signal, problem):
    context = {"dag_run": _Run({"cdc_signals": signal})}
    with pytest.raises(SignalError, match=problem):
        airflow_signals(None, context, "window", run_conf_types=allowed, capture="t")
    # the operator's own signals (the DAG author's) are not limited by run_conf_signals
    filtered = {
        **_START,
        "data": {**_START["data"], "additional-conditions": [{"data-collection": "public.orders", "filter": "id > 1"}]},
    }
    assert airflow_signals([filtered], {}, "window", run_conf_types=(), capture="t")[0].type == "execute-snapshot"


def test_run_conf_tables_are_exact_names_not_patterns_and_ids_stay_apart_from_the_operators():
    pattern = {"id": "op-1", "type": "execute-snapshot", "data": {"data-collections": ["public\\.ord.*"]}}
    context = {"dag_run": _Run({"cdc_signals": pattern})}
    (signal,) = airflow_signals(None, context, "window", run_conf_types=("execute-snapshot",), capture="t")
    assert signal.id == "conf:op-1"  # a conf cannot mark the operator's signal 'op-1' as applied
    with pytest.raises(SignalError, match="matches no table"):
        apply_signal(IncrementalState(), signal, CAPTURED)
    context = {"dag_run": _Run({"cdc_signals": _START})}
    (exact,) = airflow_signals(None, context, "window", run_conf_types=("execute-snapshot",), capture="t")
    assert [t.table for t in apply_signal(IncrementalState(), exact, CAPTURED)[0].tables] == [ORDERS]


def test_new_tables_join_the_incremental_snapshot_and_are_remembered():
    offset = PostgresOffset(identity=OffsetIdentity("t", "1", "db", "slot"), extra={"tables": [["public", "orders"]]})
    state, known, _ = incremental_update(offset, [], [ITEMS], CAPTURED)
    assert [t.table for t in state.active] == [ITEMS]
    assert known == {"tables": [["public", "orders"], ["public", "items"]]}


# -- the supersede rule -------------------------------------------------------------------------

VALUE = pa.struct([pa.field("id", pa.int32()), pa.field("v", pa.string())])


def _events(rows):
    """Stream events of (op, id, commit_lsn, xid)."""
    n = len(rows)
    values = pa.array([{"id": r[1], "v": "x"} for r in rows], VALUE)
    source = pa.array(
        [{"commit_lsn": r[2], "txId": r[3], "lsn": r[2]} for r in rows],
        SOURCE_BLOCK,
    )
    before = pa.array([{"id": r[1], "v": None} if r[0] == "d" else None for r in rows], VALUE)
    after = pa.array([None if r[0] in ("d", "t") else {"id": r[1], "v": "x"} for r in rows], VALUE)
    assert len(values) == n
    return pa.RecordBatch.from_arrays(
        [before, after, source, pa.array([r[0] for r in rows])], names=["before", "after", "source", "op"]
    )


SNAPSHOT = XidSnapshot(50, 60, (55,)).to_text()


def _chunk(low=100, high=200):
    return StagedChunk("w-1", ORDERS, "s1", "p", 5, low, high, SNAPSHOT, ("id",), ("id",), 1)


def _rows(ids):
    return pa.array([{"id": i, "v": f"r{i}"} for i in ids], VALUE)


def test_changes_inside_the_watermark_window_or_unseen_supersede_chunk_rows():
    chunk = _chunk()
    watch = ChunkKeyWatch([chunk], "t")
    watch.observe(
        {
            "t.public.orders": [
                _events(
                    [
                        ("u", 1, 90, 40),  # before the low watermark, seen by the chunk: keep
                        ("u", 2, 150, 58),  # inside the window: drop
                        ("d", 3, 95, 55),  # before the window but in flight at the read: drop
                        ("u", 4, 250, 70),  # after the high watermark: keep (it follows the r)
                        ("c", 9, 150, 58),  # not a chunk row
                    ]
                )
            ]
        }
    )
    kept = surviving_rows(chunk, _rows([1, 2, 3, 4, 5]), watch)
    assert pc_ids(kept) == [1, 4, 5]


def test_a_truncate_inside_the_window_supersedes_the_whole_chunk():
    chunk = _chunk()
    watch = ChunkKeyWatch([chunk], "t")
    watch.observe({"t.public.orders": [_events([("t", None, 150, 58)])]})
    assert len(surviving_rows(chunk, _rows([1, 2]), watch)) == 0


def test_emitted_rows_are_incremental_reads_at_the_high_watermark():
    batch = emit_chunk(_chunk(), _rows([1, 2]), EventContext("t", "db", "0000000002", 7))
    rows = batch.to_pylist()
    assert [r["op"] for r in rows] == ["r", "r"]
    assert {(r["source"]["snapshot"], r["source"]["lsn"], r["source"]["commit_lsn"]) for r in rows} == {
        ("incremental", 200, 200)
    }
    assert [r["id"] for r in rows] == [1, 2] and rows[0]["before"] is None and rows[0]["window_id"] == "0000000002"


def pc_ids(array):
    return [v["id"] for v in array.to_pylist()]


def test_a_signals_pattern_cannot_stall_the_capture():
    """A pattern written to take Python's backtracking matcher exponential time (a signal-table
    writer's ReDoS): RE2 answers at once; look-arounds RE2 cannot run are refused with the reason."""
    import time

    evil = {"data-collections": ["(?:(?:(?:.)*)*)*X"]}
    started = time.process_time()
    with pytest.raises(SignalError, match="matches no table"):
        apply_signal(IncrementalState(), signal("execute-snapshot", evil), [TableRef("public", "a" * 40)])
    assert time.process_time() - started < 5  # Python's re: hours for a 40-character name
    with pytest.raises(SignalError, match="not a regular expression this capture accepts"):
        apply_signal(
            IncrementalState(), signal("execute-snapshot", {"data-collections": ["(?=p)public.orders"]}), CAPTURED
        )
    with pytest.raises(SignalError, match="at most 100 patterns"):
        apply_signal(IncrementalState(), signal("execute-snapshot", {"data-collections": ["x"] * 101}), CAPTURED)
