"""A window's transactions in commit order, merged from the record streams of several tablets.

Input: per tablet, its pages (:mod:`.pages`) from its stored position, and the window
``[from_ht, to_ht)`` on commit hybrid times, fixed at run start (``end_ht = to_ht - 1``). Output:
:class:`TxBegin`, :class:`Change` … :class:`TxEnd` items, one group per transaction, and
afterwards each tablet's end position (:attr:`WindowMerge.end_positions`).

**Transactions.** On each tablet a transaction is a fragment ``BEGIN … COMMIT`` (YB writes both
markers for multi- and single-shard transactions, ``cdc_populate_end_markers_transactions``). A
multi-shard transaction has a fragment on every tablet it wrote, with the same transaction id and
commit time; those fragments are merged into one transaction. Its identity, and the order of
transactions, is :class:`TxKey` ``(commit_time, kind, id)``: equal commit times are ordered as YB
orders them on one tablet (``SortConsistentWALRecords``): single-shard writes first (by tablet id,
then WAL op id), then multi-shard transactions by transaction id. Because that is each tablet's own
order, a plain k-way merge on the key yields every transaction once, in order, with all its parts.

**Numbering.** A transaction's changes are numbered (``total_order``, and per data collection
``data_collection_order``) from 1, part by part in tablet-id order, each part in its tablet's
record order: deterministic, so a retried window numbers its events identically.

**Watermark.** A transaction can be emitted once no tablet can still send one ordered before it.
A tablet is past a key when it has a later head (its next transaction's key), when it has ended,
or when its safe time (the pages' ``safe_hybrid_time`` / ``SAFEPOINT`` records: everything
committed at or before it has been sent) is at or past the key's commit time. The merge reads a
tablet only as far as needed for that.

**Memory.** Nothing is buffered per transaction: the head of each tablet is just its next ``BEGIN``
(for a single-shard transaction also the records up to its first WAL op id), and a transaction's
parts are streamed tablet after tablet from their pages. What is held is one page per tablet
(``cdc_stream_records_threshold_size_bytes``, 4 MB by default) while its transaction is merged.

**Window end.** A tablet ends when it reaches a ``BEGIN`` (or a schema change) committed at or
after ``to_ht`` (the **cut**: that transaction belongs to the next window), or a page boundary with
its safe time at or past ``end_ht`` and no transaction open. Its end position is where the next
window starts, before the cut:

- cut in page ``P``: ``(P``'s request checkpoint``, end_ht, 0)``. YB sends again what follows that
  checkpoint except what is committed at or before the safe time (``GetCommitTimeThreshold``),
  so the next window starts exactly with the cut transaction;
- no cut: the last page's response position (checkpoint, safe time, WAL segment index).

**Splits.** Once a split is applied, the parent answers ``TABLET_SPLIT`` to the next request at
once, whatever it had left to send (``cdcsdk_producer.cc``: ``TABLET_DATA_SPLIT_COMPLETED`` →
"moving to children tablets immediately"); its pages end with a :class:`~.pages.Split` at the
position that was refused. Each child's log starts with a copy of the parent's log up to and
including the split op (``Log::CopyTo``), so a child read from a position before the split sends
again the parent's changes of its half of the range after that position, then its own. The reader
of the parent ends at the split (the tablet is finished for the watermark); the merge asks
``on_split`` for the children with the position they go on from (:meth:`TabletReader.hand_over`):
the refused request's checkpoint, with as safe time the highest of the refused request's, the
parent's watermark and the commit time of the last transaction taken from the parent. The parent
sent everything committed at or before that time (its safe times, and its records in commit order),
so a child's record committed at or before it was taken from the parent already and is skipped
(by the server, ``GetCommitTimeThreshold``, and by the reader, as sent before); a record committed
after it was not sent by the parent, and comes from exactly one child (the halves are disjoint).
Nothing is lost: the checkpoint lies before every record not yet taken, and is in the children's
copied logs (the parent's stored checkpoint, which holds the parent's log, is never past it). The
merge adds a reader for each child, which the watermark then waits on like any other tablet, so
what the children send is merged in commit order with the rest. A single-shard write sent again by
a child is named after the child (its :class:`TxKey` holds the tablet that sent it), so a retried
window can attribute a pre-split change to a child where the first attempt had the parent. The
window's splits, in the order found (a child can split again), are :attr:`WindowMerge.splits`; the
children's end positions are in :attr:`WindowMerge.end_positions`, the parent's are not (it is not
read again).

**Sent again.** Records committed before ``from_ht`` (the tail of a transaction a previous window
took, re-sent from a mid-transaction checkpoint) and fragments a tablet sends twice (a response
checkpoint can lag what it sent) are skipped. Op ids cannot tell them: YB's sorting makes WAL op ids
non-monotonic within a stream, and a single-shard ``COMMIT`` has write id 0 while its rows count
up, so they are recognised by commit time and :class:`TxKey`, as the logical-replication source
recognises a re-sent transaction by its commit LSN.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping

from airflow_provider_cdc.cdc.basics.errors import CdcStateError, DecodingError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import TabletPosition
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import Split, TabletSplitError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.tablet_reader import MergeStats, Pages, TabletReader
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.transactions import Change, Item, TxBegin, TxEnd, TxKey

#: ``data_collection(row)``: the change's data collection, or None for a table not captured.
DataCollection = Callable[[pb.RowMessage], str | None]


#: ``on_split(parent, at)``: the children of ``parent``, which answered ``TABLET_SPLIT``; ``at`` is
#: where they go on from (:meth:`TabletReader.hand_over`): child id → (its start position, its pages).
SplitHandler = Callable[[str, TabletPosition], Mapping[str, tuple[TabletPosition, Pages]]]


def schema_table(row: pb.RowMessage) -> str:
    """The default data collection: ``<schema>.<table>`` as the record names them."""
    return f"{row.pgschema_name}.{row.table}"


class WindowMerge:
    """The transactions of one window across tablets; iterate once, then read :attr:`end_positions`
    and :attr:`splits`.

    ``tablets``: tablet id → its pages (lazy: read only as far as needed); ``start``: tablet id →
    the position those pages start from (a tablet whose safe time is already past the window end
    is not read). ``data_collection`` names each change's data collection, or None for a table
    that is not captured (its changes are dropped and not numbered; the default keeps all).
    ``on_split`` gives the children of a tablet whose pages end with a :class:`~.pages.Split`
    (see the module docstring); without it such a tablet fails the window."""

    def __init__(
        self,
        *,
        from_ht: int,
        to_ht: int,
        tablets: Mapping[str, Pages],
        start: Mapping[str, TabletPosition],
        data_collection: DataCollection = schema_table,
        on_split: SplitHandler | None = None,
    ):
        if to_ht < from_ht:
            raise ValueError(f"window ends ({to_ht}) before it starts ({from_ht})")
        if set(tablets) != set(start):
            raise ValueError(f"tablets {sorted(set(tablets) ^ set(start))} lack pages or a start position")
        self.stats = MergeStats()
        self._from, self._to = from_ht, to_ht
        self._data_collection = data_collection
        self._on_split = on_split
        self._readers = [self._reader(tablet, tablets[tablet], start[tablet]) for tablet in sorted(tablets)]
        self._splits: list[tuple[str, dict[str, TabletPosition]]] = []
        self._iterated = False

    def _reader(self, tablet_id: str, pages: Pages, start: TabletPosition) -> TabletReader:
        return TabletReader(tablet_id, pages, start, from_ht=self._from, to_ht=self._to, stats=self.stats)

    def _check_finished(self) -> None:
        unfinished = [r.tablet_id for r in self._readers if r.end is None]
        if unfinished:
            raise RuntimeError(f"the window has not been read to its end (tablets {', '.join(unfinished)})")

    @property
    def end_positions(self) -> dict[str, TabletPosition]:
        """Each tablet's position after the window: where the next window starts. A tablet that was
        split in the window is not in it (its children are)."""
        self._check_finished()
        return {r.tablet_id: r.end for r in self._readers if r.end is not None and r.split is None}

    @property
    def splits(self) -> tuple[tuple[str, dict[str, TabletPosition]], ...]:
        """The tablets split in the window, in the order found: (parent, child → its start position).
        A child split in turn comes after its parent's entry."""
        self._check_finished()
        return tuple((parent, dict(children)) for parent, children in self._splits)

    def __iter__(self) -> Iterator[Item]:
        if self._iterated:
            raise RuntimeError("a WindowMerge is read once")
        self._iterated = True
        return self._items()

    def _items(self) -> Iterator[Item]:
        stats = self.stats
        while True:
            key = self._settle()
            if key is None:
                return
            if stats.last_key is not None and key <= stats.last_key:
                raise DecodingError(f"transaction {key.id} merged after {stats.last_key.id}")
            parts = [r for r in self._readers if r.head == key]
            tablets = tuple(r.tablet_id for r in parts)
            yield TxBegin(key, tablets)
            total = 0
            counts: Counter[str] = Counter()
            for reader in parts:
                for record, schema in reader.part():
                    collection = self._data_collection(record.row_message)
                    if collection is None:
                        stats.filtered_changes += 1
                        continue
                    total += 1
                    counts[collection] += 1
                    yield Change(key, reader.tablet_id, record, schema, collection, total, counts[collection])
            yield TxEnd(key, tablets, total, dict(counts))
            stats.transactions += 1
            stats.changes += total
            stats.last_key = key

    def _settle(self) -> TxKey | None:
        """Read tablets until every one is past the smallest head; that head (None: all ended). A
        tablet that ends with a split is replaced by its children here, before any bound is taken
        without them."""
        while True:
            progressed = False
            for reader in list(self._readers):
                if reader.head is not None or reader.end is not None:
                    continue
                bound = self._bound()
                if bound is not None and reader.watermark >= bound.commit_time:
                    continue  # its next transaction comes after the smallest head
                reader.advance(None if bound is None else bound.commit_time)
                progressed = True
                if reader.split is not None:
                    self._hand_over(reader, reader.split)
            if not progressed:
                return self._bound()

    def _hand_over(self, parent: TabletReader, split: Split) -> None:
        """The split ``parent``'s children join the merge, each from the position ``on_split``
        gives. They keep the parent's table schemas until their own DDL records come (the children
        hold the parent's tables; YB sends a child's schema with its first response)."""
        if self._on_split is None:
            raise TabletSplitError(f"tablet {parent.tablet_id} was split (asked from {split.at.checkpoint})")
        children = dict(self._on_split(parent.tablet_id, parent.hand_over(split.at)))
        if len(children) < 2:
            raise CdcStateError(f"tablet {parent.tablet_id} was split into {sorted(children)}: two children expected")
        known = sorted(set(children) & {r.tablet_id for r in self._readers})
        if known:
            raise CdcStateError(
                f"tablet {parent.tablet_id} was split into {', '.join(sorted(children))}, but "
                f"{', '.join(known)} is read in this window already"
            )
        starts: dict[str, TabletPosition] = {}
        for child, (position, pages) in sorted(children.items()):
            reader = self._reader(child, pages, position)
            reader.schemas = dict(parent.schemas)
            self._readers.append(reader)
            starts[child] = position
        self._readers.sort(key=lambda r: r.tablet_id)  # a transaction's parts are numbered in tablet-id order
        self._splits.append((parent.tablet_id, starts))
        self.stats.splits += 1

    def _bound(self) -> TxKey | None:
        heads = [r.head for r in self._readers if r.head is not None]
        return min(heads) if heads else None


__all__ = ["DataCollection", "SplitHandler", "WindowMerge", "schema_table"]
