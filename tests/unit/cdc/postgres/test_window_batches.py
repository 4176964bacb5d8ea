"""The columnar window collector (Arrow batches of messages) flushes what the streaming one does.

Message streams are generated (transactions of inserts, updates, deletes, key changes, updates
with old tuples and unchanged TOAST, truncates, transactional and non-transactional logical
messages, ALTER TABLE mid-window, an uncaptured and an uncounted table, window ends anywhere,
tiny chunks), encoded with the independent test encoder (:mod:`tests.support.pgoutput`), fed to
:class:`WindowCollector` frame by frame and to :class:`BatchWindowCollector` in batches of random
sizes; the ``flush`` calls, the stats and any error must be equal.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import CdcError, DecodingError
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.settings import EventContext, EventSettings
from airflow_provider_cdc.cdc.sources.postgres import columnar, stream
from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    Relation,
    RelationColumn,
    Truncate,
    TypeInfo,
    Update,
)
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.replication import XLogData
from airflow_provider_cdc.cdc.sources.postgres.stream import MARKER_PREFIX, WindowCollector
from airflow_provider_cdc.cdc.sources.postgres.tables import Column, TableInfo, TableRef
from airflow_provider_cdc.cdc.sources.postgres.types import PgType
from airflow_provider_cdc.cdc.sources.postgres.window_batches import BatchWindowCollector
from tests.support.pgoutput import encode

INT4, TEXT = PgType(23, -1, "integer", "int4"), PgType(25, -1, "text", "text")
CAPTURED_A, CAPTURED_B, SIGNALS, UNCAPTURED = 16_001, 16_002, 16_003, 16_004
NAMES = {CAPTURED_A: "a", CAPTURED_B: "b", SIGNALS: "signals", UNCAPTURED: "other"}
TABLES = {
    TableRef("public", name): TableInfo(
        TableRef("public", name), oid, (Column("id", INT4), Column("v", TEXT)), ("id",), "d", True
    )
    for oid, name in NAMES.items()
    if oid != UNCAPTURED
}
FROM_LSN = 0x1000
T0_US = 1_764_000_000_000_000


def relation(oid: int, width: int) -> Relation:
    names = ["id", "v", "w", "x"][:width]
    types = [INT4.oid] + [TEXT.oid] * (width - 1)
    columns = tuple(RelationColumn(n, t, -1, n == "id") for n, t in zip(names, types))
    return Relation(oid, "public", NAMES[oid], "d", columns)


# -- generated streams ---------------------------------------------------------------------------

key = st.integers(1, 4).map(lambda i: str(i).encode())
text = st.one_of(st.none(), st.binary(max_size=6).map(lambda b: b.hex().encode()))
prefix = st.sampled_from(["app.audit", "app.debug", "other", "airflow_provider_cdc.watermark"])


@st.composite
def streams(draw):
    """``(messages, to_lsn)``: ``messages`` are ``(lsn, message)`` in stream order."""
    lsn = FROM_LSN
    widths = dict.fromkeys(NAMES, 2)
    out: list[tuple[int, object]] = []

    def emit(message) -> None:
        nonlocal lsn
        lsn += draw(st.integers(1, 40))
        out.append((lsn, message))

    def row(oid: int, *, toast: bool = False) -> tuple:
        values = [draw(key), draw(st.one_of(text, st.just(UNCHANGED_TOAST)) if toast else text)]
        return tuple(values + [draw(text) for _ in range(widths[oid] - 2)])

    def change(oid: int):
        kind = draw(st.sampled_from(["insert", "insert", "update", "update_key", "update_full", "delete"]))
        if kind == "insert":
            return Insert(oid, row(oid))
        if kind == "update":
            return Update(oid, None, None, row(oid, toast=True))
        if kind == "update_key":
            new = row(oid)
            old = (draw(key),) + (None,) * (widths[oid] - 1)
            return Update(oid, "K", old, new)
        if kind == "update_full":
            return Update(oid, "O", row(oid), row(oid, toast=True))
        return Delete(oid, "K", (draw(key),) + (None,) * (widths[oid] - 1))

    for oid in NAMES:
        emit(relation(oid, 2))
    xid = 700
    for _ in range(draw(st.integers(0, 8))):
        between = draw(st.sampled_from(["none", "none", "message", "relation", "type", "origin"]))
        if between == "message":
            emit(LogicalMessage(False, lsn + 5, draw(prefix), draw(st.binary(max_size=8))))
        elif between == "type":
            emit(TypeInfo(90_000, "public", "mood"))
        elif between == "origin":
            emit(Origin(5, "upstream"))
        elif between == "relation":
            oid = draw(st.sampled_from(sorted(NAMES)))
            widths[oid] = draw(st.integers(2, 4))
            emit(relation(oid, widths[oid]))
        body: list = []
        for _ in range(draw(st.integers(0, 12))):
            what = draw(st.sampled_from(["change"] * 8 + ["truncate", "message", "relation"]))
            if what == "change":
                body.append(change(draw(st.sampled_from(sorted(NAMES)))))
            elif what == "truncate":
                oids = draw(st.lists(st.sampled_from(sorted(NAMES)), min_size=1, max_size=3, unique=True))
                body.append(Truncate(tuple(oids), draw(st.booleans()), draw(st.booleans())))
            elif what == "message":
                body.append(LogicalMessage(True, 0, draw(prefix), draw(st.binary(max_size=8))))
            else:
                oid = draw(st.sampled_from(sorted(NAMES)))
                widths[oid] = draw(st.integers(2, 4))
                body.append(relation(oid, widths[oid]))
        final = lsn + 40 * (len(body) + 2)
        ts = T0_US + xid * 1000
        emit(Begin(final, ts, xid))
        for message in body:
            if isinstance(message, LogicalMessage):
                message = dataclasses.replace(message, lsn=lsn + 1)
            emit(message)
        lsn = final - 1
        emit(Commit(0, final, final + 1, ts))
        xid += draw(st.integers(1, 3))
    # The window's end somewhere in the stream, then the marker after it (as the job emits).
    commits = [m.commit_lsn for _, m in out if isinstance(m, Commit)]
    to_lsn = draw(st.sampled_from([*commits, lsn + 1]))
    emit(LogicalMessage(False, max(lsn, to_lsn) + 10, MARKER_PREFIX, b"w"))
    return out, to_lsn


class Flushes:
    def __init__(self) -> None:
        self.calls: list[tuple[dict, pa.RecordBatch | None]] = []

    def __call__(self, batches: dict, tx_batch: pa.RecordBatch | None) -> None:
        self.calls.append((batches, tx_batch))


def collector(cls, to_lsn: int, max_changes: int, event_settings: EventSettings, out: Flushes):
    window = Window(3, "stream", Lsn(FROM_LSN), Lsn(to_lsn), 1_764_000_500_000)
    return cls(
        window=window,
        tables=TABLES,
        context=EventContext.of_window("pg", "shop", window),
        topic_prefix="pg",
        previous_commit_lsn=Lsn(0x900),
        max_changes_per_chunk=max_changes,
        flush=out,
        settings=event_settings,
        uncounted=frozenset({TableRef("public", "signals")}),
    )


def batches_of(frames: list[tuple[int, bytes]], sizes: list[int]) -> list[pa.RecordBatch]:
    out, at, k = [], 0, 0
    while at < len(frames):
        size = sizes[k % len(sizes)] if sizes else len(frames)
        part = frames[at : at + size]
        out.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array([lsn for lsn, _ in part], pa.int64()),
                    pa.array([7] * len(part), pa.int64()),
                    pa.array([payload for _, payload in part], pa.binary()),
                ],
                names=["lsn", "xid", "data"],
            )
        )
        at, k = at + size, k + 1
    return out


def run_both(frames, to_lsn, max_changes, sizes, event_settings=None, min_run=1):
    """Both collectors' outcome: (flushes, stats or the error). ``min_run``: the batch collector's
    shortest run handled in bulk (1: every run, whatever its length)."""
    event_settings = event_settings or EventSettings()
    outcomes = []
    for cls in (WindowCollector, BatchWindowCollector):
        out = Flushes()
        c = collector(cls, to_lsn, max_changes, event_settings, out)
        c.min_run = min_run
        try:
            if cls is WindowCollector:
                c.consume(XLogData(lsn, payload) for lsn, payload in frames)
            else:
                c.consume_batches(batches_of(frames, sizes))
            result = c.finish()
        except CdcError as exc:
            result = exc
        outcomes.append((out.calls, result))
    return outcomes


def assert_same(expected, actual) -> None:
    (calls, result), (batch_calls, batch_result) = expected, actual
    if isinstance(result, Exception):
        assert type(batch_result) is type(result) and str(batch_result) == str(result)
    else:  # everything but the start time
        assert dataclasses.replace(batch_result, started=0) == dataclasses.replace(result, started=0)
    assert len(batch_calls) == len(calls)
    for (topics, tx), (batch_topics, batch_tx) in zip(calls, batch_calls):
        assert list(batch_topics) == list(topics)
        for topic, batches in topics.items():
            assert len(batch_topics[topic]) == len(batches)
            for want, got in zip(batches, batch_topics[topic]):
                assert got.schema == want.schema
                assert got.equals(want), (topic, got.to_pylist(), want.to_pylist())
        assert (batch_tx is None) == (tx is None)
        assert tx is None or batch_tx.equals(tx)


@settings(max_examples=100, deadline=None)
@given(
    streams(),
    st.integers(1, 12),
    st.lists(st.integers(1, 20), min_size=1, max_size=5),
    st.sampled_from(
        [
            EventSettings(),
            EventSettings(message_prefix_include=("app\\..*",)),
            EventSettings(message_prefix_exclude=("app\\.debug",)),
        ]
    ),
    st.sampled_from([1, 1, 4]),
)
def test_batches_flush_what_frames_flush(stream_and_end, max_changes, sizes, event_settings, min_run):
    messages, to_lsn = stream_and_end
    frames = [(lsn, encode(m)) for lsn, m in messages]
    expected, actual = run_both(frames, to_lsn, max_changes, sizes, event_settings, min_run)
    assert_same(expected, actual)


def test_a_chunk_is_flushed_at_max_chunk_bytes(monkeypatch):
    monkeypatch.setattr(stream, "MAX_CHUNK_BYTES", 60)
    frames = [(FROM_LSN + 1, encode(relation(CAPTURED_A, 2))), (FROM_LSN + 2, encode(Begin(0x5000, T0_US, 9)))]
    frames += [(FROM_LSN + 3 + i, encode(Insert(CAPTURED_A, (b"1", b"x" * (i * 7))))) for i in range(9)]
    frames += [(0x5000, encode(Commit(0, 0x5000, 0x5001, T0_US)))]
    expected, actual = run_both(frames, 0x6000, 100, [4])
    assert len(expected[0]) > 2
    assert_same(expected, actual)


# -- malformed input: the same error from both ---------------------------------------------------


def _tx(*changes, final: int = 0x5000) -> list[tuple[int, bytes]]:
    body = [(FROM_LSN + 10 + i, c if isinstance(c, bytes) else encode(c)) for i, c in enumerate(changes)]
    return [
        (FROM_LSN + 1, encode(relation(CAPTURED_A, 2))),
        (FROM_LSN + 2, encode(Begin(final, T0_US, 9))),
        *body,
        (final, encode(Commit(0, final, final + 1, T0_US))),
    ]


INSERT = encode(Insert(CAPTURED_A, (b"1", b"x")))
MALFORMED = {
    "truncated insert": _tx(INSERT[:-1]),
    "insert cut in its OID": _tx(INSERT[:4]),
    "insert without its tuple": _tx(INSERT[:6]),
    "truncated begin": [(FROM_LSN + 1, encode(Begin(0x5000, T0_US, 9))[:-2])],
    "unknown kind": _tx(b"Z\x00\x00"),
    "empty message": _tx(b""),
    "change before its relation": _tx(encode(Insert(CAPTURED_B, (b"1", b"x")))),
    "commit without begin": [(0x5000, encode(Commit(0, 0x5000, 0x5001, T0_US)))],
    "commit of another transaction": [*_tx(INSERT)[:-1], (20480, encode(Commit(0, 16384, 16385, T0_US)))],
    "change outside a transaction": [(FROM_LSN + 1, encode(relation(CAPTURED_A, 2))), (FROM_LSN + 2, INSERT)],
    "transaction before the window": _tx(INSERT, final=FROM_LSN - 1),
    "stream ends inside a transaction": _tx(INSERT)[:-1],
    "tuple of the wrong width": _tx(encode(Insert(CAPTURED_A, (b"1",)))),
    "unknown column kind": _tx(INSERT.replace(b"t\x00\x00\x00\x01x", b"q\x00\x00\x00\x01x")),
}


@pytest.mark.parametrize("frames", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_input_gives_the_same_error(frames):
    expected, actual = run_both(frames, 0x6000, 2, [3])
    assert isinstance(expected[1], CdcError)
    assert_same(expected, actual)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.builds(Insert, st.just(7), st.tuples(key, text)).map(encode), max_size=20), st.integers(0, 5))
def test_an_arrow_array_of_messages_decodes_as_the_list(payloads, skip):
    rows = columnar.decode_rows(payloads, 2)
    for array in (pa.array([b"x"] * skip + payloads, pa.binary()), pa.array(payloads, pa.large_binary())):
        decoded = columnar.decode_array(array[skip:] if len(array) > len(payloads) else array, 2)
        assert bytes(decoded.kinds) == bytes(rows.kinds)
        for j in range(2):
            assert decoded.text(decoded.new, j).equals(rows.text(rows.new, j))


def test_a_null_message_is_rejected_as_an_empty_one():
    frames = _tx(INSERT)
    batch = batches_of(frames, [len(frames)])[0]
    data = pa.array([*batch.column("data").to_pylist()[:3], None, *batch.column("data").to_pylist()[3:]])
    lsns = pa.array([*batch.column("lsn").to_pylist()[:3], FROM_LSN + 11, *batch.column("lsn").to_pylist()[3:]])
    nulled = pa.RecordBatch.from_arrays([lsns, pa.nulls(len(data), pa.int64()), data], names=["lsn", "xid", "data"])
    c = collector(BatchWindowCollector, 0x6000, 10, EventSettings(), Flushes())
    with pytest.raises(DecodingError, match="empty pgoutput message"):
        c.consume_batches([nulled.slice(0, 1), nulled.slice(1)])  # the second one starts at an offset


@pytest.mark.parametrize("cls", [WindowCollector, BatchWindowCollector])
def test_a_key_change_that_fills_a_chunk_keeps_its_create(cls):
    """The delete half of a key change fills the chunk: the create goes to the next chunk (it
    used to go to the flushed chunk's buffer and was lost)."""
    change = Update(CAPTURED_A, "K", (b"1", None), (b"2", b"x"))
    frames = _tx(INSERT, encode(change))
    out = Flushes()
    c = collector(cls, 0x6000, 2, EventSettings(), out)
    if cls is WindowCollector:
        c.consume(XLogData(lsn, payload) for lsn, payload in frames)
    else:
        c.consume_batches(batches_of(frames, [len(frames)]))
    stats = c.finish()
    events = [e for topics, _ in out.calls for b in topics.get("pg.public.a", []) for e in b.to_pylist()]
    assert [(e["op"], e["transaction"]["total_order"]) for e in events] == [("c", 1), ("d", 2), ("c", 3)]
    assert stats.changes == 3 and stats.key_changes == 1


# -- memory of a chunk's decode ------------------------------------------------------------------

WIDE = 9  # the bench table's width (bench/workload.py)


def _wide_chunk(n: int) -> list[bytes]:
    row = tuple(b"value %d of the row" % j for j in range(WIDE))
    return [encode(Update(7, "K", row, row) if i % 3 == 0 else Insert(7, row)) for i in range(n)]


def test_a_decoded_chunk_holds_two_int32_per_value():
    """What a decoded chunk keeps while its events are built (beside the messages themselves):
    each value's start and end as int32 and the kind bytes, about 18 bytes per column of a row.
    It held int64 starts and lengths and then int32 offsets as well (~51 bytes per column)."""
    import tracemalloc

    n = 20_000
    array = pa.array(_wide_chunk(n), pa.binary())  # Arrow memory: not traced
    tracemalloc.start()
    try:
        rows = columnar.decode_array(array, WIDE)
        texts = [rows.text(image, j) for image in (rows.old, rows.new) for j in range(WIDE)]
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert texts[0].to_pylist()[:2] == ["value 0 of the row", None]  # old image: the Update's only
    assert texts[WIDE].to_pylist()[:2] == ["value 0 of the row"] * 2
    assert held / (n * WIDE) <= 20, f"{held / (n * WIDE):.0f} bytes per column of a row"


def test_a_chunk_of_many_parts_is_joined_without_a_second_copy():
    """The parts a columnar collector adds (one per run of a batch) are released as they are
    copied into the chunk's buffer: Arrow memory peaks at the parts, not at the parts and their
    concatenation (``concat_arrays``: two copies of the chunk's messages at once)."""
    import numpy as np

    from airflow_provider_cdc.cdc.sources.postgres.events import TableEncoder
    from airflow_provider_cdc.cdc.sources.postgres.stream_events import StreamEventBuffer

    table = TABLES[TableRef("public", "a")]
    payloads = [encode(Insert(CAPTURED_A, (b"%d" % i, b"x" * 200))) for i in range(20_000)]
    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        buffer = StreamEventBuffer(TableEncoder(table, table.columns, EventSettings()), None)  # type: ignore[arg-type]
        for part in range(20):
            rows = payloads[part * 1000 : (part + 1) * 1000]
            zeros = np.zeros(len(rows), np.int64)
            buffer.add_many(pa.array(rows, pa.binary()), zeros, zeros, zeros, zeros)
        parts = pool.bytes_allocated()
        before = pool.max_memory()
        assert before <= parts * 1.1  # nothing else allocated so far
        decoded = buffer._decoded()[0]
        peak = pool.max_memory()
    finally:
        pa.set_memory_pool(previous)
    assert len(decoded) == len(payloads)
    assert peak <= parts * 1.3, f"Arrow memory peaked at {peak / parts:.2f} x the chunk's parts"
