"""The job spec of a SQL Server window: everything its job needs, as one JSON-able value.

It never contains the password: :class:`SqlServerConnectionInfo` leaves it out of ``to_dict``
and the job reads it from the environment variable the spec names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_cdc.cdc.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.event_settings import EventSettings
from airflow_provider_cdc.cdc.gaps import CaptureGap
from airflow_provider_cdc.cdc.naming import validate_topic_prefix
from airflow_provider_cdc.cdc.sources.sqlserver.connection import SqlServerConnectionInfo
from airflow_provider_cdc.cdc.spec import SPEC_FORMAT, CaptureOptions, SparkOptions
from airflow_provider_cdc.cdc.tables import TableRef
from airflow_provider_cdc.cdc.window import Window

#: How change rows are read: Debezium's ``data.query.mode``.
DATA_QUERY_MODES = ("function", "direct")
#: Debezium's ``snapshot.isolation.mode`` values this capture supports (docs/sqlserver.md).
SNAPSHOT_ISOLATION_MODES = ("snapshot", "read_committed")


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
    data_query_mode: str = "function"
    snapshot_isolation_mode: str = "snapshot"
    server_time_zone: str = "UTC"  # how to read cdc.lsn_time_mapping's local times
    # Capture instances earlier windows read: one of these whose oldest change moved past the
    # window's start lost changes to the cleanup job (a new one simply starts where it starts).
    known_instances: tuple[str, ...] = ()
    run: dict[str, Any] | None = None  # the scheduler run that planned the window (backfills)
    checkpoint: dict[str, Any] | None = None  # the offset it was planned from (restores a lost offset)

    connector = "sqlserver"

    def __post_init__(self) -> None:
        validate_topic_prefix(self.topic_prefix)
        if not self.tables:
            raise CdcConfigurationError("no tables to capture")
        if self.data_query_mode not in DATA_QUERY_MODES:
            raise CdcConfigurationError(
                f"data_query_mode {self.data_query_mode!r} is not one of {', '.join(DATA_QUERY_MODES)}"
            )
        if self.snapshot_isolation_mode not in SNAPSHOT_ISOLATION_MODES:
            raise CdcConfigurationError(
                f"snapshot_isolation_mode {self.snapshot_isolation_mode!r} is not one of "
                f"{', '.join(SNAPSHOT_ISOLATION_MODES)}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": SPEC_FORMAT,
            "connector": self.connector,
            "topic_prefix": self.topic_prefix,
            "connection": self.connection.to_dict(),
            "tables": [t.to_json() for t in self.tables],
            "window": self.window.to_dict(),
            "sink_path": self.sink_path,
            "options": self.options.to_dict(),
            "spark": self.spark.to_dict(),
            "events": self.events.to_dict(),
            "gap": None if self.gap is None else self.gap.to_dict(),
            "data_query_mode": self.data_query_mode,
            "snapshot_isolation_mode": self.snapshot_isolation_mode,
            "server_time_zone": self.server_time_zone,
            "known_instances": list(self.known_instances),
            "run": self.run,
            "checkpoint": self.checkpoint,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> SqlServerJobSpec:
        data = json.loads(text)
        if data.get("format") != SPEC_FORMAT or data.get("connector") != cls.connector:
            raise CdcConfigurationError(
                f"not a SQL Server job spec of format {SPEC_FORMAT}: format={data.get('format')!r}, "
                f"connector={data.get('connector')!r}"
            )
        return cls(
            topic_prefix=data["topic_prefix"],
            connection=SqlServerConnectionInfo.from_dict(data["connection"]),
            tables=tuple(TableRef(*t) for t in data["tables"]),
            window=Window.from_dict(data["window"]),
            sink_path=data["sink_path"],
            options=CaptureOptions.from_dict(data.get("options") or {}),
            spark=SparkOptions.from_dict(data.get("spark") or {}),
            events=EventSettings.from_dict(data.get("events") or {}),
            gap=CaptureGap.from_dict(data["gap"]) if data.get("gap") else None,
            data_query_mode=data.get("data_query_mode", "function"),
            snapshot_isolation_mode=data.get("snapshot_isolation_mode", "snapshot"),
            server_time_zone=data.get("server_time_zone", "UTC"),
            known_instances=tuple(data.get("known_instances") or ()),
            run=data.get("run"),
            checkpoint=data.get("checkpoint"),
        )
