"""Arrow schemas as Iceberg stores them: types Iceberg v2 has no type for, made storable; which
type changes a table can evolve to, and which it can only read after a rewrite.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Transaction

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sinks.schemas import merge_schemas

PARTITION_FIELD = "window_id_trunc"
#: Snapshot summary key: the newest window seq the table ever held (every snapshot we make has it).
NEWEST_KEY = "cdc.newest-window-seq"
CONFORMED_SUFFIX = ".conformed.parquet"
COMPACT_TARGET_BYTES = 128 * 1024 * 1024

_UNSIGNED = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64(), pa.uint64(): pa.decimal128(20)}


def _storable_type(t: pa.DataType, column: str) -> pa.DataType:
    """The type Iceberg v2 stores ``t``'s values in without loss (ns → µs casts are checked when
    the file is rewritten); a clear error when there is none."""
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_storable_type(f.type, f"{column}.{f.name}")) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(_storable_type(t.value_type, f"{column}.element"))
    if pa.types.is_map(t):
        return pa.map_(_storable_type(t.key_type, f"{column}.key"), _storable_type(t.item_type, f"{column}.value"))
    if t in _UNSIGNED:
        return _UNSIGNED[t]
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_time(t):
        return pa.time64("us")
    if pa.types.is_timestamp(t):  # Iceberg keeps µs: s/ms files are read as such, ns ones rewritten
        return pa.timestamp("us", None if t.tz is None else "UTC")
    if pa.types.is_decimal(t) and t.precision > 38:
        hint = "decimal_handling_mode='string' (or 'double')"
        raise CdcConfigurationError(f"column {column!r} is {t}: Iceberg decimals hold 38 digits; capture with {hint}")
    if pa.types.is_decimal(t):
        return pa.decimal128(t.precision, t.scale)
    if pa.types.is_duration(t) or pa.types.is_interval(t):
        hint = "interval_handling_mode='numeric' or 'string'"
        raise CdcConfigurationError(f"column {column!r} is {t}, which Iceberg has no type for; capture with {hint}")
    if pa.types.is_null(t):  # left out of the table schema, filled in by conforming
        return t
    if pa.types.is_boolean(t) or pa.types.is_signed_integer(t) or pa.types.is_floating(t) or pa.types.is_date32(t):
        return t
    if _is_text(t) or _is_bytes(t) or pa.types.is_fixed_size_binary(t):
        return t
    raise CdcConfigurationError(
        f"column {column!r} is {t}, which Iceberg has no type for; capture it as text (column_text_list)"
    )


def storable_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_type(_storable_type(f.type, f.name)) for f in schema])


def without_nulls(schema: pa.Schema) -> pa.Schema:
    """No null-typed fields (Iceberg v2 has no such type): merged with the table's as absent."""

    def keep(t: pa.DataType) -> pa.DataType | None:
        if pa.types.is_struct(t):
            fields = [f.with_type(k) for f in t if (k := keep(f.type)) is not None]
            return pa.struct(fields) if fields else None
        nested = [t.value_type] if pa.types.is_list(t) else [t.key_type, t.item_type] if pa.types.is_map(t) else []
        return None if pa.types.is_null(t) or any(keep(n) is None for n in nested) else t

    return pa.schema([f.with_type(k) for f in schema if (k := keep(f.type)) is not None])


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """Regular (not large) string, binary and list types, all nullable, no metadata: the form
    :func:`.schemas.merge_schemas` compares."""

    def plain(t: pa.DataType) -> pa.DataType:
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, plain(f.type)) for f in t])
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return pa.list_(plain(t.value_type))
        if pa.types.is_map(t):
            return pa.map_(plain(t.key_type), plain(t.item_type))
        return pa.string() if pa.types.is_large_string(t) else pa.binary() if pa.types.is_large_binary(t) else t

    return pa.schema([pa.field(f.name, plain(f.type)) for f in schema])


def arrow_schema(schema: Any) -> pa.Schema:
    return plain_schema(schema_to_pyarrow(schema, include_field_ids=False))


def evolve(
    txn: Transaction, current: pa.Schema, schemas: Iterable[pa.Schema]
) -> tuple[pa.Schema, list[tuple[str, ...]]]:
    """Evolve the table to the merge of its schema and ``schemas``: returns the new schema and
    the columns replaced by a new field, Iceberg being unable to promote their type to the merged one."""
    target = plain_schema(merge_schemas([current, *schemas]))
    if target.equals(current):
        return current, []
    retyped = _retyped(list(current), list(target), ())
    if retyped:
        with txn.update_schema(allow_incompatible_changes=True) as update:
            for path in retyped:
                update.delete_column(path)
    with txn.update_schema() as update:
        update.union_by_name(target)
    return arrow_schema(txn.table_metadata.schema()), retyped


def _retyped(old: list[pa.Field], new: list[pa.Field], prefix: tuple[str, ...]) -> list[tuple[str, ...]]:
    by_name = {f.name: f for f in new}
    paths = []
    for field in old:
        other = by_name.get(field.name)
        if other is None or other.type.equals(field.type):
            continue
        if pa.types.is_struct(field.type) and pa.types.is_struct(other.type):
            paths += _retyped(list(field.type), list(other.type), (*prefix, field.name))
        elif not _promotable(field.type, other.type):
            paths.append((*prefix, field.name))
    return paths


def _promotable(old: pa.DataType, new: pa.DataType) -> bool:
    """Iceberg v2's type promotions: int → long, float → double, wider decimal of equal scale."""
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return old.scale == new.scale and old.precision <= new.precision
    return (old, new) in ((pa.int32(), pa.int64()), (pa.float32(), pa.float64()))


def readable(src: pa.DataType | pa.Schema, dst: pa.DataType | pa.Schema) -> bool:
    """Can a file column of type ``src`` be registered as is under the table's ``dst``?"""
    if isinstance(src, pa.Schema):
        src, dst = pa.struct(list(src)), pa.struct(list(dst))
    if src.equals(dst):
        return True
    if pa.types.is_struct(src) and pa.types.is_struct(dst):
        return all(dst.get_field_index(f.name) >= 0 and readable(f.type, dst.field(f.name).type) for f in src)
    if pa.types.is_list(src) and pa.types.is_list(dst):
        return readable(src.value_type, dst.value_type)
    if pa.types.is_map(src) and pa.types.is_map(dst):
        return readable(src.key_type, dst.key_type) and readable(src.item_type, dst.item_type)
    if pa.types.is_signed_integer(src) and pa.types.is_signed_integer(dst):
        return dst.bit_width >= max(src.bit_width, 32)  # int8/int16 files are Iceberg ints
    if pa.types.is_timestamp(src) and pa.types.is_timestamp(dst):  # pyiceberg reads s/ms as µs
        return (src.tz is None) == (dst.tz is None) and src.unit != "ns"
    if (_is_text(src) and _is_text(dst)) or (_is_bytes(src) and _is_bytes(dst)):
        return True
    return _promotable(src, dst)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_bytes(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)
