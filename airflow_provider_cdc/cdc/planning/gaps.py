"""Capture gaps: the explicit record that changes between two windows could not be captured.

When ``snapshot_mode='when_needed'`` re-snapshots because the slot was dropped, its WAL was
removed, or something else moved it past the stored offset (SQL Server: the cleanup job purged
change rows not yet read, or a capture instance was disabled), the changes between the last
committed window and the new snapshot are gone. The re-snapshot window then carries one row in
the ``<prefix>.capture_gap`` side table (and the same facts in its commit-log entry), so
consumers can see the discontinuity instead of trusting a history with a silent hole.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pyarrow loads when a gap is written, not when a DAG file is parsed
    import pyarrow as pa

#: PostgreSQL: the slot is gone, its WAL was removed, or it moved past the offset; SQL Server: the
#: cleanup job purged unread change rows, or a capture instance was disabled; YugabyteDB: the slot
#: was not read within the intent retention and expired.
GAP_REASONS = (
    "slot_missing",
    "wal_lost",
    "slot_ahead",
    "changes_purged",
    "instance_missing",
    "slot_expired",
    "slot_not_of_interest",  # ... its tables not polled within 4 h of its creation (the first window came late)
    "stream_missing",  # YugabyteDB CDC service: the stream was deleted
    "stream_expired",  # ... not read for cdc_intent_retention_ms
    "stream_replaced",  # ... a new stream replaces the one the checkpoints belong to
)


@cache
def gap_schema() -> pa.Schema:
    """The ``capture_gap`` side table's schema."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("window_id", pa.string(), nullable=False),
            pa.field("reason", pa.string(), nullable=False),
            pa.field("detail", pa.string(), nullable=False),
            pa.field("last_window_id", pa.string()),
            pa.field("last_lsn", pa.string()),
            pa.field("slot_confirmed_lsn", pa.string()),
            pa.field("wal_status", pa.string()),
            pa.field("detected_ts_ms", pa.int64(), nullable=False),
        ]
    )


def __getattr__(name: str) -> Any:  # GAP_SCHEMA, built on first use
    if name == "GAP_SCHEMA":
        return gap_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class CaptureGap:
    """Why a re-snapshot was needed, and where the captured history stops before it."""

    reason: str  # one of GAP_REASONS
    detail: str
    last_window_id: str | None  # last window committed before the gap
    last_lsn: str | None  # stored offset: everything before it was captured
    slot_confirmed_lsn: str | None
    wal_status: str | None
    detected_ts_ms: int

    def __post_init__(self) -> None:
        if self.reason not in GAP_REASONS:
            raise ValueError(f"unknown gap reason {self.reason!r}")

    @classmethod
    def of(
        cls,
        decision: Any,
        offset: Any,
        now_ms: int,
        *,
        slot_confirmed_lsn: Any = None,
        wal_status: str | None = None,
    ) -> CaptureGap:
        """The gap a snapshot ``decision`` (with its ``gap_reason``) records after ``offset`` (the
        stored one, or None), with what the source can say about its reader."""
        from airflow_provider_cdc.cdc.basics.window import window_id_for

        if decision.gap_reason is None:
            raise TypeError("CaptureGap.of takes a snapshot decision that records a gap (gap_reason is None)")
        return cls(
            reason=decision.gap_reason,
            detail=decision.reason,
            last_window_id=None if offset is None or not offset.window_seq else window_id_for(offset.window_seq),
            last_lsn=None if offset is None or offset.lsn is None else str(offset.lsn),
            slot_confirmed_lsn=None if slot_confirmed_lsn is None else str(slot_confirmed_lsn),
            wal_status=wal_status,
            detected_ts_ms=now_ms,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaptureGap:
        return cls(**data)

    def to_batch(self, window_id: str) -> pa.RecordBatch:
        import pyarrow as pa

        return pa.RecordBatch.from_pylist([{"window_id": window_id, **self.to_dict()}], schema=gap_schema())
