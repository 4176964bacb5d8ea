"""The job spec of a PostgreSQL window: everything its Spark job needs, as one JSON-able value.

The operator builds it, the job runs it, in-process or through ``spark-submit`` (then written
to a file). It never contains the password: :class:`PgConnectionInfo` leaves it out of
``to_dict`` and the job reads it from the environment variable the spec names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.gaps import CaptureGap
from airflow_provider_cdc.cdc.planning.incremental import IncrementalState
from airflow_provider_cdc.cdc.planning.spec import (
    CaptureOptions,
    SparkOptions,
    check_common,
    common_from_json,
    common_to_dict,
)
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo
from airflow_provider_cdc.cdc.sources.postgres.events import EventSettings
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn, lsn_or_none


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
    default_watermarks = "message"

    def __post_init__(self) -> None:
        check_common(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            **common_to_dict(self),
            "connection": self.connection.to_dict(),
            "slot_name": self.slot_name,
            "publication_name": self.publication_name,
            "previous_commit_lsn": None if self.previous_commit_lsn is None else int(self.previous_commit_lsn),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> PostgresJobSpec:
        data, common = common_from_json(text, cls.connector, "PostgreSQL")
        return cls(
            **common,
            connection=PgConnectionInfo.from_dict(data["connection"]),
            slot_name=data["slot_name"],
            publication_name=data["publication_name"],
            previous_commit_lsn=lsn_or_none(data.get("previous_commit_lsn")),
        )
