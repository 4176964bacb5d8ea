"""The CDC-service snapshot's pure parts: the protocol's checkpoints, paging one tablet, and READ
records as ``op = r`` events (compared with the stream collector's events for the same rows)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcStateError, CdcTransientError, DecodingError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.settings import EventContext, EventSettings
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import Checkpoint, TabletPosition
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.collector import YB_SOURCE_BLOCK, YbCdcWindowCollector
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.merge import WindowMerge
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import Page
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.snapshot_pages import (
    BOOTSTRAP,
    check_bootstrap,
    common_snapshot_time,
    first_page,
    is_end_marker,
    snapshot_pages,
    streaming_start,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.snapshot_rows import SnapshotRows, SnapshotTable, event_schema

Op = pb.RowMessage
TABLE_ID = "000033e8000030008000000000004000"  # a YSQL table id: table OID 0x4000
T = 1_700_000_000_000_000 << 12  # the snapshot's hybrid time
BOOT = Checkpoint(2, 7, b"", -1, T)
SNAPSHOT = Window(1, "snapshot", None, None, 1_700_000_000_000)
CONTEXT = EventContext.of_window("yb", "yugabyte", SNAPSHOT)

DDL = pb.RowMessage(
    op=Op.DDL,
    table="emp",
    pgschema_name="public",
    table_id=TABLE_ID,
    schema=pb.CDCSDKSchemaPB(
        column_info=[
            pb.CDCSDKColumnInfoPB(name="id", oid=23, is_key=True),
            pb.CDCSDKColumnInfoPB(name="name", oid=25),
            pb.CDCSDKColumnInfoPB(name="pay", oid=1700),
            pb.CDCSDKColumnInfoPB(name="ok", oid=16),
        ]
    ),
)
ROWS = [(1, "ann", "10.50", True), (2, None, None, False), (3, "cy \u2713", "-1", None)]


def ddl_record() -> pb.CDCSDKProtoRecordPB:
    return pb.CDCSDKProtoRecordPB(row_message=DDL)


def datums(values: tuple) -> list[pb.DatumMessagePB]:
    id_, name, pay, ok = values
    out = [pb.DatumMessagePB(column_name="id", column_type=23, datum_int32=id_)]
    out.append(
        pb.DatumMessagePB(column_name="name", column_type=25, **({} if name is None else {"datum_string": name}))
    )
    out.append(pb.DatumMessagePB(column_name="pay", column_type=1700, **({} if pay is None else {"datum_string": pay})))
    out.append(pb.DatumMessagePB(column_name="ok", column_type=16, **({} if ok is None else {"datum_bool": ok})))
    return out


def read_record(values: tuple, key: bytes, op: int = Op.READ, table_id: str = TABLE_ID) -> pb.CDCSDKProtoRecordPB:
    record = pb.CDCSDKProtoRecordPB(
        row_message=pb.RowMessage(
            op=op,
            table="emp",
            pgschema_name="public",
            table_id=table_id,
            commit_time=T,
            record_time=T,
            new_tuple=datums(values),
        )
    )
    record.cdc_sdk_op_id.term, record.cdc_sdk_op_id.index = BOOT.term, BOOT.index
    record.cdc_sdk_op_id.write_id_key = key
    return record


def response(checkpoint: Checkpoint, *records: pb.CDCSDKProtoRecordPB) -> pb.GetChangesResponsePB:
    return pb.GetChangesResponsePB(
        cdc_sdk_checkpoint=checkpoint.to_pb(), safe_hybrid_time=T, cdc_sdk_proto_records=list(records)
    )


class Script:
    """A tablet's answers in order, recording the requests (the ``fetch`` of :func:`snapshot_pages`)."""

    def __init__(self, *answers: pb.GetChangesResponsePB):
        self.answers = list(answers)
        self.requests: list[TabletPosition] = []

    def __call__(self, position: TabletPosition) -> pb.GetChangesResponsePB:
        self.requests.append(position)
        return self.answers.pop(0)


# -- checkpoints ------------------------------------------------------------------------------


def test_the_protocols_checkpoints() -> None:
    assert Checkpoint(-1, -1, b"", -1, 0) == BOOTSTRAP
    assert is_end_marker(Checkpoint(2, 7, b"", 0, 0))
    assert not is_end_marker(Checkpoint(2, 7, b"k", 0, 0)) and not is_end_marker(BOOT)
    assert not is_end_marker(Checkpoint(2, 7, b"", 0, T))
    # pages start at the tablet's first key whatever the bootstrap answered
    assert first_page(Checkpoint(2, 7, b"key", -1, T)) == BOOT
    start = streaming_start(Checkpoint(2, 7, b"key", -1, T))
    assert start == TabletPosition(Checkpoint(2, 7, b"", 0, 0), safe_hybrid_time=T)


@pytest.mark.parametrize(
    "answer", [Checkpoint(2, 7, b"", 0, 0), Checkpoint(2, 7, b"", -1, 0), Checkpoint(-1, -1, b"", -1, T)]
)
def test_a_bootstrap_answer_without_a_snapshot_is_refused(answer: Checkpoint) -> None:
    assert check_bootstrap("t1", BOOT) == BOOT
    with pytest.raises(CdcStateError, match="tablet t1: the snapshot bootstrap answered checkpoint"):
        check_bootstrap("t1", answer)


def test_every_tablet_must_share_the_snapshot_time() -> None:
    assert common_snapshot_time({"a": BOOT, "b": Checkpoint(3, 9, b"", -1, T)}) == T
    other = Checkpoint(3, 9, b"", -1, T + 5)
    with pytest.raises(CdcStateError, match=rf"2 different snapshot times \({T}: a, c; {T + 5}: b\)"):
        common_snapshot_time({"a": BOOT, "b": other, "c": BOOT})


# -- paging -----------------------------------------------------------------------------------


def test_pages_follow_the_key_up_to_the_end_marker() -> None:
    script = Script(
        response(
            Checkpoint(2, 7, b"k2", -1, T), ddl_record(), read_record(ROWS[0], b"k1"), read_record(ROWS[1], b"k2")
        ),
        response(Checkpoint(2, 7, b"k3", -1, T), read_record(ROWS[2], b"k3")),
        response(Checkpoint(2, 7, b"", 0, 0)),  # the end marker, no rows
    )
    pages = list(snapshot_pages(script, "t1", Checkpoint(2, 7, b"ignored", -1, T)))
    assert [len(p.records) for p in pages] == [3, 1, 0]
    assert [r.checkpoint for r in script.requests] == [
        BOOT,
        Checkpoint(2, 7, b"k2", -1, T),
        Checkpoint(2, 7, b"k3", -1, T),
    ]
    assert script.requests[1].safe_hybrid_time == T  # the previous answer's safe time goes back
    assert not script.answers


def test_an_empty_tablet_ends_with_its_first_page_and_the_last_page_may_hold_rows() -> None:
    assert len(list(snapshot_pages(Script(response(Checkpoint(2, 7, b"", 0, 0))), "t1", BOOT))) == 1
    last = Script(response(Checkpoint(2, 7, b"", 0, 0), read_record(ROWS[0], b"k1")))
    assert [len(p.records) for p in snapshot_pages(last, "t1", BOOT)] == [1]


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (Checkpoint(2, 8, b"", 0, 0), r"the snapshot ended at op 2\.8, not at the bootstrap's 2\.7"),
        (Checkpoint(2, 7, b"k1", -1, T + 1), "neither a page of that snapshot nor its end"),
        (Checkpoint(2, 9, b"", 0, T), "neither a page of that snapshot nor its end"),
    ],
)
def test_an_answer_outside_the_snapshot_fails(answer: Checkpoint, error: str) -> None:
    with pytest.raises(CdcStateError, match=error):
        list(snapshot_pages(Script(response(answer, read_record(ROWS[0], b"k1"))), "t1", BOOT))


def test_a_tablet_that_stops_progressing_fails() -> None:
    stuck = Checkpoint(2, 7, b"k1", -1, T)
    script = Script(response(stuck, read_record(ROWS[0], b"k1")), *(response(stuck) for _ in range(9)))
    with pytest.raises(CdcTransientError, match="5 snapshot pages in a row brought no row"):
        list(snapshot_pages(script, "t1", BOOT))
    assert len(script.requests) == 6


# -- rows to events ---------------------------------------------------------------------------


def snapshot_rows() -> SnapshotRows:
    return SnapshotRows(SnapshotTable.of(DDL), "t1", T, CONTEXT, EventSettings())


def test_read_records_become_r_events_with_the_yb_source_block() -> None:
    rows = snapshot_rows()
    for record in (
        ddl_record(),
        read_record(ROWS[0], b"k1"),
        pb.CDCSDKProtoRecordPB(row_message=pb.RowMessage(op=Op.BEGIN)),  # ignored, as the connector does
        read_record(ROWS[1], b"k2"),
        read_record((9, "x", "1", True), b"o1", table_id="000033e8000030008000000000004001"),  # another table
        read_record(ROWS[2], b"k3"),
    ):
        rows.add(record)
    assert len(rows) == 3
    batch = rows.flush()
    assert len(rows) == 0
    assert batch.schema == event_schema(rows.encoder)
    events = batch.to_pylist()
    assert [e["op"] for e in events] == ["r"] * 3
    assert [e["after"] for e in events] == [
        {"id": 1, "name": "ann", "pay": "10.50", "ok": True},
        {"id": 2, "name": None, "pay": None, "ok": False},
        {"id": 3, "name": "cy \u2713", "pay": "-1", "ok": None},
    ]
    assert all(e["before"] is None and e["transaction"] is None for e in events)
    lsns = [Checkpoint(2, 7, key, 0, 0).text() for key in (b"k1", b"k2", b"k3")]
    assert [e["source"]["lsn"] for e in events] == lsns
    assert [e["source"]["sequence"] for e in events] == [json.dumps([None, lsn], separators=(",", ":")) for lsn in lsns]
    source = events[0]["source"]
    assert {k: source[k] for k in ("connector", "name", "snapshot", "db", "schema", "table", "txId", "xmin")} == {
        "connector": "yugabytedb",
        "name": "yb",
        "snapshot": "true",
        "db": "yugabyte",
        "schema": "public",
        "table": "emp",
        "txId": None,
        "xmin": None,
    }
    assert (source["commit_time"], source["record_time"], source["tablet_id"]) == (T, T, "t1")
    assert source["ts_ms"] == (T >> 12) // 1000 and events[0]["ts_ms"] == max(CONTEXT.ts_ms, source["ts_ms"])
    assert batch.schema.field("source").type == YB_SOURCE_BLOCK


def test_snapshot_values_are_the_streams() -> None:
    """The stream collector fed the same rows as INSERTs makes the same ``after`` values, in the
    same layout (the snapshot reuses its conversion, not a second one)."""
    rows = snapshot_rows()
    for i, values in enumerate(ROWS):
        rows.add(read_record(values, f"k{i}".encode()))
    snapshot = rows.flush()

    inserts = [read_record(values, b"", op=Op.INSERT) for values in ROWS]
    for i, record in enumerate(inserts):
        record.cdc_sdk_op_id.index, record.cdc_sdk_op_id.write_id = 8, i + 1
        record.row_message.commit_time = T + 1
    begin, commit = (pb.CDCSDKProtoRecordPB(row_message=pb.RowMessage(op=o, commit_time=T + 1)) for o in (3, 4))
    for record in (begin, commit):
        record.cdc_sdk_op_id.index = 8
    window = Window(2, "stream", YbLsn(T + 1), YbLsn(T + 2), 1_700_000_000_000)
    page = Page(TabletPosition(Checkpoint(2, 7)), (ddl_record(), begin, *inserts, commit), Checkpoint(2, 8), T + 5)
    merge = WindowMerge(from_ht=T + 1, to_ht=T + 2, tablets={"t1": [page]}, start={"t1": page.request})
    flushed: list[dict] = []
    collector = YbCdcWindowCollector(
        window=window,
        context=EventContext.of_window("yb", "yugabyte", window),
        topic_prefix="yb",
        previous_commit_lsn=None,
        max_changes_per_chunk=100,
        flush=lambda batches, tx: flushed.append(batches),
        captured=[TableRef("public", "emp")],
    )
    collector.consume_items(merge)
    collector.finish()
    (stream,) = [b for chunk in flushed for b in chunk["yb.public.emp"]]
    assert stream.schema == snapshot.schema
    assert stream.column("after").to_pylist() == snapshot.column("after").to_pylist()
    assert pa.compute.all(pa.compute.equal(stream.column("op"), "c")).as_py()


def test_a_schema_change_or_a_change_record_during_the_snapshot_fails() -> None:
    rows = snapshot_rows()
    changed = pb.RowMessage()
    changed.CopyFrom(DDL)
    changed.schema.column_info.add(name="extra", oid=25)
    with pytest.raises(DecodingError, match=r'the schema of "public"\."emp" changed during the snapshot'):
        rows.add(pb.CDCSDKProtoRecordPB(row_message=changed))
    with pytest.raises(DecodingError, match=r'a DELETE record in a snapshot page of "public"\."emp"'):
        rows.add(read_record(ROWS[0], b"k", op=Op.DELETE))
