"""A captured table's snapshot rows as events: its table version from the ``DDL`` record (as the stream
collector builds one), and a tablet's ``READ`` records made into ``op = r`` event batches through
PostgreSQL's decoder and encoder with YugabyteDB's ``source`` block ("Rows to events" in
:mod:`.snapshot`'s docstring).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from airflow_provider_cdc.cdc.basics.errors import (
    DecodingError,
)
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.sources.postgres import columnar
from airflow_provider_cdc.cdc.sources.postgres.events import EventContext, EventSettings, SnapshotBatches, TableEncoder
from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo
from airflow_provider_cdc.cdc.sources.postgres.types import TypeCache
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.collector import YB_SOURCE_BLOCK, record_lsn, yb_source_batch
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.position import commit_ts_ms
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.records import (
    ddl_key_columns,
    ddl_table,
    relation_columns,
    relation_oid,
    row_image,
)

Op = pb.RowMessage

#: Records a snapshot page may hold besides READ and DDL: transaction markers the connector
#: ignores while snapshotting (it logs a warning), and safe points.
_IGNORED = frozenset((Op.BEGIN, Op.COMMIT, Op.SAFEPOINT))


# -- table versions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotTable:
    """A captured table of the stream as its DDL record describes it at the snapshot time:
    what a tablet's task needs to make its events (picklable)."""

    table_id: str
    table: TableInfo
    schema: tuple[tuple[str, int, bool], ...]  # the DDL record's (name, type oid, is_key) per column

    @classmethod
    def of(cls, ddl: pb.RowMessage) -> SnapshotTable:
        """The table version of ``ddl``, built as the stream collector builds one it has no
        catalog entry for (so both write one layout)."""
        columns = relation_columns(ddl, TypeCache(), None)
        keys = ddl_key_columns(ddl)
        table = TableInfo(ddl_table(ddl), relation_oid(ddl.table_id), columns, keys, "c", bool(keys))
        return cls(ddl.table_id, table, schema_signature(ddl))

    @property
    def ref(self) -> TableRef:
        return self.table.ref


def schema_signature(ddl: pb.RowMessage) -> tuple[tuple[str, int, bool], ...]:
    """What identifies a DDL record's table version: its columns' names, type oids and key flags."""
    return tuple((c.name, c.oid, c.is_key) for c in ddl.schema.column_info)


def event_schema(encoder: TableEncoder) -> pa.Schema:
    """The snapshot files' schema: the table's event layout with the YugabyteDB ``source`` block."""
    schema = encoder.layout.schema
    index = schema.get_field_index("source")
    return schema.set(index, pa.field("source", YB_SOURCE_BLOCK, nullable=False))


# -- rows to events ---------------------------------------------------------------------------


class SnapshotRows:
    """The ``READ`` records of one table read from one tablet, buffered as the pgoutput Insert
    messages yboutput would send for them, and made into ``op = r`` event batches."""

    def __init__(
        self, table: SnapshotTable, tablet_id: str, snapshot_ht: int, context: EventContext, settings: EventSettings
    ) -> None:
        self.table = table
        self.tablet_id = tablet_id
        self.snapshot_ht = snapshot_ht
        self.encoder = TableEncoder(table.table, table.table.columns, settings)
        self._events = SnapshotBatches(
            self.encoder,
            context=context,
            snapshot_lsn=snapshot_ht,
            snapshot_xmin=None,
            snapshot_ts_ms=commit_ts_ms(snapshot_ht),
        )
        self._payloads: list[bytes] = []
        self._lsns: list[str] = []
        self._record_times: list[int] = []

    def __len__(self) -> int:
        return len(self._payloads)

    def add(self, record: pb.CDCSDKProtoRecordPB) -> None:
        """One record of a snapshot page: a row of this table is buffered, a schema record is
        checked to be this table version, rows of other tables (a colocated tablet) are skipped.
        The record's ``op`` is changed to ``INSERT`` in place (records are not reused)."""
        row = record.row_message
        if row.op == Op.READ:
            if row.table_id and row.table_id != self.table.table_id:
                return
            row.op = Op.INSERT  # a READ record carries the row as an INSERT does
            encoder = self.encoder
            image = row_image(row, encoder.relation_columns, encoder.table.key_columns)
            self._payloads.append(image.payload(self.table.table.oid))
            self._lsns.append(record_lsn(record))
            self._record_times.append(row.record_time or self.snapshot_ht)
        elif row.op == Op.DDL:
            if row.table_id == self.table.table_id and schema_signature(row) != self.table.schema:
                raise DecodingError(
                    f"tablet {self.tablet_id}: the schema of {self.table.ref} changed during the snapshot "
                    f"(version {row.schema_version}); a snapshot reads one table version"
                )
        elif row.op not in _IGNORED:
            raise DecodingError(
                f"tablet {self.tablet_id}: a {Op.Op.Name(row.op)} record in a snapshot page of {self.table.ref}"
            )

    def flush(self) -> pa.RecordBatch:
        """The buffered rows as one event batch (the buffer is emptied)."""
        payloads, lsns, record_times = self._payloads, self._lsns, self._record_times
        self._payloads, self._lsns, self._record_times = [], [], []
        encoder = self.encoder
        try:
            rows = columnar.decode_rows(payloads, len(encoder.relation_columns))
        except columnar.MalformedRow as exc:
            raise DecodingError(
                f"tablet {self.tablet_id}, {self.table.ref}: snapshot row {lsns[exc.row]}: {exc}"
            ) from None
        values = encoder.typed([rows.text(rows.new, p) for p in encoder.positions])
        batch = self._events.batch(values)
        origins = {
            "tablet_id": pa.repeat(pa.scalar(self.tablet_id), len(lsns)),
            "lsn": pa.array(lsns, pa.string()),
            "record_time": pa.array(record_times, pa.int64()),
            "txId": pa.nulls(len(lsns), pa.string()),
            "sequence": pa.array([json.dumps([None, lsn], separators=(",", ":")) for lsn in lsns], pa.string()),
        }
        return yb_source_batch(_rows_numbered(batch), origins)


def _rows_numbered(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with each row's PostgreSQL ``source.lsn`` set to its row number: the index into
    the row origins :func:`~.collector.yb_source_batch` takes (the collector's "LSN")."""
    index = batch.schema.get_field_index("source")
    source = batch.column(index)
    numbers = pa.array(np.arange(len(batch), dtype=np.int64))
    fields = list(source.type)
    children = [numbers if f.name == "lsn" else source.field(f.name) for f in fields]
    return batch.set_column(index, batch.schema.field(index), pa.StructArray.from_arrays(children, fields=fields))


__all__ = ["SnapshotRows", "SnapshotTable", "event_schema", "schema_signature"]
