"""Schema evolution: reading events of one table written under different schemas.

Every window writes the event schema of the table version it saw (a table version changes
with ``ALTER TABLE``; inside a window each version is written as separate files). Readers merge
the versions by column name, recursively inside ``before``/``after``:

- a column added later is null in earlier events; a dropped column is null in later ones;
- a renamed column is a drop plus an add: both names are present;
- a retyped column takes the wider type when one exists (integers, floats, decimals that still
  fit decimal(38), date → timestamp is *not* widened); otherwise the merged column is a string
  holding each value's text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

_INT_RANK = {pa.int8(): 1, pa.int16(): 2, pa.int32(): 3, pa.int64(): 4}


def merge_types(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    if a.equals(b):
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_null(b):
        return a
    if a in _INT_RANK and b in _INT_RANK:
        return a if _INT_RANK[a] >= _INT_RANK[b] else b
    if pa.types.is_floating(a) and pa.types.is_floating(b):
        return pa.float64()
    if (pa.types.is_floating(a) and b in _INT_RANK) or (pa.types.is_floating(b) and a in _INT_RANK):
        return pa.float64()
    if pa.types.is_decimal(a) and pa.types.is_decimal(b):
        scale = max(a.scale, b.scale)
        integer_digits = max(a.precision - a.scale, b.precision - b.scale)
        if integer_digits + scale <= 38:
            return pa.decimal128(integer_digits + scale, scale)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return pa.struct(merge_fields(list(a), list(b)))
    if pa.types.is_list(a) and pa.types.is_list(b):
        return pa.list_(merge_types(a.value_type, b.value_type))
    return pa.string()


def merge_fields(a: Sequence[pa.Field], b: Sequence[pa.Field]) -> list[pa.Field]:
    by_name = {f.name: f for f in b}
    merged = []
    for field in a:
        other = by_name.pop(field.name, None)
        merged.append(field if other is None else pa.field(field.name, merge_types(field.type, other.type)))
    merged.extend(f.with_nullable(True) for f in b if f.name in by_name)
    return [f.with_nullable(True) for f in merged]


def merge_schemas(schemas: Sequence[pa.Schema]) -> pa.Schema:
    fields: list[pa.Field] = list(schemas[0])
    for schema in schemas[1:]:
        fields = merge_fields(fields, list(schema))
    return pa.schema(fields)


def conform(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` converted to ``target`` (missing struct fields null, others cast or rendered)."""
    if array.type.equals(target):
        return array
    if pa.types.is_struct(target) and pa.types.is_struct(array.type):
        children = [
            conform(pc.struct_field(array, field.name), field.type)
            if array.type.get_field_index(field.name) >= 0
            else pa.nulls(len(array), field.type)
            for field in target
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=pc.is_null(array))
    if pa.types.is_string(target):
        try:
            return pc.cast(array, target)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            return pa.array([None if v is None else _text(v) for v in array.to_pylist()], pa.string())
    return pc.cast(array, target)


def conform_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = [
        conform(table.column(f.name).combine_chunks(), f.type)
        if f.name in table.column_names
        else pa.nulls(len(table), f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str, sort_keys=True)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)
