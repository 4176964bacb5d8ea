"""Debezium-compatible change events and transaction boundary rows, as Arrow record batches.

An event row has Debezium's envelope columns verbatim (``before``, ``after``, ``source``, ``op``,
``ts_ms``, ``transaction``), then the table's key columns flat (for partitioning and merges),
then extension columns, then the ``window_id`` that wrote it:

- ``__debezium_oldkey`` / ``__debezium_newkey``: Debezium's key-change headers as columns; a
  primary-key change is a ``d`` carrying the new key followed by a ``c`` carrying the old key;
- ``unchanged_toast_columns``: columns whose TOASTed value the update did not change (their
  value is not in the WAL: a placeholder or null stands in, and merges must keep the old value);
- ``truncate``: the ``CASCADE`` / ``RESTART IDENTITY`` flags of an ``op = t`` event.

The ``source`` struct is connector specific and supplied by the source package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

ENVELOPE_FIELDS = ("before", "after", "source", "op", "ts_ms", "transaction")
WINDOW_ID_FIELD = "window_id"
OLD_KEY_FIELD = "__debezium_oldkey"
NEW_KEY_FIELD = "__debezium_newkey"
UNCHANGED_FIELD = "unchanged_toast_columns"
TRUNCATE_FIELD = "truncate"
EXTENSION_FIELDS = (OLD_KEY_FIELD, NEW_KEY_FIELD, UNCHANGED_FIELD, TRUNCATE_FIELD)
RESERVED_NAMES = frozenset(ENVELOPE_FIELDS) | {WINDOW_ID_FIELD, "ts_us", "ts_ns", "message", *EXTENSION_FIELDS}

#: The fields every connector's ``source`` block starts with (Debezium's common source fields);
#: each source appends its own (PostgreSQL: txId, lsn, ...; SQL Server: change_lsn, commit_lsn, ...).
SOURCE_COMMON_FIELDS = (
    pa.field("version", pa.string()),
    pa.field("connector", pa.string()),
    pa.field("name", pa.string()),
    pa.field("ts_ms", pa.int64()),
    pa.field("snapshot", pa.string()),
    pa.field("db", pa.string()),
    pa.field("sequence", pa.string()),
    pa.field("schema", pa.string()),
    pa.field("table", pa.string()),
)

TRANSACTION_BLOCK = pa.struct(
    [
        pa.field("id", pa.string()),
        pa.field("total_order", pa.int64()),
        pa.field("data_collection_order", pa.int64()),
    ]
)
TRUNCATE_FLAGS = pa.struct([pa.field("cascade", pa.bool_()), pa.field("restart_identity", pa.bool_())])
UNCHANGED_LIST = pa.list_(pa.string())

DATA_COLLECTION_COUNT = pa.struct([pa.field("data_collection", pa.string()), pa.field("event_count", pa.int64())])

#: Schema of the ``<prefix>.transaction`` dataset: one BEGIN and one END row per transaction.
TRANSACTION_SCHEMA = pa.schema(
    [
        pa.field("status", pa.string(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("ts_ms", pa.int64()),
        pa.field("event_count", pa.int64()),
        pa.field("data_collections", pa.list_(DATA_COLLECTION_COUNT)),
        pa.field(WINDOW_ID_FIELD, pa.string(), nullable=False),
    ]
)

#: Data collection name under which logical decoding messages count in transaction metadata.
MESSAGE_DATA_COLLECTION = "message"


class Op:
    """Debezium operation codes."""

    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"
    TRUNCATE = "t"
    MESSAGE = "m"


@dataclass(frozen=True)
class EventLayout:
    """The column layout of one table's change events."""

    value_fields: tuple[pa.Field, ...]
    key_columns: tuple[str, ...]
    source_type: pa.StructType

    def __post_init__(self) -> None:
        names = [f.name for f in self.value_fields]
        missing = [k for k in self.key_columns if k not in names]
        if missing:
            raise CdcConfigurationError(f"key column(s) {missing} are not among the columns {names}")

    @cached_property
    def value_type(self) -> pa.StructType:
        return pa.struct(list(self.value_fields))

    @cached_property
    def key_type(self) -> pa.StructType:
        types = {f.name: f.type for f in self.value_fields}
        return pa.struct([pa.field(k, types[k]) for k in self.key_columns])

    @cached_property
    def flat_key_names(self) -> dict[str, str]:
        """Key column → name of its flat copy (``key_<name>`` when it clashes with the envelope)."""
        out: dict[str, str] = {}
        for name in self.key_columns:
            flat = f"key_{name}" if name in RESERVED_NAMES else name
            if flat in RESERVED_NAMES or flat in out.values():
                raise CdcConfigurationError(f"key column {name!r} cannot be flattened without a clash")
            out[name] = flat
        return out

    @cached_property
    def schema(self) -> pa.Schema:
        key_types = {f.name: f.type for f in self.value_fields}
        key_change = (
            [pa.field(OLD_KEY_FIELD, self.key_type), pa.field(NEW_KEY_FIELD, self.key_type)] if self.key_columns else []
        )
        return pa.schema(
            [
                pa.field("before", self.value_type),
                pa.field("after", self.value_type),
                pa.field("source", self.source_type, nullable=False),
                pa.field("op", pa.string(), nullable=False),
                pa.field("ts_ms", pa.int64()),
                pa.field("transaction", TRANSACTION_BLOCK),
                *(pa.field(flat, key_types[key]) for key, flat in self.flat_key_names.items()),
                *key_change,
                pa.field(UNCHANGED_FIELD, UNCHANGED_LIST),
                pa.field(TRUNCATE_FIELD, TRUNCATE_FLAGS),
                pa.field(WINDOW_ID_FIELD, pa.string(), nullable=False),
            ]
        )

    def value_struct(self, children: Sequence[pa.Array], present: Sequence[bool] | None) -> pa.Array:
        """A ``before``/``after`` column from per-field arrays; ``present[i]`` False → null row."""
        length = len(children[0]) if children else len(present or ())
        if present is not None and not any(present):
            return pa.nulls(length, self.value_type)
        mask = None if present is None or all(present) else pa.array([not p for p in present])
        return pa.StructArray.from_arrays(list(children), fields=list(self.value_fields), mask=mask)

    def key_struct(self, children: Sequence[pa.Array], present: Sequence[bool]) -> pa.Array:
        if not any(present):
            return pa.nulls(len(present), self.key_type)
        mask = pa.array([not p for p in present])
        return pa.StructArray.from_arrays(list(children), fields=list(self.key_type), mask=mask)

    def query_events(
        self, after: pa.Array, source: dict, *, ts_ms: int, window_id: str, op: pa.Array | None = None
    ) -> pa.RecordBatch:
        """Events of rows read by a query (snapshots, incremental chunks): no before image, one
        ``source`` for all, ``op = r`` unless given."""
        length = len(after)
        return self.assemble(
            before=pa.nulls(length, self.value_type),
            after=after,
            source=pa.repeat(pa.scalar(source, self.source_type), length),
            op=op if op is not None else pa.repeat(pa.scalar(Op.READ), length),
            ts_ms=ts_ms,
            transaction=None,
            window_id=window_id,
        )

    def assemble(
        self,
        *,
        before: pa.Array,
        after: pa.Array,
        source: pa.Array,
        op: pa.Array,
        ts_ms: int,
        transaction: pa.Array | None,
        window_id: str,
        old_key: pa.Array | None = None,
        new_key: pa.Array | None = None,
        unchanged: pa.Array | None = None,
        truncate: pa.Array | None = None,
    ) -> pa.RecordBatch:
        length = len(op)
        flat_keys = [
            pc.coalesce(pc.struct_field(after, key), pc.struct_field(before, key)) for key in self.flat_key_names
        ]
        key_change = (
            [
                old_key if old_key is not None else pa.nulls(length, self.key_type),
                new_key if new_key is not None else pa.nulls(length, self.key_type),
            ]
            if self.key_columns
            else []
        )
        columns = [
            before,
            after,
            source,
            op,
            pa.repeat(pa.scalar(ts_ms, pa.int64()), length),
            transaction if transaction is not None else pa.nulls(length, TRANSACTION_BLOCK),
            *flat_keys,
            *key_change,
            unchanged if unchanged is not None else pa.nulls(length, UNCHANGED_LIST),
            truncate if truncate is not None else pa.nulls(length, TRUNCATE_FLAGS),
            pa.repeat(pa.scalar(window_id, pa.string()), length),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def message_schema(source_type: pa.StructType, content_type: pa.DataType) -> pa.Schema:
    """Schema of the ``<prefix>.message`` dataset (``op = m``, logical decoding messages)."""
    return pa.schema(
        [
            pa.field("source", source_type, nullable=False),
            pa.field("op", pa.string(), nullable=False),
            pa.field("ts_ms", pa.int64()),
            pa.field("transaction", TRANSACTION_BLOCK),
            pa.field("message", pa.struct([pa.field("prefix", pa.string()), pa.field("content", content_type)])),
            pa.field("prefix", pa.string()),
            pa.field(WINDOW_ID_FIELD, pa.string(), nullable=False),
        ]
    )


def transaction_rows(*, transaction_id: str, ts_ms: int, counts: dict[str, int], window_id: str) -> list[dict]:
    """The BEGIN and END rows of one transaction (``counts``: data collection → events)."""
    collections = [{"data_collection": name, "event_count": n} for name, n in counts.items()]
    return [
        {
            "status": "BEGIN",
            "id": transaction_id,
            "ts_ms": ts_ms,
            "event_count": None,
            "data_collections": None,
            WINDOW_ID_FIELD: window_id,
        },
        {
            "status": "END",
            "id": transaction_id,
            "ts_ms": ts_ms,
            "event_count": sum(counts.values()),
            "data_collections": collections,
            WINDOW_ID_FIELD: window_id,
        },
    ]


def transaction_batch(rows: list[dict]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=TRANSACTION_SCHEMA)
