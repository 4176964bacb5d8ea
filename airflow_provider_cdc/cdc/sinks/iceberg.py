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
a class by name survives from either (see :class:`_PinnedCatalog`). On an object store, with an
access active (:mod:`.object_store`), the FileIOs reach S3 with that access only, whatever the
catalog's properties, a catalog server or a table's metadata say (:func:`_with_store_access`); the
files written here (conformed rewrites, compaction) go through Arrow's file system of the same
access, and maintenance deletes objects with obstore (Arrow's delete leaves directory markers).

The paths of data files, manifests and manifest lists come from objects that whoever may write
the sink can write: every path read, rewritten, listed or deleted here must be under the table's
own directory (:func:`refuse_outside`), or the call fails naming it.
"""

from __future__ import annotations

import functools
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
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, BooleanExpression, EqualTo, In
from pyiceberg.io import PY_IO_IMPL, FileIO
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.table import DataScan, Table, Transaction, _parquet_files_to_data_files
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
#: FileIO properties that say which S3 endpoint to reach and as whom (pyiceberg 0.12's ``s3.*``
#: connection keys, its ``client.*`` fallbacks, and a proxy): with an object-store access active
#: they come from it only, never from a catalog server's config or a table's metadata.
_STORE_KEY = re.compile(
    r"^(client\.|s3\.(endpoint|region|resolve-region|access-key-id|secret-access-key|session-token|proxy-uri|"
    r"role-arn|role-session-name|anonymous|force-virtual-addressing|connect-timeout|request-timeout)$)",
    re.IGNORECASE,
)
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
        storable = [_without_nulls(_storable_schema(schema)) for schema in raw.values()]
        if table is None:
            table = self._create(topic, storable)
        txn = table.transaction()
        if table.metadata.name_mapping() is None:  # as add_files sets it; schema updates keep it current
            txn.set_properties({"schema.name-mapping.default": table.schema().name_mapping.model_dump_json()})
        if table.spec().is_unpartitioned() and table.current_snapshot() is None:
            with txn.update_spec() as spec:
                spec.add_field(WINDOW_ID_FIELD, TruncateTransform(8), PARTITION_FIELD)
        schema, retyped = _evolve(txn, _arrow(table.schema()), storable)
        added = [path if _readable(raw[path], schema) else _rewrite(path, schema, _conformed(path)) for path in inputs]
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
                if data_file.file_path not in gone and not _readable(_file_schema(data_file.file_path), schema):
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
                identifier, _plain(merge_schemas(schemas)), location=self.table_uri(topic), properties=TABLE_PROPERTIES
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


# -- opening catalogs: the FileIO and every class pyiceberg imports are the provider's choice ---
#
# pyiceberg imports, by the dotted name a property holds, the FileIO (``py-io-impl``), the
# catalog (``py-catalog-impl``), the S3 retry strategy (``s3.retry-strategy-impl``), the REST
# catalog's auth manager (``auth``: ``{"type": "custom", "impl": ...}``) and a table's location
# provider (``write.py-location-provider.impl``): ``importlib.import_module`` in
# ``pyiceberg/io/__init__.py``, ``io/pyarrow.py``, ``catalog/__init__.py``, ``catalog/rest/auth.py``
# and ``table/locations.py`` (every import by name in pyiceberg 0.12.0, the version this was
# checked against). Those properties do not only come from the DAG author: a REST catalog server
# sends ``defaults`` and ``overrides`` that pyiceberg merges into the catalog's properties (and
# reads ``auth`` from while still constructing the catalog), and the FileIO of every table is
# built from ``{**catalog properties, **table metadata properties}``, so whoever can answer as
# the catalog, or write a table's metadata file (anyone who can write to a local sink), could
# name ``subprocess.getoutput`` or ``logging.config.fileConfig`` and run code on the worker.
# Refusing such keys in a connection's extra is not enough. So every catalog the provider opens
# is a subclass of its own class (:class:`_PinnedCatalog`) that:
#
# - builds every table's FileIO as the provider's choice: ``PyArrowFileIO``, or ``FsspecFileIO``
#   when the DAG's own properties name it; no other ``py-io-impl`` is accepted;
# - drops from the REST server's config, before the session is made, and from every table's
#   metadata and FileIO properties, the keys that make pyiceberg import a class
#   (:func:`importing_key`): a forged table is still read, its import keys are ignored (logged,
#   by name) and the next commit writes its metadata without them.
#
# The hooks are pyiceberg's own methods (``Catalog._load_file_io``, ``load_table``,
# ``create_table``, ``register_table``, ``commit_table``; ``RestCatalog._fetch_config``,
# ``_response_to_table``, ``_response_to_staged_table``), which every catalog and table path of
# 0.12 goes through; ``tests/integration/test_iceberg_metadata_attacks.py`` checks them against a
# malicious REST server and forged metadata, so an upgrade that moves them fails there.

ARROW_FILE_IO = "pyiceberg.io.pyarrow.PyArrowFileIO"
FSSPEC_FILE_IO = "pyiceberg.io.fsspec.FsspecFileIO"
FILE_IOS = (ARROW_FILE_IO, FSSPEC_FILE_IO)


def importing_key(key: str) -> bool:
    """Does property ``key`` make pyiceberg import a class by name? (Every such key of 0.12 has
    ``impl`` in it, and the REST catalog's ``auth`` holds one; ``auth.*`` too, for safety.)"""
    lowered = str(key).lower()
    return "impl" in lowered or lowered == "auth" or lowered.startswith("auth.")


def open_catalog(name: str, properties: Mapping[str, Any]) -> Catalog:
    """``pyiceberg.catalog.load_catalog(name, **properties)``, pinned (see above). A REST catalog
    is constructed as :class:`_PinnedCatalog` directly: pyiceberg reads the server's ``auth``
    while constructing it."""
    from pyiceberg.catalog import PY_CATALOG_IMPL, TYPE, CatalogType, infer_catalog_type

    props = {str(k): v for k, v in properties.items()}
    file_io = _chosen_file_io(props)
    props[PY_IO_IMPL] = file_io
    if not props.get(PY_CATALOG_IMPL):
        from pyiceberg.catalog import _ENV_CONFIG, _check_required_catalog_properties, merge_config

        # As load_catalog does: the worker's own pyiceberg config (~/.pyiceberg.yaml, PYICEBERG_*)
        # under the properties given.
        conf = merge_config(_ENV_CONFIG.get_catalog_config(name) or {}, props)
        given = conf.get(TYPE)
        kind = CatalogType(given.lower()) if isinstance(given, str) and given else infer_catalog_type(name, conf)
        if kind == CatalogType.REST:
            _check_required_catalog_properties(name, kind, conf)
            return _pinned_rest_class()(name, **conf)
    return pin_catalog(load_catalog(name, **props), props)


def pin_catalog(catalog: Catalog, given: Mapping[str, Any] | None = None) -> Catalog:
    """``catalog``, made a :class:`_PinnedCatalog` in place. ``given``: the properties the DAG
    gave it (their import keys stay); None for a catalog made elsewhere (a state table's catalog
    object): then none of its import keys stay but a ``py-io-impl`` naming pyiceberg's own."""
    if isinstance(catalog, _PinnedCatalog):
        return catalog
    current = dict(catalog.properties)
    file_io = _chosen_file_io(current if given is None else given)
    try:
        catalog.__class__ = _pinned_class(type(catalog))
    except TypeError:
        raise CdcConfigurationError(
            f"the Iceberg catalog {type(catalog).__name__} cannot be opened with the provider's FileIO"
        ) from None
    pinned: Any = catalog
    pinned._cdc_file_io = file_io
    pinned.properties = _scrubbed(current, given or {}, file_io, "the catalog's properties")
    return catalog


def _chosen_file_io(properties: Mapping[str, Any]) -> str:
    chosen = properties.get(PY_IO_IMPL)
    if chosen in (None, ""):
        return ARROW_FILE_IO
    if chosen not in FILE_IOS:
        raise CdcConfigurationError(
            f"the Iceberg catalog's properties name py-io-impl {chosen!r}: the provider reads and writes Iceberg "
            f"tables with pyiceberg's own FileIO only ({ARROW_FILE_IO}, the default, or {FSSPEC_FILE_IO}), so that "
            "neither a catalog server nor a table's metadata can choose code to run on the workers"
        )
    return str(chosen)


def _scrubbed(properties: Mapping[str, Any], given: Mapping[str, Any], file_io: str, where: str) -> dict[str, Any]:
    """``properties`` without the import keys ``given`` did not hold (those take ``given``'s
    value), with ``py-io-impl`` the chosen FileIO."""

    def kept(key: str, value: Any) -> bool:
        return value == file_io if key == PY_IO_IMPL else key in given and given[key] == value

    _warn_ignored(sorted(k for k, v in properties.items() if importing_key(k) and not kept(k, v)), where)
    out = {k: v for k, v in properties.items() if not importing_key(k)}
    out.update({k: v for k, v in given.items() if importing_key(k)})
    out[PY_IO_IMPL] = file_io
    return out


def _with_store_access(properties: Mapping[str, Any]) -> dict[str, Any]:
    """``properties`` reaching S3 with the active object-store access (the DAG's
    ``object_store_conn_id``) only: whichever endpoint, region, keys or proxy the catalog's
    properties, a catalog server or a table's metadata named are dropped (anyone who can write a
    table's metadata file could otherwise send its reads and writes to a store of their own).
    Without an active access, pyiceberg's own merge applies (the default credential chain, a REST
    catalog's vended credentials)."""
    access = object_store.current()
    if access is None:
        return dict(properties)
    kept = {k: v for k, v in properties.items() if not _STORE_KEY.match(str(k))}
    return {**kept, **access.iceberg_properties()}


def _clean_metadata(metadata: Any, where: str) -> Any:
    """Table metadata without properties that make pyiceberg import a class."""
    dropped = sorted(k for k in metadata.properties if importing_key(k))
    if not dropped:
        return metadata
    _warn_ignored(dropped, f"the metadata of {where}")
    properties = {k: v for k, v in metadata.properties.items() if k not in dropped}
    return metadata.model_copy(update={"properties": properties})


_warned: set[tuple[str, tuple[str, ...]]] = set()


def _warn_ignored(keys: list[str], where: str) -> None:
    """Once per process and place: a forged table is loaded many times a run."""
    if keys and (where, tuple(keys)) not in _warned:
        _warned.add((where, tuple(keys)))
        log.warning("ignored %s of %s: they would make pyiceberg import a class they name", keys, where)  # names only


def _clean_table(table: Any) -> Any:
    table.metadata = _clean_metadata(table.metadata, _table_name(table.name(), table.metadata_location))
    return table


def _table_name(identifier: Sequence[str], metadata_location: str | None) -> str:
    return f"Iceberg table {'.'.join(identifier)} ({metadata_location})"


class _PinnedCatalog(Catalog):
    """Mixed into the class of every catalog the provider opens (see the comment above). A
    ``Catalog`` itself, so that the subclass has the catalog's layout and a catalog made elsewhere
    can take it in place."""

    _cdc_file_io: str = ARROW_FILE_IO

    def _load_file_io(self, properties: Mapping[str, Any] | None = None, location: str | None = None) -> FileIO:
        # The table's (metadata properties, a REST server's table config and vended credentials):
        # none of its import keys; the catalog's own were scrubbed when it was opened.
        props = {k: v for k, v in (properties or {}).items() if not importing_key(k)}
        props[PY_IO_IMPL] = self._cdc_file_io  # wins over the catalog's in pyiceberg's merge
        io = super()._load_file_io(props, location)  # type: ignore[misc]
        io.properties = _with_store_access(io.properties)  # file systems are built on first use
        return io

    # pyiceberg's SQL, DynamoDB and BigQuery catalogs build some FileIOs from ``self.properties``
    # directly (``load_file_io``): the catalog's own properties carry the active access too, read
    # when asked (the access is the job's, the catalog object may outlive it).
    @property  # type: ignore[override]
    def properties(self) -> dict[str, Any]:
        return _with_store_access(self.__dict__.get("properties", {}))

    @properties.setter
    def properties(self, value: Mapping[str, Any]) -> None:
        # Not the access's own values read back (a REST catalog's config merge): its keys stay
        # out of the stored properties, for when the access is no longer active.
        access = object_store.current()
        overlay = access.iceberg_properties() if access is not None else {}
        self.__dict__["properties"] = {k: v for k, v in value.items() if k not in overlay or overlay[k] != v}

    def load_table(self, identifier: Any) -> Table:
        return _clean_table(super().load_table(identifier))  # type: ignore[misc]

    def create_table(self, *args: Any, **kwargs: Any) -> Table:
        return _clean_table(super().create_table(*args, **kwargs))  # type: ignore[misc]

    def register_table(self, *args: Any, **kwargs: Any) -> Table:
        return _clean_table(super().register_table(*args, **kwargs))  # type: ignore[misc]

    def commit_table(self, table: Table, requirements: Any, updates: Any) -> Any:
        response = super().commit_table(table, requirements, updates)  # type: ignore[misc]
        metadata = _clean_metadata(response.metadata, _table_name(table.name(), response.metadata_location))
        return response if metadata is response.metadata else response.model_copy(update={"metadata": metadata})


class _PinnedRest(_PinnedCatalog):
    """The REST catalog's own hooks: its server's config, and the tables it answers with."""

    def __init__(self, name: str, **properties: Any):
        self._cdc_file_io = properties[PY_IO_IMPL]  # set by open_catalog
        super().__init__(name, **properties)  # type: ignore[call-arg]

    def _fetch_config(self) -> None:
        given: dict[str, Any] = dict(self.properties)  # type: ignore[attr-defined]
        super()._fetch_config()  # type: ignore[misc]
        # Before __init__ makes the session, which imports the class ``auth`` names.
        self.properties = _scrubbed(self.properties, given, self._cdc_file_io, "the REST catalog server's config")

    def _response_to_table(self, identifier_tuple: tuple[str, ...], table_response: Any) -> Any:
        cleaned = _clean_response(identifier_tuple, table_response)
        return super()._response_to_table(identifier_tuple, cleaned)  # type: ignore[misc]

    def _response_to_staged_table(self, identifier_tuple: tuple[str, ...], table_response: Any) -> Any:
        cleaned = _clean_response(identifier_tuple, table_response)
        return super()._response_to_staged_table(identifier_tuple, cleaned)  # type: ignore[misc]


def _clean_response(identifier: tuple[str, ...], response: Any) -> Any:
    metadata = _clean_metadata(response.metadata, _table_name(identifier, response.metadata_location))
    return response if metadata is response.metadata else response.model_copy(update={"metadata": metadata})


@functools.cache
def _pinned_class(cls: type) -> type:
    from pyiceberg.catalog.rest import RestCatalog

    mixin = _PinnedRest if issubclass(cls, RestCatalog) else _PinnedCatalog
    return type(f"Pinned{cls.__name__}", (mixin, cls), {"__module__": __name__})


def _pinned_rest_class() -> type:
    from pyiceberg.catalog.rest import RestCatalog

    return _pinned_class(RestCatalog)


# -- schemas -----------------------------------------------------------------------------------

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


def _storable_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_type(_storable_type(f.type, f.name)) for f in schema])


def _without_nulls(schema: pa.Schema) -> pa.Schema:
    """No null-typed fields (Iceberg v2 has no such type): merged with the table's as absent."""

    def keep(t: pa.DataType) -> pa.DataType | None:
        if pa.types.is_struct(t):
            fields = [f.with_type(k) for f in t if (k := keep(f.type)) is not None]
            return pa.struct(fields) if fields else None
        nested = [t.value_type] if pa.types.is_list(t) else [t.key_type, t.item_type] if pa.types.is_map(t) else []
        return None if pa.types.is_null(t) or any(keep(n) is None for n in nested) else t

    return pa.schema([f.with_type(k) for f in schema if (k := keep(f.type)) is not None])


def _plain(schema: pa.Schema) -> pa.Schema:
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


def _arrow(schema: Any) -> pa.Schema:
    return _plain(schema_to_pyarrow(schema, include_field_ids=False))


def _evolve(
    txn: Transaction, current: pa.Schema, schemas: Iterable[pa.Schema]
) -> tuple[pa.Schema, list[tuple[str, ...]]]:
    """Evolve the table to the merge of its schema and ``schemas``: returns the new schema and
    the columns replaced by a new field, Iceberg being unable to promote their type to the merged one."""
    target = _plain(merge_schemas([current, *schemas]))
    if target.equals(current):
        return current, []
    retyped = _retyped(list(current), list(target), ())
    if retyped:
        with txn.update_schema(allow_incompatible_changes=True) as update:
            for path in retyped:
                update.delete_column(path)
    with txn.update_schema() as update:
        update.union_by_name(target)
    return _arrow(txn.table_metadata.schema()), retyped


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


def _readable(src: pa.DataType | pa.Schema, dst: pa.DataType | pa.Schema) -> bool:
    """Can a file column of type ``src`` be registered as is under the table's ``dst``?"""
    if isinstance(src, pa.Schema):
        src, dst = pa.struct(list(src)), pa.struct(list(dst))
    if src.equals(dst):
        return True
    if pa.types.is_struct(src) and pa.types.is_struct(dst):
        return all(dst.get_field_index(f.name) >= 0 and _readable(f.type, dst.field(f.name).type) for f in src)
    if pa.types.is_list(src) and pa.types.is_list(dst):
        return _readable(src.value_type, dst.value_type)
    if pa.types.is_map(src) and pa.types.is_map(dst):
        return _readable(src.key_type, dst.key_type) and _readable(src.item_type, dst.item_type)
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
                rows = rows.cast(_plain(rows.schema))  # no field ids: files are read by name, as all others
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
