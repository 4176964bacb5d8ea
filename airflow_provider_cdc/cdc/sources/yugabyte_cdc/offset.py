"""The stored offset of a YugabyteDB CDC-service capture (the document is the core's, :mod:`cdc.offset`).

Positions are commit hybrid times (:mod:`.position`). Key names follow the Debezium YugabyteDB
gRPC connector where it has the concept (``YugabyteDBOffsetContext``, ``SourceInfo``): ``txId``,
``ts_usec``, ``commit_time`` (the last captured transaction's commit hybrid time) and, per tablet,
``lsn`` (its ``OpId`` text, ``term:index:base64(key):write_id:time``); the next window's start is
``next_commit_ht`` and the snapshot's hybrid time ``snapshot_time`` (the name of the checkpoint
field that carries it). The identity pins the database: ``namespace_id`` is its YB id (what the
stream's ``GetCDCDBStreamInfo`` names) and ``database`` its name, so an offset of another database
is refused. The stream is not part of the identity: a stream that expired is replaced by a new
one, which the capture re-snapshots from (the lost-WAL policy); its id is source state
(``source_state.stream_id``), and a stream window refuses tablet checkpoints of another stream.

The tablets' checkpoints are the source's state the core carries from each window's commit-log
entry into the offset (``extra.source_state``, as SQL Server keeps its capture instances): a
window's job returns :func:`source_state` in its stats, so a roll-forward or a restore from the
commit log brings them back with the window that reached them, and they are never ahead of the
sink. :class:`YbCdcOffset` reads them as :class:`TabletCheckpoints`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import InvalidOffsetError
from airflow_provider_cdc.cdc.planning.offset import OFFSET_FORMAT, CaptureOffset, OffsetFormat, OffsetIdentity
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import TabletCheckpoints
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.position import CommitHt

CONNECTOR = "yugabytedb_grpc"
YB_CDC_OFFSET = OffsetFormat(
    connector=CONNECTOR,
    position=CommitHt,
    keys={
        "lsn": "next_commit_ht",
        "lsn_commit": "commit_time",
        "tx_id": "txId",
        "snapshot_lsn": "snapshot_time",
        "system_identifier": "namespace_id",
    },
    slot=False,
)
SOURCE_STATE = "source_state"
TABLETS = "tablets"
STREAM_ID = "stream_id"
LAST_READ_MS = "last_read_ms"

__all__ = [
    "CONNECTOR",
    "OFFSET_FORMAT",
    "YB_CDC_OFFSET",
    "OffsetIdentity",
    "YbCdcOffset",
    "source_state",
]


def source_state(tablets: TabletCheckpoints, *, stream_id: str, **extra: Any) -> dict[str, Any]:
    """What a window's job returns as ``stats["source_state"]``: the stream and the tablets where
    the next window starts (plus anything else the source keeps, e.g. when the stream was last read)."""
    return {**extra, STREAM_ID: stream_id, TABLETS: tablets.to_json()}


class YbCdcOffset(CaptureOffset):
    """A CDC-service capture's progress; positions are commit hybrid times."""

    FORMAT = YB_CDC_OFFSET

    @property
    def stream_id(self) -> str | None:
        """The stream the tablets' checkpoints belong to (None before the first window)."""
        value = (self.extra.get(SOURCE_STATE) or {}).get(STREAM_ID)
        return None if value is None else str(value)

    @property
    def last_read_ms(self) -> int | None:
        """When a window last read the stream (its expiry timer restarts on every read)."""
        value = (self.extra.get(SOURCE_STATE) or {}).get(LAST_READ_MS)
        return None if value is None else int(value)

    @property
    def last_commit_ht(self) -> int | None:
        """Commit hybrid time of the last captured transaction (``commit_time``)."""
        return None if self.lsn_commit is None else int(self.lsn_commit)

    @property
    def tablets(self) -> TabletCheckpoints:
        """The stream's tablets and where each resumes (empty before the first window)."""
        state = self.extra.get(SOURCE_STATE) or {}
        if not isinstance(state, dict):
            raise InvalidOffsetError(f"offset field 'extra.{SOURCE_STATE}' must be an object, got {state!r}")
        return TabletCheckpoints.from_json(state.get(TABLETS))

    def with_tablets(self, tablets: TabletCheckpoints, stream_id: str | None = None) -> YbCdcOffset:
        """This offset with ``tablets`` as the stream's checkpoints (other source state kept)."""
        state = dict(self.extra.get(SOURCE_STATE) or {})
        state[TABLETS] = tablets.to_json()
        if stream_id is not None:
            state[STREAM_ID] = stream_id
        return replace(self, extra={**self.extra, SOURCE_STATE: state})

    @classmethod
    def from_json(cls, text: str | bytes | dict, *, source: str = "offset store") -> YbCdcOffset:
        """The core's loader, plus a check that the tablet checkpoints parse (a malformed entry
        fails here, naming the store, rather than in the middle of a window)."""
        offset = super().from_json(text, source=source)
        try:
            offset.tablets  # noqa: B018 (parsed for its errors)
        except InvalidOffsetError as exc:
            raise InvalidOffsetError(f"{source}: {exc}") from None
        return offset
