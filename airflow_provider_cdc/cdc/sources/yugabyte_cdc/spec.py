"""The job spec of a CDC-service stream window: everything its job needs, as one JSON-able value.

Common fields come from :mod:`cdc.planning.spec`; the source's own are the cluster's master addresses,
the DB stream id, the database name (``source.db``), the window's start tablet positions (the
offset's tablet checkpoints, :class:`~.checkpoints.TabletCheckpoints`), the previous window's last
commit hybrid time (the first event's ``source.sequence``), the stream's record type when the
planner already knows it, TLS options and the ``GetChanges`` frame cap. TLS options are file
paths and switches only: no key material, no password is ever in a spec. ``tls`` is TLS, verified,
unless it is None: plaintext, which only the connection's explicit ``rpc_sslmode=disable`` gives
(JSON ``null``; a spec without the key gets the default, TLS).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
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
from airflow_provider_cdc.cdc.sources.postgres.events import EventSettings
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.addresses import parse_addresses
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import TabletCheckpoints
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.offset import CONNECTOR
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import methods
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import DEFAULT_TLS, TlsOptions


@dataclass(frozen=True)
class YbCdcJobSpec:
    topic_prefix: str
    master_addresses: str  # "host:port,host:port" (the connector's database.master.addresses)
    stream_id: str
    database: str
    tables: tuple[TableRef, ...]
    window: Window
    sink_path: str
    tablets: TabletCheckpoints = field(default_factory=TabletCheckpoints)  # where each tablet starts
    previous_commit_ht: int | None = None
    record_type: str | None = None  # CDCRecordType name; None: asked from the stream
    # The captured tables' YB ids (from the YSQL catalog): the snapshot then touches only their
    # tablets. Empty: learnt from one tablet of each stream table (every stream table is probed).
    table_ids: tuple[tuple[TableRef, str], ...] = ()
    tls: TlsOptions | None = DEFAULT_TLS  # None: plaintext (rpc_sslmode=disable)
    get_changes_max_bytes: int = methods.GET_CHANGES_MAX_BYTES
    options: CaptureOptions = field(default_factory=CaptureOptions)
    spark: SparkOptions = field(default_factory=SparkOptions)
    events: EventSettings = field(default_factory=EventSettings)
    gap: CaptureGap | None = None
    incremental: IncrementalState | None = None
    signal_table: TableRef | None = None
    incremental_watermarks: str = "insert_insert"
    run: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None

    connector = CONNECTOR
    default_watermarks = "insert_insert"

    def __post_init__(self) -> None:
        check_common(self)
        parse_addresses(self.master_addresses)  # fails early on a malformed list
        if not self.stream_id:
            raise CdcConfigurationError("no DB stream id")
        if self.record_type is not None and self.record_type not in pb.CDCRecordType.DESCRIPTOR.values_by_name:
            raise CdcConfigurationError(f"unknown CDC record type {self.record_type!r}")

    @property
    def record_type_value(self) -> int | None:
        return None if self.record_type is None else pb.CDCRecordType.Value(self.record_type)

    def to_dict(self) -> dict[str, Any]:
        return {
            **common_to_dict(self),
            "master_addresses": self.master_addresses,
            "stream_id": self.stream_id,
            "database": self.database,
            "tablets": self.tablets.to_json(),
            "previous_commit_ht": self.previous_commit_ht,
            "record_type": self.record_type,
            "table_ids": [[*ref.to_json(), table_id] for ref, table_id in self.table_ids],
            "tls": None if self.tls is None else asdict(self.tls),
            "get_changes_max_bytes": self.get_changes_max_bytes,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> YbCdcJobSpec:
        data, common = common_from_json(text, cls.connector, "YugabyteDB CDC-service", cls.default_watermarks)
        tls = data.get("tls", asdict(DEFAULT_TLS))
        return cls(
            **common,
            master_addresses=data["master_addresses"],
            stream_id=data["stream_id"],
            database=data["database"],
            tablets=TabletCheckpoints.from_json(data.get("tablets")),
            previous_commit_ht=data.get("previous_commit_ht"),
            record_type=data.get("record_type"),
            table_ids=tuple(
                (TableRef(schema, name), table_id) for schema, name, table_id in data.get("table_ids") or ()
            ),
            tls=None if tls is None else TlsOptions(**tls),
            get_changes_max_bytes=int(data.get("get_changes_max_bytes") or methods.GET_CHANGES_MAX_BYTES),
        )


__all__ = ["YbCdcJobSpec"]
