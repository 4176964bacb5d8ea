"""Iceberg tables of the landed datasets, written with pyiceberg (no Spark, no JVM).

Each dataset is a table named by its topic (``shop.public.orders`` → namespace ``shop.public``,
table ``orders``) whose location is the dataset's directory, so the staged files
``window=<id>/attempt=<id>/part-*.parquet`` are already inside it: a window's commit registers
them as they are (no rewrite) in one pyiceberg transaction = one catalog commit and one snapshot
tagged with :class:`WindowTag` properties. The catalog is a SQLite file beside the sink
(``_cdc_catalog/iceberg.db``) unless pyiceberg catalog properties are given; a sink on an object
store needs them (a SQLite file cannot live in a bucket).

Tables are partitioned by ``truncate(8, window_id)`` (100 consecutive windows per partition):
manifest partition summaries then find a window's files without reading every manifest, and
compaction can still merge neighbouring windows. Files are added by column name through the
table's name mapping (``schema.name-mapping.default``), which schema updates keep current.

What a file cannot be registered as is gets rewritten, conformed to the table schema
(:func:`.schemas.conform_table`), beside the original (``*.conformed.parquet``): Arrow types
Iceberg v2 has no type for (null, unsigned, float16, time32, ns precision) and type changes the
table cannot *read* (a string column given an int file). A type change the table cannot *evolve*
to (int → string, int → double, a decimal scale change) replaces the column by a new field of
the merged type, and every current file holding the old type is rewritten in the same commit;
snapshots from before that change then read the column as null (the name mapping names the new
field only).

pyiceberg 0.12 cannot compact data files or rewrite manifests, and its snapshot expiry only
drops metadata: :meth:`IcebergTables.maintain` merges small files itself and deletes the files
only expired snapshots referenced.

Every catalog the provider opens (sink tables, state tables, maintenance, readers, the setup
check) goes through :func:`open_catalog` or :func:`pin_catalog`: its FileIO is pyiceberg's own
(``PyArrowFileIO``, or ``FsspecFileIO`` if the DAG's ``table_catalog`` names it), whatever a REST
catalog server's config or a table's metadata says, and no property that makes pyiceberg import
a class by name survives from either (see :mod:`.iceberg_catalog`). On an object store, with an
access active (:mod:`.object_store`), the FileIOs reach S3 with that access only, whatever the
catalog's properties, a catalog server or a table's metadata say (:mod:`.iceberg_catalog`); the
files written here (conformed rewrites, compaction) go through Arrow's file system of the same
access, and maintenance deletes objects with obstore (Arrow's delete leaves directory markers).

The paths of data files, manifests and manifest lists come from objects that whoever may write
the sink can write: every path read, rewritten, listed or deleted here must be under the table's
own directory (:func:`refuse_outside`), or the call fails naming it.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, BooleanExpression, EqualTo, In
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile
from pyiceberg.table import DataScan, Table, _parquet_files_to_data_files
from pyiceberg.transforms import TruncateTransform

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError
from airflow_provider_cdc.cdc.basics.naming import Topic, directory_parts, topic_location
from airflow_provider_cdc.cdc.basics.window import window_id_for
from airflow_provider_cdc.cdc.events.envelope import WINDOW_ID_FIELD
from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.formats import (
    CATALOG_DIR,
    ICEBERG,
    TableCommit,
    WindowTag,
    local_base,
    object_store_catalog_message,
)
from airflow_provider_cdc.cdc.sinks.iceberg_catalog import open_catalog, pin_catalog
from airflow_provider_cdc.cdc.sinks.iceberg_schemas import (
    arrow_schema,
    evolve,
    plain_schema,
    readable,
    storable_schema,
    without_nulls,
)
from airflow_provider_cdc.cdc.sinks.schemas import conform_table, merge_schemas
from airflow_provider_cdc.cdc.sinks.storage import (
    PRIVATE_DIR_MODE,
    contained,
    create_private_file,
    create_private_sqlite,
    ensure_private_root,
    inside,
    is_uri,
)

PARTITION_FIELD = "window_id_trunc"
#: Snapshot summary key: the newest window seq the table ever held (every snapshot we make has it).
NEWEST_KEY = "cdc.newest-window-seq"
CONFORMED_SUFFIX = ".conformed.parquet"
COMPACT_TARGET_BYTES = 128 * 1024 * 1024
TABLE_PROPERTIES = {
    "format-version": "2",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}
_SECRET_KEY = re.compile(r"pass|secret|token|credential|key|auth|signature", re.IGNORECASE)
log = logging.getLogger(__name__)


class IcebergTables:
    """The landed datasets of one capture as Iceberg tables (see the module docstring)."""

    name: ClassVar[str] = ICEBERG

    def __init__(self, base_path: str, topic_prefix: str, options: Mapping[str, str] | None = None):
        self.base_path = local_base(base_path).rstrip("/")
        self.topic_prefix = topic_prefix
        self._options = {str(k): str(v) for k, v in (options or {}).items()}

    def __repr__(self) -> str:  # property names only: values may be credentials
        catalog = f"catalog properties {sorted(self._options)}" if self._options else "SQLite catalog"
        return f"IcebergTables({self.base_path!r}, {self.topic_prefix!r}, {catalog})"

    @cached_property
    def catalog(self) -> Catalog:
        if not self._options and object_store.is_object_store(self.base_path):
            raise CdcConfigurationError(object_store_catalog_message("sink_path", self.base_path))
        try:
            if self._options:
                create_private_sqlite(self._options.get("uri"))
                return open_catalog("cdc", self._options)
            from pyiceberg.catalog.sql import SqlCatalog

            directory = Path(self.base_path, CATALOG_DIR)
            ensure_private_root(self.base_path)
            directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
            create_private_file(directory / "iceberg.db")  # 0600 before SQLite creates it
            catalog = SqlCatalog("cdc", uri=f"sqlite:///{directory}/iceberg.db", warehouse=self.base_path)
            return pin_catalog(catalog, {})
        except CdcConfigurationError:
            raise
        except Exception as exc:  # its message may quote the properties: redact, and drop the chain
            message = _redact(f"{type(exc).__name__}: {exc}", self._options)
            raise CdcConfigurationError(f"cannot open the Iceberg catalog ({message})") from None

    def identifier(self, topic: Topic) -> tuple[str, ...]:
        # From the escaped directory, not the name: a schema or table name may contain dots.
        return directory_parts(topic.directory)

    def table_uri(self, topic: Topic) -> str:
        return topic_location(self.base_path, topic.directory)

    def exists(self, topic: Topic) -> bool:
        return self.catalog.table_exists(self.identifier(topic))

    def load(self, topic: Topic) -> Table | None:
        try:
            return self.catalog.load_table(self.identifier(topic))
        except NoSuchTableError:
            return None

    # -- the window commit -------------------------------------------------------------------

    def commit_window(self, topic: Topic, files: Sequence[str], tag: WindowTag) -> TableCommit | None:
        table = self.load(topic)
        newest = _newest_window(table)
        # Windows commit in order: a window newer than every committed one has no earlier attempt
        # in the table, so the usual commit reads no manifest (pyiceberg opens each one of the
        # window's partition, up to 100, to find an earlier attempt's files).
        maybe_retry = table is not None and (newest is None or tag.window_seq <= newest)
        window_files = (
            _files_of(table.metadata, table.io, EqualTo(WINDOW_ID_FIELD, tag.window_id)) if maybe_retry else []
        )
        refuse_outside(self.table_uri(topic), [f.file_path for f in window_files], "data files")
        if any(f"/window={tag.window_id}/attempt={tag.attempt}/" in f.file_path for f in window_files):
            return self.window_commits(topic).get(tag.window_seq)  # this attempt committed already
        # A conformed copy left by an earlier call of this attempt is made again from its source.
        given = set(files)
        inputs = [f for f in files if not (f.endswith(CONFORMED_SUFFIX) and _source_of(f) in given)]
        if not inputs and not window_files:
            return None
        raw = {path: _file_schema(path) for path in inputs}
        for path, schema in raw.items():
            if WINDOW_ID_FIELD not in schema.names:
                raise CdcConfigurationError(f"{path} has no {WINDOW_ID_FIELD} column: it is not a window's events")
        storable = [without_nulls(storable_schema(schema)) for schema in raw.values()]
        if table is None:
            table = self._create(topic, storable)
        txn = table.transaction()
        if table.metadata.name_mapping() is None:  # as add_files sets it; schema updates keep it current
            txn.set_properties({"schema.name-mapping.default": table.schema().name_mapping.model_dump_json()})
        if table.spec().is_unpartitioned() and table.current_snapshot() is None:
            with txn.update_spec() as spec:
                spec.add_field(WINDOW_ID_FIELD, TruncateTransform(8), PARTITION_FIELD)
        schema, retyped = evolve(txn, arrow_schema(table.schema()), storable)
        added = [path if readable(raw[path], schema) else _rewrite(path, schema, _conformed(path)) for path in inputs]
        # Earlier attempts' files go; a compacted file that holds other windows too is rewritten
        # without this window's rows (pyiceberg's own delete would need pyiceberg-core to write
        # into a truncate-partitioned table, and would make a snapshot of its own).
        removed = list(window_files)
        for data_file in window_files:
            if not _single_window(table, data_file, tag.window_id):
                added.append(_rewrite(data_file.file_path, schema, _renamed(data_file.file_path), tag.window_id))
        if retyped:  # files written before the type change cannot be read under the new field
            gone = {f.file_path for f in removed}
            current = _files_of(txn.table_metadata, table.io, AlwaysTrue())
            refuse_outside(self.table_uri(topic), [f.file_path for f in current], "data files")
            for data_file in current:
                if data_file.file_path not in gone and not readable(_file_schema(data_file.file_path), schema):
                    removed.append(data_file)
                    added.append(_rewrite(data_file.file_path, schema, _renamed(data_file.file_path)))
        new_files = _parquet_files_to_data_files(txn.table_metadata, added, table.io)
        if removed or new_files:
            props = tag.properties()
            if newest is not None:  # unknown after a foreign snapshot: commits keep looking up
                props[NEWEST_KEY] = str(max(tag.window_seq, newest))
            snapshot = txn.update_snapshot(snapshot_properties=props)
            with snapshot.overwrite() if removed else snapshot.merge_append() as producer:
                for data_file in removed:
                    producer.delete_data_file(data_file)
                for data_file in new_files:
                    producer.append_data_file(data_file)
        committed = txn.commit_transaction()
        return TableCommit(
            format=ICEBERG,
            table=".".join(self.identifier(topic)),
            version=committed.metadata.current_snapshot_id or 0,
            window_seq=tag.window_seq,
            attempt=tag.attempt,
            files_added=len(inputs),
            rows_added=sum(f.record_count for f in new_files[: len(inputs)]),
            files_removed=len(window_files),
        )

    def _create(self, topic: Topic, schemas: list[pa.Schema]) -> Table:
        identifier = self.identifier(topic)
        for depth in range(1, len(identifier)):  # catalogs with nested namespaces want each level
            try:
                self.catalog.create_namespace(identifier[:depth])
            except NamespaceAlreadyExistsError:
                pass
        try:
            return self.catalog.create_table(
                identifier,
                plain_schema(merge_schemas(schemas)),
                location=self.table_uri(topic),
                properties=TABLE_PROPERTIES,
            )
        except TableAlreadyExistsError:  # another process created it first
            return self.catalog.load_table(identifier)

    # -- reading -----------------------------------------------------------------------------

    def window_commits(self, topic: Topic) -> dict[int, TableCommit]:
        """From the tagged snapshots still in the table's history: expiring a window's snapshot
        removes its entry here (its rows stay; :meth:`holds_window` still finds them)."""
        table = self.load(topic)
        commits: dict[int, TableCommit] = {}
        for snapshot in sorted(table.metadata.snapshots if table else [], key=lambda s: s.sequence_number or 0):
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            tag = WindowTag.from_properties(summary)
            if tag is None or tag.topic_prefix not in ("", self.topic_prefix):
                continue
            commits[tag.window_seq] = TableCommit(
                format=ICEBERG,
                table=".".join(self.identifier(topic)),
                version=snapshot.snapshot_id,
                window_seq=tag.window_seq,
                attempt=tag.attempt,
                files_added=int(summary.get("added-data-files", 0)),
                rows_added=int(summary.get("added-records", 0)),
                files_removed=int(summary.get("deleted-data-files", 0)),
            )
        return commits

    def window_snapshot(self, topic: Topic, window_seq: int) -> int | None:
        """The snapshot id of the commit that holds window ``window_seq`` (for ``as_of`` reads)."""
        commit = self.window_commits(topic).get(window_seq)
        return None if commit is None else commit.version

    def holds_window(self, topic: Topic, window_seq: int) -> bool:
        table = self.load(topic)
        if table is None or table.current_snapshot() is None:
            return False
        scan = table.scan(row_filter=EqualTo(WINDOW_ID_FIELD, window_id_for(window_seq)), limit=1)
        return _read(scan, self.table_uri(topic)).num_rows > 0

    def scan_arrow(
        self, topic: Topic, *, window_seqs: Collection[int] | None = None, snapshot_id: int | None = None
    ) -> pa.Table | None:
        """Current rows (or those of snapshot ``snapshot_id``), of ``window_seqs`` only if given."""
        table = self.load(topic)
        if table is None:
            return None
        row_filter: BooleanExpression = AlwaysTrue()
        if window_seqs is not None:
            ids = {window_id_for(seq) for seq in window_seqs}
            row_filter = In(WINDOW_ID_FIELD, ids) if ids else AlwaysFalse()
        return _read(table.scan(row_filter=row_filter, snapshot_id=snapshot_id), self.table_uri(topic))

    def data_files(self, topic: Topic) -> list[str]:
        table = self.load(topic)
        files = [f.file_path for f in _files_of(table.metadata, table.io, AlwaysTrue())] if table else []
        refuse_outside(self.table_uri(topic), files, "data files")
        return [_local(f) for f in files]

    # -- maintenance -------------------------------------------------------------------------

    def maintain(self, topic: Topic, *, compact: bool = True, retain_hours: float | None = None) -> dict[str, int]:
        """Compact small files (each partition's files under 128 MiB merged into files of up to
        that size), then expire snapshots older than ``retain_hours`` (branch heads are kept) and
        delete the files only expired snapshots referenced."""
        expire_older_than_ms = None if retain_hours is None else int((time.time() - retain_hours * 3600) * 1000)
        done = {"files_compacted": 0, "files_written": 0, "snapshots_expired": 0, "files_deleted": 0}
        table = self.load(topic)
        if table is None:
            return done
        if compact:
            done["files_compacted"], done["files_written"] = _compact(table, self.table_uri(topic))
            table = table.refresh()
        if expire_older_than_ms is not None:
            before = list(table.metadata.snapshots)
            cutoff = datetime.fromtimestamp(expire_older_than_ms / 1000, tz=timezone.utc)
            table.maintenance.expire_snapshots().older_than(cutoff).commit()
            table = table.refresh()
            expired = [s for s in before if table.metadata.snapshot_by_id(s.snapshot_id) is None]
            done["snapshots_expired"], done["files_deleted"] = (
                len(expired),
                _delete_unreachable(table, expired, self.table_uri(topic)),
            )
        return done


# -- files -------------------------------------------------------------------------------------


def _newest_window(table: Table | None) -> int | None:
    """The newest window seq committed to ``table`` (None: unknown, a snapshot not ours)."""
    snapshot = table.current_snapshot() if table is not None else None
    if snapshot is None:
        return 0
    newest = snapshot.summary.additional_properties.get(NEWEST_KEY) if snapshot.summary else None
    return None if newest is None else int(newest)


def _files_of(metadata: Any, io: Any, row_filter: BooleanExpression) -> list[DataFile]:
    return [task.file for task in DataScan(table_metadata=metadata, io=io, row_filter=row_filter).plan_files()]


def _single_window(table: Table, data_file: DataFile, window_id: str) -> bool:
    field_id = table.schema().find_field(WINDOW_ID_FIELD).field_id
    bounds = data_file.lower_bounds.get(field_id), data_file.upper_bounds.get(field_id)
    return bounds == (window_id.encode(), window_id.encode())


def _file_schema(path: str) -> pa.Schema:
    fs, where = _filesystem(path)
    return pq.read_metadata(where, filesystem=fs).schema.to_arrow_schema()


def _filesystem(path: str) -> tuple[Any, str]:
    """Arrow's file system for a data file (the active access's on an object store) and its path."""
    if object_store.is_object_store(path):
        return object_store.filesystem(path)
    return None, _local(path)


def _write_parquet(table: pa.Table, target: str) -> None:
    """``table`` as the Parquet file ``target``, whole or not at all: an object PUT is atomic, a
    local file is written aside and renamed."""
    fs, where = _filesystem(target)
    if fs is not None:
        pq.write_table(table, where, filesystem=fs)
        return
    Path(where).parent.mkdir(parents=True, exist_ok=True)
    temporary = f"{where}.tmp-{uuid.uuid4().hex[:8]}"
    pq.write_table(table, temporary)
    os.replace(temporary, where)


def _rewrite(path: str, schema: pa.Schema, target: str, drop_window: str | None = None) -> str:
    """``path`` conformed to the table's ``schema`` as ``target`` (without ``drop_window``'s rows)."""
    fs, where = _filesystem(path)
    table = pq.read_table(where, filesystem=fs)
    if drop_window is not None:
        table = table.filter(pc.field(WINDOW_ID_FIELD) != drop_window)
    columns = []
    for field in schema:  # one at a time, to name the column whose values cannot be cast
        try:
            columns.append(conform_table(table, pa.schema([field])).column(0))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:  # e.g. ns values with sub-µs digits
            raise CdcConfigurationError(
                f"column {field.name!r} of {path} cannot be stored as the Iceberg table's {field.type} ({exc}); "
                "capture with time_precision_mode='spark', or the column as text (column_text_list)"
            ) from None
    _write_parquet(pa.Table.from_arrays(columns, schema=schema), target)
    return target


def _conformed(path: str) -> str:
    return path[: -len(".parquet")] + CONFORMED_SUFFIX if path.endswith(".parquet") else path + CONFORMED_SUFFIX


def _source_of(conformed: str) -> str:
    return conformed[: -len(CONFORMED_SUFFIX)] + ".parquet"


def _renamed(path: str) -> str:
    stem = path[: -len(".parquet")] if path.endswith(".parquet") else path
    return f"{stem.removesuffix('.conformed')}.r{uuid.uuid4().hex[:8]}{CONFORMED_SUFFIX}"


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _compact(table: Table, location: str) -> tuple[int, int]:
    """Merge each partition's small files into files of up to COMPACT_TARGET_BYTES (pyiceberg
    0.12 has no rewrite_data_files); one overwrite snapshot, no window tag. The merged files go
    under ``location`` (the table's directory), not the location its metadata names."""
    groups: dict[str, list[Any]] = {}
    tasks = list(table.scan().plan_files())
    refuse_outside(location, _task_files(tasks), "data files")
    for task in tasks:
        if task.file.file_size_in_bytes < COMPACT_TARGET_BYTES:
            groups.setdefault(repr(task.file.partition), []).append(task)
    removed, written = [], []
    for tasks in groups.values():
        chunk: list[Any] = []
        for task in [*sorted(tasks, key=lambda t: t.file.file_path), None]:
            full = task is None or sum(t.file.file_size_in_bytes for t in chunk) + task.file.file_size_in_bytes > (
                COMPACT_TARGET_BYTES
            )
            if full and len(chunk) > 1:
                rows = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(chunk)
                rows = rows.cast(plain_schema(rows.schema))  # no field ids: files are read by name, as all others
                path = f"{_local(location)}/data/compacted-{uuid.uuid4().hex}.parquet"
                _write_parquet(rows, path)
                removed += [t.file for t in chunk]
                written.append(path)
            if full:
                chunk = []
            if task is not None:
                chunk.append(task)
    if written:
        txn = table.transaction()
        newest = _newest_window(table)
        props = {"cdc.maintenance": "compact", **({NEWEST_KEY: str(newest)} if newest is not None else {})}
        with txn.update_snapshot(snapshot_properties=props).overwrite() as producer:
            for data_file in removed:
                producer.delete_data_file(data_file)
            for data_file in _parquet_files_to_data_files(txn.table_metadata, written, table.io):
                producer.append_data_file(data_file)
        txn.commit_transaction()
    return len(removed), len(written)


def _delete_unreachable(table: Table, expired: list[Any], location: str) -> int:
    """Delete data files, manifests and manifest lists only ``expired`` snapshots referenced
    (pyiceberg's expiry removes the snapshots from the metadata and leaves every file). Only
    files under the table's ``location``: the others are refused, after the rest is deleted."""
    io = table.io
    live_manifests = {m.manifest_path: m for s in table.metadata.snapshots for m in s.manifests(io)}
    live = {e.data_file.file_path for m in live_manifests.values() for e in m.fetch_manifest_entry(io)}
    dead_manifests = {m.manifest_path: m for s in expired for m in s.manifests(io)}
    for path in live_manifests:
        dead_manifests.pop(path, None)
    dead = {e.data_file.file_path for m in dead_manifests.values() for e in m.fetch_manifest_entry(io)} - live
    lists = {s.manifest_list for s in expired} - {s.manifest_list for s in table.metadata.snapshots}
    doomed = [*sorted(dead), *dead_manifests, *lists]
    outside = outside_location(location, doomed)
    for path in doomed:
        if path in outside:
            continue
        if object_store.is_object_store(path):  # Arrow's delete (the FileIO's) leaves directory markers
            object_store.delete_object(path)
        else:
            io.delete(path)
    refuse_outside(location, outside, "files to delete")
    return len(dead)


def outside_location(location: str, paths: Iterable[str]) -> list[str]:
    """Those of ``paths`` that are not files under the table's ``location``. The paths come from
    manifests and manifest lists, which whoever may write the sink can write: they may name
    another capture's objects, another bucket, or a file of the worker (``file://``)."""
    root = _comparable(location)
    return [p for p in paths if root is None or not _under(root, p)]


def refuse_outside(location: str, paths: Iterable[str], what: str) -> None:
    """:class:`CdcStateError` if any of ``paths`` is not under ``location`` (nothing is read or
    deleted from outside the table)."""
    outside = outside_location(location, paths)
    if outside:
        shown = ", ".join(repr(p) for p in outside[:5]) + (f" and {len(outside) - 5} more" if len(outside) > 5 else "")
        raise CdcStateError(
            f"the Iceberg table at {location} names {what} outside the table: {shown}; refused (this capture never "
            "writes them: its metadata or manifests were changed by someone who may write the sink; restore "
            "them from a backup, or drop the table and land it again)"
        )


def _comparable(path: str) -> str | None:
    """``path`` as a URI of the library scheme (object stores) or an absolute local path; None
    for anything else (``hdfs://``, ``http://``, ``file://host/...``): never inside a table here."""
    if object_store.is_object_store(path):
        return object_store.library_uri(path).rstrip("/")
    if path.startswith("file:"):
        parsed = urlparse(path)
        return None if parsed.netloc not in ("", "localhost") else os.path.abspath(parsed.path)
    return None if is_uri(path) else os.path.abspath(path)


def _under(root: str, path: str) -> bool:
    file = _comparable(path)
    if file is None or not file.startswith(root + "/"):
        return False
    relative = file[len(root) + 1 :]
    try:  # plain names only (no '..', not even percent-encoded); locally, no link out of the table
        inside(relative)
        inside(unquote(relative))
        if not object_store.is_object_store(root):
            contained(root, relative)
    except CdcStateError:
        return False
    return True


def _task_files(tasks: Iterable[Any]) -> list[str]:
    """The data and delete files a scan's tasks read."""
    return [path for t in tasks for path in (t.file.file_path, *(d.file_path for d in t.delete_files))]


def _read(scan: DataScan, location: str) -> pa.Table:
    """``scan.to_arrow()``, its files checked to be the table's first."""
    tasks = list(scan.plan_files())
    refuse_outside(location, _task_files(tasks), "data files")
    return ArrowScan(
        scan.table_metadata, scan.io, scan.projection(), scan.row_filter, scan.case_sensitive, scan.limit
    ).to_table(tasks)


def _redact(text: str, options: Mapping[str, str]) -> str:
    """``text`` without passwords in URIs, secret-looking catalog properties or the active
    object-store access's keys."""
    text = re.sub(r"(://[^/\s:@]*:)[^@\s/]+@", r"\1***@", text)
    for key, value in options.items():
        if _SECRET_KEY.search(key) and len(value) >= 4:
            text = text.replace(value, "***")
    return object_store.redact(text)
