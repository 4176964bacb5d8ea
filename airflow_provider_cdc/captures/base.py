"""What every capture has, whatever its source: the configuration base (one run's session is
:mod:`.source_run`).

A DAG author picks the source by picking the capture class (``PostgresCapture``,
``SqlServerCapture``); the operators are the same for all of them. Each source supplies:

- a :class:`Capture` subclass: its connection and source-only settings, its offset type and
  name rules, its setup (preflight and creating what it needs) and its run session;
- a :class:`~.source_run.SourceRun`: one run's session with the source, holding the capture lock, which
  answers the operators' questions (where does the source stand, where does a window end, what
  does the job read) and acknowledges what landed where the source has something to acknowledge.

The operators (:mod:`airflow_provider_cdc.operators`) do the rest once for all sources: reconcile offset and
commit log, decide run type and snapshot, plan the window, write in the invariant order (sink
commit, then offset, then acknowledgement), report.
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.naming import validate_topic_prefix
from airflow_provider_cdc.cdc.basics.positions import Position
from airflow_provider_cdc.cdc.basics.problems import Problems
from airflow_provider_cdc.cdc.basics.readiness import Readiness
from airflow_provider_cdc.cdc.basics.tables import NameRules, TableRef
from airflow_provider_cdc.cdc.events.columns import ColumnRules
from airflow_provider_cdc.cdc.events.settings import EventSettings
from airflow_provider_cdc.cdc.events.value_modes import ValueModes
from airflow_provider_cdc.cdc.planning.incremental import validate_run_conf_signals
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset, OffsetIdentity
from airflow_provider_cdc.cdc.planning.plan import streams, validate_snapshot_mode
from airflow_provider_cdc.cdc.planning.spec import (
    DEFAULT_SPARK_MASTER,
    CaptureOptions,
    SparkOptions,
    validate_watermarks,
)
from airflow_provider_cdc.cdc.sinks.formats import check_table_names, check_table_sink
from airflow_provider_cdc.cdc.sinks.object_store import ObjectStoreAccess
from airflow_provider_cdc.cdc.sinks.path_checks import check_path_setting
from airflow_provider_cdc.offsets.base import OffsetStore, peek_offset

if TYPE_CHECKING:
    from airflow_provider_cdc.captures.source_run import SourceRun

OFFSET_STORES = ("variable", "state_table")
#: A table that joins the capture after its snapshot: "incremental" snapshots it while capture
#: continues; "fail" stops the window until a full snapshot ran (the behaviour before 0.x).
NEW_TABLE_SNAPSHOT = ("incremental", "fail")


@dataclass(kw_only=True)
class Capture(ABC):
    """The settings every capture has. See docs/operators.md for every field."""

    #: Set by each source.
    OFFSET_TYPE: ClassVar[type[CaptureOffset]]
    NAMES: ClassVar[NameRules]
    SOURCE_NAME: ClassVar[str]  # for messages: "PostgreSQL", "SQL Server"
    DEFAULT_WATERMARKS: ClassVar[str] = "message"  # the source's incremental_watermarks default
    LANDS_MESSAGES: ClassVar[bool] = False  # does the source deliver logical messages (<prefix>.message)?
    LINEAGE_SCHEME: ClassVar[str] = "postgres"  # OpenLineage's namespace scheme for the source

    tables: Sequence[str | TableRef] = ()
    topic_prefix: str = ""
    sink_path: str = ""
    # How the landed datasets are stored: "parquet" (directories + the commit log), "iceberg" or
    # "delta" (one lake table per dataset, one table commit per window; docs/lake-formats.md).
    sink_format: str = "parquet"
    # pyiceberg catalog properties for sink_format="iceberg" (empty: a SQLite catalog file beside
    # the sink). Not for secrets: they would travel in the job spec.
    table_catalog: Mapping[str, str] = field(default_factory=dict)
    # An Airflow connection holding the Iceberg catalog's properties (its extra, by name) and its
    # secret (the password), read when a run starts; table_catalog overrides its properties.
    table_catalog_conn_id: str | None = None
    # The Amazon provider's 'aws' connection for an S3 (or S3-compatible) sink_path and the
    # current-state task's state_path: keys or role, endpoint_url, region, addressing style; read
    # when a task runs. None: the workers' own credentials (instance role, environment).
    object_store_conn_id: str | None = None
    # Debezium's table.include.list / table.exclude.list: regular expressions on schema.table,
    # resolved against the catalog by every task (instead of, or to filter, ``tables``).
    table_include_list: Sequence[str] = ()
    table_exclude_list: Sequence[str] = ()
    snapshot_mode: str = "initial"
    offset_store: str | OffsetStore = "variable"
    offset_table: str = "cdc_state.offsets"
    # The role that owns offset_table when not the capture role (an administrator created it and
    # granted SELECT, INSERT, UPDATE): the state-table store refuses a table, or its schema, owned
    # by anyone else (docs/operators.md).
    offset_table_owner: str | None = None
    spark_conn_id: str | None = None
    # The in-process session's master (without spark_conn_id): local[2], two of the worker's cores,
    # not all of them (local[*]): the worker runs other tasks. Needs the [spark] extra (pyspark).
    spark_master: str = DEFAULT_SPARK_MASTER
    # Left out of the repr (log lines, the serialized DAG of a mapped task): it may hold credentials.
    spark_conf: Mapping[str, str] = field(default_factory=dict, repr=False)
    spark_application: str | None = None
    max_changes_per_chunk: int = 100_000
    snapshot_partition_bytes: int = 256 * 1024 * 1024
    snapshot_max_partitions: int = 64
    # SQL run (in its own transaction) before each stream window fixes its end, so its changes
    # land in that window: Debezium's heartbeat.action.query.
    heartbeat_action_query: str | None = None
    # Value representation (Debezium's handling modes; "spark" time types by default).
    decimal_handling_mode: str = "precise"
    time_precision_mode: str = "spark"
    binary_handling_mode: str = "bytes"
    # Column selection and masking (Debezium's column.* options).
    column_include_list: Sequence[str] = ()
    column_exclude_list: Sequence[str] = ()
    column_masks: Mapping[str, str] = field(default_factory=dict)
    column_text_list: Sequence[str] = ()
    # Incremental snapshots (docs/incremental.md): Debezium's signal.data.collection (a table with
    # columns id, type, data), chunking, watermarks, and what happens to a table that joins the
    # capture after its snapshot.
    signal_table: str | TableRef | None = None
    incremental_chunk_size: int = 50_000
    incremental_chunks_per_run: int = 20
    incremental_watermarks: str = "message"
    new_table_snapshot: str = "incremental"
    # Signal types a DAG run's conf (``cdc_signals``) may send: none by default, since anyone who
    # may trigger the DAG writes the conf. Filters and surrogate keys never come from it.
    run_conf_signals: Sequence[str] = ()

    #: The settings a repr shows: identifiers only. A repr reaches log lines and the serialized DAG
    #: of a mapped task (partial_kwargs), so settings that may hold a secret stay out: spark_conf,
    #: column_masks (a hash mask's name holds its salt), table_catalog properties, SQL.
    REPR_FIELDS: ClassVar[tuple[str, ...]] = (
        "topic_prefix",
        "tables",
        "table_include_list",
        "table_exclude_list",
        "sink_path",
        "sink_format",
        "snapshot_mode",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # @dataclass keeps a __repr__ the class already has: each source's capture keeps this one.
        cls.__repr__ = Capture.__repr__  # type: ignore[method-assign]

    def __repr__(self) -> str:
        from dataclasses import fields

        names = [f.name for f in fields(self) if f.name.endswith("_conn_id")] + list(self.REPR_FIELDS)
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in names if getattr(self, n, None) not in (None, (), ""))
        return f"{type(self).__name__}({shown})"

    def __post_init__(self) -> None:
        validate_topic_prefix(self.topic_prefix)
        validate_snapshot_mode(self.snapshot_mode)
        for name in ("tables", "table_include_list", "table_exclude_list"):
            if isinstance(getattr(self, name), str):
                raise CdcConfigurationError(f"{name} must be a list, not one string")
        refs = tuple(TableRef.coerce(t, self.NAMES) for t in self.tables)
        if not refs and not self.table_include_list:
            raise CdcConfigurationError("a capture needs at least one table (tables or table_include_list)")
        if refs and self.table_include_list:
            raise CdcConfigurationError("give tables or table_include_list, not both")
        for pattern in (*self.table_include_list, *self.table_exclude_list):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise CdcConfigurationError(
                    f"table pattern {pattern!r} is not a valid regular expression: {exc}"
                ) from None
        duplicates = sorted({r.quoted(self.NAMES) for r in refs if refs.count(r) > 1})
        if duplicates:
            raise CdcConfigurationError(f"tables listed more than once: {', '.join(duplicates)}")
        self.tables = refs
        self.validate_source()
        # Fixed at parse: it names the outlets (Jinja, relative paths and '%' are refused, see there).
        self.sink_path = check_path_setting(self.sink_path, "sink_path")
        check_table_sink(
            self.sink_format, self.sink_path, self.table_catalog, catalog_conn_id=self.table_catalog_conn_id
        )
        check_object_store_conn_id(self.object_store_conn_id, self.sink_path)
        check_table_names(self.sink_format, self.topic_prefix, refs)
        if self.table_catalog_conn_id is not None and self.sink_format != "iceberg":
            raise CdcConfigurationError(f"table_catalog_conn_id is for sink_format='iceberg', not {self.sink_format!r}")
        if self.heartbeat_action_query is not None and not str(self.heartbeat_action_query).strip():
            raise CdcConfigurationError("heartbeat_action_query is empty: give a SQL statement or None")
        if isinstance(self.offset_store, str) and self.offset_store not in OFFSET_STORES:
            raise CdcConfigurationError(
                f"offset_store {self.offset_store!r} is not one of {', '.join(OFFSET_STORES)} "
                "(or an OffsetStore instance)"
            )
        if self.offset_store == "state_table":
            try:
                TableRef.parse(self.offset_table, self.NAMES)
            except CdcConfigurationError as exc:
                raise CdcConfigurationError(f"offset_table {self.offset_table!r} is invalid: {exc}") from None
        if self.offset_table_owner is not None:
            if self.offset_store != "state_table":
                raise CdcConfigurationError("offset_table_owner is for offset_store='state_table'")
            if not isinstance(self.offset_table_owner, str) or not self.offset_table_owner.strip():
                raise CdcConfigurationError(
                    f"offset_table_owner {self.offset_table_owner!r} is not a role name (give it as in pg_roles)"
                )
        if self.signal_table is not None:
            try:
                TableRef.coerce(self.signal_table, self.NAMES)
            except CdcConfigurationError as exc:
                raise CdcConfigurationError(f"signal_table {self.signal_table!r} is invalid: {exc}") from None
        validate_watermarks(self.incremental_watermarks, self.signal_table_ref, default=self.DEFAULT_WATERMARKS)
        self.run_conf_signals = validate_run_conf_signals(self.run_conf_signals)
        if self.new_table_snapshot not in NEW_TABLE_SNAPSHOT:
            raise CdcConfigurationError(
                f"new_table_snapshot {self.new_table_snapshot!r} is not one of {', '.join(NEW_TABLE_SNAPSHOT)}"
            )
        self.capture_options()  # validates the tuning knobs
        self.event_settings()  # validates modes, patterns and masking rules

    # -- what each source supplies ---------------------------------------------------------------

    @abstractmethod
    def validate_source(self) -> None:
        """Check the source's own settings (connection id, slot names, ...) at DAG parse."""

    @property
    @abstractmethod
    def conn_id(self) -> str:
        """The Airflow connection of the source database."""

    @abstractmethod
    def position(self, text: str) -> Position:
        """A position the user typed (e.g. ``upto_lsn``), in the source's own text form."""

    def value_modes(self) -> ValueModes:
        """Debezium's handling modes (a source with more modes adds them)."""
        return ValueModes(
            decimal=self.decimal_handling_mode,
            time_precision=self.time_precision_mode,
            binary=self.binary_handling_mode,
        )

    def event_settings(self) -> EventSettings:
        """How the source's values become event values: handling modes and column rules."""
        if isinstance(self.column_include_list, str) or isinstance(self.column_exclude_list, str):
            raise CdcConfigurationError("column_include_list / column_exclude_list take a list of patterns")
        return EventSettings(
            modes=self.value_modes(),
            columns=ColumnRules.from_options(
                include=tuple(self.column_include_list),
                exclude=tuple(self.column_exclude_list),
                debezium_properties=self.column_masks,
                as_text=tuple(self.column_text_list),
            ),
        )

    def store(self) -> OffsetStore:
        """Where the offset lives: the given store, or an Airflow Variable (sources with their own
        stores extend this)."""
        if not isinstance(self.offset_store, str):
            return self.offset_store
        from airflow_provider_cdc.offsets.variable import VariableOffsetStore

        return VariableOffsetStore()

    @abstractmethod
    def setup(self, log: logging.Logger) -> dict[str, Any]:
        """Preflight (every problem in one error, nothing created before it passes), then create
        what the capture needs on the source, idempotently. Returns the setup task's summary."""

    @abstractmethod
    def open_run(self, log: logging.Logger) -> AbstractContextManager[SourceRun]:
        """One run's session with the source, holding the capture lock for its duration."""

    @abstractmethod
    def resolve_tables(self, conn: Any) -> tuple[TableRef, ...]:
        """The tables this capture reads now (explicit list or patterns against the catalog)."""

    def resolve_tables_now(self) -> tuple[TableRef, ...]:
        """The tables this capture reads now (opens a session only when patterns are used)."""
        if self.table_refs:
            return self.table_refs
        with self.hook().session() as conn:  # type: ignore[attr-defined]
            return self.resolve_tables(conn)

    @abstractmethod
    def readiness(self, sensor: Any, context: Any) -> Readiness:
        """Whether the next window can run (for :class:`CdcChangesSensor`; ``sensor`` carries its options)."""

    @abstractmethod
    def readiness_trigger(self, sensor: Any, context: Any) -> Any:
        """The trigger a deferrable sensor waits on (fires ``Readiness.to_event()``)."""

    @abstractmethod
    def connection_errors(self) -> tuple[type[BaseException], ...]:
        """The driver's errors for a session that died (a retry may succeed)."""

    # -- shared ----------------------------------------------------------------------------------

    def setup_problems(self) -> Problems:
        """Setup's list of problems (raised together at its end), starting with the sink's checks."""
        problems = Problems("setup")
        with problems.check():
            self.check_sink()
        return problems

    def check_column_rules(self, problems: Problems, tables: Iterable[Any], encoder: Callable[..., Any]) -> None:
        """Setup: column filters and masks that cannot apply to a described table, one problem each
        (``encoder``: the source's event encoder class, built as the job builds it)."""
        for table in tables:
            with problems.check():
                encoder(table, table.columns, self.event_settings())

    def check_stored_offset(self, problems: Problems, identity: OffsetIdentity | None) -> CaptureOffset | None:
        """Setup: the stored offset is readable and this capture's on this server (``identity``; None
        where the server could not be identified, a problem of its own). Returns the offset, or None
        when there is none or it is a problem."""
        store = self.store()
        with problems.check():
            stored = peek_offset(store, self.topic_prefix, self.OFFSET_TYPE)  # malformed, or another capture's
            if stored is not None and identity is not None:
                stored.check_identity(identity, source=store.describe(self.topic_prefix))
            return stored
        return None

    @property
    def streams(self) -> bool:
        """Does this capture stream changes (every snapshot mode but ``initial_only``)?"""
        return streams(self.snapshot_mode)

    @property
    def tables_known_at_parse(self) -> bool:
        """Are the captured tables known without asking the source (no include-list patterns)?"""
        return not self.table_include_list and bool(self.tables)

    @property
    def table_refs(self) -> tuple[TableRef, ...]:
        """The explicitly listed tables (empty when the capture uses table_include_list)."""
        return tuple(self.tables)  # type: ignore[arg-type]

    def incremental_unavailable(self) -> str | None:
        """Why this capture cannot run incremental snapshots as configured (None: it can)."""
        return None

    def retention_ms(self) -> int | None:
        """How long the source keeps unread changes for this capture, where it expires them by time
        (YugabyteDB's intent retention); None where retention is not a time (setup compares it with
        the DAG's schedule)."""
        return None

    @property
    def signal_table_ref(self) -> TableRef | None:
        return None if self.signal_table is None else TableRef.coerce(self.signal_table, self.NAMES)

    def capture_options(self) -> CaptureOptions:
        return CaptureOptions(
            max_changes_per_chunk=self.max_changes_per_chunk,
            snapshot_partition_bytes=self.snapshot_partition_bytes,
            snapshot_max_partitions=self.snapshot_max_partitions,
            idle_timeout_seconds=getattr(self, "idle_timeout_seconds", 300.0),
            window_reader=getattr(self, "window_reader", "auto"),
            decoding_work_mem_bytes=getattr(self, "decoding_work_mem_bytes", None),
            incremental_chunk_size=self.incremental_chunk_size,
            incremental_chunks_per_run=self.incremental_chunks_per_run,
            sink_format=self.sink_format,
            table_catalog=dict(self.table_catalog),
        )

    def check_sink(self) -> None:
        """Setup's sink checks: the path can hold the sink (on an object store: a probe object
        written and deleted) and the table format, if any, can be written."""
        from airflow_provider_cdc.cdc.sinks.lake_tables import check_table_sink_ready
        from airflow_provider_cdc.cdc.sinks.path_checks import check_writable
        from airflow_provider_cdc.cdc.sinks.storage import exposed_root

        check_writable(self.sink_path)
        exposed = exposed_root(self.sink_path)  # a warning, not a failure: sharing through a group may be intended
        if exposed:
            logging.getLogger(__name__).warning("%s", exposed)
        check_table_sink_ready(self.sink_format, self.catalog_properties())

    def object_store_access(self) -> ObjectStoreAccess | None:
        """The access ``object_store_conn_id`` gives (read now: at run time, never at parse);
        None without one (each library's default credential chain)."""
        if self.object_store_conn_id is None:
            return None
        from airflow_provider_cdc.captures.object_store_connection import object_store_access

        return object_store_access(self.object_store_conn_id)

    def run_options(self) -> CaptureOptions:
        """:meth:`capture_options` with the connections resolved (at run time: DAG parsing reads
        no connection): the Iceberg catalog's, and the object store's access. The operators make
        that access active for their run (``object_store.using``), so it is read once per task."""
        from dataclasses import replace

        from airflow_provider_cdc.cdc.sinks import object_store

        access = object_store.current() or self.object_store_access()
        return replace(self._catalog_options(), object_store=access)

    def _catalog_options(self) -> CaptureOptions:
        options = self.capture_options()
        if self.table_catalog_conn_id is None:
            return options
        from dataclasses import replace

        from airflow_provider_cdc.captures.table_catalog import catalog_connection

        properties, secret_property, secret = catalog_connection(self.table_catalog_conn_id)
        return replace(
            options,
            table_catalog={**properties, **dict(self.table_catalog)},
            table_catalog_secret_property=secret_property,
            table_catalog_secret=secret,
        )

    def catalog_properties(self) -> dict[str, str]:
        """The Iceberg catalog's properties for this process (with the connection's secret)."""
        return self._catalog_options().catalog_properties()

    def spark_options(self) -> SparkOptions:
        return SparkOptions(master=self.spark_master, conf=dict(self.spark_conf))

    def describe(self) -> dict[str, Any]:
        return {
            "topic_prefix": self.topic_prefix,
            "tables": [r.data_collection for r in self.table_refs] or {"include": list(self.table_include_list)},
            "snapshot_mode": self.snapshot_mode,
            "sink_path": self.sink_path,
            "sink_format": self.sink_format,
        }


def check_object_store_conn_id(conn_id: Any, sink_path: str) -> None:
    """``object_store_conn_id`` at DAG parse: a connection id, for a sink on S3 (an ``aws``
    connection says nothing to GCS or Azure, whose libraries take their own default credentials)."""
    if conn_id is None:
        return
    from airflow_provider_cdc.cdc.sinks.object_store import S3_SCHEMES, scheme_of

    if not isinstance(conn_id, str) or not conn_id.strip() or "{{" in conn_id:
        raise CdcConfigurationError(
            f"object_store_conn_id must be the id of an Airflow 'aws' connection, got {conn_id!r}"
        )
    if scheme_of(sink_path) not in S3_SCHEMES:
        raise CdcConfigurationError(
            f"object_store_conn_id {conn_id!r} is for a sink_path on S3 or an S3-compatible store "
            f"(s3://bucket/prefix), but sink_path is {sink_path!r}: remove object_store_conn_id, or put the "
            "sink on the store (GCS and Azure paths use their libraries' default credentials)"
        )
