"""CDCSDKProtoRecordPB records of a tablet's ops, in the stream's record type.

Before/after images per record type (the reference's §2.5 table, from YB's docs):

| record type | UPDATE new_tuple | UPDATE old_tuple | DELETE old_tuple |
|---|---|---|---|
| CHANGE | key + modified columns | none | key |
| FULL_ROW_NEW_IMAGE | whole row | none | whole row |
| MODIFIED_COLUMNS_OLD_AND_NEW_IMAGES | key + modified | key + modified (old values) | key |
| ALL | whole row | whole old row | whole row |

INSERT and READ carry the whole row in ``new_tuple``. Every record of an op carries the op's
(term, index) and its position in the op as ``write_id`` (with a matching ``write_id_key``).
"""

from __future__ import annotations

from airflow_provider_cdc.cdc.sources.postgres.decoder import UNCHANGED_TOAST
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

from .datums import tuple_of
from .schema import Column, TableSchema, schema_pb
from .tablets import Op, RowChange, Tablet

_FULL_AFTER = (pb.FULL_ROW_NEW_IMAGE, pb.ALL)
_FULL_BEFORE = (pb.FULL_ROW_NEW_IMAGE, pb.ALL)


def write_id_key(index: int, write_id: int) -> bytes:
    """Where a record sits in its op; a checkpoint with this key resumes after it."""
    return f"{index}.{write_id}".encode()


def op_records(op: Op, tablet: Tablet, record_type: int) -> list[pb.CDCSDKProtoRecordPB]:
    """All records of one op, in order (none for NO_OP and split ops)."""
    if op.kind == "ddl":
        return [ddl_record(tablet, op.schema, op.term, op.index, 0, op.ht)]
    if op.kind != "txn":
        return []
    records = [_control(pb.RowMessage.BEGIN, op, 0)]
    for position, change in enumerate(op.changes, start=1):
        record = _record(op.term, op.index, position)
        _fill_row(record.row_message, change, op.schema, record_type)
        _identify(record.row_message, tablet, op.schema)
        record.row_message.transaction_id = op.txn_id
        record.row_message.commit_time = op.ht
        record.row_message.record_time = op.ht
        record.row_message.primary_key = change.key
        records.append(record)
    records.append(_control(pb.RowMessage.COMMIT, op, len(op.changes) + 1))
    return records


def ddl_record(
    tablet: Tablet, schema: TableSchema, term: int, index: int, write_id: int, ht: int
) -> pb.CDCSDKProtoRecordPB:
    record = _record(term, index, write_id)
    message = record.row_message
    message.op = pb.RowMessage.DDL
    _identify(message, tablet, schema)
    message.schema.CopyFrom(schema_pb(schema, tablet.table.num_tablets))
    message.schema_version = schema.version
    if ht:
        message.commit_time = ht
    return record


def read_record(
    tablet: Tablet, schema: TableSchema, row: dict, key: bytes, term: int, index: int, snapshot_ht: int
) -> pb.CDCSDKProtoRecordPB:
    """One snapshot row."""
    record = _record(term, index, 0)
    record.cdc_sdk_op_id.write_id_key = key
    message = record.row_message
    message.op = pb.RowMessage.READ
    _identify(message, tablet, schema)
    message.new_tuple.extend(tuple_of(schema.columns, row))
    message.commit_time = snapshot_ht
    message.record_time = snapshot_ht
    message.primary_key = key
    return record


def safepoint_record(tablet: Tablet, safe_time: int) -> pb.CDCSDKProtoRecordPB:
    """The record ending a streaming response (cdcsdk_producer.cc PopulateCDCSDKSafepointOpRecord):
    op SAFEPOINT, the response's safe time as commit_time, the table's name and schema; no op id."""
    record = pb.CDCSDKProtoRecordPB()
    message = record.row_message
    message.op = pb.RowMessage.SAFEPOINT
    message.pgschema_name = tablet.table.schema_name
    message.commit_time = safe_time
    message.table = tablet.table.name
    return record


def stamp_from_op_id(records, term: int, index: int, write_id: int, key: bytes) -> None:
    """Every record of a streaming response carries the request's from checkpoint as
    ``from_op_id`` (cdcsdk_producer.cc, the end of GetChangesForCDCSDK)."""
    for record in records:
        from_op_id = record.from_op_id
        from_op_id.term, from_op_id.index = term, index
        from_op_id.write_id, from_op_id.write_id_key = write_id, key


def _record(term: int, index: int, write_id: int) -> pb.CDCSDKProtoRecordPB:
    record = pb.CDCSDKProtoRecordPB()
    record.cdc_sdk_op_id.term = term
    record.cdc_sdk_op_id.index = index
    record.cdc_sdk_op_id.write_id = write_id
    record.cdc_sdk_op_id.write_id_key = write_id_key(index, write_id)
    return record


def _control(kind: int, op: Op, write_id: int) -> pb.CDCSDKProtoRecordPB:
    record = _record(op.term, op.index, write_id)
    record.row_message.op = kind
    record.row_message.transaction_id = op.txn_id
    record.row_message.commit_time = op.ht
    return record


def _identify(message: pb.RowMessage, tablet: Tablet, schema: TableSchema) -> None:
    message.table = tablet.table.name
    message.pgschema_name = tablet.table.schema_name
    message.table_id = tablet.table.table_id
    message.schema_version = schema.version


def _fill_row(message: pb.RowMessage, change: RowChange, schema: TableSchema, record_type: int) -> None:
    columns = schema.columns
    keys = schema.key_columns
    message.op = change.op
    if change.op == pb.RowMessage.INSERT:
        message.new_tuple.extend(tuple_of(columns, change.new or {}))
    elif change.op == pb.RowMessage.DELETE:
        before = columns if record_type in _FULL_BEFORE else keys
        message.old_tuple.extend(tuple_of(before, change.old or {}))
    else:
        new, old = change.new or {}, change.old
        modified = _modified(columns, old, new)
        picked = tuple(c for c in columns if c.is_key or c.name in modified)
        if record_type in _FULL_AFTER:
            message.new_tuple.extend(tuple_of(columns, new))
        else:
            message.new_tuple.extend(tuple_of(picked, new))
        if old is not None and record_type == pb.ALL:
            message.old_tuple.extend(tuple_of(columns, old))
        elif old is not None and record_type == pb.MODIFIED_COLUMNS_OLD_AND_NEW_IMAGES:
            message.old_tuple.extend(tuple_of(picked, old))


def _modified(columns: tuple[Column, ...], old: dict | None, new: dict) -> set[str]:
    """Columns an UPDATE changed (compared by value: a column SET to its value is not modified)."""
    return {
        c.name
        for c in columns
        if not c.is_key
        and c.name in new
        and new[c.name] is not UNCHANGED_TOAST
        and (old is None or old.get(c.name) != new[c.name])
    }
