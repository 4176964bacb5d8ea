"""One tablet's ``GetChanges`` responses as pages, and the loop that polls a tablet up to a window's end.

A :class:`Page` is one response with the position it was requested from. What a page tells about
the window (``cdcsdk_producer.cc``, ``GetChangesForCDCSDK``):

- its records are in commit order (``cdc_enable_consistent_records``, on by default, sorts each
  response by commit time) and come after the previous page's, except records YB sends again
  (a response checkpoint can lag the records sent; see :mod:`.checkpoints`);
- its ``safe_hybrid_time`` (also sent as a trailing ``SAFEPOINT`` record) says every record of the
  tablet committed at or before it has been sent;
- so a tablet has **passed** a window ending at hybrid time ``E`` once a page's safe time is
  ``>= E`` or a page holds a record committed after ``E``.

:func:`poll_pages` requests pages from a start position until the tablet has passed the end. It
only sequences calls: the RPC (leader discovery, retries, errors) is the ``fetch`` callable's, and
so is waiting when a tablet has nothing new yet (``on_idle``).

**Splits.** Once a split is applied, the parent answers ``TABLET_SPLIT`` at once, with whatever it
had not sent yet still unsent (``cdcsdk_producer.cc``, ``GetChangesForCDCSDK``:
``TABLET_DATA_SPLIT_COMPLETED`` → "moving to children tablets immediately"); a request resuming a
transaction is served first (no split check on that path), and while the split is being applied the
parent may still serve up to its split op. Its children's logs start with a copy of the parent's up
to the split op (``Log::CopyTo``), so they send what the parent did not. ``fetch`` raises
:class:`TabletSplitError` on ``TABLET_SPLIT`` (and on ``INVALID_REQUEST`` for a parent the stream's
tablets name as their split parent, :meth:`~.client.YbCdcClient.get_changes`).
:func:`poll_until_split` turns that into the last item of the tablet's pages, a :class:`Split`
marker with the position that was refused, so that the merge can end the tablet there and go on
with its children from that position (:mod:`.merge`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import Checkpoint, TabletPosition
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

Op = pb.RowMessage

#: ``fetch(position)``: one ``GetChanges`` of the tablet from ``position``.
Fetch = Callable[[TabletPosition], pb.GetChangesResponsePB]


class TabletSplitError(CdcStateError):
    """A tablet answered ``TABLET_SPLIT``: it was split and its children hold what follows.

    Defined here rather than with the client (which raises it) because it is part of the contract
    between a ``fetch`` and the polling loop: :func:`poll_until_split` ends a tablet's pages on it."""


@dataclass(frozen=True)
class Split:
    """The last item of a split tablet's pages (:func:`poll_until_split`): asked from ``at``, the
    tablet answered ``TABLET_SPLIT``. Records after ``at`` may not have been sent (YB answers at
    once once the split is applied): the children send them, from ``at`` (:mod:`.merge`)."""

    at: TabletPosition


@dataclass(frozen=True)
class Page:
    """One ``GetChanges`` response of one tablet."""

    request: TabletPosition
    records: Sequence[pb.CDCSDKProtoRecordPB]
    checkpoint: Checkpoint  # the response's cdc_sdk_checkpoint: the next request's
    safe_hybrid_time: int
    wal_segment_index: int = 0

    @classmethod
    def of(cls, request: TabletPosition, response: pb.GetChangesResponsePB) -> Page:
        """The page ``response`` answers to ``request``. Fields YB did not send keep the request's
        (the server copies the request's checkpoint when it did not move; the safe time never goes
        back, ``CheckResponseSafeTimeCorrectness``)."""
        checkpoint = (
            Checkpoint.from_pb(response.cdc_sdk_checkpoint)
            if response.HasField("cdc_sdk_checkpoint")
            else request.checkpoint
        )
        safe = response.safe_hybrid_time if response.HasField("safe_hybrid_time") else request.safe_hybrid_time
        return cls(
            request=request,
            records=tuple(response.cdc_sdk_proto_records),
            checkpoint=checkpoint,
            safe_hybrid_time=max(safe, request.safe_hybrid_time),
            wal_segment_index=response.wal_segment_index,
        )

    @property
    def next_position(self) -> TabletPosition:
        """Where the request after this page starts."""
        return TabletPosition(self.checkpoint, self.safe_hybrid_time, self.wal_segment_index)

    def passes(self, end_ht: int) -> bool:
        """Has the tablet sent everything committed at or before ``end_ht``?"""
        if self.safe_hybrid_time >= end_ht:
            return True
        return any(r.row_message.commit_time > end_ht for r in self.records)


def passed(position: TabletPosition, end_ht: int) -> bool:
    """A tablet whose stored safe time is at or past ``end_ht`` has nothing up to it left to send."""
    return position.safe_hybrid_time >= end_ht


def poll_pages(
    fetch: Fetch,
    start: TabletPosition,
    end_ht: int,
    *,
    on_idle: Callable[[Page], None] | None = None,
) -> Iterator[Page]:
    """The pages of one tablet from ``start`` until it has passed ``end_ht``: each request starts
    where the previous page's response points (checkpoint, safe time, WAL segment index).
    ``on_idle(page)`` is called after a page that brought nothing new (no records, safe time not
    moved), before polling again: the caller waits there, and raises when it has waited too long."""
    position = start
    if passed(position, end_ht):
        return
    while True:
        page = Page.of(position, fetch(position))
        yield page
        if page.passes(end_ht):
            return
        idle = not any(r.row_message.op != Op.SAFEPOINT for r in page.records) and (
            page.safe_hybrid_time == position.safe_hybrid_time
        )
        position = page.next_position
        if idle and on_idle is not None:
            on_idle(page)


def poll_until_split(
    fetch: Fetch,
    start: TabletPosition,
    end_ht: int,
    *,
    on_idle: Callable[[Page], None] | None = None,
) -> Iterator[Page | Split]:
    """:func:`poll_pages`, except that a ``TABLET_SPLIT`` answer (:class:`TabletSplitError` from
    ``fetch``) ends the pages with a :class:`Split` item instead of failing: a split is a normal end
    of a tablet in a stream window, which then continues on the tablet's children."""
    asked = [start]

    def tracked(position: TabletPosition) -> pb.GetChangesResponsePB:
        asked[0] = position
        return fetch(position)

    try:
        yield from poll_pages(tracked, start, end_ht, on_idle=on_idle)
    except TabletSplitError:
        yield Split(asked[0])


__all__ = ["Fetch", "Page", "Split", "TabletSplitError", "passed", "poll_pages", "poll_until_split"]
