"""DB streams and their per-tablet state (YB's ``cdc_state`` table, one row per stream and tablet).

A stream covers the tables of one database that had a primary key when it was created, with a
record type and a checkpoint type. A stream created with a consistent snapshot (one exported
PostgreSQL snapshot) has every tablet's stream start right after it.

The rows the master writes at creation (``xrepl_catalog_manager.cc`` ``PopulateCDCStateTable``):

* without a consistent snapshot: checkpoint -1.-1 (``OpId::Invalid``), ``active_time`` 0 and
  ``cdc_sdk_safe_time`` 0. With ``active_time`` 0 the tablet counts as expired
  (``CheckStreamActive``) until ``SetCDCCheckpoint`` sets it;
* with one (USE_SNAPSHOT): checkpoint the snapshot's op id, ``snapshot_key`` "" (a snapshot is
  to be taken), ``cdc_sdk_safe_time`` the snapshot time, ``active_time`` the creation time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

RECORD_TYPES = {
    "CHANGE": pb.CHANGE,
    "ALL": pb.ALL,
    "FULL_ROW_NEW_IMAGE": pb.FULL_ROW_NEW_IMAGE,
    "MODIFIED_COLUMNS_OLD_AND_NEW_IMAGES": pb.MODIFIED_COLUMNS_OLD_AND_NEW_IMAGES,
}

#: OpId::Invalid(): a cdc_state row nobody has set yet.
INVALID = (-1, -1)


def now_ms() -> float:
    return time.time() * 1000


@dataclass
class TabletState:
    """One ``cdc_state`` row."""

    start: tuple[int, int]  # op id the stream's changes start after (its snapshot point)
    checkpoint: tuple[int, int] = INVALID  # what the client set (explicitly, or by polling)
    snapshot_key: bytes | None = None  # set while a snapshot is in progress
    safe_time: int = 0
    active_ms: float = field(default_factory=now_ms)  # cdc_state.active_time; 0: never set
    polled: bool = False  # YB's last_replication_time is set
    expired: bool = False  # seen expired: its retention was released (until SetCDCCheckpoint)
    split_reported: bool = False
    last_sent: tuple | None = None  # the checkpoint the last response carried (schema cache)

    def holds(self) -> int:
        """The lowest op index this stream still needs on the tablet."""
        return self.checkpoint[1] if self.checkpoint[1] > 0 else self.start[1]


@dataclass
class Stream:
    stream_id: str
    namespace_id: str
    database: str
    table_ids: list[str]
    record_type: int
    checkpoint_type: str  # "EXPLICIT" | "IMPLICIT"
    snapshot_ht: int
    snapshot_name: str | None
    created_ht: int
    states: dict[str, TabletState] = field(default_factory=dict)
    consistent_snapshot: bool = True  # created with USE_SNAPSHOT (yb-admin's default here)

    def initial_state(self, start: tuple[int, int]) -> TabletState:
        """The ``cdc_state`` row the master writes for a tablet when the stream is created."""
        if not self.consistent_snapshot:
            return TabletState(start=start, active_ms=0)
        return TabletState(start=start, checkpoint=start, snapshot_key=b"", safe_time=self.snapshot_ht)

    def options(self) -> list[tuple[str, str]]:
        """CDCStreamInfoPB.options as ``yb-admin create_change_data_stream`` sets them."""
        return [
            ("id_type", "NAMESPACEID"),
            ("checkpoint_type", self.checkpoint_type),
            ("source_type", "CDCSDK"),
            ("record_format", "PROTO"),
            ("record_type", pb.CDCRecordType.Name(self.record_type)),
            ("state", "ACTIVE"),
        ]
