"""The SQL Server window's events, built a column at a time, agree with a row-by-row reference.

``WindowReader`` buffers the change rows of a chunk and builds every column at the flush (the
``source`` and ``transaction`` blocks from per-transaction values, LSN texts with numpy). The
reference here builds each event on its own, as Debezium describes it: a ``source`` dict from
:func:`events.source_block`, values typed one row at a time, then ``RecordBatch.from_pylist``.
Random windows (two tables, key changes, NULLs, a mask, chunks that split transactions) must
give the same rows, schema and order.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.naming import table_topic
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.columns import ColumnRules, MaskRule
from airflow_provider_cdc.cdc.events.settings import EventContext, EventSettings
from airflow_provider_cdc.cdc.sources.sqlserver.events import TableEncoder, source_block
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import MAX_SQLSERVER_LSN, SqlServerLsn, lsn_texts
from airflow_provider_cdc.cdc.sources.sqlserver.stream import WindowReader
from airflow_provider_cdc.cdc.sources.sqlserver.tables import CaptureInstance, SqlColumn, TableInfo
from airflow_provider_cdc.cdc.sources.sqlserver.types import SqlServerType

CONTEXT = EventContext(topic_prefix="shop", database="shopdb", window_id="w-7", ts_ms=1_700_000_000_000)
SETTINGS = EventSettings(columns=ColumnRules(masks=(MaskRule(r"dbo\.orders\.note", "mask", 3),)))
ORDERS = TableRef("dbo", "orders")
ITEMS = TableRef("dbo", "items")
TABLES = {
    ORDERS.data_collection: TableInfo(
        ORDERS,
        (
            SqlColumn("id", SqlServerType("int", 4, 10)),
            SqlColumn("region", SqlServerType("nvarchar", 20)),
            SqlColumn("note", SqlServerType("nvarchar", 40)),
            SqlColumn("amount", SqlServerType("decimal", 9, 9, 2)),
            SqlColumn("at", SqlServerType("datetime2", 8, 27, 7)),
            SqlColumn("paid", SqlServerType("bit", 1, 1)),
        ),
        ("id", "region"),
        (CaptureInstance("dbo_orders", ORDERS, None, 1, "pk", ("id", "region", "note", "amount", "at", "paid")),),
    ),
    ITEMS.data_collection: TableInfo(
        ITEMS,
        (
            SqlColumn("id", SqlServerType("bigint", 8, 19)),
            SqlColumn("weight", SqlServerType("float", 8, 53)),
            SqlColumn("blob", SqlServerType("varbinary", 16)),
        ),
        ("id",),
        (CaptureInstance("dbo_items", ITEMS, None, 2, "pk", ("id", "weight", "blob")),),
    ),
}

# What pyodbc returns for each column's select expression (datetime2: CONVERT(varchar, [at], 121)).
_datetime2_text = st.builds(
    lambda d, f: f"{d:%Y-%m-%d %H:%M:%S}.{f:07d}",
    st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2100, 1, 1)),
    st.integers(0, 10**7 - 1),
)
_VALUES = {
    ORDERS.data_collection: (
        st.integers(0, 3),
        st.sampled_from(["eu", "us", "ü"]),
        st.none() | st.text(max_size=5),
        st.none() | st.decimals(-(10**6), 10**6, places=2, allow_nan=False, allow_infinity=False),
        st.none() | _datetime2_text,
        st.booleans(),
    ),
    ITEMS.data_collection: (
        st.integers(-(2**40), 2**40),
        st.none() | st.floats(allow_nan=False, allow_infinity=False),
        st.none() | st.binary(max_size=4),
    ),
}
_INSTANCES = {name: table.instances[0] for name, table in TABLES.items()}


@st.composite
def windows(draw: st.DrawFn) -> tuple[list[tuple[CaptureInstance, tuple]], dict[int, tuple]]:
    """Merged change rows ``(instance, (start_lsn, seqval, operation, values...))`` of random
    transactions, and the commit times of their start LSNs."""
    rows: list[tuple[CaptureInstance, tuple]] = []
    times: dict[int, tuple] = {}
    lsn = draw(st.integers(1, MAX_SQLSERVER_LSN // 2))
    for _ in range(draw(st.integers(1, 6))):
        lsn += draw(st.integers(1, 2**64))
        start = SqlServerLsn(lsn).to_bytes()
        when = draw(st.datetimes(dt.datetime(2000, 1, 1), dt.datetime(2100, 1, 1)))
        times[lsn] = (when, draw(st.none() | st.binary(min_size=1, max_size=10)))
        seqval = lsn
        for _ in range(draw(st.integers(1, 8))):
            table = draw(st.sampled_from(sorted(TABLES)))
            instance = _INSTANCES[table]
            values = tuple(draw(s) for s in _VALUES[table])
            seqval += draw(st.integers(1, 2**20))
            seq = SqlServerLsn(seqval).to_bytes()
            kind = draw(st.sampled_from(["insert", "delete", "update", "update"]))
            if kind == "update":
                after = tuple(draw(s) if draw(st.booleans()) else v for s, v in zip(_VALUES[table], values))
                rows.append((instance, (start, seq, 3, *values)))
                rows.append((instance, (start, seq, 4, *after)))
            else:
                rows.append((instance, (start, seq, 1 if kind == "delete" else 2, *values)))
    return rows, times


def _utc_ms(when: dt.datetime) -> int:
    return int(when.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)


def _typed_row(encoder: TableEncoder, values: tuple | None) -> dict[str, Any] | None:
    """One row's values through the codecs (and masks) on their own."""
    if values is None:
        return None
    arrays = encoder.typed([[v] for v in values])
    return {c.name: a.to_pylist()[0] for c, a in zip(encoder.columns, arrays)}


def reference(
    rows: list[tuple[CaptureInstance, tuple]], times: dict[int, tuple], encoders: dict[str, TableEncoder]
) -> dict[str, list[dict[str, Any]]]:
    """Each table's events, one dict per event, in order."""
    out: dict[str, list[dict[str, Any]]] = {}
    total, counts, pending = 0, {}, None
    current = None
    for instance, row in rows:
        start, seqval, operation, values = int.from_bytes(row[0], "big"), row[1], row[2], row[3:]
        if start != current:
            current, total, counts = start, 0, {}
        if operation == 3:
            pending = values
            continue
        table, encoder = instance.table, encoders[instance.name]
        before, after = (values, None) if operation == 1 else (pending if operation == 4 else None, values)
        events: list[tuple[str, tuple | None, tuple | None, int, tuple | None, tuple | None]] = []
        keys = encoder.key_indexes
        if operation == 4 and tuple(before[i] for i in keys) != tuple(after[i] for i in keys):
            events.append(("d", before, None, 1, None, after))
            events.append(("c", None, after, 2, before, None))
        else:
            events.append(({1: "d", 2: "c", 4: "u"}[operation], before, after, 1, None, None))
        when, tran_id = times[start]
        for op, b, a, serial, old_key_row, new_key_row in events:
            total += 1
            counts[table.data_collection] = counts.get(table.data_collection, 0) + 1
            typed_before, typed_after = _typed_row(encoder, b), _typed_row(encoder, a)
            event: dict[str, Any] = {
                "before": typed_before,
                "after": typed_after,
                "source": source_block(
                    CONTEXT,
                    table.schema,
                    table.name,
                    snapshot="false",
                    ts_ms=_utc_ms(when),
                    change_lsn=str(SqlServerLsn(seqval)),
                    commit_lsn=str(SqlServerLsn(start)),
                    event_serial_no=serial,
                ),
                "op": op,
                "ts_ms": CONTEXT.ts_ms,
                "transaction": {
                    "id": tran_id.hex() if tran_id else str(SqlServerLsn(start)),
                    "total_order": total,
                    "data_collection_order": counts[table.data_collection],
                },
                "window_id": CONTEXT.window_id,
            }
            for key, flat in encoder.layout.flat_key_names.items():
                value = None if typed_after is None else typed_after[key]
                event[flat] = value if value is not None else (None if typed_before is None else typed_before[key])
            for field, key_row in (("__debezium_oldkey", old_key_row), ("__debezium_newkey", new_key_row)):
                typed = _typed_row(encoder, key_row)
                event[field] = None if typed is None else {k: typed[k] for k in encoder.key_columns}
            out.setdefault(table_topic(CONTEXT.topic_prefix, table.schema, table.name), []).append(event)
    return out


@settings(max_examples=60, deadline=None)
@given(window=windows(), chunk=st.integers(1, 30))
def test_window_events_match_a_row_by_row_reference(window: tuple, chunk: int) -> None:
    rows, times = window
    flushed: dict[str, list[pa.RecordBatch]] = {}

    def flush(batches: dict[str, list[pa.RecordBatch]], transactions: pa.RecordBatch | None) -> None:
        for topic, found in batches.items():
            flushed.setdefault(topic, []).extend(found)

    reader = WindowReader(
        tables=TABLES,
        context=CONTEXT,
        settings=SETTINGS,
        max_changes_per_chunk=chunk,
        flush=flush,
        commit_times=lambda low, high: {k: v for k, v in times.items() if int(low) <= k <= int(high)},
    )
    first, last = min(times), max(times)
    window_ = Window(seq=1, kind="stream", from_lsn=SqlServerLsn(first), to_lsn=SqlServerLsn(last + 1), planned_at_ms=0)
    reader.read(iter(rows), window_)

    encoders = {i.name: reader.encoder(i) for i in _INSTANCES.values()}
    expected = reference(rows, times, encoders)
    assert sorted(flushed) == sorted(expected)
    layouts = {
        table_topic(CONTEXT.topic_prefix, i.table.schema, i.table.name): encoders[i.name].layout
        for i in _INSTANCES.values()
    }
    for topic, batches in flushed.items():
        schema = layouts[topic].schema
        assert all(b.schema.equals(schema) for b in batches)
        got = pa.Table.from_batches(batches, schema).combine_chunks()
        want = pa.Table.from_pylist(expected[topic], schema)
        assert got.to_pylist() == want.to_pylist()
        assert got.equals(want)


@given(st.lists(st.integers(0, MAX_SQLSERVER_LSN), max_size=20))
def test_lsn_texts_are_debeziums_lsn_strings(values: list[int]) -> None:
    texts = lsn_texts([SqlServerLsn(v) for v in values])
    assert texts.type == pa.string()
    assert texts.to_pylist() == [str(SqlServerLsn(v)) for v in values]
    texts.validate(full=True)


def test_lsn_texts_of_the_extremes() -> None:
    assert lsn_texts([SqlServerLsn(0), SqlServerLsn(MAX_SQLSERVER_LSN)]).to_pylist() == [
        "00000000:00000000:0000",
        "ffffffff:ffffffff:ffff",
    ]
    assert lsn_texts([SqlServerLsn("0000002a:00000bd8:0003")]).to_pylist() == ["0000002a:00000bd8:0003"]


def test_decimal_values_keep_their_scale() -> None:
    """A sanity check of the reference's typing: a row typed alone is typed as in a column."""
    encoder = TableEncoder(TABLES[ORDERS.data_collection], TABLES[ORDERS.data_collection].columns, SETTINGS)
    row = (1, "eu", "secret", Decimal("1.50"), "2024-05-06 07:08:09.1234567", True)
    typed = _typed_row(encoder, row)
    assert typed is not None
    assert typed["amount"] == Decimal("1.50") and typed["note"] == "***"
