"""A current-state table in Delta (delta-rs): MERGE on the key, files found by their statistics.

See :mod:`.tables` for what every state table does; this is Delta's way.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.sinks.formats import DELTA, TableCommit, WindowTag
from airflow_provider_cdc.cdc.sinks.object_store import without_secrets
from airflow_provider_cdc.cdc.sinks.schemas import conform_table, merge_schemas
from airflow_provider_cdc.cdc.state.table_rows import (
    DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_TARGET_FILE_SIZE,
    DELETE_FLAG,
    MAX_IN_TERMS,
    SEQ_KEY,
    distinct_values,
    plain_types,
    rows_with_keys,
    same_fields,
    sort_by_keys,
    tag_properties,
)

#: About how much zstd shrinks a state table's rows (Arrow bytes to bytes on disk), measured.
ZSTD_STATE_RATIO = 4


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

    @property
    def _file_bytes(self) -> int:
        """delta-rs's file target, in bytes on disk, for ``target_file_size`` in the rows' Arrow
        bytes (as pyiceberg counts it): zstd shrinks state rows about fourfold (642.6 → 154.6 MB
        for the same rows, docs/benchmarks.md), so a Delta file holds about the rows an Iceberg
        file holds, and a window rewrites as many rows in either format."""
        return max(1, self.target_file_size // ZSTD_STATE_RATIO)

    def _writer(self) -> Any:
        from deltalake import WriterProperties

        # Named, or delta-rs writes no compression at all once WriterProperties is given (four times the
        # bytes of zstd on a state table, docs/benchmarks.md); zstd, as pyiceberg writes.
        return WriterProperties(max_row_group_size=self.row_group_rows, compression="ZSTD")

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
                rows.append_column(DELETE_FLAG, pa.repeat(pa.scalar(False), len(rows))),
                conform_table(gone, target).append_column(DELETE_FLAG, pa.repeat(pa.scalar(True), len(gone))),
            ]
        )
        columns = {_quote(c): f"s.{_quote(c)}" for c in target.names}
        flag = f"s.{_quote(DELETE_FLAG)}"
        metrics = (
            table.merge(
                source,
                " AND ".join([f"t.{_quote(k)} = s.{_quote(k)}" for k in keys] + _delta_key_terms(source, keys)),
                source_alias="s",
                target_alias="t",
                merge_schema=not same_fields(current, target),  # adds only the columns the clauses set
                writer_properties=self._writer(),
                commit_properties=CommitProperties(custom_metadata=tag_properties(tag, "merge")),
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
            target_file_size=self._file_bytes,
            writer_properties=self._writer(),
            configuration={"delta.targetFileSize": str(self._file_bytes)},
            commit_properties=CommitProperties(custom_metadata=tag_properties(tag, "overwrite")),
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
        values = sorted(distinct_values(key_values.column(k).cast(actions.schema.field(f"min.{k}").type)))
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
        values = sorted(distinct_values(column))
        if not values:
            continue
        if len(values) > MAX_IN_TERMS:
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
