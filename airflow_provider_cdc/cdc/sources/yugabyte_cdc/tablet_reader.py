"""One tablet's part of the window merge: its records consumed transaction fragment by fragment, its
watermark, where it ends (the cut) and where a split's children go on from (:meth:`TabletReader.hand_over`).
The rules (commit order, watermark, window end, splits, records sent again) are :mod:`.merge`'s docstring.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import TabletPosition
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import Page, Split
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.transactions import MULTI_SHARD, ROW_OPS, SINGLE_SHARD, TxKey

Op = pb.RowMessage

#: A tablet's pages; a split tablet's end with a :class:`~.pages.Split` (:func:`~.pages.poll_until_split`).
Pages = Iterable[Page | Split]


@dataclass
class MergeStats:
    transactions: int = 0
    changes: int = 0
    filtered_changes: int = 0  # changes of tables not captured (not numbered)
    earlier_skipped: int = 0  # records committed before the window, sent again
    resent_skipped: int = 0  # transaction parts a tablet sent twice within the window
    splits: int = 0  # tablets that answered TABLET_SPLIT (handed over to their children)
    last_key: TxKey | None = None


class TabletReader:
    """One tablet's records, consumed fragment by fragment (see the module docstring)."""

    def __init__(
        self,
        tablet_id: str,
        pages: Pages,
        start: TabletPosition,
        *,
        from_ht: int,
        to_ht: int,
        stats: MergeStats,
    ):
        self.tablet_id = tablet_id
        self._pages = iter(pages)
        self._page: Page | None = None
        self._last_page: Page | None = None
        self._i = 0
        self._pending: deque[pb.CDCSDKProtoRecordPB] = deque()  # looked ahead, not yet consumed
        self._from, self._to, self._end_ht = from_ht, to_ht, to_ht - 1
        self._start_safe = start.safe_hybrid_time
        self._stats = stats
        self.watermark = max(from_ht - 1, start.safe_hybrid_time)
        self.head: TxKey | None = None
        self.end: TabletPosition | None = None
        self.split: Split | None = None  # set when the tablet answered TABLET_SPLIT (then ``end`` too)
        self.schemas: dict[str, pb.RowMessage] = {}
        self._last: TxKey | None = None
        self._seen: set[TxKey] = set()  # keys consumed and still above the watermark
        self._seen_order: deque[TxKey] = deque()
        if self.watermark >= self._end_ht:  # an empty window, or a tablet already past its end
            self._finish(start)

    # -- records -----------------------------------------------------------------------------

    def _take(self, *, inside: bool = False) -> pb.CDCSDKProtoRecordPB | None:
        """The next record, or None at the end of a page (whose safe time then applies) and at a
        split (the tablet has then ended). ``inside``: a transaction is open, where a split cannot be
        (YB resumes a transaction sent over several responses without a split check)."""
        if self._pending:
            return self._pending.popleft()
        page = self._page
        if page is None:
            item = next(self._pages, None)
            if item is None:
                where = f"inside transaction {self.head}" if self.head is not None else "before the window end"
                raise DecodingError(
                    f"tablet {self.tablet_id}: its changes ended {where} (safe time {self.watermark}, "
                    f"window end {self._end_ht})"
                )
            if isinstance(item, Split):
                if inside:
                    raise DecodingError(
                        f"tablet {self.tablet_id}: TABLET_SPLIT inside a transaction (asked from {item.at.checkpoint})"
                    )
                self.split = item
                self._finish(item.at)
                return None
            page = item
            self._page, self._i = page, 0
        if self._i < len(page.records):
            self._i += 1
            return page.records[self._i - 1]
        self._page, self._last_page = None, page
        self._raise_watermark(page.safe_hybrid_time)
        return None

    def _raise_watermark(self, safe: int) -> None:
        if safe > self.watermark:
            self.watermark = safe
            while self._seen_order and self._seen_order[0].commit_time <= safe:
                self._seen.discard(self._seen_order.popleft())

    def _finish(self, position: TabletPosition) -> None:
        self.end = position
        close = getattr(self._pages, "close", None)
        if close is not None:
            close()  # stop a lazy poller: the next window reads the rest

    def hand_over(self, at: TabletPosition) -> TabletPosition:
        """Where a split tablet's children go on from (module docstring, Splits): the refused
        request's checkpoint, with a safe time at or past everything taken from this tablet. The
        WAL segment index is the parent's sorting state and does not apply to a child's log."""
        taken = self._last.commit_time if self._last is not None else -1
        return TabletPosition(at.checkpoint, max(at.safe_hybrid_time, self.watermark, taken), 0)

    def _cut(self) -> None:
        """End before the record just taken (it belongs to the next window)."""
        if self._page is None:
            raise RuntimeError("window cut before any page was read")
        self._finish(TabletPosition(self._page.request.checkpoint, self._end_ht, 0))

    def _schema(self, row: pb.RowMessage) -> None:
        self.schemas[_table_key(row)] = row

    # -- between transactions ----------------------------------------------------------------

    def advance(self, bound: int | None) -> None:
        """Read until the next transaction's ``BEGIN`` (:attr:`head`), the tablet's end, or its
        safe time reaching ``bound`` (None: moving at all, so that tablets are read in turn)."""
        mark = self.watermark
        while self.head is None and self.end is None:
            reached = self.watermark >= bound if bound is not None else self.watermark > mark
            if reached:
                return
            record = self._take()
            if record is None:
                if self.end is None and self.watermark >= self._end_ht:
                    if self._last_page is None:
                        raise RuntimeError("window finished before any page was read")
                    self._finish(self._last_page.next_position)
                continue
            row = record.row_message
            if row.op == Op.BEGIN:
                self._begin(record)
            elif row.op == Op.SAFEPOINT:
                self._raise_watermark(row.commit_time)
            elif row.op == Op.DDL:
                if row.commit_time >= self._to:
                    self._cut()
                else:
                    self._schema(row)
            elif row.op in ROW_OPS or row.op == Op.COMMIT:
                self._outside(row)
            else:
                raise DecodingError(f"tablet {self.tablet_id}: unexpected {_op_name(row)} record in a stream window")

    def _outside(self, row: pb.RowMessage) -> None:
        """A change or COMMIT with no BEGIN: the tail of a transaction sent before (YB resumes a
        transaction split over responses from its checkpoint, without a new BEGIN)."""
        txid = row.transaction_id.decode("ascii", "replace")
        if row.commit_time < self._from or row.commit_time <= self._start_safe:
            self._stats.earlier_skipped += 1
        elif txid and TxKey(row.commit_time, MULTI_SHARD, (txid,)) in self._seen:
            self._stats.resent_skipped += 1
        else:
            raise DecodingError(
                f"tablet {self.tablet_id}: {_op_name(row)} record committed at {row.commit_time} outside a transaction"
            )

    def _begin(self, record: pb.CDCSDKProtoRecordPB) -> None:
        row = record.row_message
        commit = row.commit_time
        if not commit:
            raise DecodingError(f"tablet {self.tablet_id}: BEGIN without a commit time")
        if commit >= self._to:
            self._cut()
            return
        txid = row.transaction_id.decode("ascii", "replace")
        if txid:
            key = TxKey(commit, MULTI_SHARD, (txid,))
        else:
            term, index = self._first_op_id()
            key = TxKey(commit, SINGLE_SHARD, (self.tablet_id, term, index))
        if self._sent_before(key):
            self._skip(key)
        else:
            self.head = key

    def _first_op_id(self) -> tuple[int, int]:
        """The WAL op id of a single-shard write: its first record that has one (looked ahead)."""
        looked: list[pb.CDCSDKProtoRecordPB] = []
        while True:
            record = self._take(inside=True)
            if record is None:
                continue  # YB never splits one write over responses; tolerated all the same
            looked.append(record)
            if record.HasField("cdc_sdk_op_id") and record.row_message.op != Op.DDL:
                self._pending.extendleft(reversed(looked))
                return record.cdc_sdk_op_id.term, record.cdc_sdk_op_id.index
            if record.row_message.op not in (Op.DDL, *ROW_OPS):
                raise DecodingError(
                    f"tablet {self.tablet_id}: {_op_name(record.row_message)} in a single-shard write before its op id"
                )

    def _sent_before(self, key: TxKey) -> bool:
        if key.commit_time < self._from or key.commit_time <= self._start_safe:
            self._stats.earlier_skipped += 1
            return True
        if self._last is not None and key <= self._last:
            if key in self._seen:
                self._stats.resent_skipped += 1
                return True
            raise DecodingError(
                f"tablet {self.tablet_id}: transaction {key.id} arrived after {self._last.id}, out of commit order"
            )
        if key.commit_time <= self.watermark:
            raise DecodingError(
                f"tablet {self.tablet_id}: transaction {key.id} arrived after the tablet's safe time "
                f"{self.watermark} had passed its commit time"
            )
        return False

    # -- one transaction ---------------------------------------------------------------------

    def part(self) -> Iterator[tuple[pb.CDCSDKProtoRecordPB, pb.RowMessage | None]]:
        """The head transaction's changes on this tablet, each with its table's schema record."""
        key = self.head
        if key is None:
            raise RuntimeError("no head transaction to read")
        for record in self._fragment(key):
            row = record.row_message
            yield record, self.schemas.get(_table_key(row))
        self._last = key
        self._seen.add(key)
        self._seen_order.append(key)
        self.head = None

    def _skip(self, key: TxKey) -> None:
        for _ in self._fragment(key):
            pass

    def _fragment(self, key: TxKey) -> Iterator[pb.CDCSDKProtoRecordPB]:
        """The change records of the transaction ``key`` up to its COMMIT (schema records inside
        it applied, page boundaries crossed)."""
        while True:
            record = self._take(inside=True)
            if record is None:
                continue
            row = record.row_message
            if row.op in ROW_OPS:
                self._check_member(key, row)
                yield record
            elif row.op == Op.DDL:
                self._schema(row)
            elif row.op == Op.COMMIT:
                self._check_member(key, row)
                return
            else:
                raise DecodingError(f"tablet {self.tablet_id}: {_op_name(row)} record inside transaction {key.id}")

    def _check_member(self, key: TxKey, row: pb.RowMessage) -> None:
        if row.commit_time != key.commit_time or (
            key.kind == MULTI_SHARD and row.transaction_id and row.transaction_id.decode("ascii", "replace") != key.txid
        ):
            raise DecodingError(
                f"tablet {self.tablet_id}: {_op_name(row)} of transaction {row.transaction_id!r} committed at "
                f"{row.commit_time} inside transaction {key.id}"
            )


def _table_key(row: pb.RowMessage) -> str:
    return row.table_id or row.table


def _op_name(row: pb.RowMessage) -> str:
    try:
        return Op.Op.Name(row.op)
    except ValueError:
        return f"op {row.op}"


__all__ = ["MergeStats", "Pages", "TabletReader"]
