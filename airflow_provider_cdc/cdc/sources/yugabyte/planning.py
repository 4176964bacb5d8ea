"""Planning a YugabyteDB capture's run: the core's planning plus the slot, in hybrid times.

A stream window holds the transactions whose commit position ``c`` is in ``[from, to)`` (the
core's rule). With ``HYBRID_TIME`` slots a commit's position is its commit hybrid time, so a
window that ends at hybrid time ``E`` (read at run start) has ``to = E + 1``; the next starts
there. The slot is acknowledged with flush ``to - 1 = E`` (every transaction committed at or before
``E`` landed); YugabyteDB restarts after the last transaction that flush covers.

==========================  ==================================================================
state found at run start    action
==========================  ==================================================================
slot behind offset          normal (an acknowledgement covers only transactions streamed on its
                            connection): the window's reader skips what comes back
slot ahead of offset        something else acknowledged the slot: fail (data skipped)
slot missing                fail, or re-snapshot when ``snapshot_mode='when_needed'``
slot expired                not read for ``intent_retention_ms`` (YugabyteDB's
                            ``cdc_intent_retention_ms``): as missing
==========================  ==================================================================
"""

from __future__ import annotations

from airflow_provider_cdc.cdc.basics.errors import OffsetMismatchError, WalLostError
from airflow_provider_cdc.cdc.planning import plan as core
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset, OffsetIdentity
from airflow_provider_cdc.cdc.planning.plan import StreamPlan
from airflow_provider_cdc.cdc.sources.yugabyte.admin import YbSlotStatus
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn
from airflow_provider_cdc.cdc.sources.yugabyte.offset import YugabyteOffset


def last_read_ms(offset: CaptureOffset | None) -> int | None:
    """When the capture last read the slot (YugabyteDB's expiry timer restarts on every read)."""
    if offset is None:
        return None
    state = offset.extra.get("source_state") or {}
    value = state.get("last_read_ms")
    return None if value is None else int(value)


def expiry_ms(offset: CaptureOffset | None, retention_ms: int) -> int | None:
    """When the slot expires if it is not read again (None: never read by this capture)."""
    read = last_read_ms(offset)
    return None if read is None else read + retention_ms


def expired_why(subject: str, offset: CaptureOffset | None, retention_ms: int, now_ms: int) -> str | None:
    """Why ``subject`` (a slot, a CDC stream) has expired, when the capture last read it longer
    than the intent retention ago (None: it has not, or it was never read)."""
    expires = expiry_ms(offset, retention_ms)
    if expires is None or now_ms <= expires:
        return None
    return (
        f"{subject} was last read {(now_ms - expires + retention_ms) / 3_600_000:.1f} h ago, longer than the "
        f"intent retention ({retention_ms / 3_600_000:.1f} h): YugabyteDB has expired it"
    )


def not_of_interest_why(offset: CaptureOffset | None, now_ms: int) -> str | None:
    """Why a slot no window has read yet has lost its tables' history: a snapshot records when the
    first window must read the slot (``source_state.first_poll_due_ms``: the slot's creation plus
    ``cdcsdk_tablet_not_of_interest_timeout_secs``); a stream window's state no longer has it."""
    if offset is None:
        return None
    due = (offset.extra.get("source_state") or {}).get("first_poll_due_ms")
    if due is None or now_ms <= int(due):
        return None
    return (
        f"no window has read the slot since it was created for the snapshot, and "
        f"{(now_ms - int(due)) / 60_000:.0f} min more than cdcsdk_tablet_not_of_interest_timeout_secs have passed: "
        "YugabyteDB no longer keeps the changes of tables a slot did not poll within that time of its creation"
    )


def acknowledged(position: int) -> int:
    """The flush that acknowledges everything before window end ``position`` (exclusive)."""
    return position - 1


def slot_unavailable(
    offset: CaptureOffset | None, slot: YbSlotStatus | None, *, retention_ms: int, now_ms: int
) -> tuple[str, str] | None:
    """Can the slot still deliver the changes after the stored offset? ``(gap reason, why)`` if not."""
    if slot is None:
        return "slot_missing", "the replication slot is missing"
    expired = expired_why("the slot", offset, retention_ms, now_ms)
    if expired is not None:
        return "slot_expired", expired
    unpolled = not_of_interest_why(offset, now_ms)
    if unpolled is not None:
        return "slot_not_of_interest", unpolled
    if (
        offset is not None
        and offset.lsn is not None
        and slot.confirmed_flush_lsn is not None
        and slot.confirmed_flush_lsn > acknowledged(offset.lsn)
    ):
        return "slot_ahead", f"the slot ({slot.confirmed_flush_lsn}) moved past the stored offset ({offset.lsn})"
    return None


def check_slot_not_ahead(slot: YbSlotStatus, offset: CaptureOffset) -> None:
    confirmed = slot.confirmed_flush_lsn
    if confirmed is not None and offset.lsn is not None and confirmed > acknowledged(offset.lsn):
        raise OffsetMismatchError(
            f"replication slot {slot.slot_name!r} is confirmed up to {confirmed}, past the stored offset "
            f"{offset.lsn}: something else consumed the slot, and the changes in between were never captured. "
            "Re-snapshot (snapshot_mode='when_needed' or 'always')."
        )


def plan_stream_window(
    *,
    mode: str,
    offset: YugabyteOffset | None,
    slot: YbSlotStatus,
    identity: OffsetIdentity,
    end: int,
    current: int,
    now_ms: int,
    retention_ms: int,
    clamp: bool = False,
) -> StreamPlan:
    """The next stream window, ending after the commits at or before hybrid time ``end``; with
    ``clamp`` (an ``upto_time`` before the offset, e.g. the first interval after a snapshot) an
    empty window at the offset instead of an error."""
    notes: list[str] = []
    expired = slot_unavailable(offset, slot, retention_ms=retention_ms, now_ms=now_ms)
    if expired is not None and expired[0] in ("slot_expired", "slot_not_of_interest"):
        raise WalLostError(
            f"replication slot {slot.slot_name!r} has most likely lost changes: {expired[1]}. Changes since the "
            "last window are gone; re-snapshot with snapshot_mode='when_needed' (or 'always')"
        )
    start = YbLsn((slot.restart_commit_ht or 0) + 1)
    offset = core.stream_start(
        mode, offset, identity, offset_type=YugabyteOffset, start=start, start_name="the slot's restart point"
    ).note_into(notes)
    if offset.lsn is None:
        raise RuntimeError("the stream's start offset has no position")
    check_slot_not_ahead(slot, offset)
    target = max(end + 1, int(offset.lsn)) if clamp else end + 1
    window, offset = core.plan_window(
        offset,
        target=YbLsn(target),
        current=YbLsn(current + 1),
        now_ms=now_ms,
        notes=notes,
        current_name="current hybrid time",
    )
    return StreamPlan(window, offset, None, tuple(notes))
