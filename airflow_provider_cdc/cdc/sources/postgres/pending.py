"""Is there something to capture? The decision shared by the sensor and its trigger."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_cdc.cdc.basics.readiness import Readiness

if TYPE_CHECKING:  # annotations only: admin (psycopg, pyarrow) is not loaded when a DAG file is parsed
    from airflow_provider_cdc.cdc.sources.postgres.slots import SlotStatus


def slot_readiness(status: SlotStatus | None, slot_name: str, min_pending_bytes: int) -> Readiness:
    """Fail on a missing or lost slot; ready once at least ``min_pending_bytes`` are pending."""
    if status is None:
        return Readiness(
            "failed",
            f"replication slot {slot_name!r} does not exist: run the capture's setup task, and "
            "re-snapshot if it existed before (changes since it was dropped are lost)",
        )
    if status.wal_lost:
        return Readiness(
            "failed",
            f"replication slot {slot_name!r} lost its WAL (wal_status 'lost'): changes are gone; "
            "re-snapshot with snapshot_mode='when_needed'",
        )
    pending = status.pending_bytes or 0
    if pending >= min_pending_bytes:
        return Readiness("ready", f"{pending} bytes of WAL pending on slot {slot_name!r}", pending)
    return Readiness("waiting", f"{pending} bytes pending on slot {slot_name!r} (< {min_pending_bytes})", pending)
