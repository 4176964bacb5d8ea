"""A current-state table in Iceberg (pyiceberg): delete + append in one transaction, files found
through ``In`` filters of at most 200 values.

See :mod:`.tables` for what every state table does; this is Iceberg's way.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError
from airflow_provider_cdc.cdc.sinks.formats import ICEBERG, TableCommit, WindowTag
from airflow_provider_cdc.cdc.sinks.schemas import conform_table, merge_schemas
from airflow_provider_cdc.cdc.state.table_rows import (
    DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_TARGET_FILE_SIZE,
    IN_LIMIT,
    SEQ_KEY,
    distinct_values,
    plain_type,
    plain_types,
    rows_with_keys,
    same_fields,
    sort_by_keys,
    tag_properties,
)


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
        filters = [_iceberg_in(k, distinct_values(key_values.column(k))) for k in keys]
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
        props = tag_properties(tag, "merge")
        with table.transaction() as tx:
            if not same_fields(current, target):
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
        props = tag_properties(tag, "overwrite")
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
    return pa.schema([f.with_type(plain_type(f.type)).with_metadata(None) for f in schema.as_arrow()])


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
        return _iceberg_in(keys[0], distinct_values(key_values.column(keys[0])))
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
    return _balanced_or([In(name, values[i : i + IN_LIMIT]) for i in range(0, len(values), IN_LIMIT)])


def _balanced_or(terms: list[Any]) -> Any:
    from pyiceberg.expressions import Or

    if len(terms) == 1:
        return terms[0]
    middle = len(terms) // 2
    return Or(_balanced_or(terms[:middle]), _balanced_or(terms[middle:]))
