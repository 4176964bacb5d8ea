"""Deciding what a run does: reconcile stored offset, commit log and slot; plan the window.

Pure functions over plain values, so every branch is unit-tested without a database. The three
records of progress are written in this order by every run: sink commit log, then the offset,
then the slot acknowledgement. A crash between two writes leaves them disagreeing in one of a
few known ways, each repaired here; any other disagreement is an error that says what happened
and what to do, never a silent skip.

==========================  ==================================================================
state found at run start    action
==========================  ==================================================================
log ahead of offset         crash after the sink commit: adopt the log's window (roll forward)
offset ahead of log         the sink lost data (path changed, files deleted): fail
slot behind offset          crash before the acknowledgement: acknowledge now, then continue
slot ahead of offset        something else consumed or advanced the slot: fail (data skipped)
slot missing / WAL lost     fail, or re-snapshot when ``snapshot_mode='when_needed'``
pending window, same start  a retry: run the same window again (same id, same bounds)
==========================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from airflow_provider_cdc.cdc.errors import (
    CdcConfigurationError,
    InvalidLsnError,
    OffsetMismatchError,
    SlotMissingError,
    SnapshotRequiredError,
    WalLostError,
)
from airflow_provider_cdc.cdc.runs import record_run
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.sources.postgres.admin import SlotStatus
from airflow_provider_cdc.cdc.sources.postgres.incremental import IncrementalState
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.offset import OffsetIdentity, PostgresOffset
from airflow_provider_cdc.cdc.window import Window

SNAPSHOT_MODES = ("initial", "always", "never", "initial_only", "when_needed")


def validate_snapshot_mode(mode: str) -> str:
    if mode not in SNAPSHOT_MODES:
        raise CdcConfigurationError(
            f"snapshot_mode {mode!r} is not supported; choose one of {', '.join(SNAPSHOT_MODES)}"
        )
    return mode


def streams(mode: str) -> bool:
    """Does this snapshot mode stream changes (and so need a replication slot)?"""
    return mode != "initial_only"


@dataclass(frozen=True)
class Reconciled:
    offset: PostgresOffset | None
    notes: tuple[str, ...] = ()


def reconcile(
    offset: PostgresOffset | None,
    last_commit: CommitEntry | None,
    identity: OffsetIdentity,
    *,
    source: str = "offset store",
    committed: Callable[[], list[CommitEntry]] | None = None,
) -> Reconciled:
    """Bring the stored offset in line with the sink's commit log (the durable record).

    ``source`` names where the offset came from, for the error when it belongs to another capture.
    When the store lost the offset (deleted, reset to an older document, a new Airflow metadata
    database), the whole offset is restored from the log: the position, the snapshot and its
    tables, the incremental snapshot's progress and the run records, so nothing is re-read or
    re-snapshotted. ``committed`` lists the committed windows, read only for logs written
    before entries kept their offset.
    """
    notes: list[str] = []
    if offset is not None:
        offset.check_identity(identity, source=source)
    committed_seq = last_commit.window.seq if last_commit else 0
    offset_seq = offset.window_seq if offset else 0
    if offset_seq > committed_seq:
        raise OffsetMismatchError(
            f"the stored offset says window {offset_seq} of capture {identity.topic_prefix!r} landed, "
            f"but the sink's commit log ends at window {committed_seq or 'none'}. The sink path was "
            "changed or its files deleted; restore them, or delete the stored offset to re-snapshot."
        )
    if last_commit is None or committed_seq == offset_seq:
        return Reconciled(offset, ())
    pending = offset.pending if offset is not None else None
    adjacent = offset is not None and offset_seq + 1 == committed_seq
    stopped_between_writes = adjacent and pending is not None and pending.seq == committed_seq
    if stopped_between_writes or (adjacent and "offset" not in last_commit.stats):
        notes.append(
            f"the sink committed {last_commit.window.describe()} but the offset store had window "
            f"{offset_seq or 'none'} (a run stopped between the two writes): adopting the sink's record"
        )
        return Reconciled(offset_after_commit(offset, last_commit, identity), tuple(notes))
    restored = restore_from_log(last_commit, identity, committed)
    notes.append(
        f"{source} has {'no offset' if offset is None else f'window {offset_seq or None}'} but the sink's commit "
        f"log ends at {last_commit.window.describe()}: the offset was lost or reset; restored it from the "
        "commit log (position, snapshot, incremental snapshot, run records), nothing is re-read or re-snapshotted"
    )
    return Reconciled(replace(restored, revision=offset.revision if offset is not None else 0), tuple(notes))


def checkpoint(offset: PostgresOffset) -> dict[str, Any]:
    """The offset as a commit entry keeps it (``stats["offset"]``): no pending window, no revision."""
    return replace(offset, pending=None, revision=0).to_dict()


def restore_from_log(
    last_commit: CommitEntry,
    identity: OffsetIdentity,
    committed: Callable[[], list[CommitEntry]] | None = None,
) -> PostgresOffset:
    """The offset after ``last_commit``, from the commit log alone: the offset its run was planned
    from (kept in the entry) plus the entry itself. Entries written before they kept it are
    replayed from the first committed window (the snapshot's table list is then unknown)."""
    recorded = last_commit.stats.get("offset")
    where = f"the sink's commit log ({last_commit.window.describe()})"
    if recorded is not None:
        base = PostgresOffset.from_json(recorded, source=where)
        base.check_identity(identity, source=where)
        return offset_after_commit(base, last_commit, identity)
    offset: PostgresOffset | None = None
    for entry in committed() if committed is not None else [last_commit]:
        offset = offset_after_commit(offset, entry, identity)
    assert offset is not None
    return offset


def offset_after_commit(offset: PostgresOffset | None, entry: CommitEntry, identity: OffsetIdentity) -> PostgresOffset:
    """The offset that records ``entry`` as the last committed window."""
    base = offset if offset is not None else PostgresOffset(identity=identity)
    window = entry.window
    if window.to_lsn is None:
        raise OffsetMismatchError(f"commit log entry of {window.describe()} has no end position")
    updated = replace(
        base,
        lsn=window.to_lsn,
        window_seq=window.seq,
        pending=None,
        revision=base.revision,
    )
    if window.kind == "snapshot":
        updated = replace(updated, snapshot_completed=True, snapshot_lsn=window.to_lsn)
        if updated.incremental is not None:
            # A full snapshot is a complete image: chunks staged before it have nothing to add
            # (and their watermarks lie before the stream's new start). Tables keep their progress.
            updated = replace(updated, incremental=replace(updated.incremental, staged=()))
    if entry.stats.get("run"):  # the scheduler run that landed the newest window of each kind (backfills)
        runs = record_run(updated.extra.get("runs"), entry.stats["run"], window.kind)
        updated = replace(updated, extra={**updated.extra, "runs": runs})
    if "incremental" in entry.stats:  # the stream job's new incremental snapshot state
        updated = replace(updated, incremental=IncrementalState.from_dict(entry.stats["incremental"]))
    if entry.last_commit_lsn is not None:
        updated = replace(
            updated,
            lsn_commit=Lsn(entry.last_commit_lsn),
            tx_id=entry.last_tx_id,
            ts_usec=entry.last_commit_ts_us,
        )
    return updated


@dataclass(frozen=True)
class SnapshotDecision:
    run: bool
    reason: str
    # Set when a completed capture must re-snapshot because changes were lost (a gap).
    gap_reason: str | None = None


def decide_snapshot(mode: str, offset: PostgresOffset | None, slot: SlotStatus | None) -> SnapshotDecision:
    """Debezium's snapshot modes, for one run of the snapshot task."""
    validate_snapshot_mode(mode)
    completed = offset is not None and offset.snapshot_completed
    if mode == "never":
        return SnapshotDecision(False, "snapshot_mode='never': changes are streamed only")
    if mode == "always":
        return SnapshotDecision(True, "snapshot_mode='always': every run snapshots")
    if mode in ("initial", "initial_only"):
        if completed:
            return SnapshotDecision(False, f"snapshot_mode={mode!r}: the initial snapshot already completed")
        return SnapshotDecision(True, f"snapshot_mode={mode!r}: no completed snapshot yet")
    # when_needed: no usable offset, or the slot can no longer deliver from it
    if not completed:
        return SnapshotDecision(True, "snapshot_mode='when_needed': no completed snapshot yet")
    if slot is None:
        return SnapshotDecision(True, "snapshot_mode='when_needed': the replication slot is missing", "slot_missing")
    if slot.wal_lost:
        return SnapshotDecision(True, "snapshot_mode='when_needed': the slot's WAL was removed", "wal_lost")
    assert offset is not None
    if offset.lsn is not None and slot.confirmed_flush_lsn is not None and slot.confirmed_flush_lsn > offset.lsn:
        return SnapshotDecision(
            True,
            f"snapshot_mode='when_needed': the slot ({slot.confirmed_flush_lsn}) moved past the "
            f"stored offset ({offset.lsn})",
            "slot_ahead",
        )
    return SnapshotDecision(False, "snapshot_mode='when_needed': the stored offset is still available")


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


@dataclass(frozen=True)
class StreamPlan:
    window: Window
    offset: PostgresOffset  # to store (with the window as pending) before the job runs
    acknowledge_first: Lsn | None  # slot lags the offset: acknowledge this before reading
    notes: tuple[str, ...]


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
    if offset is None or offset.lsn is None:
        if mode != "never":
            raise SnapshotRequiredError(
                f"capture {identity.topic_prefix!r} has no completed snapshot (snapshot_mode={mode!r}); "
                "the snapshot task must run before the first stream window"
            )
        offset = PostgresOffset(identity=identity, lsn=confirmed) if offset is None else replace(offset, lsn=confirmed)
        notes_list.append(f"no stored offset: streaming from the slot's confirmed position {confirmed}")
    elif mode != "never" and not offset.snapshot_completed:
        raise SnapshotRequiredError(
            f"capture {identity.topic_prefix!r}: the snapshot has not completed; run the snapshot task"
        )
    assert offset.lsn is not None
    acknowledge_first = None
    check_slot_not_ahead(slot, offset)
    if confirmed < offset.lsn:
        acknowledge_first = offset.lsn
        notes_list.append(
            f"the slot ({confirmed}) lags the stored offset ({offset.lsn}): a previous run stopped "
            "after storing its offset; acknowledging now"
        )
    pending = offset.pending
    if (
        pending is not None
        and pending.kind == "stream"
        and pending.seq == offset.window_seq + 1
        and pending.from_lsn == offset.lsn
    ):
        if pending.to_lsn != target:
            notes_list.append(
                f"retrying {pending.describe()} as planned (requested end {target} ignored, "
                "so the retry reproduces the same window)"
            )
        return StreamPlan(pending, offset, acknowledge_first, tuple(notes_list))
    if target < offset.lsn:
        raise InvalidLsnError(
            f"upto_lsn {target} is behind the committed offset {offset.lsn}: a window cannot end "
            "before it starts (windows already captured are replayed from the sink, not the slot)"
        )
    if target > current_lsn:
        raise InvalidLsnError(
            f"upto_lsn {target} is ahead of the server's current WAL position {current_lsn}: give a "
            "position the server has written, or leave upto_lsn empty for the current position"
        )
    window = Window(
        seq=offset.window_seq + 1,
        kind="stream",
        from_lsn=offset.lsn,
        to_lsn=target,
        planned_at_ms=now_ms,
    )
    return StreamPlan(window, offset.with_pending(window), acknowledge_first, tuple(notes_list))


def plan_snapshot_window(
    offset: PostgresOffset | None, identity: OffsetIdentity, *, now_ms: int
) -> tuple[Window, PostgresOffset]:
    base = offset if offset is not None else PostgresOffset(identity=identity)
    window = Window(seq=base.window_seq + 1, kind="snapshot", from_lsn=None, to_lsn=None, planned_at_ms=now_ms)
    return window, base.with_pending(window)
