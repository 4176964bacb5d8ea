"""Planning a PostgreSQL capture's run: the core's planning (:mod:`cdc.planning`) plus the slot.

The slot is the third record of progress (after the sink's commit log and the offset): every
run acknowledges it last, with ``pg_replication_slot_advance``.

==========================  ==================================================================
state found at run start    action
==========================  ==================================================================
slot behind offset          crash before the acknowledgement: acknowledge now, then continue
slot ahead of offset        something else consumed or advanced the slot: fail (data skipped)
slot missing / WAL lost     fail, or re-snapshot when ``snapshot_mode='when_needed'``
==========================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Callable

from airflow_provider_cdc.cdc.basics.errors import OffsetMismatchError, SlotMissingError, WalLostError
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning import plan as core
from airflow_provider_cdc.cdc.planning.plan import (
    SNAPSHOT_MODES,
    Reconciled,
    SnapshotDecision,
    StreamPlan,
    checkpoint,
    streams,
    validate_snapshot_mode,
)
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.offset import OffsetIdentity, PostgresOffset
from airflow_provider_cdc.cdc.sources.postgres.slots import SlotStatus

__all__ = [
    "SNAPSHOT_MODES",
    "Reconciled",
    "SnapshotDecision",
    "StreamPlan",
    "check_slot_not_ahead",
    "checkpoint",
    "decide_snapshot",
    "offset_after_commit",
    "plan_snapshot_window",
    "plan_stream_window",
    "reconcile",
    "restore_from_log",
    "slot_unavailable",
    "streams",
    "validate_snapshot_mode",
]


def reconcile(
    offset: PostgresOffset | None,
    last_commit: CommitEntry | None,
    identity: OffsetIdentity,
    *,
    source: str = "offset store",
    committed: Callable[[], list[CommitEntry]] | None = None,
) -> Reconciled:
    """:func:`cdc.planning.reconcile` for PostgreSQL offsets."""
    return core.reconcile(offset, last_commit, identity, offset_type=PostgresOffset, source=source, committed=committed)


def restore_from_log(
    last_commit: CommitEntry,
    identity: OffsetIdentity,
    committed: Callable[[], list[CommitEntry]] | None = None,
) -> PostgresOffset:
    return core.restore_from_log(last_commit, identity, committed, offset_type=PostgresOffset)


def offset_after_commit(offset: PostgresOffset | None, entry: CommitEntry, identity: OffsetIdentity) -> PostgresOffset:
    return core.offset_after_commit(offset, entry, identity, offset_type=PostgresOffset)


def slot_unavailable(offset: PostgresOffset | None, slot: SlotStatus | None) -> tuple[str, str] | None:
    """Can the slot still deliver the changes after the stored offset? ``(gap reason, why)`` if not."""
    if slot is None:
        return "slot_missing", "the replication slot is missing"
    if slot.wal_lost:
        return "wal_lost", "the slot's WAL was removed"
    if (
        offset is not None
        and offset.lsn is not None
        and slot.confirmed_flush_lsn is not None
        and slot.confirmed_flush_lsn > offset.lsn
    ):
        return "slot_ahead", f"the slot ({slot.confirmed_flush_lsn}) moved past the stored offset ({offset.lsn})"
    return None


def decide_snapshot(mode: str, offset: PostgresOffset | None, slot: SlotStatus | None) -> SnapshotDecision:
    """Debezium's snapshot modes, for one run of the snapshot task."""
    return core.decide_snapshot(mode, offset, slot_unavailable(offset, slot))


def check_slot_not_ahead(slot: SlotStatus, offset: PostgresOffset) -> None:
    """Fail when the slot was acknowledged past the stored offset (changes were skipped)."""
    confirmed = slot.confirmed_flush_lsn
    if confirmed is not None and offset.lsn is not None and confirmed > offset.lsn:
        raise OffsetMismatchError(
            f"replication slot {slot.slot_name!r} is confirmed up to {confirmed}, past the stored "
            f"offset {offset.lsn}: something else consumed or advanced the slot, and the changes in "
            "between were never captured. Re-snapshot (snapshot_mode='when_needed' or 'always') or, "
            "if you know nothing was lost, set the offset's lsn to the slot's position."
        )


def plan_stream_window(
    *,
    mode: str,
    offset: PostgresOffset | None,
    slot: SlotStatus,
    identity: OffsetIdentity,
    target: Lsn,
    current_lsn: Lsn,
    now_ms: int,
    notes: tuple[str, ...] = (),
) -> StreamPlan:
    """Plan the next stream window after :func:`reconcile`; ``target`` is fixed at run start."""
    validate_snapshot_mode(mode)
    notes_list = list(notes)
    if slot.wal_lost:
        raise WalLostError(
            f"replication slot {slot.slot_name!r} has wal_status 'lost': the WAL it needed was removed "
            "(max_slot_wal_keep_size). Changes since the last window are gone; re-snapshot with "
            "snapshot_mode='when_needed' (or 'always'), or drop and recreate the slot and snapshot."
        )
    confirmed = slot.confirmed_flush_lsn
    if confirmed is None:
        raise SlotMissingError(f"replication slot {slot.slot_name!r} has no confirmed position yet")
    offset = core.stream_start(
        mode, offset, identity, offset_type=PostgresOffset, start=confirmed, start_name="the slot's confirmed position"
    ).note_into(notes_list)
    if offset.lsn is None:
        raise RuntimeError("the stream's start offset has no position")
    acknowledge_first = None
    check_slot_not_ahead(slot, offset)
    if confirmed < offset.lsn:
        acknowledge_first = offset.lsn
        notes_list.append(
            f"the slot ({confirmed}) lags the stored offset ({offset.lsn}): a previous run stopped "
            "after storing its offset; acknowledging now"
        )
    window, offset = core.plan_window(
        offset, target=target, current=current_lsn, now_ms=now_ms, notes=notes_list, current_name="current WAL position"
    )
    return StreamPlan(window, offset, acknowledge_first, tuple(notes_list))


def plan_snapshot_window(
    offset: PostgresOffset | None, identity: OffsetIdentity, *, now_ms: int
) -> tuple[Window, PostgresOffset]:
    return core.plan_snapshot_window(offset, identity, offset_type=PostgresOffset, now_ms=now_ms)
