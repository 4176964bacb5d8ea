"""One capture's configuration, shared by its setup, snapshot, window and sensor tasks.

Operators take a ``PostgresCapture`` instead of repeating twenty parameters each. It is
validated when the DAG file is parsed, without I/O and without importing Spark, so mistakes
(an invalid prefix, a misspelt snapshot mode, an unparsable table name) fail the DAG import
with a clear message rather than a task at 3 a.m.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_cdc.cdc.columns import ColumnRules
from airflow_provider_cdc.cdc.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.naming import validate_topic_prefix
from airflow_provider_cdc.cdc.sources.postgres.admin import PUBLICATION_MODES
from airflow_provider_cdc.cdc.sources.postgres.events import EventSettings
from airflow_provider_cdc.cdc.sources.postgres.offset import OffsetIdentity
from airflow_provider_cdc.cdc.sources.postgres.planning import validate_snapshot_mode
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from airflow_provider_cdc.cdc.sources.postgres.types import DEFAULT_PLACEHOLDER, ValueModes
from airflow_provider_cdc.cdc.spec import CaptureOptions, SparkOptions, validate_watermarks
from airflow_provider_cdc.offsets.base import OffsetStore

_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")
OFFSET_STORES = ("variable", "state_table")
#: A table that joins the capture after its snapshot: "incremental" snapshots it while capture
#: continues; "fail" stops the window until a full snapshot ran (the behaviour before 0.x).
NEW_TABLE_SNAPSHOT = ("incremental", "fail")


@dataclass
class PostgresCapture:
    """Configuration of one PostgreSQL capture. See docs/operators.md for every field."""

    postgres_conn_id: str
    tables: Sequence[str | TableRef] = ()
    topic_prefix: str = ""
    sink_path: str = ""
    # Debezium's table.include.list / table.exclude.list: regular expressions on schema.table,
    # resolved against the catalog by every task (instead of, or to filter, ``tables``).
    table_include_list: Sequence[str] = ()
    table_exclude_list: Sequence[str] = ()
    slot_name: str | None = None
    publication_name: str | None = None
    publication_autocreate_mode: str = "filtered"
    snapshot_mode: str = "initial"
    offset_store: str | OffsetStore = "variable"
    offset_table: str = "public.airflow_cdc_offsets"
    spark_conn_id: str | None = None
    spark_master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    spark_application: str | None = None
    max_changes_per_chunk: int = 100_000
    snapshot_partition_bytes: int = 256 * 1024 * 1024
    snapshot_max_partitions: int = 64
    idle_timeout_seconds: float = 300.0
    # How long a run waits for a slot still held by a reader (a just-killed run's walsender).
    slot_release_timeout_seconds: float = 30.0
    # SQL run (in its own transaction) before each stream window fixes its end, so its changes
    # land in that window: Debezium's heartbeat.action.query (e.g. an UPDATE of a captured
    # heartbeat table, or SELECT pg_logical_emit_message(true, 'heartbeat', now()::text)).
    heartbeat_action_query: str | None = None
    # Value representation (Debezium's handling modes; "spark" time types by default).
    decimal_handling_mode: str = "precise"
    time_precision_mode: str = "spark"
    binary_handling_mode: str = "bytes"
    hstore_handling_mode: str = "json"
    interval_handling_mode: str = "numeric"
    unavailable_value_placeholder: str = DEFAULT_PLACEHOLDER
    # Column selection and masking (Debezium's column.* options).
    column_include_list: Sequence[str] = ()
    column_exclude_list: Sequence[str] = ()
    column_masks: Mapping[str, str] = field(default_factory=dict)
    column_text_list: Sequence[str] = ()
    message_prefix_include_list: Sequence[str] = ()
    message_prefix_exclude_list: Sequence[str] = ()
    # Incremental snapshots (docs/incremental.md): Debezium's signal.data.collection (a table with
    # columns id, type, data whose inserts are read from the stream), chunking, watermarks, and
    # what happens to a table that joins the capture after its snapshot.
    signal_table: str | TableRef | None = None
    incremental_chunk_size: int = 50_000
    incremental_chunks_per_run: int = 20
    incremental_watermarks: str = "message"
    new_table_snapshot: str = "incremental"

    def __post_init__(self) -> None:
        validate_topic_prefix(self.topic_prefix)
        validate_snapshot_mode(self.snapshot_mode)
        if self.publication_autocreate_mode not in PUBLICATION_MODES:
            raise CdcConfigurationError(
                f"publication_autocreate_mode {self.publication_autocreate_mode!r} is not one of "
                f"{', '.join(PUBLICATION_MODES)}"
            )
        for name in ("tables", "table_include_list", "table_exclude_list"):
            if isinstance(getattr(self, name), str):
                raise CdcConfigurationError(f"{name} must be a list, not one string")
        refs = tuple(TableRef.coerce(t) for t in self.tables)
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
        duplicates = sorted({str(r) for r in refs if refs.count(r) > 1})
        if duplicates:
            raise CdcConfigurationError(f"tables listed more than once: {', '.join(duplicates)}")
        self.tables = refs
        if not _SLOT_NAME.match(self.resolved_slot_name):
            raise CdcConfigurationError(
                f"slot_name {self.resolved_slot_name!r} is invalid: PostgreSQL slot names use only "
                "lower-case letters, digits and '_', at most 63 characters"
            )
        if not self.postgres_conn_id:
            raise CdcConfigurationError("postgres_conn_id is required")
        if not self.sink_path or not str(self.sink_path).strip():
            raise CdcConfigurationError("sink_path is required (a local directory or a Hadoop URI)")
        if self.heartbeat_action_query is not None and not str(self.heartbeat_action_query).strip():
            raise CdcConfigurationError("heartbeat_action_query is empty: give a SQL statement or None")
        if isinstance(self.offset_store, str) and self.offset_store not in OFFSET_STORES:
            raise CdcConfigurationError(
                f"offset_store {self.offset_store!r} is not one of {', '.join(OFFSET_STORES)} "
                "(or an OffsetStore instance)"
            )
        if self.offset_store == "state_table":
            try:
                TableRef.parse(self.offset_table)
            except CdcConfigurationError as exc:
                raise CdcConfigurationError(f"offset_table {self.offset_table!r} is invalid: {exc}") from None
        if self.signal_table is not None:
            try:
                TableRef.coerce(self.signal_table)
            except CdcConfigurationError as exc:
                raise CdcConfigurationError(f"signal_table {self.signal_table!r} is invalid: {exc}") from None
        validate_watermarks(self.incremental_watermarks, self.signal_table_ref)
        if self.new_table_snapshot not in NEW_TABLE_SNAPSHOT:
            raise CdcConfigurationError(
                f"new_table_snapshot {self.new_table_snapshot!r} is not one of {', '.join(NEW_TABLE_SNAPSHOT)}"
            )
        self.capture_options()  # validates the tuning knobs
        self.event_settings()  # validates modes, patterns and masking rules

    @property
    def table_refs(self) -> tuple[TableRef, ...]:
        """The explicitly listed tables (empty when the capture uses table_include_list)."""
        return tuple(self.tables)  # type: ignore[arg-type]

    def resolve_tables(self, conn) -> tuple[TableRef, ...]:
        """The tables this capture reads now (explicit list or patterns against the catalog)."""
        from airflow_provider_cdc.cdc.sources.postgres.admin import resolve_tables

        return resolve_tables(conn, self.table_refs, self.table_include_list, self.table_exclude_list)

    @property
    def signal_table_ref(self) -> TableRef | None:
        return None if self.signal_table is None else TableRef.coerce(self.signal_table)

    @property
    def resolved_slot_name(self) -> str:
        return self.slot_name or f"cdc_{self.topic_prefix.lower()}"[:63]

    @property
    def resolved_publication_name(self) -> str:
        return self.publication_name or f"cdc_{self.topic_prefix.lower()}"

    def identity(self, system_identifier: str, database: str) -> OffsetIdentity:
        return OffsetIdentity(self.topic_prefix, system_identifier, database, self.resolved_slot_name)

    def store(self) -> OffsetStore:
        if not isinstance(self.offset_store, str):
            return self.offset_store
        if self.offset_store == "state_table":
            from airflow_provider_cdc.offsets.state_table import PostgresStateTableOffsetStore

            return PostgresStateTableOffsetStore(self.postgres_conn_id, self.offset_table)
        from airflow_provider_cdc.offsets.variable import VariableOffsetStore

        return VariableOffsetStore()

    def capture_options(self) -> CaptureOptions:
        return CaptureOptions(
            max_changes_per_chunk=self.max_changes_per_chunk,
            snapshot_partition_bytes=self.snapshot_partition_bytes,
            snapshot_max_partitions=self.snapshot_max_partitions,
            idle_timeout_seconds=self.idle_timeout_seconds,
            incremental_chunk_size=self.incremental_chunk_size,
            incremental_chunks_per_run=self.incremental_chunks_per_run,
        )

    def event_settings(self) -> EventSettings:
        if isinstance(self.column_include_list, str) or isinstance(self.column_exclude_list, str):
            raise CdcConfigurationError("column_include_list / column_exclude_list take a list of patterns")
        return EventSettings(
            modes=ValueModes(
                decimal=self.decimal_handling_mode,
                time_precision=self.time_precision_mode,
                binary=self.binary_handling_mode,
                hstore=self.hstore_handling_mode,
                interval=self.interval_handling_mode,
                unavailable_value_placeholder=self.unavailable_value_placeholder,
            ),
            columns=ColumnRules.from_options(
                include=tuple(self.column_include_list),
                exclude=tuple(self.column_exclude_list),
                debezium_properties=self.column_masks,
                as_text=tuple(self.column_text_list),
            ),
            message_prefix_include=tuple(self.message_prefix_include_list),
            message_prefix_exclude=tuple(self.message_prefix_exclude_list),
        )

    def spark_options(self) -> SparkOptions:
        return SparkOptions(master=self.spark_master, conf=dict(self.spark_conf))

    def describe(self) -> dict[str, Any]:
        return {
            "topic_prefix": self.topic_prefix,
            "slot": self.resolved_slot_name,
            "publication": self.resolved_publication_name,
            "tables": [r.data_collection for r in self.table_refs] or {"include": list(self.table_include_list)},
            "snapshot_mode": self.snapshot_mode,
            "sink_path": self.sink_path,
        }
