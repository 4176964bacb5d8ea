"""Current-state tables in a lake format: one captured table's current rows as an Iceberg or Delta table.

Every commit is tagged with the window it brings the table up to (:meth:`WindowTag.properties`:
``cdc.window-seq``, ``cdc.window-id`` ... in the Iceberg snapshot summary or the Delta
``commitInfo``), so the table's own history says which windows it holds
(:meth:`StateTable.current_window_seq`) and which version was the state at any window
(:meth:`StateTable.version_for_window`). Two ways to write, each one table commit:

- :meth:`StateTable.commit_merge` removes the current rows of some keys and writes new rows:
  Delta ``MERGE`` on the key, Iceberg delete + append in one transaction. Both formats are
  copy-on-write, so only the data files holding those keys are rewritten;
- :meth:`StateTable.overwrite` replaces the whole table, schema included (snapshot windows,
  truncates, tables without a key).

Rows are written sorted by key into files of a bounded size, so a window's keys hit few files, and
reads and commits find those files by the files' min/max statistics: Iceberg through ``In`` filters
cut into lists of at most 200 values (pyiceberg stops pruning above that), Delta by matching the
keys against its add actions' statistics, and its MERGE predicate names the keys' values
(deltalake prunes the target by the predicate's target-only terms, not by the join).
Columns the captured table gained are added to the table (union by name, :mod:`.sinks.schemas`'
rules); a type change the format cannot promote (int → text, say) fails the merge: re-snapshot.
"""

from __future__ import annotations

import bisect
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

from airflow_provider_cdc.cdc.errors import CdcConfigurationError, CdcStateError
from airflow_provider_cdc.cdc.sinks.formats import DELTA, ICEBERG, TAG_PREFIX, TableCommit, WindowTag
from airflow_provider_cdc.cdc.sinks.object_store import without_secrets
from airflow_provider_cdc.cdc.sinks.schemas import conform_table, merge_schemas

DEFAULT_TARGET_FILE_SIZE = 32 * 1024 * 1024
DEFAULT_ROW_GROUP_ROWS = 64 * 1024
SEQ_KEY = TAG_PREFIX + "window-seq"
MODE_KEY = TAG_PREFIX + "state-mode"  # "merge" or "overwrite": how the commit changed the table
_IN_LIMIT = 200  # pyiceberg's IN_PREDICATE_LIMIT
_MAX_IN_TERMS = 10_000  # key values listed in a Delta MERGE predicate (more: their range)
_DELETE_FLAG = "__cdc_delete"  # marks the MERGE source rows that only remove a key


class StateTable(Protocol):
    """The current-state table of one captured table, in one lake format."""

    format: ClassVar[str]

    @property
    def name(self) -> str:
        """The table's identifier (Iceberg) or URI (Delta)."""

    def exists(self) -> bool: ...

    def schema(self) -> pa.Schema | None:
        """The table's current schema (None if there is no table yet)."""

    def read_keys(self, keys: Sequence[str], key_values: pa.Table) -> pa.Table:
        """The current rows whose key (columns ``keys``) is one of the rows of ``key_values``."""

    def read_version(self, version: int | None = None) -> pa.Table:
        """All rows of ``version`` (default: the current one)."""

    def current_window_seq(self) -> int | None:
        """The window the newest tagged commit brought the table to (None: no tagged commit)."""

    def tagged_versions(self) -> list[tuple[int, int]]:
        """(version, window seq) of the commits tagged with a window, newest first."""

    def version_for_window(self, window_seq: int) -> int:
        """The version tagged with the newest window <= ``window_seq`` (CdcStateError if none)."""

    def commit_merge(
        self, new_rows: pa.Table, delete_keys: pa.Table, tag: WindowTag, *, keys: Sequence[str]
    ) -> TableCommit | None:
        """One commit: the rows of ``delete_keys`` (every current row replaced or removed) go,
        ``new_rows`` come in. None when both are empty (nothing to commit)."""

    def overwrite(self, rows: pa.Table, tag: WindowTag, *, keys: Sequence[str] = ()) -> TableCommit:
        """One commit replacing the table's rows and schema with ``rows`` (creates the table)."""

    def data_files(self) -> list[str]:
        """The Parquet files of the current version."""


# -- Arrow helpers ---------------------------------------------------------------------------------


def plain_types(table: pa.Table) -> pa.Table:
    """``table`` with large and view string/binary/list types as their plain forms: Spark's
    ``toArrow`` gives large types, deltalake's scans view types, and the formats store one."""
    schema = pa.schema([f.with_type(_plain_type(f.type)) for f in table.schema])
    return table if schema.equals(table.schema) else table.cast(schema)


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.list_(_plain_type(t.value_type))
    if pa.types.is_list(t):
        return pa.list_(_plain_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_plain_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_plain_type(t.key_type), _plain_type(t.item_type))
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


def _distinct(column: pa.ChunkedArray) -> list[Any]:
    return pc.unique(column).drop_null().to_pylist()


def _tag_properties(tag: WindowTag, mode: str) -> dict[str, str]:
    return {**tag.properties(), MODE_KEY: mode}


# -- Iceberg ---------------------------------------------------------------------------------------


class IcebergStateTable:
    """A state table in an Iceberg catalog (pyiceberg).

    ``catalog``: the path of a SQLite file (pyiceberg's SQL catalog, created if missing), catalog
    properties for ``pyiceberg.catalog.load_catalog`` (with an optional ``name``), or a catalog.
    Each merge's transaction holds two snapshots (the delete, then the append), both tagged.
    """

    format: ClassVar[str] = ICEBERG

    def __init__(
        self,
        catalog: str | os.PathLike | Mapping[str, str] | Any,
        identifier: str | tuple[str, ...],
        location: str | None = None,
        *,
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    ):
        self.catalog = _iceberg_catalog(catalog)
        self.identifier = identifier if isinstance(identifier, tuple) else tuple(identifier.split("."))
        self.location = location
        self.properties = {
            # pyiceberg bin-packs by in-memory Arrow size: files on disk come out smaller.
            "write.target-file-size-bytes": str(target_file_size),
            "write.parquet.row-group-limit": str(row_group_rows),
        }

    @property
    def name(self) -> str:
        return ".".join(self.identifier)

    def _table(self) -> Any:
        return self.catalog.load_table(self.identifier)

    def exists(self) -> bool:
        return self.catalog.table_exists(self.identifier)

    def schema(self) -> pa.Schema | None:
        return _iceberg_arrow_schema(self._table().schema()) if self.exists() else None

    def read_keys(self, keys: Sequence[str], key_values: pa.Table) -> pa.Table:
        from pyiceberg.expressions import And

        table = self._table()
        if not len(key_values):
            return _iceberg_arrow_schema(table.schema()).empty_table()
        # One In per key column prunes files by their column bounds; for a composite key that is a
        # superset (the cross product), made exact by the join below.
        filters = [_iceberg_in(k, _distinct(key_values.column(k))) for k in keys]
        found = plain_types(table.scan(row_filter=filters[0] if len(filters) == 1 else And(*filters)).to_arrow())
        return found if len(keys) == 1 else rows_with_keys(found, keys, key_values)

    def read_version(self, version: int | None = None) -> pa.Table:
        if not self.exists():
            raise CdcStateError(f"no state table {self.name}")
        return plain_types(self._table().scan(snapshot_id=version).to_arrow())

    def _tagged_snapshots(self) -> list[tuple[int, int]]:
        """(snapshot id, window seq) of the current snapshot's ancestry, newest first."""
        if not self.exists():
            return []
        table = self._table()
        out = []
        snapshot = table.current_snapshot()
        while snapshot is not None:
            seq = snapshot.summary.additional_properties.get(SEQ_KEY) if snapshot.summary else None
            if seq is not None:
                out.append((snapshot.snapshot_id, int(seq)))
            parent = snapshot.parent_snapshot_id
            snapshot = table.snapshot_by_id(parent) if parent is not None else None
        return out

    def tagged_versions(self) -> list[tuple[int, int]]:
        return self._tagged_snapshots()

    def current_window_seq(self) -> int | None:
        tagged = self._tagged_snapshots()
        return tagged[0][1] if tagged else None

    def version_for_window(self, window_seq: int) -> int:
        for snapshot_id, seq in self._tagged_snapshots():
            if seq <= window_seq:
                return snapshot_id
        raise CdcStateError(f"state table {self.name} has no snapshot of window {window_seq} or earlier")

    def data_files(self) -> list[str]:
        from airflow_provider_cdc.cdc.sinks.iceberg import refuse_outside

        if not self.exists():
            return []
        table = self._table()
        files = sorted(task.file.file_path for task in table.scan().plan_files())
        refuse_outside(self.location or table.location(), files, "data files")
        return files

    def commit_merge(
        self, new_rows: pa.Table, delete_keys: pa.Table, tag: WindowTag, *, keys: Sequence[str]
    ) -> TableCommit | None:
        if not len(new_rows) and not len(delete_keys):
            return None
        table = self._table()
        before = table.current_snapshot()
        current = _iceberg_arrow_schema(table.schema())
        target = merge_schemas([current, plain_types(new_rows).schema]) if len(new_rows) else current
        props = _tag_properties(tag, "merge")
        with table.transaction() as tx:
            if not _same_fields(current, target):
                with tx.update_schema() as update:
                    update.union_by_name(target)
            if len(delete_keys):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # "did not match any records"
                    tx.delete(_iceberg_key_filter(keys, delete_keys), snapshot_properties=props)
            if len(new_rows):
                tx.append(conform_table(sort_by_keys(plain_types(new_rows), keys), target), snapshot_properties=props)
        return self._commit(tag, before, len(new_rows))

    def overwrite(self, rows: pa.Table, tag: WindowTag, *, keys: Sequence[str] = ()) -> TableCommit:
        rows = sort_by_keys(plain_types(rows), keys)
        props = _tag_properties(tag, "overwrite")
        if not self.exists():
            for depth in range(1, len(self.identifier)):
                self.catalog.create_namespace_if_not_exists(self.identifier[:depth])
            # Created empty, then filled: the SQL catalog's create_table_transaction refuses
            # nested namespaces (``shop_state.public.orders``).
            table = self.catalog.create_table(
                self.identifier, schema=rows.schema, location=self.location, properties=self.properties
            )
            with table.transaction() as tx:
                tx.append(rows, snapshot_properties=props)
            return self._commit(tag, None, len(rows))
        table = self._table()
        before = table.current_snapshot()
        with table.transaction() as tx:
            _iceberg_replace_schema(tx, table.schema(), rows.schema)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                tx.overwrite(rows, snapshot_properties=props)
        return self._commit(tag, before, len(rows))

    def _commit(self, tag: WindowTag, before: Any, rows: int) -> TableCommit:
        """The commit just made, with its file counts summed over the transaction's snapshots."""
        table = self._table()
        snapshot, added, removed = table.current_snapshot(), 0, 0
        head = snapshot.snapshot_id
        while snapshot is not None and (before is None or snapshot.snapshot_id != before.snapshot_id):
            summary = snapshot.summary.additional_properties
            added += int(summary.get("added-data-files", 0))
            removed += int(summary.get("deleted-data-files", 0))
            parent = snapshot.parent_snapshot_id
            snapshot = table.snapshot_by_id(parent) if parent is not None else None
        return TableCommit(ICEBERG, self.name, head, tag.window_seq, tag.attempt, added, rows, removed)


def _iceberg_catalog(catalog: Any) -> Any:
    """The state tables' catalog, opened as every Iceberg catalog of the provider is: with
    pyiceberg's own FileIO, whatever a catalog server or a table's metadata names, and without
    the properties that make pyiceberg import a class (:func:`.sinks.iceberg.open_catalog`). A
    catalog object given is pinned so in place."""
    from airflow_provider_cdc.cdc.sinks.iceberg import open_catalog, pin_catalog

    if isinstance(catalog, (str, os.PathLike)):
        from pyiceberg.catalog.sql import SqlCatalog

        from airflow_provider_cdc.cdc.sinks.formats import object_store_catalog_message
        from airflow_provider_cdc.cdc.sinks.object_store import is_object_store
        from airflow_provider_cdc.cdc.sinks.storage import create_private_file, ensure_private_root

        # A SQLite file cannot live in a bucket (and os.path would make "s3:/..." a local directory).
        if is_object_store(os.fspath(catalog)):
            state_path = re.sub(r"^([A-Za-z0-9]+):/+", r"\1://", os.path.dirname(os.path.dirname(os.fspath(catalog))))
            raise CdcConfigurationError(object_store_catalog_message("state_path", state_path))
        path = os.path.abspath(os.fspath(catalog))
        ensure_private_root(os.path.dirname(path))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        create_private_file(path)  # 0600 before SQLite creates it
        sqlite = SqlCatalog("cdc_state", uri=f"sqlite:///{path}", warehouse=f"file://{os.path.dirname(path)}")
        return pin_catalog(sqlite, {})
    if isinstance(catalog, Mapping):
        from airflow_provider_cdc.cdc.sinks.storage import create_private_sqlite

        props = dict(catalog)
        create_private_sqlite(props.get("uri"))
        return open_catalog(props.pop("name", "cdc_state"), props)
    return pin_catalog(catalog)


def _iceberg_arrow_schema(schema: Any) -> pa.Schema:
    return pa.schema([f.with_type(_plain_type(f.type)).with_metadata(None) for f in schema.as_arrow()])


def _same_fields(a: pa.Schema, b: pa.Schema) -> bool:
    return a.names == b.names and all(x.type.equals(y.type) for x, y in zip(a, b))


def _iceberg_replace_schema(tx: Any, current: Any, target: pa.Schema) -> None:
    """Make the table's schema ``target``: drop columns it lacks or cannot promote, add the rest."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.exceptions import ResolveError
    from pyiceberg.schema import promote

    wanted = Catalog._convert_schema_if_needed(target)
    drop = []
    for field in current.fields:
        new = wanted.find_field(field.name) if field.name in target.names else None
        if new is None:
            drop.append(field.name)
            continue
        try:
            if new.field_type != field.field_type:
                promote(field.field_type, new.field_type)
        except ResolveError:
            drop.append(field.name)  # an incompatible type: a snapshot brings the column back new
    if drop:
        with tx.update_schema(allow_incompatible_changes=True) as update:
            for name in drop:
                update.delete_column(name)
    with tx.update_schema() as update:
        update.union_by_name(target)


def _iceberg_key_filter(keys: Sequence[str], key_values: pa.Table) -> Any:
    """The exact row filter of ``key_values``: ``In`` for one key column; for several, an ``Or``
    over the first column's values of ``And(EqualTo(first), In(rest...))``, as a balanced tree
    (pyiceberg's visitors recurse, and ``Or(a, b, c...)`` nests one level per term)."""
    from pyiceberg.expressions import And, EqualTo

    if len(keys) == 1:
        return _iceberg_in(keys[0], _distinct(key_values.column(keys[0])))
    terms = []
    rows = key_values.select(list(keys)).to_pylist()
    groups: dict[Any, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys[:-1]), []).append(row)
    for prefix, members in groups.items():
        parts = [EqualTo(k, v) for k, v in zip(keys[:-1], prefix)]
        parts.append(_iceberg_in(keys[-1], list({m[keys[-1]] for m in members})))
        terms.append(And(*parts))
    return _balanced_or(terms)


def _iceberg_in(name: str, values: list[Any]) -> Any:
    """``In(name, values)`` as an ``Or`` of ``In`` lists of sorted values within pyiceberg's
    ``IN_PREDICATE_LIMIT`` (200): above it the metrics evaluators stop pruning files by bounds."""
    from pyiceberg.expressions import In

    values = sorted(values)
    return _balanced_or([In(name, values[i : i + _IN_LIMIT]) for i in range(0, len(values), _IN_LIMIT)])


def _balanced_or(terms: list[Any]) -> Any:
    from pyiceberg.expressions import Or

    if len(terms) == 1:
        return terms[0]
    middle = len(terms) // 2
    return Or(_balanced_or(terms[:middle]), _balanced_or(terms[middle:]))


# -- Delta -----------------------------------------------------------------------------------------


class DeltaStateTable:
    """A state table as a Delta table (deltalake, no JVM) at ``uri``: a local path or an object
    store's URI (``s3a://`` is read as ``s3://``), reached with ``storage_options`` or, by default,
    with the process's active object-store access (:func:`.sinks.object_store.delta_storage_options`)."""

    format: ClassVar[str] = DELTA

    def __init__(
        self,
        uri: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    ):
        from airflow_provider_cdc.cdc.sinks import object_store

        self.uri = object_store.library_uri(uri)
        if storage_options is None:
            storage_options = object_store.delta_storage_options(self.uri)
        self.storage_options = dict(storage_options) if storage_options else None
        self.target_file_size = target_file_size
        self.row_group_rows = row_group_rows

    @property
    def name(self) -> str:
        return self.uri

    def _table(self, version: int | None = None) -> Any:
        from deltalake import DeltaTable

        return DeltaTable(self.uri, version=version, storage_options=self.storage_options)

    def _writer(self) -> Any:
        from deltalake import WriterProperties

        return WriterProperties(max_row_group_size=self.row_group_rows)

    @without_secrets
    def exists(self) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.uri, storage_options=self.storage_options)

    @without_secrets
    def schema(self) -> pa.Schema | None:
        return _delta_arrow_schema(self._table()) if self.exists() else None

    @without_secrets
    def read_keys(self, keys: Sequence[str], key_values: pa.Table) -> pa.Table:
        table = self._table()
        schema = _delta_arrow_schema(table)
        if not len(key_values):
            return schema.empty_table()
        # Only the files whose min/max holds a key value of every key column are read. The key
        # filter is applied after the read, not pushed into the scan: files deltalake's MERGE writes
        # declare strings as string_view, which pyarrow's scanner cannot compare with strings.
        dataset = table.to_pyarrow_dataset(schema=schema)
        wanted = set(_delta_files_with(table, keys, key_values))
        files = [f for f in dataset.get_fragments() if f.path in wanted]
        found = plain_types(pds.FileSystemDataset(files, schema, dataset.format, dataset.filesystem).to_table())
        condition = None
        for k in keys:
            term = pc.field(k).isin(pc.unique(key_values.column(k).cast(schema.field(k).type)).drop_null())
            condition = term if condition is None else condition & term
        found = found.filter(condition)
        return found if len(keys) == 1 else rows_with_keys(found, keys, key_values)

    @without_secrets
    def read_version(self, version: int | None = None) -> pa.Table:
        if not self.exists():
            raise CdcStateError(f"no state table {self.name}")
        table = self._table(version)
        return plain_types(table.to_pyarrow_dataset(schema=_delta_arrow_schema(table)).to_table())

    def _tagged_versions(self, limit: int | None = None) -> list[tuple[int, int]]:
        """(version, window seq) of the tagged commits among the newest ``limit``, newest first."""
        if not self.exists():
            return []
        history = sorted(self._table().history(limit), key=lambda c: c["version"], reverse=True)
        return [(int(c["version"]), int(c[SEQ_KEY])) for c in history if SEQ_KEY in c]

    @without_secrets
    def tagged_versions(self) -> list[tuple[int, int]]:
        return self._tagged_versions()

    @without_secrets
    def current_window_seq(self) -> int | None:
        # The newest commits first: history reads one log file per version.
        tagged = self._tagged_versions(16) or self._tagged_versions()
        return tagged[0][1] if tagged else None

    @without_secrets
    def version_for_window(self, window_seq: int) -> int:
        for version, seq in self._tagged_versions():
            if seq <= window_seq:
                return version
        raise CdcStateError(f"state table {self.name} has no version of window {window_seq} or earlier")

    @without_secrets
    def data_files(self) -> list[str]:
        from airflow_provider_cdc.cdc.sinks.delta import table_files

        # The relative names of the log (checked to stay inside) under the path verbatim: the
        # escaped directory's '%' is never decoded.
        return sorted(table_files(self._table(), self.uri)) if self.exists() else []

    @without_secrets
    def commit_merge(
        self, new_rows: pa.Table, delete_keys: pa.Table, tag: WindowTag, *, keys: Sequence[str]
    ) -> TableCommit | None:
        from deltalake import CommitProperties

        if not len(new_rows) and not len(delete_keys):
            return None
        table = self._table()
        current = _delta_arrow_schema(table)
        target = merge_schemas([current, plain_types(new_rows).schema]) if len(new_rows) else current
        rows = conform_table(sort_by_keys(plain_types(new_rows), keys), target)
        # Keys that only go: source rows flagged for when_matched_delete (value columns null).
        gone = rows_with_keys(delete_keys.select(list(keys)), keys, rows, keep=False)
        source = pa.concat_tables(
            [
                rows.append_column(_DELETE_FLAG, pa.repeat(pa.scalar(False), len(rows))),
                conform_table(gone, target).append_column(_DELETE_FLAG, pa.repeat(pa.scalar(True), len(gone))),
            ]
        )
        columns = {_quote(c): f"s.{_quote(c)}" for c in target.names}
        flag = f"s.{_quote(_DELETE_FLAG)}"
        metrics = (
            table.merge(
                source,
                " AND ".join([f"t.{_quote(k)} = s.{_quote(k)}" for k in keys] + _delta_key_terms(source, keys)),
                source_alias="s",
                target_alias="t",
                merge_schema=not _same_fields(current, target),  # adds only the columns the clauses set
                writer_properties=self._writer(),
                commit_properties=CommitProperties(custom_metadata=_tag_properties(tag, "merge")),
            )
            .when_matched_delete(flag)
            .when_matched_update(columns, predicate=f"NOT {flag}")
            .when_not_matched_insert(columns, predicate=f"NOT {flag}")
            .execute()
        )
        return TableCommit(
            DELTA,
            self.uri,
            table.version(),
            tag.window_seq,
            tag.attempt,
            int(metrics.get("num_target_files_added", 0)),
            len(rows),
            int(metrics.get("num_target_files_removed", 0)),
        )

    @without_secrets
    def overwrite(self, rows: pa.Table, tag: WindowTag, *, keys: Sequence[str] = ()) -> TableCommit:
        from deltalake import CommitProperties, write_deltalake

        rows = sort_by_keys(plain_types(rows), keys)
        write_deltalake(
            self.uri,
            rows,
            mode="overwrite",
            schema_mode="overwrite",
            storage_options=self.storage_options,
            target_file_size=self.target_file_size,
            writer_properties=self._writer(),
            configuration={"delta.targetFileSize": str(self.target_file_size)},
            commit_properties=CommitProperties(custom_metadata=_tag_properties(tag, "overwrite")),
        )
        table = self._table()
        metrics = table.history(1)[0].get("operationMetrics", {})
        return TableCommit(
            DELTA,
            self.uri,
            table.version(),
            tag.window_seq,
            tag.attempt,
            int(metrics.get("num_added_files", 0)),
            len(rows),
            int(metrics.get("num_removed_files", 0)),
        )


def _delta_files_with(table: Any, keys: Sequence[str], key_values: pa.Table) -> list[str]:
    """The table's files whose min/max stats admit a value of every key column (files without
    stats always). pyarrow's own pruning gives up on ``isin`` lists of more than a few dozen values."""
    actions = pa.table(table.get_add_actions(flatten=True))
    keep = [True] * len(actions)
    for k in keys:
        if f"min.{k}" not in actions.column_names or f"max.{k}" not in actions.column_names:
            continue
        values = sorted(_distinct(key_values.column(k).cast(actions.schema.field(f"min.{k}").type)))
        lows, highs = actions.column(f"min.{k}").to_pylist(), actions.column(f"max.{k}").to_pylist()
        for i, (low, high) in enumerate(zip(lows, highs)):
            if keep[i] and low is not None and high is not None:
                at = bisect.bisect_left(values, low)
                keep[i] = at < len(values) and values[at] <= high
    return [path for path, kept in zip(actions.column("path").to_pylist(), keep) if kept]


def _delta_key_terms(source: pa.Table, keys: Sequence[str]) -> list[str]:
    """Target-only terms naming the source's key values (integer and text keys): deltalake's MERGE
    prunes the target's files by them, while from the join alone it scans far more (ten times
    slower on 5M rows, bench/state_merge.py). Long lists become a range."""
    terms = []
    for k in keys:
        column = source.column(k)
        if pa.types.is_integer(column.type):
            literal = str
        elif pa.types.is_string(column.type):
            literal = _sql_text
        else:
            continue  # timestamps, decimals...: no literal syntax to rely on; the join alone is exact
        values = sorted(_distinct(column))
        if not values:
            continue
        if len(values) > _MAX_IN_TERMS:
            terms.append(f"t.{_quote(k)} >= {literal(values[0])} AND t.{_quote(k)} <= {literal(values[-1])}")
        else:
            terms.append(f"t.{_quote(k)} IN ({', '.join(map(literal, values))})")
    return terms


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _delta_arrow_schema(table: Any) -> pa.Schema:
    return pa.schema(pa.schema(table.schema().to_arrow()))  # arro3 → pyarrow (Arrow C interface)


def _quote(name: str) -> str:
    """A column name in deltalake's SQL expressions (as is, case and all)."""
    return "`" + name.replace("`", "``") + "`"
