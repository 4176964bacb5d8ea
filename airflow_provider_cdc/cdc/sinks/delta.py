"""Delta Lake tables of the landed datasets, committed with delta-rs (no Spark, no JVM).

A window's staged Parquet files are registered as they are (``add`` actions with their size and
footer statistics), so landing a window costs a footer read per file, not a rewrite. Each window
is one commit that also removes what earlier attempts of the window added, carries the
:class:`~.formats.WindowTag` in ``commitInfo`` and the ``txn`` action ``(app id, window seq)``.

What delta-rs (1.6) dictates here:

- ``create_write_transaction`` ignores a new schema in ``append`` mode (no ``metaData`` action);
  only ``overwrite`` writes one, and it then removes *every* current file. So added columns are
  a separate, data-free commit just before the window's (``write_deltalake`` of an empty table
  with ``schema_mode="merge"``, which also upgrades the protocol for ``timestamp_ntz``): a crash
  between the two leaves only null columns behind. A changed column type cannot be expressed
  at all (delta-rs has no ``typeWidening``; ``merge`` silently keeps the old type), so it
  rewrites the table once, like Spark's ``overwriteSchema``: one ``overwrite`` commit.
- Table paths containing ``%`` cannot be opened (delta-rs decodes them twice).
- On an object store (``s3://``; ``gs://`` and ``abfss://`` by construction) every delta-rs call
  gets :func:`.object_store.delta_storage_options` and the staged files are read, rewritten and
  deleted through Arrow's file system for the store. delta-rs publishes each ``_delta_log`` entry
  with one create-only PUT (``If-None-Match: *``): two writers racing for a version cannot both
  win, the loser retries on the new version (docs/architecture.md).
- Its post-commit hook checkpoints every 100 commits and then drops expired commit files.
- ``history()`` is the only source of the window tags; log cleanup (after checkpoints, older than
  ``delta.logRetentionDuration``) drops them. The ``txn`` version and the file paths survive.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar, NoReturn
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError
from airflow_provider_cdc.cdc.basics.naming import Topic, path_from_uri, topic_location
from airflow_provider_cdc.cdc.basics.window import window_id_for
from airflow_provider_cdc.cdc.events.envelope import WINDOW_ID_FIELD
from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.formats import APP_ID_PREFIX, DELTA, TAG_PREFIX, TableCommit, WindowTag
from airflow_provider_cdc.cdc.sinks.schemas import conform_table, merge_schemas
from airflow_provider_cdc.cdc.sinks.storage import contained, inside

_COUNTS = ("files-added", "rows-added", "files-removed")


class DeltaTables:
    """The landed datasets of one capture as Delta tables at ``<base_path>/<topic directory>``.

    ``base_path`` is a local directory, a ``file://`` URI or an object-store URI (``s3://``,
    ``s3a://``, ``gs://``, ``abfss://``...). ``options`` keys ``delta.*`` become table properties
    of tables created here (e.g. ``delta.logRetentionDuration``)."""

    name: ClassVar[str] = DELTA

    def __init__(self, base_path: str, topic_prefix: str, options: Mapping[str, str] | None = None):
        parsed = urlparse(base_path)
        if object_store.is_object_store(base_path):
            self.base_path = object_store.library_uri(base_path).rstrip("/")
        elif parsed.scheme in ("", "file"):
            self.base_path = os.path.abspath(unquote(parsed.path) if parsed.scheme else base_path)
        else:
            raise CdcConfigurationError(
                f"sink_format='delta' writes to local paths and object stores (s3://, gs://, abfss://), not "
                f"{parsed.scheme}:// ones (delta-rs has no Hadoop file system), got {base_path!r}"
            )
        self.topic_prefix = topic_prefix
        self.options = dict(options or {})
        unknown = sorted(k for k in self.options if not k.startswith("delta."))
        if unknown:
            raise CdcConfigurationError(f"unknown Delta option(s) {unknown}: only table properties 'delta.*'")

    def table_uri(self, topic: Topic) -> str:
        return topic_location(self.base_path, topic.directory)

    @object_store.without_secrets
    def exists(self, topic: Topic) -> bool:
        return _load(self.table_uri(topic)) is not None

    @object_store.without_secrets
    def commit_window(self, topic: Topic, files: Sequence[str], tag: WindowTag) -> TableCommit | None:
        from deltalake import Schema, write_deltalake
        from deltalake.transaction import CommitProperties, RemoveAction, Transaction, create_table_with_add_actions

        uri = self.table_uri(topic)
        table = _load(uri)
        current = _active_files(table, uri) if table is not None else []
        window, mine = f"window={tag.window_id}/attempt=", f"window={tag.window_id}/attempt={tag.attempt}/"
        earlier = [f for f in current if window in f["path"] and mine not in f["path"]]
        # Rows of the window compacted (maintain()) into files of many windows: filtered out below.
        mixed = [f for f in current if "window=" not in f["path"] and _may_hold(f, tag.window_id)]
        registered = {f["path"] for f in current}
        new = [r for r in (_relative(uri, f) for f in files) if r not in registered]
        if not new and not earlier and not mixed:
            return self.window_commits(topic).get(tag.window_seq) if any(mine in p for p in registered) else None

        stored = _Files(uri)
        footers = {r: stored.read_metadata(r) for r in new}
        storable = {r: _storable_schema(m.schema.to_arrow_schema(), r) for r, m in footers.items()}
        old_schema = _storable_schema(pa.schema(table.schema().to_arrow()), uri)[0] if table is not None else None
        merged = merge_schemas([s for s in [old_schema] if s] + [s for s, _ in storable.values()])
        target = _storable_schema(merged, uri, null=pa.string())[0]  # null in every file: no type to store
        retype = old_schema is not None and not _fits(old_schema, target)
        adds, removed = [], list(earlier)
        for r in new:
            schema, rewrite = storable[r]
            # Readers take a file's columns by name and tolerate missing ones, but not another
            # type (int → text, unsigned, null-typed, ns timestamps): those files are conformed.
            adds.append(_rewrite(stored, r, target) if rewrite or not _fits(schema, target) else r)
        for f in mixed:
            rows = stored.read_table(f["path"])
            keep = rows.filter(pc.not_equal(rows.column(WINDOW_ID_FIELD), tag.window_id))
            if len(keep) < len(rows):
                removed.append(f)
                if len(keep):
                    adds.append(_write(stored, posixpath.dirname(f["path"]), keep, target))
        if retype:  # every current file gets the new type (delta-rs writes the metaData, removes all)
            gone = {f["path"] for f in removed}
            adds += [_rewrite(stored, f["path"], target) for f in current if f["path"] not in gone]
        if not adds and not removed:
            return None

        actions = [_add_action(stored, r, footers.get(r)) for r in adds]
        rows_added = sum(json.loads(a.stats)["numRecords"] for a in actions)
        counts = dict(zip(_COUNTS, (len(actions), rows_added, len(removed) if not retype else len(current))))
        props = CommitProperties(
            custom_metadata={**tag.properties(), **{TAG_PREFIX + k: str(v) for k, v in counts.items()}},
            app_transactions=[Transaction(tag.app_id, tag.window_seq)],
        )
        if table is None:
            create_table_with_add_actions(
                uri,
                Schema.from_arrow(target),
                actions,
                configuration=self.options,
                commit_properties=props,
                storage_options=object_store.delta_storage_options(uri),
            )
        else:
            if _paths(target) - _paths(old_schema):
                write_deltalake(
                    table,
                    target.empty_table(),
                    mode="append",
                    schema_mode="merge",
                    commit_properties=CommitProperties(
                        custom_metadata={TAG_PREFIX + "schema-for": f"{tag.window_seq}/{tag.attempt}"}
                    ),
                )
                table.update_incremental()
            if retype:
                table.create_write_transaction(actions, "overwrite", Schema.from_arrow(target), commit_properties=props)
            else:
                now = int(time.time() * 1000)
                removes = [RemoveAction(f["path"], True, now, f["size"]) for f in removed]
                table.create_write_transaction([*actions, *removes], "append", table.schema(), commit_properties=props)
        for r in new:  # staged originals that were conformed are not part of the table
            if r not in adds:
                stored.remove(r)
        if table is None:
            table = _load(uri)
        else:
            table.update_incremental()
        return TableCommit(
            DELTA, uri, table.version(), tag.window_seq, tag.attempt, len(actions), rows_added, counts["files-removed"]
        )

    @object_store.without_secrets
    def window_commits(self, topic: Topic) -> dict[int, TableCommit]:
        uri = self.table_uri(topic)
        table = _load(uri)
        return {} if table is None else _window_commits(table, uri)

    def version_of(self, topic: Topic, window_seq: int) -> int | None:
        """The table version holding window ``window_seq`` (its newest attempt), for ``as_of`` reads."""
        commit = self.window_commits(topic).get(window_seq)
        return None if commit is None else commit.version

    @object_store.without_secrets
    def last_window_seq(self, topic: Topic) -> int | None:
        """The ``txn`` version of this capture: the last window committed (kept by checkpoints)."""
        table = _load(self.table_uri(topic))
        return None if table is None else table.transaction_version(APP_ID_PREFIX + self.topic_prefix)

    @object_store.without_secrets
    def scan_arrow(self, topic: Topic, *, window_seqs: Collection[int] | None = None) -> pa.Table | None:
        table = _load(self.table_uri(topic))
        if table is None:
            return None
        if window_seqs is None:
            return table.to_pyarrow_table()
        ids = [window_id_for(seq) for seq in window_seqs]
        rows = table.to_pyarrow_table(filters=[(WINDOW_ID_FIELD, "in", ids)] if ids else None)
        return rows if ids else rows.slice(0, 0)

    @object_store.without_secrets
    def holds_window(self, topic: Topic, window_seq: int) -> bool:
        # One column, the first matching row, files pruned by their window_id statistics: a run
        # asks this every time. (Not the txn version: a RESTORE keeps it while dropping the rows.)
        table = _load(self.table_uri(topic))
        if table is None:
            return False
        dataset = table.to_pyarrow_dataset()
        found = dataset.head(
            1, columns=[WINDOW_ID_FIELD], filter=pc.field(WINDOW_ID_FIELD) == window_id_for(window_seq)
        )
        return found.num_rows > 0

    @object_store.without_secrets
    def data_files(self, topic: Topic) -> list[str]:
        uri = self.table_uri(topic)
        table = _load(uri)
        return [] if table is None else table_files(table, uri)

    @object_store.without_secrets
    def maintain(self, topic: Topic, *, compact: bool = True, retain_hours: float | None = None) -> dict:
        """Compact small files and/or vacuum: delete files unreferenced for ``retain_hours`` (time
        travel to versions older than that stops working), and the files older than that which no
        version names: those a crashed attempt staged in a table it never reached (delta-rs's
        "full" vacuum, one listing of the table; its default only deletes removed files). A
        retried window whose earlier attempt was compacted still replaces it: its rows are
        filtered out of the compacted files."""
        vacuum_retention_hours = None if retain_hours is None else max(0, round(retain_hours))
        table = _load(self.table_uri(topic))
        result: dict[str, Any] = {}
        if table is None:
            return result
        if compact:
            result["compact"] = table.optimize.compact()
        if vacuum_retention_hours is not None:
            result["vacuumed"] = table.vacuum(
                retention_hours=vacuum_retention_hours, dry_run=False, enforce_retention_duration=False, full=True
            )
        return result


@object_store.without_secrets
def time_travel_version(table_uri: str, window_seq: int) -> int | None:
    """The version of the Delta table at ``table_uri`` that holds window ``window_seq`` (newest attempt)."""
    table = _load(table_uri)
    commit = None if table is None else _window_commits(table, table_uri).get(window_seq)
    return None if commit is None else commit.version


def _load(uri: str) -> Any:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    if "%" in uri:
        raise CdcConfigurationError(
            f"delta-rs cannot open a table whose path contains '%' ({uri}): topic directories escape names "
            "with characters outside [A-Za-z0-9_-]; use sink_format 'parquet' or 'iceberg' for such tables"
        )
    try:
        return DeltaTable(uri, storage_options=object_store.delta_storage_options(uri))
    except TableNotFoundError:
        return None


def _window_commits(table: Any, uri: str) -> dict[int, TableCommit]:
    out: dict[int, TableCommit] = {}
    history = table.history()  # newest first
    for commit in history:
        tag = WindowTag.from_properties(commit)
        if tag is not None and tag.window_seq not in out:
            n = [int(commit.get(TAG_PREFIX + k, 0)) for k in _COUNTS]
            out[tag.window_seq] = TableCommit(DELTA, uri, commit["version"], tag.window_seq, tag.attempt, *n)
    # Commits dropped by log cleanup: the current files still name their window and attempt, and
    # the oldest version left holds them (their own commit version is lost).
    oldest = min((c["version"] for c in history), default=table.version())
    lost: dict[int, list[Any]] = {}
    for f in _active_files(table, uri):
        parts = dict(p.split("=", 1) for p in f["path"].split("/")[:-1] if "=" in p)
        if parts.get("window", "").isdigit() and "attempt" in parts and int(parts["window"]) not in out:
            lost.setdefault(int(parts["window"]), []).append((parts["attempt"], f["num_records"] or 0))
    for seq, found in lost.items():
        out[seq] = TableCommit(DELTA, uri, oldest, seq, found[0][0], len(found), sum(n for _, n in found))
    return out


def _active_files(table: Any, uri: str) -> list[dict[str, Any]]:
    """The table's current data files. Their paths come from ``_delta_log``, which whoever may
    write the sink can write: each must be a file inside the table's directory (the writer reads
    and rewrites these files), never ``..``, an absolute path, a URI or a link out of it."""
    actions = pa.table(table.get_add_actions(flatten=True))
    wanted = ["path", "size_bytes", "num_records", f"min.{WINDOW_ID_FIELD}", f"max.{WINDOW_ID_FIELD}"]
    actions = actions.select([c for c in wanted if c in actions.column_names])  # not every column's stats
    return [
        {
            "path": path_from_uri(r["path"]),
            "size": r["size_bytes"],
            "num_records": r.get("num_records"),
            "min": r.get(f"min.{WINDOW_ID_FIELD}"),
            "max": r.get(f"max.{WINDOW_ID_FIELD}"),
        }
        for r in actions.to_pylist()
        if _inside_table(uri, path_from_uri(r["path"]))
    ]


def table_files(table: Any, uri: str) -> list[str]:
    """The paths of the current data files of the Delta table at ``uri``, each checked to be inside
    it (:func:`_active_files`): never ``file_uris()``, which resolves a forged ``../`` or absolute
    path of ``_delta_log`` to another capture's files, or anyone's."""
    root = uri.rstrip("/") if object_store.is_object_store(uri) else os.path.abspath(uri)
    return [f"{root}/{f['path']}" for f in _active_files(table, uri)]


def _inside_table(uri: str, path: str) -> bool:
    try:
        # No links on an object store: a plain relative name (no scheme, no '..') stays inside.
        inside(path) if object_store.is_object_store(uri) else contained(uri, inside(path))
    except CdcStateError as exc:
        raise CdcStateError(f"the Delta table {uri} lists a data file {path!r} outside it: {exc}") from None
    return True


def _may_hold(f: Mapping[str, Any], window_id: str) -> bool:
    return f["min"] is None or f["max"] is None or f["min"] <= window_id <= f["max"]


def _relative(uri: str, file: str) -> str:
    if object_store.is_object_store(uri):  # a URI under the table's (s3a:// as s3://), names plain
        found = object_store.library_uri(file)
        relative = found[len(uri) + 1 :] if found.startswith(uri + "/") else ""
        try:
            if relative and inside(relative):
                return relative
        except CdcStateError:
            pass
        _not_inside(file, uri)
    path = os.path.abspath(path_from_uri(urlparse(file).path) if file.startswith("file:") else file)
    relative = os.path.relpath(path, uri)
    if relative.startswith(".."):
        _not_inside(file, uri)
    return relative.replace(os.sep, "/")


def _not_inside(file: str, uri: str) -> NoReturn:
    raise CdcConfigurationError(f"{file} is not inside the Delta table {uri}")


class _Files:
    """The table's files for Arrow: local paths as they always were, an object store's through
    its Arrow file system (``bucket/key`` paths)."""

    def __init__(self, uri: str):
        self.uri = uri
        self.fs, self.root = object_store.filesystem(uri) if object_store.is_object_store(uri) else (None, uri)

    def path(self, relative: str) -> str:
        return os.path.join(self.root, relative) if self.fs is None else f"{self.root}/{relative}"

    def read_metadata(self, relative: str) -> pq.FileMetaData:
        return pq.read_metadata(self.path(relative), filesystem=self.fs)

    def read_table(self, relative: str) -> pa.Table:
        return pq.read_table(self.path(relative), filesystem=self.fs)

    def write_table(self, rows: pa.Table, relative: str) -> None:
        pq.write_table(rows, self.path(relative), filesystem=self.fs)

    def remove(self, relative: str) -> None:
        if self.fs is None:
            os.remove(self.path(relative))
        else:  # not Arrow's delete_file: it leaves a "directory" marker object
            object_store.delete_object(f"{self.uri}/{relative}")

    def size_and_mtime(self, relative: str) -> tuple[int, float]:
        if self.fs is None:
            return os.path.getsize(self.path(relative)), os.path.getmtime(self.path(relative))
        info = self.fs.get_file_info(self.path(relative))
        return info.size, info.mtime.timestamp() if info.mtime else time.time()


def _rewrite(files: _Files, relative: str, target: pa.Schema) -> str:
    return _write(files, posixpath.dirname(relative), files.read_table(relative), target)


def _write(files: _Files, directory: str, rows: pa.Table, target: pa.Schema) -> str:
    storable = _storable_schema(rows.schema, directory)[0]  # lossless casts (uint → wider int ...)
    try:
        rows = conform_table(conform_table(rows, storable), target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise CdcConfigurationError(f"rows under {directory} cannot be stored in the Delta table: {exc}") from exc
    relative = f"{directory}/part-{uuid.uuid4().hex[:12]}-conformed.parquet".lstrip("/")
    files.write_table(rows, relative)
    return relative


def _add_action(files: _Files, relative: str, meta: pq.FileMetaData | None) -> Any:
    from deltalake.transaction import AddAction

    size, mtime = files.size_and_mtime(relative)
    return AddAction(relative, size, {}, int(mtime * 1000), True, _stats(meta or files.read_metadata(relative)))


def _stats(meta: pq.FileMetaData) -> str:
    """Delta file statistics from the footer: row count, and min/max/null count of top-level
    scalar columns whose values have an unambiguous JSON form (``window_id`` among them)."""
    stats: dict[str, Any] = {"numRecords": meta.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    schema = meta.schema.to_arrow_schema()
    for i in range(meta.num_columns):
        name = meta.row_group(0).column(i).path_in_schema if meta.num_row_groups else None
        if name is None or schema.get_field_index(name) < 0 or pa.types.is_nested(schema.field(name).type):
            continue
        columns = [meta.row_group(g).column(i).statistics for g in range(meta.num_row_groups)]
        if any(c is None for c in columns):
            continue
        if all(c.has_null_count for c in columns):
            stats["nullCount"][name] = sum(c.null_count for c in columns)
        values = [v for c in columns if c.has_min_max for v in (c.min, c.max)]
        if len(values) == 2 * len(columns) and all(_json_stat(v) for v in values):
            stats["minValues"][name], stats["maxValues"][name] = min(values), max(values)
    return json.dumps(stats)


def _json_stat(value: Any) -> bool:
    # Writers truncate long strings to prefixes (not valid maxima): only short ones are exact.
    return (
        isinstance(value, int)
        or (isinstance(value, float) and math.isfinite(value))
        or (isinstance(value, str) and len(value) <= 32)
    )


def _fits(narrow: pa.Schema, wide: pa.Schema) -> bool:
    """Every column of ``narrow`` is in ``wide`` with the same type (structs may lack fields)."""
    return all(wide.get_field_index(f.name) >= 0 and _type_fits(f.type, wide.field(f.name).type) for f in narrow)


def _type_fits(narrow: pa.DataType, wide: pa.DataType) -> bool:
    if pa.types.is_struct(narrow) and pa.types.is_struct(wide):
        return _fits(pa.schema(list(narrow)), pa.schema(list(wide)))
    if pa.types.is_list(narrow) and pa.types.is_list(wide):
        return _type_fits(narrow.value_type, wide.value_type)
    return narrow.equals(wide)


def _paths(fields: Any, prefix: str = "") -> set[str]:
    """Dotted names of all columns and nested fields (``[]`` for list elements)."""
    out = set()
    for f in fields:
        out.add(prefix + f.name)
        if pa.types.is_struct(f.type):
            out |= _paths(f.type, f"{prefix}{f.name}.")
        elif pa.types.is_list(f.type) and pa.types.is_struct(f.type.value_type):
            out |= _paths(f.type.value_type, f"{prefix}{f.name}[].")
    return out


#: Lossless casts of types Delta lacks (a null type stays null until merged, then becomes string).
_REWRITTEN = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.decimal128(20),
    pa.float16(): pa.float32(),
}
_PHYSICALLY_SAME = {
    pa.large_string(): pa.string(),
    pa.string_view(): pa.string(),
    pa.large_binary(): pa.binary(),
    pa.binary_view(): pa.binary(),
    pa.date64(): pa.date32(),
}


def _storable_schema(schema: pa.Schema, where: str, null: pa.DataType | None = None) -> tuple[pa.Schema, bool]:
    """``schema`` in types Delta can hold (as delta-rs maps them back to Arrow), and whether the
    file must be rewritten to hold them; a type without a lossless Delta form raises. Null-typed
    columns stay null (to merge with a typed file) unless ``null`` says what to store them as."""
    rewrite = False

    def leaf(t: pa.DataType, name: str) -> pa.DataType:
        nonlocal rewrite
        if pa.types.is_dictionary(t):
            return leaf(t.value_type, name)
        if t in _PHYSICALLY_SAME:
            return _PHYSICALLY_SAME[t]
        if t in _REWRITTEN or pa.types.is_null(t) or pa.types.is_fixed_size_binary(t):
            rewrite = True  # Delta has no unsigned, half or null types; its binary is variable-length
            return _REWRITTEN.get(t, pa.binary() if pa.types.is_fixed_size_binary(t) else (t if null is None else null))
        if pa.types.is_timestamp(t):
            rewrite = rewrite or t.unit == "ns"  # Delta timestamps are µs; ms files read fine
            return pa.timestamp("us", "UTC" if t.tz else None)
        if pa.types.is_decimal(t) and t.precision <= 38:
            rewrite = rewrite or pa.types.is_decimal256(t)
            return pa.decimal128(t.precision, t.scale)
        if pa.types.is_time(t):
            raise CdcConfigurationError(
                f"column {name!r} ({where}) is {t}: Delta has no TIME type; capture times of day as integers "
                "(time_precision_mode 'spark', 'adaptive', 'adaptive_time_microseconds' or 'connect')"
            )
        if (
            pa.types.is_integer(t)
            or pa.types.is_floating(t)
            or t in (pa.bool_(), pa.string(), pa.binary(), pa.date32())
        ):
            return t
        setting = "column_text_list (capture it as text)"
        if pa.types.is_decimal(t):
            setting = "decimal_handling_mode 'string' or 'double'"
        elif pa.types.is_interval(t) or pa.types.is_duration(t):
            setting = "interval_handling_mode 'numeric' or 'string'"
        raise CdcConfigurationError(f"column {name!r} ({where}) is {t}, which Delta cannot store; use {setting}")

    def walk(t: pa.DataType, name: str) -> pa.DataType:
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, walk(f.type, f"{name}.{f.name}")) for f in t])
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            return pa.list_(walk(t.value_type, name))
        if pa.types.is_map(t):
            return pa.map_(walk(t.key_type, name), walk(t.item_type, name))
        return leaf(t, name)

    storable = pa.schema([pa.field(f.name, walk(f.type, f.name)) for f in schema])
    return storable, rewrite
