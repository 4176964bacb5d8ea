"""What both lake formats' state tables share: the commit's tag properties, rows by key, plain
Arrow types (the formats' readers hand back dictionary/large types the fold does not expect).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.sinks.formats import TAG_PREFIX, WindowTag

DEFAULT_TARGET_FILE_SIZE = 32 * 1024 * 1024


DEFAULT_ROW_GROUP_ROWS = 64 * 1024


SEQ_KEY = TAG_PREFIX + "window-seq"


MODE_KEY = TAG_PREFIX + "state-mode"  # "merge" or "overwrite": how the commit changed the table


IN_LIMIT = 200  # pyiceberg's IN_PREDICATE_LIMIT


MAX_IN_TERMS = 10_000  # key values listed in a Delta MERGE predicate (more: their range)


DELETE_FLAG = "__cdc_delete"  # marks the MERGE source rows that only remove a key


def plain_types(table: pa.Table) -> pa.Table:
    """``table`` with large and view string/binary/list types as their plain forms: Spark's
    ``toArrow`` gives large types, deltalake's scans view types, and the formats store one."""
    schema = pa.schema([f.with_type(plain_type(f.type)) for f in table.schema])
    return table if schema.equals(table.schema) else table.cast(schema)


def plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.list_(plain_type(t.value_type))
    if pa.types.is_list(t):
        return pa.list_(plain_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(plain_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(plain_type(t.key_type), plain_type(t.item_type))
    return t


def rows_with_keys(rows: pa.Table, keys: Sequence[str], key_values: pa.Table, *, keep: bool = True) -> pa.Table:
    """The rows of ``rows`` whose key is (``keep``) or is not (not ``keep``) among ``key_values``.

    Joins only the key columns (with a row index) so any value column type is fine."""
    if not len(rows) or not len(key_values):
        return rows if not keep else rows.slice(0, 0)
    index = pa.table({**{k: rows.column(k) for k in keys}, "__i": pa.array(np.arange(len(rows), dtype=np.int64))})
    wanted = pa.table({k: key_values.column(k).cast(rows.schema.field(k).type) for k in keys})
    joined = index.join(wanted, list(keys), join_type="left semi" if keep else "left anti")
    positions = joined.column("__i").combine_chunks()
    return rows.take(positions.take(pc.sort_indices(positions)))


def sort_by_keys(rows: pa.Table, keys: Sequence[str]) -> pa.Table:
    return rows.sort_by([(k, "ascending") for k in keys]) if keys and len(rows) > 1 else rows


def distinct_values(column: pa.ChunkedArray) -> list[Any]:
    return pc.unique(column).drop_null().to_pylist()


def tag_properties(tag: WindowTag, mode: str) -> dict[str, str]:
    return {**tag.properties(), MODE_KEY: mode}


def same_fields(a: pa.Schema, b: pa.Schema) -> bool:
    return a.names == b.names and all(x.type.equals(y.type) for x, y in zip(a, b))
