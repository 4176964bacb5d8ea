"""The job spec of a PostgreSQL window: everything its Spark job needs, as one JSON-able value.

The operator builds it, the job runs it, in-process or through ``spark-submit`` (then written
to a file). It never contains the password: :class:`PgConnectionInfo` leaves it out of
``to_dict`` and the job reads it from the environment variable the spec names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_cdc.cdc.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.gaps import CaptureGap
from airflow_provider_cdc.cdc.incremental import IncrementalState
from airflow_provider_cdc.cdc.naming import validate_topic_prefix
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo
from airflow_provider_cdc.cdc.sources.postgres.events import EventSettings
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn, lsn_or_none
from airflow_provider_cdc.cdc.spec import SPEC_FORMAT, CaptureOptions, SparkOptions, validate_watermarks
from airflow_provider_cdc.cdc.tables import TableRef
from airflow_provider_cdc.cdc.window import Window


@dataclass(frozen=True)
class PostgresJobSpec:
    topic_prefix: str
    connection: PgConnectionInfo
    slot_name: str
    publication_name: str
    tables: tuple[TableRef, ...]
    window: Window
    sink_path: str
    previous_commit_lsn: Lsn | None = None  # for Debezium's source.sequence of the first event
    options: CaptureOptions = field(default_factory=CaptureOptions)
    spark: SparkOptions = field(default_factory=SparkOptions)
    events: EventSettings = field(default_factory=EventSettings)
    gap: CaptureGap | None = None  # a re-snapshot after lost changes records why
    incremental: IncrementalState | None = None  # the running incremental snapshot (stream windows)
    signal_table: TableRef | None = None  # Debezium's signal.data.collection
    incremental_watermarks: str = "message"
    # The scheduler's run that planned the window (run_id, run_type, data interval in ms), kept in
    # the commit entry so a backfill of that interval can find what landed for it.
    run: dict[str, Any] | None = None
    # The capture's offset as stored with this window pending (without ``pending``/``revision``),
    # kept in the commit entry: the commit log alone restores a lost offset store.
    checkpoint: dict[str, Any] | None = None

    connector = "postgresql"

    def __post_init__(self) -> None:
        validate_topic_prefix(self.topic_prefix)
        if not self.tables:
            raise CdcConfigurationError("no tables to capture")
        validate_watermarks(self.incremental_watermarks, self.signal_table)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": SPEC_FORMAT,
            "connector": self.connector,
            "topic_prefix": self.topic_prefix,
            "connection": self.connection.to_dict(),
            "slot_name": self.slot_name,
            "publication_name": self.publication_name,
            "tables": [t.to_json() for t in self.tables],
            "window": self.window.to_dict(),
            "sink_path": self.sink_path,
            "previous_commit_lsn": None if self.previous_commit_lsn is None else int(self.previous_commit_lsn),
            "options": self.options.to_dict(),
            "spark": self.spark.to_dict(),
            "events": self.events.to_dict(),
            "gap": None if self.gap is None else self.gap.to_dict(),
            "incremental": None if self.incremental is None else self.incremental.to_dict(),
            "signal_table": None if self.signal_table is None else self.signal_table.to_json(),
            "incremental_watermarks": self.incremental_watermarks,
            "run": self.run,
            "checkpoint": self.checkpoint,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> PostgresJobSpec:
        data = json.loads(text)
        if data.get("format") != SPEC_FORMAT or data.get("connector") != cls.connector:
            raise CdcConfigurationError(
                f"not a PostgreSQL job spec of format {SPEC_FORMAT}: format={data.get('format')!r}, "
                f"connector={data.get('connector')!r}"
            )
        return cls(
            topic_prefix=data["topic_prefix"],
            connection=PgConnectionInfo.from_dict(data["connection"]),
            slot_name=data["slot_name"],
            publication_name=data["publication_name"],
            tables=tuple(TableRef(*t) for t in data["tables"]),
            window=Window.from_dict(data["window"]),
            sink_path=data["sink_path"],
            previous_commit_lsn=lsn_or_none(data.get("previous_commit_lsn")),
            options=CaptureOptions.from_dict(data.get("options") or {}),
            spark=SparkOptions.from_dict(data.get("spark") or {}),
            events=EventSettings.from_dict(data.get("events") or {}),
            gap=CaptureGap.from_dict(data["gap"]) if data.get("gap") else None,
            incremental=IncrementalState.from_dict(data["incremental"]) if data.get("incremental") else None,
            signal_table=TableRef(*data["signal_table"]) if data.get("signal_table") else None,
            incremental_watermarks=data.get("incremental_watermarks", "message"),
            run=data.get("run"),
            checkpoint=data.get("checkpoint"),
        )
