"""One tablet's snapshot in the protocol's checkpoints: the bootstrap request, the pages from the
tablet's first key at the snapshot time, the end marker, and the checks on what the server answers
(steps 1 to 3 of :mod:`.snapshot`'s docstring; YB's ``cdc_service.cc``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from airflow_provider_cdc.cdc.basics.errors import (
    CdcStateError,
    CdcTransientError,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import (
    Checkpoint,
    TabletPosition,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import Fetch, Page
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

Op = pb.RowMessage

#: The bootstrap request's checkpoint (the connector's ``snapshotStartLsn``).
BOOTSTRAP = Checkpoint(-1, -1, b"", -1, 0)


#: Pages in a row that bring no row and do not move the key before a task gives up.
MAX_STALLED_PAGES = 5


def is_end_marker(checkpoint: Checkpoint) -> bool:
    """``isSnapshotCompleteMarker``: the answer after a tablet's last snapshot row."""
    return not checkpoint.key and checkpoint.write_id == 0 and checkpoint.snapshot_time == 0


def first_page(bootstrap: Checkpoint) -> Checkpoint:
    """The request of a tablet's first snapshot page: the bootstrap's op id and snapshot time,
    from the tablet's first key (whatever key the bootstrap answered)."""
    return Checkpoint(bootstrap.term, bootstrap.index, b"", -1, bootstrap.snapshot_time)


def streaming_start(bootstrap: Checkpoint) -> TabletPosition:
    """Where a tablet's stream continues after the snapshot: the snapshot's op id, with the
    snapshot time as safe time (every commit at or before it is in the snapshot)."""
    return TabletPosition(Checkpoint(bootstrap.term, bootstrap.index), safe_hybrid_time=bootstrap.snapshot_time)


def check_bootstrap(tablet_id: str, checkpoint: Checkpoint) -> Checkpoint:
    """The bootstrap answer's checkpoint, refused unless it is a snapshot's (``write_id -1``,
    a snapshot time, a valid op id)."""
    if not checkpoint.in_snapshot or checkpoint.snapshot_time <= 0 or checkpoint.term < 0 or checkpoint.index < 0:
        raise CdcStateError(
            f"tablet {tablet_id}: the snapshot bootstrap answered checkpoint {checkpoint}, which is no snapshot's "
            "(write_id -1 and a snapshot time): the stream has no consistent snapshot to read"
        )
    return checkpoint


def common_snapshot_time(bootstraps: Mapping[str, Checkpoint]) -> int:
    """The one snapshot time of every tablet's bootstrap; tablets at different times would make
    a snapshot of no single moment, so that fails."""
    times = {checkpoint.snapshot_time for checkpoint in bootstraps.values()}
    if len(times) != 1:
        by_time: dict[int, list[str]] = {}
        for tablet, checkpoint in sorted(bootstraps.items()):
            by_time.setdefault(checkpoint.snapshot_time, []).append(tablet)
        detail = "; ".join(f"{t}: {', '.join(tablets)}" for t, tablets in sorted(by_time.items()))
        raise CdcStateError(
            f"the stream's tablets report {len(times)} different snapshot times ({detail or 'no tablets'}); "
            "a snapshot must read every tablet at one hybrid time (a stream with a consistent snapshot)"
        )
    (snapshot_time,) = times
    return snapshot_time


def snapshot_pages(fetch: Fetch, tablet_id: str, bootstrap: Checkpoint) -> Iterator[Page]:
    """The snapshot pages of one tablet, from its first key to the page that ends with the end
    marker (included: the last page may carry rows too). Each request starts where the previous
    answer points; an answer that leaves the snapshot (another snapshot time, a checkpoint that
    is neither a page's nor the end marker) or ends it at another op id than the bootstrap's
    fails, and so does a tablet that stops progressing."""
    position = TabletPosition(first_page(bootstrap))
    stalled = 0
    while True:
        page = Page.of(position, fetch(position))
        yield page
        checkpoint = page.checkpoint
        if is_end_marker(checkpoint):
            if (checkpoint.term, checkpoint.index) != (bootstrap.term, bootstrap.index):
                raise CdcStateError(
                    f"tablet {tablet_id}: the snapshot ended at op {checkpoint.term}.{checkpoint.index}, not at the "
                    f"bootstrap's {bootstrap.term}.{bootstrap.index} where its stream is to continue"
                )
            return
        if not checkpoint.in_snapshot or checkpoint.snapshot_time != bootstrap.snapshot_time:
            raise CdcStateError(
                f"tablet {tablet_id}: a snapshot page at hybrid time {bootstrap.snapshot_time} answered checkpoint "
                f"{checkpoint}, neither a page of that snapshot nor its end"
            )
        moved = checkpoint.key != position.checkpoint.key or any(r.row_message.op == Op.READ for r in page.records)
        stalled = 0 if moved else stalled + 1
        if stalled >= MAX_STALLED_PAGES:
            raise CdcTransientError(
                f"tablet {tablet_id}: {stalled} snapshot pages in a row brought no row and kept key "
                f"{checkpoint.key!r}; the server's snapshot does not progress"
            )
        position = page.next_position


__all__ = [
    "BOOTSTRAP",
    "check_bootstrap",
    "common_snapshot_time",
    "first_page",
    "is_end_marker",
    "snapshot_pages",
    "streaming_start",
]
