"""The CDC-service collector: merged transactions → the same events as the logical-replication source.

The reference is the YugabyteDB logical-replication collector fed the frames yboutput sends for
the same transactions (written out by hand), so everything but the ``source`` block and the
transaction id must be equal; the ``source`` block is the gRPC connector's.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.settings import EventContext
from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Relation,
    RelationColumn,
    encode_delete,
    encode_insert,
    encode_update,
)
from airflow_provider_cdc.cdc.sources.postgres.replication import XLogData
from airflow_provider_cdc.cdc.sources.postgres.tables import Column, TableInfo
from airflow_provider_cdc.cdc.sources.postgres.types import PgType
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn, ht_to_unix_us
from airflow_provider_cdc.cdc.sources.yugabyte.stream import YbWindowCollector
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import Checkpoint, TabletPosition
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.collector import YB_SOURCE_BLOCK, YbCdcWindowCollector
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.merge import WindowMerge
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import Page
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from tests.support.pgoutput import encode

Op = pb.RowMessage
TABLE_ID = "000033e8000030008000000000004000"  # a YSQL table id: table OID 0x4000
OID = 0x4000
EMP = TableRef("public", "emp")
T1, T2, T3 = 1_700_000_000_000_000 << 12, (1_700_000_000_100_000) << 12, (1_700_000_000_200_000) << 12
END = T3 + 1000
WINDOW = Window(1, "stream", YbLsn(T1 - 10), YbLsn(END + 1), 1_700_000_000_000)
CONTEXT = EventContext.of_window("yb", "yugabyte", WINDOW)
TXID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


def record(
    op: int, commit: int, txid: str = "", op_id: tuple[int, int, int] = (1, 0, 0), **row
) -> pb.CDCSDKProtoRecordPB:
    message = pb.CDCSDKProtoRecordPB(
        row_message=pb.RowMessage(
            op=op, commit_time=commit, transaction_id=txid.encode(), table="emp", pgschema_name="public", **row
        )
    )
    if op in (Op.INSERT, Op.UPDATE, Op.DELETE):
        message.row_message.table_id = TABLE_ID
        message.row_message.record_time = commit - 5
    message.cdc_sdk_op_id.term, message.cdc_sdk_op_id.index, message.cdc_sdk_op_id.write_id = op_id
    return message


def datum(name: str, value: int | str | None) -> pb.DatumMessagePB:
    if value is None:
        return pb.DatumMessagePB(column_name=name, column_type=25, pg_type=25)
    if isinstance(value, int):
        return pb.DatumMessagePB(column_name=name, column_type=23, datum_int32=value)
    return pb.DatumMessagePB(column_name=name, column_type=25, datum_string=value)


DDL = pb.CDCSDKProtoRecordPB(
    row_message=pb.RowMessage(
        op=Op.DDL,
        table="emp",
        pgschema_name="public",
        table_id=TABLE_ID,
        schema=pb.CDCSDKSchemaPB(
            column_info=[
                pb.CDCSDKColumnInfoPB(name="id", oid=23, is_key=True),
                pb.CDCSDKColumnInfoPB(name="name", oid=25),
                pb.CDCSDKColumnInfoPB(name="dept", oid=25),
            ]
        ),
    )
)


def tablet_pages() -> dict[str, list[Page]]:
    """Tablet a: part of T1 (id 1), then T2 (single-shard update of id 1, CHANGE: key + changed).
    Tablet b: part of T1 (ids 2, 3), then T3 (delete of id 2)."""
    a = [
        DDL,
        record(Op.BEGIN, T1, TXID, (1, 2, 0)),
        record(Op.INSERT, T1, TXID, (1, 2, 1), new_tuple=[datum("id", 1), datum("name", "ann"), datum("dept", None)]),
        record(Op.COMMIT, T1, TXID, (1, 2, 2)),
        record(Op.BEGIN, T2, "", (1, 3, 0)),
        record(Op.UPDATE, T2, "", (1, 3, 1), new_tuple=[datum("id", 1), datum("name", "anne")]),
        record(Op.COMMIT, T2, "", (1, 3, 0)),
    ]
    b = [
        DDL,
        record(Op.BEGIN, T1, TXID, (2, 5, 0)),
        record(Op.INSERT, T1, TXID, (2, 5, 1), new_tuple=[datum("id", 2), datum("name", "bob"), datum("dept", "x")]),
        record(Op.INSERT, T1, TXID, (2, 5, 2), new_tuple=[datum("id", 3), datum("name", "cy"), datum("dept", "y")]),
        record(Op.COMMIT, T1, TXID, (2, 5, 3)),
        record(Op.BEGIN, T3, TXID[::-1], (2, 6, 0)),
        record(Op.DELETE, T3, TXID[::-1], (2, 6, 1), old_tuple=[datum("id", 2)]),
        record(Op.COMMIT, T3, TXID[::-1], (2, 6, 2)),
    ]
    start = TabletPosition(Checkpoint(1, 1))
    return {
        "a": [Page(start, tuple(a), Checkpoint(1, 3), END)],
        "b": [Page(start, tuple(b[:3]), Checkpoint(2, 4), T1 - 1), Page(start, tuple(b[3:]), Checkpoint(2, 6), END)],
    }


def yboutput_frames() -> list[XLogData]:
    """What yboutput sends for the same transactions (replica identity CHANGE)."""
    relation = Relation(
        OID,
        "public",
        "emp",
        "c",
        (
            RelationColumn("id", 23, -1, True),
            RelationColumn("name", 25, -1, False),
            RelationColumn("dept", 25, -1, False),
        ),
    )
    messages = [
        encode(relation),
        encode(Begin(T1, ht_to_unix_us(T1), 7)),
        encode_insert(OID, (b"1", b"ann", None)),
        encode_insert(OID, (b"2", b"bob", b"x")),
        encode_insert(OID, (b"3", b"cy", b"y")),
        encode(Commit(0, T1, T1, ht_to_unix_us(T1))),
        encode(Begin(T2, ht_to_unix_us(T2), 8)),
        encode_update(OID, None, None, (b"1", b"anne", UNCHANGED_TOAST)),
        encode(Commit(0, T2, T2, ht_to_unix_us(T2))),
        encode(Begin(T3, ht_to_unix_us(T3), 9)),
        encode_delete(OID, "K", (b"2", None, None)),
        encode(Commit(0, T3, T3, ht_to_unix_us(T3))),
    ]
    return [XLogData(i, m) for i, m in enumerate(messages, start=1)]


def collect(
    collector_cls: type, feed, max_changes: int, **kwargs
) -> tuple[dict[str, pa.Table], pa.Table | None, object]:
    chunks: list[tuple[dict, pa.RecordBatch | None]] = []
    collector = collector_cls(
        window=WINDOW,
        context=CONTEXT,
        topic_prefix="yb",
        previous_commit_lsn=None,
        max_changes_per_chunk=max_changes,
        flush=lambda batches, tx: chunks.append((batches, tx)),
        **kwargs,
    )
    feed(collector)
    stats = collector.finish()
    topics: dict[str, list[pa.RecordBatch]] = {}
    for batches, _ in chunks:
        for topic, bs in batches.items():
            topics.setdefault(topic, []).extend(bs)
    tables = {topic: pa.Table.from_batches(bs) for topic, bs in topics.items()}
    tx_batches = [t for _, t in chunks if t is not None]
    return tables, pa.Table.from_batches(tx_batches) if tx_batches else None, stats


def ours(max_changes: int = 2):
    merge = WindowMerge(
        from_ht=int(WINDOW.from_lsn),
        to_ht=int(WINDOW.to_lsn),
        tablets=tablet_pages(),
        start={t: TabletPosition(Checkpoint(1, 1)) for t in "ab"},
    )
    result = collect(YbCdcWindowCollector, lambda c: c.consume_items(merge), max_changes, captured=[EMP])
    return (*result, merge)


def test_events_equal_the_logical_replication_sources_but_for_source_and_ids() -> None:
    tables, tx, stats, merge = ours()
    info = TableInfo(
        EMP,
        OID,
        (Column("id", PgType(23, -1)), Column("name", PgType(25, -1)), Column("dept", PgType(25, -1))),
        ("id",),
        "c",
        True,
    )
    lr_tables, lr_tx, lr_stats = collect(
        YbWindowCollector, lambda c: c.consume(yboutput_frames()), 2, tables={EMP: info}
    )
    assert set(tables) == set(lr_tables) == {"yb.public.emp"}
    mine, theirs = tables["yb.public.emp"], lr_tables["yb.public.emp"]
    assert mine.num_rows == 5
    for name in mine.column_names:
        if name in ("source", "transaction"):
            continue
        assert mine.column(name).equals(theirs.column(name)), name
    for name in ("total_order", "data_collection_order"):
        assert pc_field(mine, "transaction", name) == pc_field(theirs, "transaction", name)
    assert pc_field(mine, "transaction", "id") == [f"{TXID}:{T1}"] * 3 + [f"a.1.3:{T2}", f"{TXID[::-1]}:{T3}"]
    assert (stats.changes, stats.transactions) == (lr_stats.changes, lr_stats.transactions) == (5, 3)
    assert stats.last_commit_lsn == T3 and stats.last_tx_id == TXID[::-1]
    assert stats.chunks == 3  # max_changes_per_chunk=2 cuts inside T1
    # the transaction side table: BEGIN/END per transaction, same counts as the LR source's
    assert tx.column("status").to_pylist() == lr_tx.column("status").to_pylist()
    assert tx.column("event_count").to_pylist() == lr_tx.column("event_count").to_pylist()
    assert tx.column("id").to_pylist()[::2] == [f"{TXID}:{T1}", f"a.1.3:{T2}", f"{TXID[::-1]}:{T3}"]
    assert set(merge.end_positions) == {"a", "b"}


def pc_field(table: pa.Table, struct: str, field: str) -> list:
    return table.column(struct).combine_chunks().field(field).to_pylist()


def test_the_source_block_is_the_grpc_connectors() -> None:
    tables, _, _, _ = ours(max_changes=100)
    table = tables["yb.public.emp"]
    assert table.schema.field("source").type == YB_SOURCE_BLOCK
    sources = table.column("source").to_pylist()
    first, update = sources[0], sources[3]
    assert first["connector"] == "yugabytedb" and first["db"] == "yugabyte" and first["name"] == "yb"
    assert (first["schema"], first["table"], first["snapshot"]) == ("public", "emp", "false")
    assert first["txId"] == TXID and update["txId"] == ""  # a single-shard write has none
    assert first["lsn"] == "1:2::1:0" and first["tablet_id"] == "a"
    assert [s["tablet_id"] for s in sources] == ["a", "b", "b", "a", "b"]  # T1's parts in tablet order
    assert first["commit_time"] == T1 and first["record_time"] == T1 - 5
    assert first["ts_ms"] == ht_to_unix_us(T1) // 1000
    assert json.loads(first["sequence"]) == [None, "1:2::1:0"]
    assert json.loads(update["sequence"]) == [str(T1), "1:3::1:0"]
    assert first["xmin"] is None


def test_a_ddl_record_with_new_columns_starts_a_table_version() -> None:
    pages = tablet_pages()
    wider = pb.CDCSDKProtoRecordPB()
    wider.CopyFrom(DDL)
    wider.row_message.schema.column_info.add(name="age", oid=23)
    a = list(pages["a"][0].records)
    a.insert(4, wider)  # before T2
    a[5 + 1].row_message.new_tuple.add().CopyFrom(datum("age", 40))
    pages["a"] = [Page(pages["a"][0].request, tuple(a), Checkpoint(1, 3), END)]
    last = pages["b"][1]  # every tablet of the table gets the schema record
    pages["b"][1] = Page(last.request, (*last.records[:2], wider, *last.records[2:]), last.checkpoint, END)
    merge = WindowMerge(
        from_ht=int(WINDOW.from_lsn),
        to_ht=int(WINDOW.to_lsn),
        tablets=pages,
        start={t: TabletPosition(Checkpoint(1, 1)) for t in "ab"},
    )
    chunks: list[dict] = []
    collector = YbCdcWindowCollector(
        window=WINDOW,
        context=CONTEXT,
        topic_prefix="yb",
        previous_commit_lsn=None,
        max_changes_per_chunk=100,
        flush=lambda batches, tx: chunks.append(batches),
        captured=[EMP],
    )
    collector.consume_items(merge)
    collector.finish()
    batches = chunks[0]["yb.public.emp"]
    assert [b.num_rows for b in batches] == [3, 2]  # two table versions
    assert "age" in batches[1].schema.field("after").type.names
    assert "age" not in batches[0].schema.field("after").type.names


def test_tables_not_captured_are_dropped_and_a_change_without_schema_fails() -> None:
    merge = WindowMerge(
        from_ht=int(WINDOW.from_lsn),
        to_ht=int(WINDOW.to_lsn),
        tablets=tablet_pages(),
        start={t: TabletPosition(Checkpoint(1, 1)) for t in "ab"},
    )
    tables, tx, stats = collect(
        YbCdcWindowCollector, lambda c: c.consume_items(merge), 100, captured=[TableRef("public", "other")]
    )
    assert tables == {} and tx is None and stats.changes == 0 and stats.transactions == 0
    pages = tablet_pages()
    pages["a"] = [Page(pages["a"][0].request, pages["a"][0].records[1:], Checkpoint(1, 3), END)]
    pages["b"] = [
        Page(p.request, tuple(r for r in p.records if r is not DDL), p.checkpoint, p.safe_hybrid_time)
        for p in pages["b"]
    ]
    merge = WindowMerge(
        from_ht=int(WINDOW.from_lsn),
        to_ht=int(WINDOW.to_lsn),
        tablets=pages,
        start={t: TabletPosition(Checkpoint(1, 1)) for t in "ab"},
    )
    with pytest.raises(DecodingError, match="before any schema record"):
        collect(YbCdcWindowCollector, lambda c: c.consume_items(merge), 100, captured=[EMP])
