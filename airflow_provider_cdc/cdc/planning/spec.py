"""The job spec: everything a Spark job needs to move one window, as one JSON-able value.

The operator builds it, the job runs it, in-process or through ``spark-submit`` (then written
to a file). It never contains the password: :class:`PgConnectionInfo` leaves it out of
``to_dict`` and the job reads it from the environment variable the spec names.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.naming import validate_topic_prefix
from airflow_provider_cdc.cdc.basics.spark_session import (
    DEFAULT_SPARK_MASTER as DEFAULT_SPARK_MASTER,  # the options a spec carries
)
from airflow_provider_cdc.cdc.basics.spark_session import SparkOptions
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.settings import EventSettings
from airflow_provider_cdc.cdc.planning.gaps import CaptureGap
from airflow_provider_cdc.cdc.planning.incremental import WATERMARK_MODES, IncrementalState
from airflow_provider_cdc.cdc.sinks.object_store import ObjectStoreAccess

SPEC_FORMAT = 1
#: Where a submitted job finds the Iceberg catalog's secret property (never in the spec file).
CATALOG_SECRET_ENV = "AIRFLOW_CDC_CATALOG_SECRET"


#: PostgreSQL captures' default ``decoding_work_mem_bytes``: a transaction of about a million
#: changes of a narrow table decodes without spilling (the server's default, 64 MB, holds ~250 k).
DEFAULT_DECODING_WORK_MEM_BYTES = 256 * 1024 * 1024
#: Its bounds: PostgreSQL's least logical_decoding_work_mem (64 kB), and under 2 GiB, which 32-bit
#: servers (MAX_KILOBYTES) and older ones on Windows (a 32-bit long in reorderbuffer.c) take; a
#: server or role set higher keeps its own value.
DECODING_WORK_MEM_BOUNDS = (64 * 1024, 2 * 1024**3 - 1024)


@dataclass(frozen=True)
class CaptureOptions:
    """How a run reads and writes: tuning knobs and the sink's table format (docs/operators.md)."""

    max_changes_per_chunk: int = 100_000
    snapshot_partition_bytes: int = 256 * 1024 * 1024
    snapshot_max_partitions: int = 64
    idle_timeout_seconds: float = 300.0
    # How a PostgreSQL stream window is read: auto | sql | stream (sources/postgres/sql_window.py).
    window_reader: str = "auto"
    # The least logical_decoding_work_mem of the sessions that decode a PostgreSQL window (None: the
    # server's as it is; a higher one is kept). Past it the server spills a transaction's changes to
    # disk and reads them back, half the decode rate of a large transaction (docs/architecture.md).
    # PostgreSQL captures set it (DEFAULT_DECODING_WORK_MEM_BYTES); a bare spec leaves the server's.
    decoding_work_mem_bytes: int | None = None
    incremental_chunk_size: int = 50_000
    incremental_chunks_per_run: int = 20
    sink_format: str = "parquet"  # parquet | iceberg | delta (cdc/sinks/formats.py)
    # Iceberg catalog properties (pyiceberg's); empty: a SQLite catalog beside the sink.
    table_catalog: dict[str, str] = field(default_factory=dict)
    # A secret catalog property (the password of table_catalog_conn_id): never serialized; a spec
    # written for spark-submit travels without it and the job reads it from CATALOG_SECRET_ENV.
    table_catalog_secret_property: str | None = None
    table_catalog_secret: str | None = field(default=None, repr=False, compare=False)
    # How to reach an object store under sink_path/state_path (object_store_conn_id): the spec
    # keeps its endpoint, region and addressing style; a submitted job reads its keys from
    # OBJECT_STORE_SECRET_ENV (cdc/sinks/object_store.py).
    object_store: ObjectStoreAccess | None = None

    def __post_init__(self) -> None:
        from airflow_provider_cdc.cdc.sinks.formats import check_sink_format

        check_sink_format(self.sink_format)
        if self.window_reader not in ("auto", "sql", "stream"):
            raise CdcConfigurationError(f"window_reader must be 'auto', 'sql' or 'stream', got {self.window_reader!r}")
        memory = self.decoding_work_mem_bytes
        low, high = DECODING_WORK_MEM_BOUNDS
        whole = isinstance(memory, int) and not isinstance(memory, bool)
        if memory is not None and not (whole and low <= memory <= high):
            raise CdcConfigurationError(
                f"decoding_work_mem_bytes must be None (the server's logical_decoding_work_mem as it is) or a "
                f"whole number of bytes from {low} (64 kB) to {high} (just under 2 GiB; a server or role set "
                f"higher keeps its own), got {memory!r}"
            )
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
        data = {**self.__dict__, "table_catalog": dict(self.table_catalog)}
        data.pop("table_catalog_secret")
        data.pop("object_store")
        if self.object_store is not None:
            data["object_store"] = self.object_store.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaptureOptions:
        data = dict(data)
        secret = os.environ.get(CATALOG_SECRET_ENV) if data.get("table_catalog_secret_property") else None
        store = data.pop("object_store", None)
        access = ObjectStoreAccess.from_env_dict(store) if store is not None else None
        return cls(**data, table_catalog_secret=secret, object_store=access)

    def catalog_properties(self) -> dict[str, str]:
        """The Iceberg catalog's properties, with the secret one when there is one."""
        props = dict(self.table_catalog)
        if self.table_catalog_secret_property and self.table_catalog_secret is not None:
            props[self.table_catalog_secret_property] = self.table_catalog_secret
        return props


def validate_watermarks(mode: str, signal_table: TableRef | None, *, default: str = "message") -> None:
    """``default``: the source's own default, which needs no signal table until one is used (on
    SQL Server, where every watermark is a signal-table row, incremental snapshots need one anyway)."""
    if mode not in WATERMARK_MODES:
        raise CdcConfigurationError(f"incremental_watermarks {mode!r} is not one of {', '.join(WATERMARK_MODES)}")
    if mode not in ("message", default) and signal_table is None:
        raise CdcConfigurationError(
            f"incremental_watermarks={mode!r} writes watermark rows into the signal table: set signal_table"
        )


#: The fields every source's window job spec has (see :func:`common_to_dict`).
COMMON_FIELDS = (
    "topic_prefix",
    "tables",
    "window",
    "sink_path",
    "options",
    "spark",
    "events",
    "gap",
    "incremental",
    "signal_table",
    "incremental_watermarks",
    "run",
    "checkpoint",
)


def common_to_dict(spec: Any) -> dict[str, Any]:
    """The JSON of the fields every window job spec has, with the format header."""
    return {
        "format": SPEC_FORMAT,
        "connector": spec.connector,
        "topic_prefix": spec.topic_prefix,
        "tables": [t.to_json() for t in spec.tables],
        "window": spec.window.to_dict(),
        "sink_path": spec.sink_path,
        "options": spec.options.to_dict(),
        "spark": spec.spark.to_dict(),
        "events": spec.events.to_dict(),
        "gap": None if spec.gap is None else spec.gap.to_dict(),
        "incremental": None if spec.incremental is None else spec.incremental.to_dict(),
        "signal_table": None if spec.signal_table is None else spec.signal_table.to_json(),
        "incremental_watermarks": spec.incremental_watermarks,
        "run": spec.run,
        "checkpoint": spec.checkpoint,
    }


def common_from_json(
    text: str, connector: str, source: str, default_watermarks: str = "message"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(the parsed JSON, the common fields' values)`` of a window job spec of ``connector``."""
    data = json.loads(text)
    if data.get("format") != SPEC_FORMAT or data.get("connector") != connector:
        raise CdcConfigurationError(
            f"not a {source} job spec of format {SPEC_FORMAT}: format={data.get('format')!r}, "
            f"connector={data.get('connector')!r}"
        )
    return data, {
        "topic_prefix": data["topic_prefix"],
        "tables": tuple(TableRef(*t) for t in data["tables"]),
        "window": Window.from_dict(data["window"]),
        "sink_path": data["sink_path"],
        "options": CaptureOptions.from_dict(data.get("options") or {}),
        "spark": SparkOptions.from_dict(data.get("spark") or {}),
        "events": EventSettings.from_dict(data.get("events") or {}),
        "gap": CaptureGap.from_dict(data["gap"]) if data.get("gap") else None,
        "incremental": IncrementalState.from_dict(data["incremental"]) if data.get("incremental") else None,
        "signal_table": TableRef(*data["signal_table"]) if data.get("signal_table") else None,
        "incremental_watermarks": data.get("incremental_watermarks", default_watermarks),
        "run": data.get("run"),
        "checkpoint": data.get("checkpoint"),
    }


def check_common(spec: Any) -> None:
    validate_topic_prefix(spec.topic_prefix)
    if not spec.tables:
        raise CdcConfigurationError("no tables to capture")
    validate_watermarks(spec.incremental_watermarks, spec.signal_table, default=spec.default_watermarks)


@dataclass(frozen=True)
class StateJobSpec:
    """A current-state job: fold committed windows of some topics into state tables."""

    topic_prefix: str
    sink_path: str
    state_path: str
    topics: tuple[tuple[str, str], ...]  # (topic name, directory)
    as_of_seq: int | None = None
    spark: SparkOptions = field(default_factory=SparkOptions)
    # The sink's table format; the state tables are kept in the same one (MERGE, time travel).
    sink_format: str = "parquet"
    table_catalog: dict[str, str] = field(default_factory=dict)  # the sink's Iceberg catalog, if any
    table_catalog_secret_property: str | None = None  # as in CaptureOptions
    table_catalog_secret: str | None = field(default=None, repr=False, compare=False)
    object_store: ObjectStoreAccess | None = None  # as in CaptureOptions
    # "spark", "arrow" (no JVM: state/arrow.py) or "auto" (Arrow for a small refresh, see there).
    state_engine: str = "spark"

    job = "current_state"

    def catalog_properties(self) -> dict[str, str]:
        props = dict(self.table_catalog)
        if self.table_catalog_secret_property and self.table_catalog_secret is not None:
            props[self.table_catalog_secret_property] = self.table_catalog_secret
        return props

    def __post_init__(self) -> None:
        from airflow_provider_cdc.cdc.sinks.formats import check_sink_format

        check_sink_format(self.sink_format)
        validate_topic_prefix(self.topic_prefix)
        if not self.topics:
            raise CdcConfigurationError("no tables to build state for")
        if self.state_engine not in ("auto", "arrow", "spark"):
            raise CdcConfigurationError(f"state_engine must be 'auto', 'arrow' or 'spark', not {self.state_engine!r}")

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
                **({"sink_format": self.sink_format} if self.sink_format != "parquet" else {}),
                **({"table_catalog": dict(self.table_catalog)} if self.table_catalog else {}),
                **({"table_catalog_secret_property": p} if (p := self.table_catalog_secret_property) else {}),
                **({"object_store": self.object_store.to_dict()} if self.object_store is not None else {}),
                **({"state_engine": self.state_engine} if self.state_engine != "spark" else {}),
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
            sink_format=data.get("sink_format", "parquet"),
            table_catalog=dict(data.get("table_catalog") or {}),
            table_catalog_secret_property=data.get("table_catalog_secret_property"),
            table_catalog_secret=(
                os.environ.get(CATALOG_SECRET_ENV) if data.get("table_catalog_secret_property") else None
            ),
            object_store=ObjectStoreAccess.from_env_dict(data["object_store"]) if data.get("object_store") else None,
            state_engine=data.get("state_engine", "spark"),
        )


def job_kind(text: str) -> str:
    """Which job a spec file describes: ``"window"`` or ``"current_state"``."""
    return json.loads(text).get("job", "window")
