"""Tablet splits in stream windows: the parent's pages end at ``TABLET_SPLIT``, its children take over.

The property test runs the same history of transactions as consecutive windows twice, against the
``GetChanges`` model of ``test_merge`` (pages of random size, lagging checkpoints, records sent
again): once on tablets that never split, once with one tablet split at a random point of its
record sequence. Like YB, the split parent serves its records up to the split op, with a safe time
that never passes the split's hybrid time, then answers ``TABLET_SPLIT``; its two children hold the
records of their halves of its hash range committed after the split (a transaction's part on the
parent becomes a part on each child it wrote). Every window must give the same transactions, with
the same changes, in the same order, and the end state must record the split and read the children.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import CdcStateError, DecodingError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import (
    Checkpoint,
    TabletCheckpoints,
    TabletPosition,
    TabletState,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import RetryPolicy, YbCdcClient
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.jobs import end_state
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.merge import WindowMerge
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import Page, Split, TabletSplitError, poll_until_split
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import framing
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.tablet_reader import Pages
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.transactions import MULTI_SHARD, SINGLE_SHARD, TxKey
from tests.unit.cdc.sources.yugabyte_cdc.test_client import TinyServer
from tests.unit.cdc.sources.yugabyte_cdc.test_merge import FakeTablet, Fragment, ddl, insert, page, read, record

Op = pb.RowMessage
TABLES = ("orders", "items")
START = TabletPosition(Checkpoint(1, 0))


# -- the model: a history, split or not ---------------------------------------------------------


@dataclass(frozen=True)
class Tx:
    """One transaction: a unique commit time (YB's hybrid times of one tablet's ops are distinct),
    its rows per tablet, each row in the lower (0) or upper (1) half of its tablet's range."""

    n: int
    commit: int
    multi: bool
    rows: dict[str, tuple[tuple[str, int], ...]]  # tablet → ((table, half), ...)

    @property
    def txid(self) -> str:
        return f"0000{self.n:04x}-0000-4000-8000-{self.n:012x}" if self.multi else ""


@dataclass
class Scenario:
    tablets: list[str]
    transactions: list[Tx]  # in commit order
    parent: str  # the tablet that splits
    split_ht: int  # odd: strictly between commit times (which are even)
    ends: list[int]  # window end hybrid times
    children: tuple[str, str]  # the parent's lower and upper half


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    tablets = [f"tablet-{i}" for i in range(draw(st.integers(1, 3)))]
    commits = sorted(draw(st.sets(st.integers(1, 40), max_size=16)))
    transactions = []
    for n, commit in enumerate(commits):
        multi = draw(st.booleans())
        parts = (
            sorted(draw(st.sets(st.sampled_from(tablets), min_size=1))) if multi else [draw(st.sampled_from(tablets))]
        )
        # a single-shard write stays on one child after a split (else YB would make it distributed)
        half = draw(st.integers(0, 1))
        rows = {
            t: tuple(
                (draw(st.sampled_from(TABLES)), draw(st.integers(0, 1)) if multi else half)
                for _ in range(draw(st.integers(1, 3)))
            )
            for t in parts
        }
        transactions.append(Tx(n, 2 * commit, multi, rows))
    parent = draw(st.sampled_from(tablets))
    split_ht = 2 * draw(st.integers(0, 41)) + 1
    ends = [*sorted(draw(st.lists(st.integers(0, 84), max_size=6))), 90]
    return Scenario(tablets, transactions, parent, split_ht, ends, (f"{parent}-lo", f"{parent}-up"))


def fragments(tablet: str, txs: list[Tx], rows_of: Callable[[Tx], list[tuple[int, str]]]) -> list[Fragment]:
    """A tablet's fragments in YB's order (commit time; unique here); single-shard writes get their
    WAL op index as identity, as the merge keys them. ``rows_of(tx)``: (row number, table) pairs."""
    out = []
    for index, tx in enumerate(sorted(txs, key=lambda t: t.commit), start=1):
        key = (
            TxKey(tx.commit, MULTI_SHARD, (tx.txid,))
            if tx.multi
            else TxKey(tx.commit, SINGLE_SHARD, (tablet, 1, index))
        )
        body = [
            insert(tx.commit, tx.txid, table, f"{tx.n}/{row}", (1, index, k))
            for k, (row, table) in enumerate(rows_of(tx))
        ]
        records = [record(Op.BEGIN, tx.commit, tx.txid), *body, record(Op.COMMIT, tx.commit, tx.txid, (1, index, 0))]
        out.append(Fragment(key, tx.commit, records))
    return out


def numbered(tx: Tx, tablet: str) -> list[tuple[int, str, int]]:
    """A transaction's rows on ``tablet`` as (row number across the transaction, table, half)."""
    first = sum(len(tx.rows[t]) for t in sorted(tx.rows) if t < tablet)
    return [(first + k, table, half) for k, (table, half) in enumerate(tx.rows[tablet])]


@dataclass
class SplitParent(FakeTablet):
    """The parent's log ends with the split op: once everything before it was sent, TABLET_SPLIT."""

    def get_changes(self, position: TabletPosition) -> pb.GetChangesResponsePB:
        if position.checkpoint.index >= len(self.fragments):
            self.calls += 1
            raise TabletSplitError(f"Tablet Split detected on {self.tablet_id}")
        return super().get_changes(position)


def unsplit_world(s: Scenario, rng: random.Random) -> dict[str, FakeTablet]:
    return {
        t: FakeTablet(
            t,
            fragments(
                t, [x for x in s.transactions if t in x.rows], lambda x, t=t: [(r, tb) for r, tb, _ in numbered(x, t)]
            ),
            frontier=95,
            rng=rng,
        )
        for t in s.tablets
    }


def split_world(s: Scenario, rng: random.Random) -> dict[str, FakeTablet]:
    """The same history with ``s.parent`` split at ``s.split_ht``: the parent keeps what committed
    before, with its safe time stopping at the split; each child what its half got after."""
    world = {t: w for t, w in unsplit_world(s, rng).items() if t != s.parent}
    mine = [x for x in s.transactions if s.parent in x.rows]
    before = [x for x in mine if x.commit < s.split_ht]
    world[s.parent] = SplitParent(
        s.parent,
        fragments(s.parent, before, lambda x: [(r, tb) for r, tb, _ in numbered(x, s.parent)]),
        frontier=s.split_ht,  # YB: the safe time of the response reaching the split op is that op's
        rng=rng,
    )
    for half, child in enumerate(s.children):

        def rows(x: Tx, half: int = half) -> list[tuple[int, str]]:
            return [(r, tb) for r, tb, h in numbered(x, s.parent) if h == half]

        after = [x for x in mine if x.commit > s.split_ht and rows(x)]
        world[child] = FakeTablet(child, fragments(child, after, rows), frontier=95, rng=rng)
    return world


def run_windows(
    world: dict[str, FakeTablet], tablets: TabletCheckpoints, ends: list[int], sloppy: list[bool]
) -> tuple[list[list[tuple[int, str, list[str]]]], TabletCheckpoints, int]:
    """Consecutive windows up to each of ``ends``: per window its transactions as (commit, txid,
    sorted change values), the end state, and the number of splits the merges handed over."""
    from_ht, windows, splits = 1, [], 0
    for number, end in enumerate(ends):
        to_ht = max(end + 1, from_ht)
        for fake in world.values():
            fake.new_window(sloppy[number % len(sloppy)])
        start = tablets.polled()

        def children(parent: str, at: TabletPosition, to_ht: int = to_ht) -> dict[str, tuple[TabletPosition, Pages]]:
            kids = [t for t in world if t.startswith(parent + "-")]
            return {c: (START, poll_until_split(world[c].get_changes, START, to_ht - 1)) for c in kids}

        pages = {t: poll_until_split(world[t].get_changes, p, to_ht - 1) for t, p in start.items()}
        merge = WindowMerge(from_ht=from_ht, to_ht=to_ht, tablets=pages, start=start, on_split=children)
        window = read(merge)
        assert all(from_ht <= key.commit_time < to_ht for key, _, _ in window)
        windows.append([(key.commit_time, key.txid, sorted(values)) for key, _, values in window])
        tablets = end_state(tablets, merge)
        splits += merge.stats.splits
        from_ht = to_ht
    return windows, tablets, splits


@given(scenarios(), st.randoms(use_true_random=False), st.lists(st.booleans(), min_size=8, max_size=8))
@settings(max_examples=200, deadline=None)
def test_a_split_at_any_point_gives_the_windows_of_the_unsplit_tablet(
    s: Scenario, rng: random.Random, sloppy: list[bool]
) -> None:
    initial = TabletCheckpoints({t: TabletState(START, table_ids=("tbl",)) for t in s.tablets})
    plain, plain_end, none = run_windows(unsplit_world(s, random.Random(rng.random())), initial, s.ends, sloppy)
    split, split_end, splits = run_windows(split_world(s, random.Random(rng.random())), initial, s.ends, sloppy)
    assert none == 0
    assert split == plain  # the same transactions, whole, with the same changes, per window, in order
    expected = [
        (x.commit, x.txid, sorted(f"{x.n}/{r}" for t in x.rows for r, _, _ in numbered(x, t))) for x in s.transactions
    ]
    assert [tx for window in plain for tx in window] == expected
    # the last window ends past everything: the split was found exactly once and recorded
    assert splits == 1
    assert split_end[s.parent].children == s.children
    assert set(split_end.polled()) == (set(s.tablets) - {s.parent}) | set(s.children)
    assert all(split_end[c].parent == s.parent and split_end[c].table_ids == ("tbl",) for c in s.children)
    assert all(p.safe_hybrid_time >= s.ends[-1] for p in split_end.polled().values())
    assert set(plain_end.polled()) == set(s.tablets)


# -- rules, one at a time -----------------------------------------------------------------------

TX = "0000000a-0000-4000-8000-000000000001"


def fragment(commit: int, txid: str, value: str, index: int, table: str = "orders") -> list[pb.CDCSDKProtoRecordPB]:
    return [
        record(Op.BEGIN, commit, txid),
        insert(commit, txid, table, value, (1, index, 1)),
        record(Op.COMMIT, commit, txid, (1, index, 0)),
    ]


class Children:
    """An ``on_split`` over fixed children pages, recording what it was asked."""

    def __init__(self, children: dict[str, dict[str, list[Page | Split]]]) -> None:
        self.children = children
        self.asked: list[tuple[str, TabletPosition]] = []

    def __call__(self, parent: str, at: TabletPosition) -> dict[str, tuple[TabletPosition, Pages]]:
        self.asked.append((parent, at))
        return {c: (TabletPosition(Checkpoint(2, 9)), pages) for c, pages in self.children[parent].items()}


def test_the_parent_ends_at_the_split_and_its_children_continue_in_commit_order() -> None:
    at = TabletPosition(Checkpoint(1, 3), 6)
    parent = [
        page([ddl("orders"), *fragment(4, "", "p-before", 2), record(Op.SAFEPOINT, 6)], 6, to=3),
        Split(at),
    ]
    other = [page([ddl("orders"), *fragment(5, TX, "o-5", 7), *fragment(9, "", "o-9", 8)], 30)]
    lo = [page([ddl("orders"), *fragment(7, "", "lo-7", 10), *fragment(9, TX[:-1] + "2", "lo-9", 11)], 30)]
    up = [page([ddl("orders"), *fragment(9, TX[:-1] + "2", "up-9", 10)], 30)]
    handler = Children({"p": {"p1": lo, "p2": up}})
    merge = WindowMerge(
        from_ht=1, to_ht=20, tablets={"p": parent, "q": other}, start={"p": START, "q": START}, on_split=handler
    )
    assert [(key.commit_time, tablets, values) for key, tablets, values in read(merge)] == [
        (4, ("p",), ["p-before"]),
        (5, ("q",), ["o-5"]),
        (7, ("p1",), ["lo-7"]),
        (9, ("q",), ["o-9"]),  # at equal commit times single-shard writes come first, as on one tablet
        (9, ("p1", "p2"), ["lo-9", "up-9"]),  # one transaction across both children, numbered by tablet id
    ]
    assert handler.asked == [("p", at)]  # asked from the position TABLET_SPLIT answered
    assert merge.splits == (("p", {"p1": TabletPosition(Checkpoint(2, 9)), "p2": TabletPosition(Checkpoint(2, 9))}),)
    assert set(merge.end_positions) == {"q", "p1", "p2"} and merge.stats.splits == 1
    tablets = end_state(TabletCheckpoints({t: TabletState(START, ("tbl",)) for t in ("p", "q")}), merge)
    assert tablets["p"].children == ("p1", "p2") and tablets["p"].position == START
    assert tablets.polled() == {t: merge.end_positions[t] for t in ("p1", "p2", "q")}


def test_nothing_is_emitted_past_the_parent_before_the_children_are_read() -> None:
    """The other tablet's transaction at 8 waits: the parent was past it only through its safe
    time before the split, and the children, once added, start below it."""
    pulled: list[str] = []

    def lazy(name: str, items: list[Page | Split]) -> Iterator[Page | Split]:
        for item in items:
            pulled.append(name)
            yield item

    parent = lazy(
        "p", [page([ddl("orders"), record(Op.SAFEPOINT, 3)], 3, to=1), Split(TabletPosition(Checkpoint(1, 1), 3))]
    )
    other = lazy("q", [page([ddl("orders"), *fragment(8, "", "q-8", 4)], 30)])
    child = lazy("c1", [page([ddl("orders"), *fragment(6, "", "c-6", 5)], 30)])
    handler = Children({"p": {"c1": child, "c2": [page([ddl("orders")], 30)]}})
    merge = WindowMerge(
        from_ht=1, to_ht=20, tablets={"p": parent, "q": other}, start={"p": START, "q": START}, on_split=handler
    )
    assert [values for _, _, values in read(merge)] == [["c-6"], ["q-8"]]
    assert pulled == ["p", "q", "p", "c1"]  # the split was read before q's transaction could go out


def test_a_split_inside_a_transaction_or_without_a_handler_fails() -> None:
    inside = [page([ddl("orders"), record(Op.BEGIN, 4, TX), insert(4, TX, "orders", "x", (1, 2, 1))], 3), Split(START)]
    with pytest.raises(DecodingError, match="TABLET_SPLIT inside a transaction"):
        list(WindowMerge(from_ht=1, to_ht=20, tablets={"p": inside}, start={"p": START}, on_split=Children({})))
    unhandled = [page([ddl("orders")], 3), Split(START)]
    with pytest.raises(TabletSplitError, match="tablet p was split"):
        list(WindowMerge(from_ht=1, to_ht=20, tablets={"p": unhandled}, start={"p": START}))


def test_children_already_read_or_a_single_child_are_refused() -> None:
    def merge(children: dict[str, list[Page | Split]]) -> WindowMerge:
        tablets = {"p": [page([ddl("orders")], 3), Split(START)], "c1": [page([ddl("orders")], 30)]}
        return WindowMerge(
            from_ht=1, to_ht=20, tablets=tablets, start={"p": START, "c1": START}, on_split=Children({"p": children})
        )

    with pytest.raises(CdcStateError, match="c1 is read in this window already"):
        list(merge({"c1": [], "c2": []}))
    with pytest.raises(CdcStateError, match="two children expected"):
        list(merge({"c3": []}))


def test_a_child_record_at_or_before_an_emitted_transaction_fails_the_window() -> None:
    """A server whose parent vouched past its split (a safe time beyond the split op) would let a
    later transaction out first; the child's earlier one is then refused, not dropped."""
    parent = [page([ddl("orders"), record(Op.SAFEPOINT, 12)], 12, to=1), Split(TabletPosition(Checkpoint(1, 1), 12))]
    other = [page([ddl("orders"), *fragment(10, "", "q-10", 4)], 30)]
    child = [page([ddl("orders"), *fragment(6, "", "c-6", 5)], 30)]
    handler = Children({"p": {"c1": child, "c2": [page([ddl("orders")], 30)]}})
    merge = WindowMerge(
        from_ht=1, to_ht=20, tablets={"p": parent, "q": other}, start={"p": START, "q": START}, on_split=handler
    )
    with pytest.raises(DecodingError, match="merged after"):
        list(merge)


def test_a_child_split_again_in_the_same_window_is_recorded_after_its_parent() -> None:
    handler = Children(
        {
            "p": {
                "c1": [
                    page([ddl("orders"), *fragment(5, "", "c1-5", 3)], 6, to=1),
                    Split(TabletPosition(Checkpoint(2, 1), 6)),
                ],
                "c2": [page([ddl("orders")], 30)],
            },
            "c1": {"g1": [page([ddl("orders"), *fragment(8, "", "g1-8", 4)], 30)], "g2": [page([ddl("orders")], 30)]},
        }
    )
    parent = [page([ddl("orders"), *fragment(3, "", "p-3", 2)], 4, to=2), Split(TabletPosition(Checkpoint(1, 2), 4))]
    merge = WindowMerge(from_ht=1, to_ht=20, tablets={"p": parent}, start={"p": START}, on_split=handler)
    assert [values for _, _, values in read(merge)] == [["p-3"], ["c1-5"], ["g1-8"]]
    assert [parent for parent, _ in merge.splits] == ["p", "c1"]
    tablets = end_state(TabletCheckpoints({"p": TabletState(START, ("tbl",))}), merge)
    assert set(tablets.polled()) == {"c2", "g1", "g2"}
    assert tablets["c1"].parent == "p" and tablets["c1"].children == ("g1", "g2")
    assert tablets["g1"].parent == "c1" and tablets["g1"].table_ids == ("tbl",)


# -- polling and the client ---------------------------------------------------------------------


def test_poll_until_split_ends_the_pages_at_the_refused_position() -> None:
    answers: list[pb.GetChangesResponsePB | Exception] = [
        pb.GetChangesResponsePB(safe_hybrid_time=4, cdc_sdk_checkpoint=pb.CDCSDKCheckpointPB(term=1, index=3)),
        TabletSplitError("Tablet Split detected on p"),
    ]

    def fetch(position: TabletPosition) -> pb.GetChangesResponsePB:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    items = list(poll_until_split(fetch, START, 10))
    assert isinstance(items[0], Page) and items[1] == Split(TabletPosition(Checkpoint(1, 3), 4))

    def broken(position: TabletPosition) -> pb.GetChangesResponsePB:
        raise CdcStateError("something else")

    with pytest.raises(CdcStateError, match="something else"):
        list(poll_until_split(broken, START, 10))


class SplitCluster:
    """A master and a tablet server: tablet ``p`` was split into ``c1`` and ``c2``; the children are
    listed only from the second ``GetTabletListToPollForCDC`` on (the master not done yet)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lists: list[pb.GetTabletListToPollForCDCRequestPB] = []
        self.tserver = TinyServer(self._tserver)
        self.master = TinyServer(self._master)

    def close(self) -> None:
        self.tserver.close()
        self.master.close()

    def location(self, tablet_id: str, parent: str = "") -> pb.TabletLocationsPB:
        location = pb.TabletLocationsPB(tablet_id=tablet_id.encode(), split_parent_tablet_id=parent.encode())
        location.replicas.add(role=pb.LEADER).ts_info.private_rpc_addresses.add(
            host="127.0.0.1", port=self.tserver.port
        )
        return location

    def _master(self, request: framing.Request) -> list[bytes]:
        ask = pb.GetTabletLocationsRequestPB.FromString(request.body)
        response = pb.GetTabletLocationsResponsePB(tablet_locations=[self.location(t.decode()) for t in ask.tablet_ids])
        return [framing.encode_response(request.call_id, response)]

    def _tserver(self, request: framing.Request) -> list[bytes]:
        self.calls.append(request.method)
        if request.method == "GetChanges":
            error = pb.CDCErrorPB(
                code=pb.CDCErrorPB.TABLET_SPLIT,
                status=pb.AppStatusPB(code=pb.AppStatusPB.TABLET_SPLIT, message="Tablet Split detected on p"),
            )
            return [framing.encode_response(request.call_id, pb.GetChangesResponsePB(error=error))]
        self.lists.append(pb.GetTabletListToPollForCDCRequestPB.FromString(request.body))
        response = pb.GetTabletListToPollForCDCResponsePB()
        children = ["c1", "c2"] if len(self.lists) > 1 else ["c1"]
        for child in children:
            pair = response.tablet_checkpoint_pairs.add()
            pair.tablet_locations.CopyFrom(self.location(child, "p"))
            pair.cdc_sdk_checkpoint.CopyFrom(pb.CDCSDKCheckpointPB(term=1, index=7, snapshot_time=123))
        return [framing.encode_response(request.call_id, response)]


@pytest.fixture
def split_cluster() -> Iterator[SplitCluster]:
    cluster = SplitCluster()
    yield cluster
    cluster.close()


def test_the_client_reports_a_split_at_once_and_lists_the_children(split_cluster: SplitCluster) -> None:
    masters = [("127.0.0.1", split_cluster.master.port)]
    retry = RetryPolicy(attempts=4, backoff_seconds=0)
    with YbCdcClient(masters, "s" * 32, retry=retry, timeout_seconds=5, tls=None) as client:
        with pytest.raises(TabletSplitError, match="Tablet Split detected on p"):
            client.get_changes("p", START)
        assert split_cluster.calls == ["GetChanges"]  # not retried: asking again cannot help
        children = client.split_children("p", ["tbl"])
    # the op id of each child (the snapshot time YB fills in from the row's safe time is no position)
    assert children == {"c1": Checkpoint(1, 7), "c2": Checkpoint(1, 7)}
    assert len(split_cluster.lists) == 2  # asked again until both children were listed
    asked = split_cluster.lists[-1]
    assert (asked.tablet_id, asked.table_info.table_id, asked.table_info.stream_id) == (b"p", b"tbl", b"s" * 32)
