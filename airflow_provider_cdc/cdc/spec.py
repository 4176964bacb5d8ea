"""The job spec: everything a Spark job needs to move one window, as one JSON-able value.

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
from airflow_provider_cdc.cdc.naming import validate_topic_prefix
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo
from airflow_provider_cdc.cdc.sources.postgres.events import EventSettings
from airflow_provider_cdc.cdc.sources.postgres.incremental import WATERMARK_MODES, IncrementalState
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn, lsn_or_none
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from airflow_provider_cdc.cdc.window import Window

SPEC_FORMAT = 1


@dataclass(frozen=True)
class CaptureOptions:
    """Tuning knobs of a run (see docs/operators.md)."""

    max_changes_per_chunk: int = 100_000
    snapshot_partition_bytes: int = 256 * 1024 * 1024
    snapshot_max_partitions: int = 64
    idle_timeout_seconds: float = 300.0
    incremental_chunk_size: int = 50_000
    incremental_chunks_per_run: int = 20

    def __post_init__(self) -> None:
        for name, minimum, unit in (
            ("max_changes_per_chunk", 1, ""),
            ("incremental_chunk_size", 1, ""),
            ("incremental_chunks_per_run", 1, ""),
            ("snapshot_partition_bytes", 1024 * 1024, " (1 MiB)"),
            ("snapshot_max_partitions", 1, ""),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
                raise CdcConfigurationError(f"{name} must be a number of at least {minimum}{unit}, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaptureOptions:
        return cls(**data)


@dataclass(frozen=True)
class SparkOptions:
    """How the embedded (in-process) Spark session is built; ignored under ``spark-submit``."""

    master: str = "local[*]"
    conf: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"master": self.master, "conf": dict(self.conf)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SparkOptions:
        return cls(master=data.get("master", "local[*]"), conf=dict(data.get("conf") or {}))


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


def validate_watermarks(mode: str, signal_table: TableRef | None) -> None:
    if mode not in WATERMARK_MODES:
        raise CdcConfigurationError(f"incremental_watermarks {mode!r} is not one of {', '.join(WATERMARK_MODES)}")
    if mode != "message" and signal_table is None:
        raise CdcConfigurationError(
            f"incremental_watermarks={mode!r} writes watermark rows into the signal table: set signal_table"
        )


@dataclass(frozen=True)
class StateJobSpec:
    """A current-state job: fold committed windows of some topics into state tables."""

    topic_prefix: str
    sink_path: str
    state_path: str
    topics: tuple[tuple[str, str], ...]  # (topic name, directory)
    as_of_seq: int | None = None
    spark: SparkOptions = field(default_factory=SparkOptions)

    job = "current_state"

    def __post_init__(self) -> None:
        validate_topic_prefix(self.topic_prefix)
        if not self.topics:
            raise CdcConfigurationError("no tables to build state for")

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": SPEC_FORMAT,
                "job": self.job,
                "topic_prefix": self.topic_prefix,
                "sink_path": self.sink_path,
                "state_path": self.state_path,
                "topics": [list(t) for t in self.topics],
                "as_of_seq": self.as_of_seq,
                "spark": self.spark.to_dict(),
            },
            sort_keys=True,
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> StateJobSpec:
        data = json.loads(text)
        if data.get("job") != cls.job:
            raise CdcConfigurationError(f"not a current-state job spec: job={data.get('job')!r}")
        return cls(
            topic_prefix=data["topic_prefix"],
            sink_path=data["sink_path"],
            state_path=data["state_path"],
            topics=tuple((t[0], t[1]) for t in data["topics"]),
            as_of_seq=data.get("as_of_seq"),
            spark=SparkOptions.from_dict(data.get("spark") or {}),
        )


def job_kind(text: str) -> str:
    """Which job a spec file describes: ``"window"`` or ``"current_state"``."""
    return json.loads(text).get("job", "window")
