"""Lake table formats behind the sink: every landed dataset as an Iceberg or Delta table.

The window writer stages a window's Parquet files exactly as the Parquet sink does (under
``<base>/<topic dir>/window=<id>/attempt=<id>/``); with ``sink_format`` ``iceberg`` or ``delta``
its commit then makes those files the window's data in each dataset's table, **one table
commit per dataset per window**, before the window's commit-log entry is published:

- the commit *replaces* whatever an earlier attempt of the same window committed to that table
  (a snapshot retried after a crash reads from a new consistent point, so its rows may differ)
  and adds this attempt's files, atomically;
- it is tagged with the window (:class:`WindowTag`: Iceberg snapshot-summary properties, Delta
  ``commitInfo`` metadata plus the ``txn`` action ``(app id, window seq)``), so a retry finds the
  commits of earlier attempts and readers and time travel find the version of any window.

The table of a dataset lives at the dataset's directory (its landed URI), so Assets and lineage
name the same place whatever the format. Only landed datasets become tables (table topics,
transactions, messages, capture gaps); the incremental snapshot's staged chunks and the query
extraction's "seen" rows stay plain Parquet files: they are the product's own bookkeeping.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

if TYPE_CHECKING:  # DAG files validate sink_format through this module: no pyarrow at parse time
    import pyarrow as pa

    from airflow_provider_cdc.cdc.basics.naming import Topic

#: Beside a sink (or state) path: the default Iceberg catalog, a SQLite file.
CATALOG_DIR = "_cdc_catalog"

PARQUET = "parquet"
ICEBERG = "iceberg"
DELTA = "delta"
SINK_FORMATS = (PARQUET, ICEBERG, DELTA)

#: Prefix of the keys a table commit carries (Iceberg summary properties, Delta commit metadata).
TAG_PREFIX = "cdc."
#: The Delta ``txn`` app id of a capture's window commits: ``airflow-provider-cdc/<prefix>``.
APP_ID_PREFIX = "airflow-provider-cdc/"


def check_sink_format(value: str) -> str:
    if value not in SINK_FORMATS:
        raise CdcConfigurationError(f"sink_format must be one of {', '.join(SINK_FORMATS)}, got {value!r}")
    return value


def check_table_sink(
    sink_format: str, sink_path: str, catalog: Mapping[str, str], *, catalog_conn_id: str | None = None
) -> None:
    """A capture's sink settings, at DAG parse (no I/O, no imports of the format libraries)."""
    check_sink_format(sink_format)
    if not isinstance(catalog, Mapping) or not all(isinstance(k, str) for k in catalog):
        raise CdcConfigurationError("table_catalog must be a mapping of pyiceberg catalog property names to values")
    if catalog and sink_format != ICEBERG:
        raise CdcConfigurationError(f"table_catalog is for sink_format='iceberg', not {sink_format!r}")
    if sink_format == PARQUET:
        return
    from airflow_provider_cdc.cdc.sinks.object_store import OBJECT_STORE_SCHEMES

    scheme = sink_path.split("://", 1)[0].lower() if "://" in sink_path else ""
    if scheme not in ("", "file", *OBJECT_STORE_SCHEMES):
        raise CdcConfigurationError(
            f"sink_format={sink_format!r} writes its tables to local paths and object stores (s3://, gs://, "
            f"abfss://), not {scheme}:// ones (the table libraries have no Hadoop file system); use "
            "sink_format='parquet' on HDFS"
        )
    check_iceberg_catalog(sink_format, sink_path, "sink_path", bool(catalog) or catalog_conn_id is not None)


def check_iceberg_catalog(sink_format: str, path: str, setting: str, has_catalog: bool) -> None:
    """An Iceberg sink or state path on an object store names its catalog (at DAG parse)."""
    from airflow_provider_cdc.cdc.sinks.object_store import is_object_store

    if sink_format == ICEBERG and not has_catalog and is_object_store(path):
        raise CdcConfigurationError(object_store_catalog_message(setting, path))


def object_store_catalog_message(setting: str, path: str) -> str:
    return (
        f"sink_format='iceberg' with {setting} {path!r} on an object store needs an Iceberg catalog: the default "
        "SQLite catalog file beside the sink cannot live in a bucket (SQLite needs a local file it can lock). Set "
        "table_catalog_conn_id (or table_catalog) to a catalog every worker reaches: a SQL catalog in a PostgreSQL "
        "database (type 'sql', uri 'postgresql+psycopg://...'), a REST catalog, Glue..."
    )


def check_table_names(sink_format: str, topic_prefix: str, tables: Iterable[Any]) -> None:
    """Tables whose names the format cannot hold, refused before anything is written: delta-rs
    cannot open a table whose path has a '%', and a name with a character outside
    ``[A-Za-z0-9_-]`` is escaped with one in its topic directory (see :mod:`..naming`)."""
    if sink_format != DELTA:
        return
    from airflow_provider_cdc.cdc.basics.naming import topic_directory

    escaped = [f"{t.schema}.{t.name}" for t in tables if "%" in topic_directory(topic_prefix, t.schema, t.name)]
    if escaped:
        raise CdcConfigurationError(
            f"sink_format='delta' cannot hold table(s) {escaped}: their names have characters outside "
            "[A-Za-z0-9_-], escaped with '%' in their directories, and delta-rs cannot open such paths. "
            "Use sink_format 'parquet' or 'iceberg' for them"
        )


def local_base(sink_path: str) -> str:
    """Where the table libraries find a sink: the local directory of a ``file://`` or plain
    path, or the object-store URI with the scheme they know (``s3a://`` → ``s3://``)."""
    if sink_path.startswith("file://"):
        return sink_path[len("file://") :]
    from airflow_provider_cdc.cdc.sinks.object_store import library_uri

    return library_uri(sink_path)


@dataclass(frozen=True)
class WindowTag:
    """What identifies a window's commit in a table's own history."""

    topic_prefix: str
    window_seq: int
    window_id: str
    kind: str  # snapshot | stream | query
    from_position: str | None
    to_position: str | None
    attempt: str
    run_id: str | None = None

    def properties(self) -> dict[str, str]:
        """The tag as string properties (``cdc.window-seq`` ...), as both formats store them."""
        values = {
            "topic-prefix": self.topic_prefix,
            "window-seq": str(self.window_seq),
            "window-id": self.window_id,
            "window-kind": self.kind,
            "from": self.from_position,
            "to": self.to_position,
            "attempt": self.attempt,
            "run-id": self.run_id,
        }
        return {TAG_PREFIX + k: v for k, v in values.items() if v is not None}

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> WindowTag | None:
        """The tag in a commit's properties, or None for commits the capture did not make."""
        get = {k[len(TAG_PREFIX) :]: str(v) for k, v in props.items() if str(k).startswith(TAG_PREFIX)}
        if "window-seq" not in get or "attempt" not in get:
            return None
        return cls(
            topic_prefix=get.get("topic-prefix", ""),
            window_seq=int(get["window-seq"]),
            window_id=get.get("window-id", ""),
            kind=get.get("window-kind", ""),
            from_position=get.get("from"),
            to_position=get.get("to"),
            attempt=get["attempt"],
            run_id=get.get("run-id"),
        )

    @property
    def app_id(self) -> str:
        return APP_ID_PREFIX + self.topic_prefix


@dataclass(frozen=True)
class TableCommit:
    """One table commit of one window: where it is in the table's history."""

    format: str
    table: str  # the table's identifier (Iceberg) or URI (Delta)
    version: int  # Delta table version, or Iceberg snapshot id
    window_seq: int
    attempt: str
    files_added: int
    rows_added: int
    files_removed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableCommit:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class TableFormat(Protocol):
    """The landed datasets of one capture (one sink path, one topic prefix) as lake tables."""

    name: ClassVar[str]

    def table_uri(self, topic: Topic) -> str:
        """Where the table of ``topic`` lives: the dataset's directory (its landed URI)."""

    def exists(self, topic: Topic) -> bool: ...

    def commit_window(self, topic: Topic, files: Sequence[str], tag: WindowTag) -> TableCommit | None:
        """Make ``files`` (Parquet, one window attempt, possibly of several table versions) the
        data of window ``tag.window_seq`` in the table of ``topic``: one atomic commit that removes
        what earlier attempts of that window committed, adds ``files`` (evolving the table's
        schema by :mod:`.schemas`' rules), and carries the tag. None when there is nothing to add
        and nothing to replace."""

    def window_commits(self, topic: Topic) -> dict[int, TableCommit]:
        """Window seq → the commit that holds it now (the newest attempt's), from table history."""

    def scan_arrow(self, topic: Topic, *, window_seqs: Collection[int] | None = None) -> pa.Table | None:
        """The table's current rows (of ``window_seqs`` only, if given); None if no table."""

    def data_files(self, topic: Topic) -> list[str]:
        """The Parquet files of the table's current version (Spark reads them directly)."""

    def maintain(self, topic: Topic, *, compact: bool = True, retain_hours: float | None = None) -> dict[str, Any]:
        """Table maintenance: compact small files; with ``retain_hours``, expire history older than
        that (Iceberg snapshots, Delta vacuum) and delete the files only it referenced."""

    def holds_window(self, topic: Topic, window_seq: int) -> bool:
        """Does the table's current version hold window ``window_seq``? Cheap: every run asks it
        of the newest window's tables, and it must not read the table's whole history."""
