"""Merging event schemas written before and after ALTER TABLE."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

from airflow_provider_cdc.cdc.sinks.schemas import conform_table, merge_schemas, merge_types


def test_widening_and_fallback_rules():
    assert merge_types(pa.int32(), pa.int64()) == pa.int64()
    assert merge_types(pa.int64(), pa.float32()) == pa.float64()
    assert merge_types(pa.decimal128(10, 2), pa.decimal128(12, 4)) == pa.decimal128(12, 4)
    assert merge_types(pa.decimal128(38, 0), pa.decimal128(38, 10)) == pa.string()  # no decimal holds both
    assert merge_types(pa.int32(), pa.string()) == pa.string()
    assert merge_types(pa.date32(), pa.timestamp("us")) == pa.string()
    assert merge_types(pa.list_(pa.int16()), pa.list_(pa.int32())) == pa.list_(pa.int32())


def test_added_dropped_renamed_and_retyped_columns_in_before_and_after():
    v1 = pa.struct([("id", pa.int32()), ("name", pa.string()), ("qty", pa.int32()), ("old", pa.string())])
    v2 = pa.struct([("id", pa.int32()), ("name", pa.string()), ("qty", pa.int64()), ("price", pa.decimal128(8, 2))])
    v3 = pa.struct([("id", pa.int32()), ("label", pa.string()), ("qty", pa.string())])
    t1 = pa.table({"after": pa.array([{"id": 1, "name": "a", "qty": 5, "old": "x"}], v1), "op": ["c"]})
    t2 = pa.table({"after": pa.array([{"id": 2, "name": "b", "qty": 6, "price": Decimal("1.50")}], v2), "op": ["u"]})
    t3 = pa.table({"after": pa.array([{"id": 3, "label": "renamed", "qty": "lots"}], v3), "op": ["u"]})
    schema = merge_schemas([t1.schema, t2.schema, t3.schema])
    after = schema.field("after").type
    assert [f.name for f in after] == ["id", "name", "qty", "old", "price", "label"]
    assert after.field("qty").type == pa.string() and after.field("price").type == pa.decimal128(8, 2)
    rows = pa.concat_tables([conform_table(t, schema) for t in (t1, t2, t3)]).column("after").to_pylist()
    assert rows[0] == {"id": 1, "name": "a", "qty": "5", "old": "x", "price": None, "label": None}
    assert rows[1] == {"id": 2, "name": "b", "qty": "6", "old": None, "price": Decimal("1.50"), "label": None}
    assert rows[2] == {"id": 3, "name": None, "qty": "lots", "old": None, "price": None, "label": "renamed"}


def test_null_structs_stay_null():
    v1 = pa.struct([("id", pa.int32())])
    v2 = pa.struct([("id", pa.int64()), ("x", pa.string())])
    t1 = pa.table({"before": pa.array([None], v1)})
    t2 = pa.table({"before": pa.array([{"id": 1, "x": "y"}], v2)})
    schema = merge_schemas([t1.schema, t2.schema])
    assert conform_table(t1, schema).column("before").to_pylist() == [None]
