"""The current-state fold on Arrow: :func:`.state.fold` without Spark, for small refreshes.

Same inputs and outputs as the Spark fold (events in the event schema, state rows or None as the
base; the state rows out, or None), same semantics (see :mod:`.spark_fold`), and the same steps in the
same order, so both give the same table, quirks included (a property test holds them equal):

- positions ``(window, snapshot rows first, commit position, total_order)``, the last truncate
  resets (events after it only, no base);
- keyed tables: per key and column, the value of the last event up to each row that is not a
  delete and does not list the column as an unchanged TOAST column (a running maximum of row
  indices over rows sorted by key and position); up to three passes patch the create half of a
  key change with the old key's values of its unchanged TOAST columns, as they were at the delete
  half; the last event of a key wins, a delete removes it;
- keyless tables: rows counted as a multiset (creates +1, deletes -1, updates both).

Runs in the worker's memory: the operator picks it for refreshes below a size it measures
(``state_engine="auto"``), Spark above. pyarrow and numpy only.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.sinks.schemas import conform, conform_table, merge_schemas

_PASSES = 3  # as state._PASSES
_BASE_POSITION = (-1, 0, "0", 0)  # the base rows' position: before every event, as in the Spark fold


def fold(events: pa.Table | None, base: pa.Table | None) -> pa.Table | None:
    """Apply ``events`` (an Arrow table in the event schema) to ``base`` (state rows, or None)."""
    if events is None:
        return base
    names = events.column_names
    keys = [f.name for f in events.schema.field("__debezium_oldkey").type] if "__debezium_oldkey" in names else []
    value_schema = pa.schema(list(events.schema.field("after").type))
    if base is not None:
        value_schema = merge_schemas([value_schema, base.schema])
    events = events.combine_chunks()
    position = _positions(events)
    reset = _last_truncate(events, position)
    if reset is not None:
        keep = _after(position, reset)
        events, position = events.filter(keep), {k: v[keep] for k, v in position.items()}
        base = None
    kept = ~_is(events.column("op"), "t")
    events, position = events.filter(kept), {k: v[kept] for k, v in position.items()}
    if not keys:
        return _fold_multiset(events, base, value_schema)
    return _fold_keyed(events, position, base, keys, value_schema)


# -- positions -----------------------------------------------------------------------------------


def _positions(events: pa.Table) -> dict[str, np.ndarray]:
    """The apply order of each event as four numpy columns (seq, phase, lsn text, order)."""
    op = events.column("op")
    source = events.column("source").combine_chunks()
    snapshot = _field(source, "snapshot")
    # Initial snapshot rows come first in their window; incremental ones sit at their chunk's watermark.
    first = pc.and_(pc.equal(op, "r"), pc.not_equal(snapshot, "incremental"))
    phase = np.where(pc.fill_null(first, False).to_numpy(zero_copy_only=False), 0, 1).astype(np.int32)
    transaction = events.column("transaction").combine_chunks()
    order = pc.fill_null(_field(transaction, "total_order").cast(pa.int64()), 0)
    return {
        "seq": pc.cast(events.column("window_id"), pa.int64()).to_numpy(),
        "phase": phase,
        "lsn": np.asarray(pc.fill_null(_sortable_commit(source), "").to_pylist(), dtype=object),
        "order": order.to_numpy(),
    }


def _sortable_commit(source: pa.StructArray) -> pa.Array:
    """As state._sortable_commit: text commit positions as they are, numbers padded to 20 digits."""
    name = "commit_lsn" if source.type.get_field_index("commit_lsn") >= 0 else "commit_time"
    column = _field(source, name)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.cast(pa.string())
    return pc.utf8_lpad(pc.cast(column, pa.string()), width=20, padding="0")


def _last_truncate(events: pa.Table, position: dict[str, np.ndarray]) -> tuple | None:
    rows = np.flatnonzero(_is(events.column("op"), "t"))
    if not len(rows):
        return None
    return max(tuple(position[k][i] for k in ("seq", "phase", "lsn", "order")) for i in rows)


def _after(position: dict[str, np.ndarray], reset: tuple) -> np.ndarray:
    """Rows whose position is strictly after ``reset`` (lexicographic over the four parts)."""
    greater = np.zeros(len(position["seq"]), dtype=bool)
    equal = np.ones(len(position["seq"]), dtype=bool)
    for name, value in zip(("seq", "phase", "lsn", "order"), reset):
        column = position[name]
        greater |= equal & (column > value)
        equal &= column == value
    return greater


# -- keyed tables --------------------------------------------------------------------------------


def _fold_keyed(
    events: pa.Table, position: dict[str, np.ndarray], base: pa.Table | None, keys: list[str], schema: pa.Schema
) -> pa.Table:
    columns = schema.names
    after = _struct(events, "after")
    before = _struct(events, "before")
    key_types = {k: schema.field(k).type for k in keys}
    key_arrays = {k: pc.coalesce(_conformed(after, k, key_types[k]), _conformed(before, k, key_types[k])) for k in keys}
    values = {c: _conformed(after, c, schema.field(c).type) for c in columns}
    op = np.asarray(events.column("op").to_pylist(), dtype=object)
    oldkey = _struct(events, "__debezium_oldkey")
    old = {k: _conformed(oldkey, k, key_types[k]) for k in keys}
    has_old = oldkey.is_valid().to_numpy(zero_copy_only=False)
    unchanged, changed_count = _unchanged(events, columns)
    pos = dict(position)
    if base is not None and base.num_rows:
        n = base.num_rows
        rows = conform_table(base, schema)
        key_arrays = {
            k: pa.concat_arrays([key_arrays[k], pc.cast(rows.column(k).combine_chunks(), key_types[k])]) for k in keys
        }
        values = {c: pa.concat_arrays([values[c], rows.column(c).combine_chunks()]) for c in columns}
        old = {k: pa.concat_arrays([old[k], pa.nulls(n, key_types[k])]) for k in keys}
        op = np.concatenate([op, np.full(n, "r", dtype=object)])
        has_old = np.concatenate([has_old, np.zeros(n, dtype=bool)])
        unchanged = {c: np.concatenate([m, np.zeros(n, dtype=bool)]) for c, m in unchanged.items()}
        changed_count = np.concatenate([changed_count, np.zeros(n, dtype=np.int64)])
        for name, value in zip(("seq", "phase", "lsn", "order"), _BASE_POSITION):
            pos[name] = np.concatenate([pos[name], np.full(n, value, dtype=pos[name].dtype)])
    # Rows sorted by key, then position: each key's events are a run, in apply order.
    table = pa.table(
        {
            **{f"_k{i}": key_arrays[k] for i, k in enumerate(keys)},
            "_seq": pos["seq"],
            "_phase": pos["phase"],
            "_lsn": pa.array(pos["lsn"], pa.string()),
            "_order": pos["order"],
        }
    )
    sort = [(f"_k{i}", "ascending") for i in range(len(keys))] + [
        (c, "ascending") for c in ("_seq", "_phase", "_lsn", "_order")
    ]
    order = pc.sort_indices(table, sort_keys=sort).to_numpy()
    table = table.take(order)
    key_arrays = {k: table.column(f"_k{i}").combine_chunks() for i, k in enumerate(keys)}
    values = {c: values[c].take(order) for c in columns}
    old = {k: old[k].take(order) for k in keys}
    op, has_old, changed_count = op[order], has_old[order], changed_count[order]
    unchanged = {c: m[order] for c, m in unchanged.items()}
    seq, lsn, total_order = pos["seq"][order], pos["lsn"][order], pos["order"][order]
    starts = _group_starts([key_arrays[k] for k in keys])
    deletes = op == "d"

    def resolve() -> dict[str, pa.Array]:
        """Per row and column: the value of the last event of its key up to it that sets it."""
        rows = np.arange(len(op))
        resolved = {}
        for c in columns:
            sets = ~deletes & ~unchanged[c]
            last = np.maximum.accumulate(np.where(sets, rows, -1)) if len(rows) else rows
            found = last >= starts
            resolved[c] = values[c].take(pa.array(np.where(found, last, 0), mask=~found))
        return resolved

    for _ in range(_PASSES):
        resolved = resolve()
        moved = (op == "c") & has_old & (changed_count > 0)
        if not moved.any():
            break
        # A create that moved a row to a new key takes unchanged TOAST values from the old key,
        # as they were when that key was deleted in the same transaction.
        created, deleted = _moves(
            np.flatnonzero(has_old), np.flatnonzero(deletes), keys, key_arrays, old, seq, lsn, total_order
        )
        patch = op[created] == "c"
        for c in columns:
            take = patch & unchanged[c][created]
            if take.any():
                target, source = created[take], deleted[take]
                index = np.arange(len(op))
                index[target] = len(op) + np.arange(len(target))
                values[c] = pa.concat_arrays([values[c], resolved[c].take(pa.array(source))]).take(pa.array(index))
        for c in columns:
            unchanged[c][created] = False
        changed_count[created] = 0
    resolved = resolve()
    last_of_key = np.append(starts[1:] != starts[:-1], True) if len(op) else np.zeros(0, dtype=bool)
    keep = np.flatnonzero(last_of_key & ~deletes)
    return pa.Table.from_arrays([resolved[c].take(pa.array(keep)) for c in columns], schema=schema)


def _moves(
    candidates: np.ndarray,
    deletes: np.ndarray,
    keys: list[str],
    key_arrays: dict[str, pa.Array],
    old: dict[str, pa.Array],
    seq: np.ndarray,
    lsn: np.ndarray,
    order: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (row with an old key, the delete of that old key just before it in its transaction):
    same window and commit position, total_order one less, the delete's key equal to the old key."""
    left = pa.table(
        {
            "_row": candidates,
            "_seq": seq[candidates],
            "_lsn": pa.array(lsn[candidates], pa.string()),
            "_order": order[candidates] - 1,
            **{f"_k{i}": old[k].take(pa.array(candidates)) for i, k in enumerate(keys)},
        }
    )
    right = pa.table(
        {
            "_del": deletes,
            "_seq": seq[deletes],
            "_lsn": pa.array(lsn[deletes], pa.string()),
            "_order": order[deletes],
            **{f"_k{i}": key_arrays[k].take(pa.array(deletes)) for i, k in enumerate(keys)},
        }
    )
    on = ["_seq", "_lsn", "_order", *[f"_k{i}" for i in range(len(keys))]]
    joined = left.join(right, keys=on, join_type="inner")
    return joined.column("_row").to_numpy(), joined.column("_del").to_numpy()


def _group_starts(keys: list[pa.Array]) -> np.ndarray:
    """For each row (sorted by key), the index of its key's first row (null keys equal)."""
    n = len(keys[0]) if keys else 0
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for array in keys:
        a, b = array.slice(1), array.slice(0, n - 1)
        same = pc.fill_null(pc.equal(a, b), False).to_numpy(zero_copy_only=False)
        both_null = pc.and_(a.is_null(), b.is_null()).to_numpy(zero_copy_only=False)
        new[1:] |= ~(same | both_null)
    return np.maximum.accumulate(np.where(new, np.arange(n), 0))


# -- keyless tables ------------------------------------------------------------------------------


def _fold_multiset(events: pa.Table, base: pa.Table | None, schema: pa.Schema) -> pa.Table:
    columns = schema.names
    after, before = _struct(events, "after"), _struct(events, "before")
    unchanged, _ = _unchanged(events, columns)
    op = np.asarray(events.column("op").to_pylist(), dtype=object)
    # Under REPLICA IDENTITY FULL the before image is complete: unchanged TOAST values come from it.
    completed = {
        c: _where(unchanged[c], _conformed(before, c, schema.field(c).type), _conformed(after, c, schema.field(c).type))
        for c in columns
    }
    old = {c: _conformed(before, c, schema.field(c).type) for c in columns}
    adds = np.flatnonzero(np.isin(op, ["r", "c", "u"]))
    removes = np.flatnonzero(~np.isin(op, ["r", "c"]))
    parts = [
        pa.table({**{c: completed[c].take(pa.array(adds)) for c in columns}, "_n": np.ones(len(adds), np.int64)}),
        pa.table({**{c: old[c].take(pa.array(removes)) for c in columns}, "_n": -np.ones(len(removes), np.int64)}),
    ]
    if base is not None and base.num_rows:
        rows = conform_table(base, schema)
        parts.append(rows.append_column("_n", pa.array(np.ones(base.num_rows, np.int64))))
    signed = pa.concat_tables([p.cast(pa.schema([*schema, pa.field("_n", pa.int64())])) for p in parts])
    signed = signed.append_column("_i", pa.array(np.arange(signed.num_rows)))
    group_keys = {f"_g{i}": _groupable(signed.column(c).combine_chunks()) for i, c in enumerate(columns)}
    grouping = pa.table({**group_keys, "_n": signed.column("_n"), "_i": signed.column("_i")})
    counted = grouping.group_by(list(group_keys)).aggregate([("_n", "sum"), ("_i", "min")])
    n = counted.column("_n_sum").to_numpy()
    first = counted.column("_i_min").to_numpy()
    index = np.repeat(first[n > 0], n[n > 0])
    return signed.select(columns).take(pa.array(index, pa.int64()))


def _groupable(array: pa.Array) -> pa.Array:
    """``array`` itself where Arrow can group by its type, else each value's text (nested types)."""
    t = array.type
    if pa.types.is_nested(t) or pa.types.is_dictionary(t):
        return pa.array([None if v is None else repr(v) for v in array.to_pylist()], pa.string())
    return array


# -- helpers -------------------------------------------------------------------------------------


def _is(column: pa.ChunkedArray | pa.Array, value: str) -> np.ndarray:
    return pc.fill_null(pc.equal(column, value), False).to_numpy(zero_copy_only=False)


def _struct(events: pa.Table, name: str) -> pa.StructArray:
    column = events.column(name).combine_chunks()
    return column.chunk(0) if isinstance(column, pa.ChunkedArray) else column


def _field(struct: pa.StructArray, name: str) -> pa.Array:
    """A struct's child, null where the struct is null."""
    if struct.type.get_field_index(name) < 0:
        return pa.nulls(len(struct))
    child = struct.field(name)
    if struct.null_count:
        child = pc.if_else(struct.is_valid(), child, pa.scalar(None, child.type))
    return child


def _conformed(struct: pa.StructArray, name: str, target: pa.DataType) -> pa.Array:
    """A struct's child conformed to ``target`` (null when the struct has no such field)."""
    if struct.type.get_field_index(name) < 0:
        return pa.nulls(len(struct), target)
    child = _field(struct, name)
    return conform(child.combine_chunks() if isinstance(child, pa.ChunkedArray) else child, target)


def _where(mask: np.ndarray, yes: pa.Array, no: pa.Array) -> pa.Array:
    if not mask.any():
        return no
    return pc.if_else(pa.array(mask), yes, no)


def _unchanged(events: pa.Table, columns: list[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per column, which events list it in ``unchanged_toast_columns``; and each list's length."""
    n = events.num_rows
    masks = {c: np.zeros(n, dtype=bool) for c in columns}
    if "unchanged_toast_columns" not in events.column_names:
        return masks, np.zeros(n, dtype=np.int64)
    lists = events.column("unchanged_toast_columns").combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    names = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy()
    flat = np.asarray(names.to_pylist(), dtype=object)
    for c in columns:
        masks[c][parents[flat == c]] = True
    return masks, lengths
