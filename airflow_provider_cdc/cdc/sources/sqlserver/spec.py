"""The job spec of a SQL Server window: everything its job needs, as one JSON-able value.

It never contains the password: :class:`SqlServerConnectionInfo` leaves it out of ``to_dict``
and the job reads it from the environment variable the spec names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.settings import EventSettings
from airflow_provider_cdc.cdc.planning.gaps import CaptureGap
from airflow_provider_cdc.cdc.planning.incremental import IncrementalState
from airflow_provider_cdc.cdc.planning.spec import (
    CaptureOptions,
    SparkOptions,
    check_common,
    common_from_json,
    common_to_dict,
)
from airflow_provider_cdc.cdc.sources.sqlserver.connection import SqlServerConnectionInfo

#: How change rows are read: Debezium's ``data.query.mode``.
DATA_QUERY_MODES = ("function", "direct")
#: Debezium's ``snapshot.isolation.mode`` values this capture supports (docs/sqlserver.md).
SNAPSHOT_ISOLATION_MODES = ("snapshot", "read_committed")
#: Incremental snapshot watermarks on SQL Server: rows in the signal table (no logical messages).
SQLSERVER_WATERMARKS = ("insert_insert", "insert_delete")


@dataclass(frozen=True)
class SqlServerJobSpec:
    topic_prefix: str
    connection: SqlServerConnectionInfo
    tables: tuple[TableRef, ...]
    window: Window
    sink_path: str
    options: CaptureOptions = field(default_factory=CaptureOptions)
    spark: SparkOptions = field(default_factory=SparkOptions)
    events: EventSettings = field(default_factory=EventSettings)
    gap: CaptureGap | None = None  # a re-snapshot after lost changes records why
    incremental: IncrementalState | None = None  # the running incremental snapshot (stream windows)
    signal_table: TableRef | None = None  # Debezium's signal.data.collection (CDC-enabled)
    incremental_watermarks: str = "insert_insert"
    # How long a stream job waits for the capture job to capture its chunks' watermark rows.
    incremental_watermark_wait_seconds: float = 120.0
    data_query_mode: str = "direct"
    snapshot_isolation_mode: str = "snapshot"
    server_time_zone: str = "UTC"  # how to read cdc.lsn_time_mapping's local times
    # Capture instances earlier windows read: one of these whose oldest change moved past the
    # window's start lost changes to the cleanup job (a new one simply starts where it starts).
    known_instances: tuple[str, ...] = ()
    # Their start_lsn when a window first saw them: one still there has purged nothing (a new
    # instance on a quiet database starts above the capture job's newest LSN, and that is no loss).
    known_starts: dict[str, str] = field(default_factory=dict)
    run: dict[str, Any] | None = None  # the scheduler run that planned the window (backfills)
    checkpoint: dict[str, Any] | None = None  # the offset it was planned from (restores a lost offset)

    connector = "sqlserver"
    default_watermarks = "insert_insert"

    def __post_init__(self) -> None:
        check_common(self)
        validate_sqlserver_modes(self.data_query_mode, self.snapshot_isolation_mode, self.incremental_watermarks)

    def to_dict(self) -> dict[str, Any]:
        return {
            **common_to_dict(self),
            "connection": self.connection.to_dict(),
            "incremental_watermark_wait_seconds": self.incremental_watermark_wait_seconds,
            "data_query_mode": self.data_query_mode,
            "snapshot_isolation_mode": self.snapshot_isolation_mode,
            "server_time_zone": self.server_time_zone,
            "known_instances": list(self.known_instances),
            "known_starts": dict(self.known_starts),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> SqlServerJobSpec:
        data, common = common_from_json(text, cls.connector, "SQL Server", cls.default_watermarks)
        return cls(
            **common,
            connection=SqlServerConnectionInfo.from_dict(data["connection"]),
            incremental_watermark_wait_seconds=float(data.get("incremental_watermark_wait_seconds", 120.0)),
            data_query_mode=data.get("data_query_mode", "direct"),
            snapshot_isolation_mode=data.get("snapshot_isolation_mode", "snapshot"),
            server_time_zone=data.get("server_time_zone", "UTC"),
            known_instances=tuple(data.get("known_instances") or ()),
            known_starts=dict(data.get("known_starts") or {}),
        )


def validate_sqlserver_modes(data_query_mode: str, snapshot_isolation_mode: str, watermarks: str) -> None:
    """The SQL Server choices, checked the same way at DAG parse (the capture) and in the job."""
    if data_query_mode not in DATA_QUERY_MODES:
        raise CdcConfigurationError(f"data_query_mode {data_query_mode!r} is not one of {', '.join(DATA_QUERY_MODES)}")
    if snapshot_isolation_mode not in SNAPSHOT_ISOLATION_MODES:
        raise CdcConfigurationError(
            f"snapshot_isolation_mode {snapshot_isolation_mode!r} is not one of {', '.join(SNAPSHOT_ISOLATION_MODES)}"
        )
    if watermarks not in SQLSERVER_WATERMARKS:
        raise CdcConfigurationError(
            f"incremental_watermarks {watermarks!r} is not available on SQL Server (it has no logical messages): "
            f"use one of {', '.join(SQLSERVER_WATERMARKS)}, rows written into the signal table"
        )
