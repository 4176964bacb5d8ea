"""Merging tablets' record streams into a window's whole transactions, in commit order.

The property test runs consecutive windows against a model of YB's per-tablet ``GetChanges``
(``cdcsdk_producer.cc``): records sorted by commit time (single-shard writes first at equal times,
then transactions by id), pages of random size, response checkpoints that lag what was sent (so
fragments come twice), a safe time that covers only what has surely been sent, records at or
before the request's safe time not sent again, and a schema record at the start of each window.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import Checkpoint, TabletPosition
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.merge import WindowMerge
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import Page, poll_pages
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.transactions import (
    MULTI_SHARD,
    SINGLE_SHARD,
    Change,
    TxBegin,
    TxEnd,
    TxKey,
)

Op = pb.RowMessage
TABLES = ("orders", "items")


# -- records ------------------------------------------------------------------------------------


def record(
    op: int, commit: int = 0, txid: str = "", op_id: tuple[int, int, int] | None = None, **row
) -> pb.CDCSDKProtoRecordPB:
    message = pb.CDCSDKProtoRecordPB(
        row_message=pb.RowMessage(op=op, commit_time=commit, transaction_id=txid.encode(), **row)
    )
    if op_id is not None:
        message.cdc_sdk_op_id.term, message.cdc_sdk_op_id.index, message.cdc_sdk_op_id.write_id = op_id
    return message


def insert(commit: int, txid: str, table: str, value: str, op_id: tuple[int, int, int]) -> pb.CDCSDKProtoRecordPB:
    datum = pb.DatumMessagePB(column_name="id", column_type=25, datum_string=value)
    return record(
        Op.INSERT, commit, txid, op_id, table=table, table_id=f"id-{table}", pgschema_name="public", new_tuple=[datum]
    )


def ddl(table: str, commit: int = 0, op_id: tuple[int, int, int] | None = None) -> pb.CDCSDKProtoRecordPB:
    schema = pb.CDCSDKSchemaPB(column_info=[pb.CDCSDKColumnInfoPB(name="id", oid=25, is_key=True)])
    return record(Op.DDL, commit, "", op_id, table=table, table_id=f"id-{table}", pgschema_name="public", schema=schema)


def page(records: list[pb.CDCSDKProtoRecordPB], safe: int, request: TabletPosition | None = None, to: int = 0) -> Page:
    request = request or TabletPosition(Checkpoint(1, 0))
    return Page(request, tuple(records), Checkpoint(1, to), safe)


def read(merge: WindowMerge) -> list[tuple[TxKey, tuple[str, ...], list[str]]]:
    """The merge's transactions as (key, tablets, change values), checking their numbering."""
    out: list[tuple[TxKey, tuple[str, ...], list[str]]] = []
    begin: TxBegin | None = None
    changes: list[Change] = []
    for item in merge:
        if isinstance(item, TxBegin):
            assert begin is None
            begin, changes = item, []
        elif isinstance(item, Change):
            assert begin is not None and item.key == begin.key
            changes.append(item)
        else:
            assert isinstance(item, TxEnd) and begin is not None and item.key == begin.key
            assert [c.total_order for c in changes] == list(range(1, len(changes) + 1))
            per: Counter[str] = Counter()
            for change in changes:
                per[change.data_collection] += 1
                assert change.data_collection_order == per[change.data_collection]
                assert change.schema is not None and change.schema.table_id == change.record.row_message.table_id
            assert item.event_count == len(changes) and dict(item.counts) == dict(per)
            assert item.tablets == begin.tablets
            out.append((item.key, item.tablets, [c.record.row_message.new_tuple[0].datum_string for c in changes]))
            begin = None
    assert begin is None
    return out


# -- a model of YB's GetChanges -----------------------------------------------------------------


@dataclass
class Fragment:
    key: TxKey
    commit: int
    records: list[pb.CDCSDKProtoRecordPB]


@dataclass
class FakeTablet:
    """One tablet's sorted fragments; a checkpoint's index counts the fragments it covers."""

    tablet_id: str
    fragments: list[Fragment]
    frontier: int  # the tablet's safe time once everything was sent
    rng: random.Random
    first_call: bool = True
    sloppy: bool = False
    calls: int = 0

    def new_window(self, sloppy: bool) -> None:
        self.first_call, self.sloppy = True, sloppy

    def get_changes(self, position: TabletPosition) -> pb.GetChangesResponsePB:
        self.calls += 1
        fragments, start, safe = self.fragments, position.checkpoint.index, position.safe_hybrid_time
        threshold = -(2**63) if (self.sloppy and self.first_call) else safe
        size = self.rng.randint(1, 3)
        records: list[pb.CDCSDKProtoRecordPB] = [ddl(t) for t in TABLES] if self.first_call else []
        self.first_call = False
        end, shipped = start, 0
        while end < len(fragments) and shipped < size:
            if fragments[end].commit > threshold:
                records.extend(fragments[end].records)
                shipped += 1
            end += 1
        if end == len(fragments):
            new_safe = max(safe, self.frontier)
        else:  # YB's safe time: the last commit time sent that no later record shares
            below = [f.commit for f in fragments[start:end] if f.commit < fragments[end].commit]
            new_safe = max([safe, 0, *below])  # YB answers 0 for a request without a safe time
        records.append(record(Op.SAFEPOINT, new_safe))
        lagging = self.rng.randint(start, end)  # a response checkpoint may lag what was sent
        return pb.GetChangesResponsePB(
            cdc_sdk_proto_records=records,
            cdc_sdk_checkpoint=pb.CDCSDKCheckpointPB(term=1, index=lagging),
            safe_hybrid_time=new_safe,
        )


@dataclass
class History:
    tablets: list[str]
    transactions: list[tuple[TxKey, tuple[str, ...], list[str]]]  # in commit order
    per_tablet: dict[str, list[Fragment]] = field(default_factory=dict)
    ends: list[int] = field(default_factory=list)


@st.composite
def histories(draw: st.DrawFn) -> History:
    tablets = [f"tablet-{i}" for i in range(draw(st.integers(1, 4)))]
    raw = []
    for n in range(draw(st.integers(0, 20))):
        commit = draw(st.integers(1, 30))
        if len(tablets) > 1 and draw(st.booleans()):
            parts = sorted(draw(st.sets(st.sampled_from(tablets), min_size=1)))
            txid = f"{draw(st.integers(0, 2**32 - 1)):08x}-0000-4000-8000-{n:012x}"
        else:
            parts, txid = [draw(st.sampled_from(tablets))], ""
        rows = {t: [draw(st.sampled_from(TABLES)) for _ in range(draw(st.integers(1, 3)))] for t in parts}
        raw.append((commit, txid, n, rows))
    # Each tablet's fragments in YB's order; single-shard writes get increasing WAL op indexes.
    per_tablet: dict[str, list[Fragment]] = {}
    keys: dict[int, TxKey] = {}
    for tablet in tablets:
        mine = [t for t in raw if tablet in t[3]]
        mine.sort(key=lambda t: (t[0], 0 if not t[1] else 1, t[1], t[2]))
        fragments = []
        for index, (commit, txid, n, rows) in enumerate(mine, start=1):
            if txid:
                key = keys.setdefault(n, TxKey(commit, MULTI_SHARD, (txid,)))
            else:
                key = keys[n] = TxKey(commit, SINGLE_SHARD, (tablet, 1, index))
            values = [f"{n}/{tablet}/{k}" for k in range(len(rows[tablet]))]
            body = [
                insert(commit, txid, table, value, (1, index, k))
                for k, (table, value) in enumerate(zip(rows[tablet], values))
            ]
            records = [record(Op.BEGIN, commit, txid), *body, record(Op.COMMIT, commit, txid, (1, index, 0))]
            fragments.append(Fragment(key, commit, records))
        per_tablet[tablet] = fragments
    transactions = sorted(
        (keys[n], tuple(sorted(rows)), [f"{n}/{t}/{k}" for t in sorted(rows) for k in range(len(rows[t]))])
        for _, _, n, rows in raw
    )
    ends = [*sorted(draw(st.lists(st.integers(0, 35), max_size=6))), 40]
    return History(tablets, transactions, per_tablet, ends)


@given(histories(), st.randoms(use_true_random=False), st.lists(st.booleans(), min_size=8, max_size=8))
@settings(max_examples=150, deadline=None)
def test_consecutive_windows_take_every_transaction_once_whole_and_in_order(
    history: History, rng: random.Random, sloppy: list[bool]
) -> None:
    fakes = {t: FakeTablet(t, history.per_tablet[t], frontier=45, rng=rng) for t in history.tablets}
    positions = {t: TabletPosition(Checkpoint(1, 0)) for t in history.tablets}
    from_ht, taken = 1, []
    for number, end in enumerate(history.ends):
        to_ht = max(end + 1, from_ht)
        for fake in fakes.values():
            fake.new_window(sloppy[number % len(sloppy)])
        pages = {t: poll_pages(fakes[t].get_changes, positions[t], to_ht - 1) for t in history.tablets}
        merge = WindowMerge(from_ht=from_ht, to_ht=to_ht, tablets=pages, start=positions)
        window = read(merge)
        assert all(from_ht <= key.commit_time < to_ht for key, _, _ in window)
        taken.extend(window)
        ends = merge.end_positions
        for tablet, position in ends.items():
            # The tablet stops before the first transaction of a later window, never past it...
            fragments = history.per_tablet[tablet]
            first_later = next((i for i, f in enumerate(fragments) if f.commit >= to_ht), len(fragments))
            assert position.checkpoint.index <= first_later
            # ...and has provably sent everything up to the window's end (an empty window reads nothing).
            assert position.safe_hybrid_time >= to_ht - 1 or (to_ht == from_ht and position == positions[tablet])
        positions, from_ht = ends, to_ht  # window N's end positions are where N + 1 starts
    assert taken == history.transactions


# -- rules, one at a time -----------------------------------------------------------------------

TX = "0000000a-0000-4000-8000-000000000001"


def merge_of(pages: dict[str, list[Page]], from_ht: int, to_ht: int, **kw) -> WindowMerge:
    start = {t: p[0].request if p else TabletPosition(Checkpoint(1, 0)) for t, p in pages.items()}
    return WindowMerge(from_ht=from_ht, to_ht=to_ht, tablets=pages, start=start, **kw)


def test_multi_shard_parts_merge_into_one_transaction_numbered_by_tablet() -> None:
    b = [
        ddl("items"),
        record(Op.BEGIN, 7, TX),
        insert(7, TX, "items", "b1", (1, 3, 1)),
        record(Op.COMMIT, 7, TX, (1, 3, 0)),
    ]
    a = [
        ddl("orders"),
        record(Op.BEGIN, 5),  # a single-shard write: no transaction id, identified by its op id
        insert(5, "", "orders", "a0", (1, 8, 0)),
        record(Op.COMMIT, 5, "", (1, 8, 0)),
        record(Op.BEGIN, 7, TX),
        insert(7, TX, "orders", "a1", (1, 9, 1)),
        ddl("items"),  # YB sends a table's schema before its first row, inside the transaction
        insert(7, TX, "items", "a2", (1, 9, 2)),
        record(Op.COMMIT, 7, TX, (1, 9, 0)),
    ]
    merge = merge_of({"tb": [page(b, 20)], "ta": [page(a, 20)]}, 1, 21)
    items = list(merge)
    assert read(merge_of({"tb": [page(b, 20)], "ta": [page(a, 20)]}, 1, 21)) == [
        (TxKey(5, SINGLE_SHARD, ("ta", 1, 8)), ("ta",), ["a0"]),
        (TxKey(7, MULTI_SHARD, (TX,)), ("ta", "tb"), ["a1", "a2", "b1"]),
    ]
    changes = [i for i in items if isinstance(i, Change) and i.key.kind == MULTI_SHARD]
    assert [(c.data_collection, c.total_order, c.data_collection_order) for c in changes] == [
        ("public.orders", 1, 1),
        ("public.items", 2, 1),
        ("public.items", 3, 2),
    ]
    assert changes[1].schema is not None and changes[1].schema.table == "items"
    assert items[-1] == TxEnd(changes[0].key, ("ta", "tb"), 3, {"public.orders": 1, "public.items": 2})
    assert TxKey(7, MULTI_SHARD, (TX,)).id == f"{TX}:7" and TxKey(5, SINGLE_SHARD, ("ta", 1, 8)).txid == ""


def test_a_transaction_at_or_past_the_end_cuts_the_tablet_before_its_begin() -> None:
    second = TabletPosition(Checkpoint(1, 4, b"k", 2), 6, 3)
    pages = [
        page([ddl("orders"), record(Op.BEGIN, 5, TX), insert(5, TX, "orders", "x", (1, 4, 1))], 6, to=4),
        page([record(Op.COMMIT, 5, TX, (1, 4, 0)), record(Op.BEGIN, 10)], 6, request=second, to=7),
    ]
    merge = merge_of({"t": pages}, 1, 10)
    assert [v for _, _, v in read(merge)] == [["x"]]
    # the next window asks again from the cut page's request, with everything up to 9 sent
    assert merge.end_positions == {"t": TabletPosition(Checkpoint(1, 4, b"k", 2), 9, 0)}


def test_without_a_cut_the_tablet_ends_at_the_last_page() -> None:
    pages = [page([record(Op.SAFEPOINT, 3)], 3, to=2), page([record(Op.SAFEPOINT, 12)], 12, to=5)]
    merge = merge_of({"t": pages}, 1, 10)
    assert read(merge) == []
    assert merge.end_positions == {"t": TabletPosition(Checkpoint(1, 5), 12, 0)}


def test_a_schema_change_after_the_end_cuts_and_one_before_applies() -> None:
    pages = [
        page(
            [
                ddl("orders"),
                ddl("orders", commit=2, op_id=(1, 1, 0)),
                record(Op.BEGIN, 4),
                insert(4, "", "orders", "x", (1, 2, 0)),
                record(Op.COMMIT, 4, "", (1, 2, 0)),
                ddl("orders", commit=10, op_id=(1, 3, 0)),
            ],
            11,
        )
    ]
    merge = merge_of({"t": pages}, 1, 10)
    assert [v for _, _, v in read(merge)] == [["x"]]
    assert merge.end_positions["t"].safe_hybrid_time == 9


def test_records_sent_again_are_skipped() -> None:
    tail = [insert(3, TX, "orders", "old", (1, 2, 4)), record(Op.COMMIT, 3, TX, (1, 2, 0))]  # before the window
    body = [record(Op.BEGIN, 6), insert(6, "", "orders", "new", (1, 5, 0)), record(Op.COMMIT, 6, "", (1, 5, 0))]
    pages = [page([ddl("orders"), *tail, *body], 5), page([*body, record(Op.SAFEPOINT, 30)], 30)]  # body twice
    merge = merge_of({"t": pages}, 5, 20)
    assert [v for _, _, v in read(merge)] == [["new"]]
    assert (merge.stats.earlier_skipped, merge.stats.resent_skipped) == (2, 1)


def test_out_of_order_and_broken_streams_fail() -> None:
    def run(records: list[pb.CDCSDKProtoRecordPB], safe: int = 30) -> None:
        list(merge_of({"t": [page([ddl("orders"), *records], safe)]}, 1, 20))

    late = [record(Op.BEGIN, 8, TX), record(Op.COMMIT, 8, TX, (1, 2, 0))]
    early = [record(Op.BEGIN, 6, "ffffffff-0000-4000-8000-000000000001"), record(Op.COMMIT, 6, "x", (1, 1, 0))]
    with pytest.raises(DecodingError, match="out of commit order"):
        run([*late, *early])
    with pytest.raises(DecodingError, match="inside transaction"):
        run([record(Op.BEGIN, 8, TX), record(Op.COMMIT, 9, TX, (1, 2, 0))])
    with pytest.raises(DecodingError, match="outside a transaction"):
        run([insert(8, TX, "orders", "x", (1, 1, 0))])
    with pytest.raises(DecodingError, match="unexpected READ"):
        run([record(Op.READ, 8)])
    with pytest.raises(DecodingError, match="ended before the window end"):
        run([], safe=5)
    with pytest.raises(DecodingError, match="ended inside transaction"):
        run([record(Op.BEGIN, 8, TX)], safe=5)
    with pytest.raises(DecodingError, match="safe time"):
        run([record(Op.SAFEPOINT, 9), *late])


def test_uncaptured_tables_are_dropped_before_numbering() -> None:
    records = [
        ddl("orders"),
        ddl("items"),
        record(Op.BEGIN, 4, TX),
        insert(4, TX, "items", "i", (1, 1, 1)),
        insert(4, TX, "orders", "o", (1, 1, 2)),
        record(Op.COMMIT, 4, TX, (1, 1, 0)),
    ]
    merge = merge_of({"t": [page(records, 30)]}, 1, 20, data_collection=lambda r: None if r.table == "items" else "o")
    changes = [i for i in merge if isinstance(i, Change)]
    assert [(c.record.row_message.table, c.total_order) for c in changes] == [("orders", 1)]
    assert merge.stats.filtered_changes == 1


def test_an_idle_tablet_is_read_only_as_far_as_the_watermark_needs() -> None:
    """A transaction is emitted before an idle tablet has been read to the window's end, once the
    idle tablet's safe time has passed its commit time."""
    pulled: list[int] = []

    def idle() -> Iterator[Page]:
        for safe in (10, 20, 30):
            pulled.append(safe)
            yield page([record(Op.SAFEPOINT, safe)], safe)

    busy = [
        page(
            [
                ddl("orders"),
                record(Op.BEGIN, 5),
                insert(5, "", "orders", "x", (1, 1, 0)),
                record(Op.COMMIT, 5, "", (1, 1, 0)),
            ],
            30,
        )
    ]
    merge = WindowMerge(
        from_ht=1,
        to_ht=25,
        tablets={"busy": busy, "idle": idle()},
        start={t: TabletPosition(Checkpoint(1, 0)) for t in ("busy", "idle")},
    )
    items = iter(merge)
    assert isinstance(next(items), TxBegin)
    assert pulled == [10]
    list(items)
    assert pulled == [10, 20, 30]
    assert merge.end_positions["idle"].safe_hybrid_time == 30


def test_a_tablet_already_past_the_end_or_an_empty_window_reads_nothing() -> None:
    def never() -> Iterator[Page]:
        raise AssertionError("read")
        yield  # pragma: no cover

    past = TabletPosition(Checkpoint(2, 9), 50)
    merge = WindowMerge(from_ht=10, to_ht=40, tablets={"t": never()}, start={"t": past})
    assert list(merge) == [] and merge.end_positions == {"t": past}
    fresh = TabletPosition(Checkpoint(1, 0))
    empty = WindowMerge(from_ht=10, to_ht=10, tablets={"t": never()}, start={"t": fresh})
    assert list(empty) == [] and empty.end_positions == {"t": fresh}


# -- polling ------------------------------------------------------------------------------------


def test_poll_pages_follows_the_responses_until_the_tablet_passes_the_end() -> None:
    responses = iter(
        [
            pb.GetChangesResponsePB(safe_hybrid_time=5, cdc_sdk_checkpoint=pb.CDCSDKCheckpointPB(term=1, index=2)),
            pb.GetChangesResponsePB(safe_hybrid_time=5),  # nothing new: idle
            pb.GetChangesResponsePB(
                cdc_sdk_proto_records=[record(Op.BEGIN, 12)],
                safe_hybrid_time=7,
                wal_segment_index=3,
                cdc_sdk_checkpoint=pb.CDCSDKCheckpointPB(term=1, index=4),
            ),
        ]
    )
    requests: list[TabletPosition] = []
    idle: list[Page] = []

    def fetch(position: TabletPosition) -> pb.GetChangesResponsePB:
        requests.append(position)
        return next(responses)

    start = TabletPosition(Checkpoint(1, 1), 3)
    pages = list(poll_pages(fetch, start, 10, on_idle=idle.append))
    assert [p.request for p in pages] == requests
    assert requests == [start, TabletPosition(Checkpoint(1, 2), 5), TabletPosition(Checkpoint(1, 2), 5)]
    assert idle == [pages[1]]
    assert pages[-1].next_position == TabletPosition(Checkpoint(1, 4), 7, 3)
    assert list(poll_pages(fetch, TabletPosition(Checkpoint(1, 1), 10), 10)) == []
