"""Deciding what a run does, for every source: reconcile the stored offset with the sink's commit
log, decide the snapshot, plan the next window.

Pure functions over plain values, so every branch is unit-tested without a database. The
records of progress are written in this order by every run: sink commit log, then the offset,
then (where the source has one) the server-side acknowledgement. A crash between two writes
leaves them disagreeing in one of a few known ways, each repaired here or by the source's
planning (:mod:`sources.postgres.planning` for the slot); any other disagreement is an error that
says what happened and what to do, never a silent skip.

==========================  ==================================================================
state found at run start    action
==========================  ==================================================================
log ahead of offset         crash after the sink commit: adopt the log's window (roll forward)
offset ahead of log         the sink lost data (path changed, files deleted): fail
offset lost or reset        restore it from the commit log (every entry keeps its offset)
source cannot deliver       fail, or re-snapshot when ``snapshot_mode='when_needed'``
pending window, same start  a retry: run the same window again (same id, same bounds)
==========================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    CdcStateError,
    InvalidLsnError,
    OffsetMismatchError,
    SnapshotRequiredError,
)
from airflow_provider_cdc.cdc.basics.positions import Position
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.incremental import IncrementalState
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset, OffsetIdentity
from airflow_provider_cdc.cdc.planning.runs import record_run
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry

SNAPSHOT_MODES = ("initial", "always", "never", "initial_only", "when_needed")

OffsetT = TypeVar("OffsetT", bound=CaptureOffset)


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
    offset: CaptureOffset | None
    notes: tuple[str, ...] = ()
    # False when the offset's position rests on the sink's commit log alone (a lost or reset offset
    # store): the log is writable by whoever can write the sink, so the source is never moved to
    # such a position on the log's word (see SourceRun.check_restored).
    corroborated: bool = True


def reconcile(
    offset: CaptureOffset | None,
    last_commit: CommitEntry | None,
    identity: OffsetIdentity,
    *,
    offset_type: type[CaptureOffset],
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
    if last_commit is None:
        return Reconciled(offset, ())
    if committed_seq == offset_seq:
        _check_same_end(offset, last_commit, identity, source)
        return Reconciled(offset, ())
    pending = offset.pending if offset is not None else None
    adjacent = offset is not None and offset_seq + 1 == committed_seq
    if adjacent and pending is not None and pending.seq == committed_seq:
        # A run stopped between its sink commit and its offset save: the entry must be the window
        # that run planned and stored as pending, bound for bound, or it is not that run's.
        if not _is_planned(pending, last_commit.window):
            raise OffsetMismatchError(
                f"the sink's commit log records {last_commit.window.describe()}, but the run that planned window "
                f"{pending.seq} of capture {identity.topic_prefix!r} stored it as {pending.describe()}: the entry "
                "is not that run's (whoever can write the sink can write one). Nothing was read or acknowledged. "
                "Move the entry aside if it is not this capture's; the planned window is then retried"
            )
        notes.append(
            f"the sink committed {last_commit.window.describe()} but the offset store had window "
            f"{offset_seq or 'none'} (a run stopped between the two writes): adopting the sink's record"
        )
        return Reconciled(offset_after_commit(offset, last_commit, identity, offset_type=offset_type), tuple(notes))
    restored = restore_from_log(last_commit, identity, committed, offset_type=offset_type)
    notes.append(
        f"{source} has {'no offset' if offset is None else f'window {offset_seq or None}'} but the sink's commit "
        f"log ends at {last_commit.window.describe()}: the offset was lost or reset; restored it from the "
        "commit log (position, snapshot, incremental snapshot, run records), nothing is re-read or re-snapshotted"
    )
    return Reconciled(
        replace(restored, revision=offset.revision if offset is not None else 0), tuple(notes), corroborated=False
    )


def _is_planned(pending: Window, landed: Window) -> bool:
    """Is ``landed`` the window that was planned as ``pending``? (A snapshot's end is found by its
    job, so only a stream window's end was planned.)"""
    return (
        landed.seq == pending.seq
        and landed.kind == pending.kind
        and landed.from_lsn == pending.from_lsn
        and (pending.to_lsn is None or landed.to_lsn == pending.to_lsn)
    )


def _check_same_end(offset: CaptureOffset | None, entry: CommitEntry, identity: OffsetIdentity, source: str) -> None:
    """The offset store and the commit log both say window N is the last: they must agree on
    where it ended. Each can be edited by other people (Variables, the sink); a position only one
    of them holds is never read from or acknowledged."""
    if offset is None or offset.lsn is None or entry.window.to_lsn is None:
        return
    if int(offset.lsn) != int(entry.window.to_lsn):
        raise OffsetMismatchError(
            f"{source} and the sink's commit log disagree about where window {entry.window_id} of capture "
            f"{identity.topic_prefix!r} ended: {offset.lsn} in the offset, {entry.window.to_lsn} in the log. One of "
            "them was edited; nothing was read or acknowledged. Restore the edited one (deleting the stored offset "
            "restores it from the log)"
        )


def uncorroborated_position(
    what: str, source_position: Any, offset: CaptureOffset, advance: str
) -> OffsetMismatchError:
    """The error for an offset restored from the commit log alone that lies ahead of the source's
    own record of what was acknowledged (``what``, at ``source_position``): moving the source there
    on the log's word would skip the changes in between if the log's entries are not genuine.
    ``advance``: how an administrator moves the source once they know the entries are."""
    return OffsetMismatchError(
        f"the offset store's record is older than the sink's commit log (or lost), so the offset was restored "
        f"from the log alone and ends at {offset.lsn}, but {what} is at {source_position}. Acknowledging up to "
        f"{offset.lsn} would skip the changes in between if those commit-log entries were not written by this "
        "capture (whoever can write to the sink can write them), so nothing was read or acknowledged. If the "
        f"newest entries are this capture's own, {advance}; otherwise move them aside with their datasets, or "
        "re-snapshot"
    )


def checkpoint(offset: CaptureOffset) -> dict[str, Any]:
    """The offset as a commit entry keeps it (``stats["offset"]``): no pending window, no revision."""
    return replace(offset, pending=None, revision=0).to_dict()


def restore_from_log(
    last_commit: CommitEntry,
    identity: OffsetIdentity,
    committed: Callable[[], list[CommitEntry]] | None = None,
    *,
    offset_type: type[OffsetT],
) -> OffsetT:
    """The offset after ``last_commit``, from the commit log alone: the offset its run was planned
    from (kept in the entry) plus the entry itself. Entries written before they kept it are
    replayed from the first committed window (the snapshot's table list is then unknown)."""
    recorded = last_commit.stats.get("offset")
    where = f"the sink's commit log ({last_commit.window.describe()})"
    if recorded is not None:
        base = offset_type.from_json(recorded, source=where)
        base.check_identity(identity, source=where)
        return offset_after_commit(base, last_commit, identity, offset_type=offset_type)
    offset: OffsetT | None = None
    for entry in committed() if committed is not None else [last_commit]:
        offset = offset_after_commit(offset, entry, identity, offset_type=offset_type)
    if offset is None:
        raise CdcStateError(f"{where} holds no committed window to restore the offset from")
    return offset


def offset_after_commit(
    offset: OffsetT | None, entry: CommitEntry, identity: OffsetIdentity, *, offset_type: type[OffsetT]
) -> OffsetT:
    """The offset that records ``entry`` as the last committed window."""
    base = offset if offset is not None else offset_type(identity=identity)
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
    if "source_state" in entry.stats:  # what the source's job keeps for the next window (SQL Server: instances)
        updated = replace(updated, extra={**updated.extra, "source_state": entry.stats["source_state"]})
    if "incremental" in entry.stats:  # the stream job's new incremental snapshot state
        updated = replace(updated, incremental=IncrementalState.from_dict(entry.stats["incremental"]))
    if entry.last_commit_lsn is not None:
        updated = replace(
            updated,
            lsn_commit=offset_type.FORMAT.position(entry.last_commit_lsn),
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


def decide_snapshot(mode: str, offset: CaptureOffset | None, unavailable: tuple[str, str] | None) -> SnapshotDecision:
    """Debezium's snapshot modes, for one run of the snapshot task. ``unavailable`` is the
    source's verdict on the stored offset: ``(gap reason, why)`` when it can no longer deliver
    the changes after it (a lost slot, purged change rows), else None."""
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
    # when_needed: no usable offset, or the source can no longer deliver from it
    if not completed:
        return SnapshotDecision(True, "snapshot_mode='when_needed': no completed snapshot yet")
    if unavailable is not None:
        reason, why = unavailable
        return SnapshotDecision(True, f"snapshot_mode='when_needed': {why}", reason)
    return SnapshotDecision(False, "snapshot_mode='when_needed': the stored offset is still available")


@dataclass(frozen=True)
class StreamPlan:
    window: Window
    offset: CaptureOffset  # to store (with the window as pending) before the job runs
    acknowledge_first: Position | None  # the server-side reader lags the offset: acknowledge this first
    notes: tuple[str, ...]


@dataclass(frozen=True)
class StreamStart:
    offset: CaptureOffset
    note: str | None

    def note_into(self, notes: list[str]) -> CaptureOffset:
        if self.note:
            notes.append(self.note)
        return self.offset


def stream_start(
    mode: str,
    offset: OffsetT | None,
    identity: OffsetIdentity,
    *,
    offset_type: type[OffsetT],
    start: Position,
    start_name: str,
) -> StreamStart:
    """The offset a stream window starts from: the stored one once the snapshot completed; with
    ``snapshot_mode='never'`` and no position yet, ``start`` (the source's own, e.g. the slot's)."""
    validate_snapshot_mode(mode)
    if offset is None or offset.lsn is None:
        if mode != "never":
            raise SnapshotRequiredError(
                f"capture {identity.topic_prefix!r} has no completed snapshot (snapshot_mode={mode!r}); "
                "the snapshot task must run before the first stream window"
            )
        offset = offset_type(identity=identity, lsn=start) if offset is None else replace(offset, lsn=start)
        return StreamStart(offset, f"no stored offset: streaming from {start_name} {start}")
    if mode != "never" and not offset.snapshot_completed:
        raise SnapshotRequiredError(
            f"capture {identity.topic_prefix!r}: the snapshot has not completed; run the snapshot task"
        )
    return StreamStart(offset, None)


def plan_window(
    offset: OffsetT,
    *,
    target: Position,
    current: Position,
    now_ms: int,
    notes: list[str],
    current_name: str = "current position",
) -> tuple[Window, OffsetT]:
    """The next stream window from a reconciled offset that has a start position: the pending
    window again when this is a retry, else ``[offset.lsn, target)`` (``target`` fixed at run
    start, no later than ``current``, the source's newest position)."""
    if offset.lsn is None:
        raise RuntimeError("plan_stream_window needs an offset with a start position")
    pending = offset.pending
    if (
        pending is not None
        and pending.kind == "stream"
        and pending.seq == offset.window_seq + 1
        and pending.from_lsn == offset.lsn
    ):
        if pending.to_lsn is None or pending.to_lsn > current:
            raise InvalidLsnError(
                f"the stored offset's pending {pending.describe()} ends past the server's {current_name} {current}: "
                "no run planned that (a window's end is fixed at a position the server has written). The offset was "
                "edited; nothing was read or acknowledged. Restore it, or remove its pending window"
            )
        if pending.to_lsn != target:
            notes.append(
                f"retrying {pending.describe()} as planned (requested end {target} ignored, "
                "so the retry reproduces the same window)"
            )
        return pending, offset
    if target < offset.lsn:
        raise InvalidLsnError(
            f"upto_lsn {target} is behind the committed offset {offset.lsn}: a window cannot end "
            "before it starts (windows already captured are replayed from the sink, not the source)"
        )
    if target > current:
        raise InvalidLsnError(
            f"upto_lsn {target} is ahead of the server's {current_name} {current}: give a "
            "position the server has written, or leave upto_lsn empty for the current position"
        )
    window = Window(seq=offset.window_seq + 1, kind="stream", from_lsn=offset.lsn, to_lsn=target, planned_at_ms=now_ms)
    return window, offset.with_pending(window)


def plan_snapshot_window(
    offset: OffsetT | None, identity: OffsetIdentity, *, offset_type: type[OffsetT], now_ms: int
) -> tuple[Window, OffsetT]:
    base = offset if offset is not None else offset_type(identity=identity)
    window = Window(seq=base.window_seq + 1, kind="snapshot", from_lsn=None, to_lsn=None, planned_at_ms=now_ms)
    return window, base.with_pending(window)
