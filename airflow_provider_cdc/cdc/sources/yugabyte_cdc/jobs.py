"""Running one CDC-service stream window: client → pages → merge → collector → sink.

Every tablet of the stream is polled from its start position (the spec's tablet checkpoints) up
to the window's end hybrid time; :class:`~.merge.WindowMerge` makes whole transactions in commit
order, :class:`~.collector.YbCdcWindowCollector` the sink's chunks. The commit entry's stats carry
the tablets' end positions as ``source_state`` (:func:`~.offset.source_state`), which the core
copies into the offset. Nothing is stored on the server here: ``SetCDCCheckpoint``
(:meth:`~.client.YbCdcClient.set_checkpoints`) follows the commit and the offset save.

A tablet split before or during the window answers ``TABLET_SPLIT`` (at once, once the split is
applied: it may not have sent everything up to the split): the merge hands it over to its children,
which go on from where the parent was refused (:class:`_StreamTablets`, the merge's module
docstring), and the end state records the split (:meth:`~.checkpoints.TabletCheckpoints.split`) with
the children's end positions, so the next window reads the children only. The parent is only ever
polled with the committed checkpoint as explicit, which YB stores before it answers ``TABLET_SPLIT``:
the server's checkpoint for it never passes what the sink holds, whatever crashes before the commit.
"""

from __future__ import annotations

import logging
import time

from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError, CdcTransientError
from airflow_provider_cdc.cdc.reading.window_job import SparkProvider, recorded_run, run_window
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.sinks.parquet import ParquetSink
from airflow_provider_cdc.cdc.sources.postgres.events import EventContext
from airflow_provider_cdc.cdc.sources.postgres.jobs import topics_of
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import Checkpoint, TabletCheckpoints, TabletPosition
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import YbCdcClient
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.collector import YbCdcWindowCollector
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.merge import WindowMerge
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.offset import source_state
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import Page, poll_until_split
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.spec import YbCdcJobSpec
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.tablet_reader import Pages

log = logging.getLogger(__name__)

#: Pause between polls of a tablet with nothing new (the connector's cdc.poll.interval.ms).
POLL_INTERVAL_SECONDS = 0.5


def run_job(spec: YbCdcJobSpec, spark_provider: SparkProvider | None = None) -> CommitEntry:
    """Run the window of ``spec`` and return its commit-log entry."""
    return run_window(spec, spark_provider, snapshot=_run_snapshot, stream=_run_stream)


def _run_snapshot(spec: YbCdcJobSpec, spark_provider: SparkProvider) -> CommitEntry:
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.snapshot import run_snapshot

    return run_snapshot(spec, spark_provider)


class IdleWait:
    """``on_idle`` of :func:`poll_pages`: wait a poll interval, and give up once a tablet has
    brought nothing new for ``timeout`` seconds (its safe time must reach the window end)."""

    def __init__(self, tablet_id: str, timeout: float, interval: float = POLL_INTERVAL_SECONDS):
        self.tablet_id, self.timeout, self.interval = tablet_id, timeout, interval
        self._since: float | None = None
        self._safe = -1

    def __call__(self, page: Page) -> None:
        now = time.monotonic()
        if self._since is None or page.safe_hybrid_time != self._safe:
            self._since, self._safe = now, page.safe_hybrid_time
        elif now - self._since > self.timeout:
            raise CdcTransientError(
                f"tablet {self.tablet_id}: no progress for {self.timeout:g}s (safe time {page.safe_hybrid_time})"
            )
        time.sleep(self.interval)


class _StreamTablets:
    """The pages of a stream window's tablets, and the hand-over of a split tablet to its children
    (the merge's ``on_split``)."""

    def __init__(self, client: YbCdcClient, spec: YbCdcJobSpec, end_ht: int) -> None:
        self._client, self._end_ht = client, end_ht
        self._idle_timeout = spec.options.idle_timeout_seconds
        self._table_ids = {tablet: state.table_ids for tablet, state in spec.tablets.items()}
        self._stream_table_ids: tuple[str, ...] | None = None

    def pages(self, tablet_id: str, start: TabletPosition, *, explicit: Checkpoint | None) -> Pages:
        """The tablet's pages from ``start`` up to the window end, ending early at a split.
        ``explicit``: the checkpoint sent as acknowledged (an EXPLICIT stream keeps what follows)."""
        fetch = self._client.fetcher(tablet_id, explicit=explicit)
        return poll_until_split(fetch, start, self._end_ht, on_idle=IdleWait(tablet_id, self._idle_timeout))

    def children(self, parent: str, at: TabletPosition) -> dict[str, tuple[TabletPosition, Pages]]:
        """The children of ``parent``, which answered ``TABLET_SPLIT``, each polled from ``at``: the
        position the merge hands over (:meth:`~.tablet_reader.TabletReader.hand_over`: the refused request's
        checkpoint, with a safe time past everything taken from the parent).

        Each child's log holds a copy of the parent's up to the split op (``Log::CopyTo``), ``at``
        included, so a child polled from ``at`` sends what the parent had not sent (the parent
        answers ``TABLET_SPLIT`` at once once the split is applied) and skips by the safe time what
        it had. The checkpoint ``GetTabletListToPollForCDC`` gives is not used: for a child not yet
        polled it is the parent's stored checkpoint (at most the committed one, and possibly older:
        ``cdc_state`` is written every ``cdc_state_checkpoint_update_interval_ms``), or 0.0 once the
        parent's row is deleted, and its ``snapshot_time`` is the parent's stored safe time, no
        safe time of this run. Polled from there without this run's safe time, a child would send
        the parent's changes taken in this window again (the connector instead first moves the
        parent's stored checkpoint to its last acknowledged record, CONN ``handleTabletSplit``).

        The children are polled without an explicit checkpoint: nothing of theirs is committed yet,
        and their ``cdc_state`` rows (0.0) and the parent's stored checkpoint hold their logs. A
        retry of this window finds the parent refusing at once, from the window's start, and starts
        the children there. The next window sends the children's committed checkpoints."""
        table_ids = self._table_ids.get(parent) or self._all_table_ids()
        found = self._client.split_children(parent, table_ids)
        children: dict[str, tuple[TabletPosition, Pages]] = {}
        for child in sorted(found):
            self._table_ids[child] = tuple(table_ids)
            children[child] = (at, self.pages(child, at, explicit=None))
        log.info(
            "tablet %s was split: reading %s from %s (safe time %d)",
            parent,
            ", ".join(children),
            at.checkpoint,
            at.safe_hybrid_time,
        )
        return children

    def _all_table_ids(self) -> tuple[str, ...]:
        """The stream's tables, for a tablet whose tables the offset does not name (a Debezium offset)."""
        if self._stream_table_ids is None:
            self._stream_table_ids = self._client.stream_tables()[1]
        return self._stream_table_ids


def end_state(tablets: TabletCheckpoints, merge: WindowMerge) -> TabletCheckpoints:
    """The stream's tablets after the window: each split recorded in the order found (a child split
    in turn comes after its parent), then every tablet read moved to its end position."""
    for parent, children in merge.splits:
        tablets = tablets.split(parent, children)
    return tablets.advanced(merge.end_positions)


def _run_stream(spec: YbCdcJobSpec, spark_provider: SparkProvider) -> CommitEntry:
    window = spec.window
    if window.from_lsn is None or window.to_lsn is None:
        raise CdcStateError(f"stream window {window.describe()} has no start or end position: its job spec is broken")
    from_ht, to_ht = int(window.from_lsn), int(window.to_lsn)
    start = spec.tablets.polled()
    if not start:
        raise CdcConfigurationError(f"stream {spec.stream_id}: the spec names no tablets to read")
    captured = {t.data_collection for t in spec.tables}

    def data_collection(row: pb.RowMessage) -> str | None:
        name = f"{row.pgschema_name}.{row.table}"
        return name if name in captured else None

    with YbCdcClient.of(spec) as client:
        record_type = spec.record_type_value
        if record_type is None:
            record_type = client.record_type()
        tablets = _StreamTablets(client, spec, to_ht - 1)
        pages = {
            tablet: tablets.pages(tablet, position, explicit=position.checkpoint)  # the committed checkpoint
            for tablet, position in start.items()
        }
        merge = WindowMerge(
            from_ht=from_ht,
            to_ht=to_ht,
            tablets=pages,
            start=start,
            data_collection=data_collection,
            on_split=tablets.children,
        )
        log.info("reading %s from stream %s (%d tablets)", window.describe(), spec.stream_id, len(start))
        sink = ParquetSink.for_spec(spec, spark_provider)
        writer = sink.open_window(window, topics_of(spec, spec.tables))
        collector = YbCdcWindowCollector(
            window=window,
            context=EventContext.of_window(spec.topic_prefix, spec.database, window),
            topic_prefix=spec.topic_prefix,
            previous_commit_lsn=spec.previous_commit_ht,
            max_changes_per_chunk=spec.options.max_changes_per_chunk,
            flush=writer.write_chunk,
            settings=spec.events,
            captured=spec.tables,
            record_type=record_type,
        )
        try:
            faults.point("window.streaming")
            collector.consume_items(merge)
            stats = collector.finish()
            faults.point("window.read_done")
        finally:
            writer.close()
        read_ms = int(time.time() * 1000)  # polling restarts the stream's expiry timer
    ends = end_state(spec.tablets, merge)
    merged = merge.stats
    return stats.commit(
        writer,
        window,
        filtered_changes=merged.filtered_changes,
        earlier_skipped=merged.earlier_skipped,
        resent_skipped=merged.resent_skipped,
        **({"tablet_splits": [[p, sorted(c)] for p, c in merge.splits]} if merge.splits else {}),
        source_state=source_state(ends, stream_id=spec.stream_id, last_read_ms=read_ms),
        **recorded_run(spec),
    )


__all__ = ["IdleWait", "end_state", "run_job"]
