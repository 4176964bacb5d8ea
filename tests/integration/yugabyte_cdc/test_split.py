"""Tablet splits in stream windows of the CDC-service source (``run_job``), against the stand-in
(docs/yugabytedb-cdc-standin.md) over real sockets.

One capture, four windows' worth of checks: (a) a tablet splits while the job polls it, with changes
before the split on its range and after it on both children (one transaction spanning a child and
another tablet, one spanning both children), all inside one window. As YugabyteDB does once a split
is applied, the parent answers TABLET_SPLIT at once, with pre-split changes still unsent, and the
children send those from their copies of the parent's log (docs/research/issue29/cdc-service.md
§1.1): every change once, whole transactions, commit order, the window's end state marks the split;
(c) the same window's spec run again gives the same changes and end state (the parent now refuses
at once, from the window's start); (b) the next window reads the children only; (d) a split between
windows, found by the next window's first ``GetChanges`` (once after records, once with nothing
after the checkpoint), a child split again. The replay of every window equals the table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import TabletCheckpoints, TabletPosition
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import YbCdcClient
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.jobs import run_job
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import TabletSplitError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.service_errors import InvalidRequestError
from tests.integration.yugabyte_cdc.test_stream import (
    base_image,
    key_of,
    keys_per_tablet,
    make_spec,
    no_spark,
    topic,
)
from tests.support.oracle import replay, source_rows
from tests.support.yugabyte_cdc import YugabyteCdcStandIn, standin_for
from tests.support.yugabyte_cdc.starts import start_streaming

pytestmark = pytest.mark.pg

TABLE = "t_split"
COLUMNS = ("id", "v", "n")
RECORD_TYPE = "ALL"  # full before images: the replay needs no column carried over
HT_PER_SECOND = 1_000_000 << 12  # hybrid time: physical microseconds << 12
ROW_OPS = (pb.RowMessage.INSERT, pb.RowMessage.UPDATE, pb.RowMessage.DELETE)


@pytest.fixture(scope="module")
def yb(request, clusters) -> Iterator[YugabyteCdcStandIn]:
    yield from standin_for(request, clusters["pg15"], rpc_heartbeat_interval=0.3)


@dataclass
class Calls:
    """Every ``GetChanges`` the job made: (tablet, rows it brought, or "split" for TABLET_SPLIT)."""

    seen: list[tuple[str, int | str]] = field(default_factory=list)
    after_first: dict[str, Callable[[], None]] = field(default_factory=dict)  # tablet → run after its first page

    def of(self, tablet: str) -> list[int | str]:
        return [outcome for t, outcome in self.seen if t == tablet]

    def tablets(self) -> set[str]:
        return {t for t, _ in self.seen}


@pytest.fixture
def calls(monkeypatch) -> Calls:
    spy = Calls()
    real = YbCdcClient.get_changes

    def get_changes(
        client: YbCdcClient, tablet_id: str, position: TabletPosition, **kw: Any
    ) -> pb.GetChangesResponsePB:
        try:
            response = real(client, tablet_id, position, **kw)
        except TabletSplitError:
            spy.seen.append((tablet_id, "split"))
            raise
        rows = [r for r in response.cdc_sdk_proto_records if r.row_message.op in ROW_OPS]
        spy.seen.append((tablet_id, len(rows)))
        hook = spy.after_first.pop(tablet_id, None)
        if hook is not None and rows:
            hook()  # e.g. split the tablet now, between two of its pages
        elif hook is not None:
            spy.after_first[tablet_id] = hook
        return response

    monkeypatch.setattr(YbCdcClient, "get_changes", get_changes)
    return spy


def execute(yb: YugabyteCdcStandIn, *statements: tuple[str, tuple], transaction: bool = False) -> None:
    with yb.connect() as conn:
        if transaction:
            with conn.transaction():
                for text, args in statements:
                    conn.execute(text, args)
        else:
            for text, args in statements:
                conn.execute(text, args)


def insert(key: int, v: str) -> tuple[str, tuple]:
    return f"INSERT INTO {TABLE} VALUES (%s, %s, %s)", (key, v, key % 7)


def update(key: int, v: str) -> tuple[str, tuple]:
    return f"UPDATE {TABLE} SET v = %s, n = n + 1 WHERE id = %s", (v, key)


def delete(key: int) -> tuple[str, tuple]:
    return f"DELETE FROM {TABLE} WHERE id = %s", (key,)


class Keys:
    """Unused keys of each active tablet (the hash decides; a split halves a tablet's keys)."""

    def __init__(self, yb: YugabyteCdcStandIn) -> None:
        self.yb = yb
        self.used: set[int] = set()

    def take(self, tablet: str, count: int = 1) -> list[int]:
        free = [k for k in keys_per_tablet(self.yb, TABLE)[tablet] if k not in self.used][:count]
        assert len(free) == count, f"tablet {tablet} has too few keys left"
        self.used.update(free)
        return free


def window_events(sink, window_number: int, events_before: list[dict]) -> list[dict]:
    events = topic(sink, TABLE)
    seen = {id_of(e) for e in events_before}
    mine = [e for e in events if id_of(e) not in seen]
    assert mine and len({e["window_id"] for e in mine}) == 1, f"window {window_number}"
    return mine


def id_of(event: dict) -> tuple:
    return (event["window_id"], event["op"], key_of(event), event["source"]["commit_time"])


def check_window(events: list[dict], from_ht: int, end_ht: int) -> None:
    """In the window's range, every change once, in commit order, transactions numbered whole."""
    assert all(from_ht <= e["source"]["commit_time"] <= end_ht for e in events)
    identities = [(e["op"], key_of(e), e["source"]["commit_time"]) for e in events]
    assert len(identities) == len(set(identities))
    seen = [(e["source"]["commit_time"], e["transaction"]["total_order"]) for e in events]
    assert seen == sorted(seen)
    by_tx: dict[str, list[int]] = {}
    for event in events:
        by_tx.setdefault(event["transaction"]["id"], []).append(event["transaction"]["total_order"])
    assert all(orders == list(range(1, len(orders) + 1)) for orders in by_tx.values())


def change_of(event: dict) -> tuple:
    """A change, whichever tablet sent it: operation, key, commit time, images."""
    return (event["op"], key_of(event), event["source"]["commit_time"], repr(event["before"]), repr(event["after"]))


def tablets_of_tx(events: list[dict], key: int) -> tuple[str, set[str]]:
    """The transaction that changed ``key`` (its only one in the window): its id and tablets."""
    (tx_id,) = {e["transaction"]["id"] for e in events if key_of(e) == key}
    return tx_id, {e["source"]["tablet_id"] for e in events if e["transaction"]["id"] == tx_id}


def lineage(tablets: TabletCheckpoints) -> dict[str, tuple]:
    """Each tablet's checkpoint, tables, parent and children: the end state but for safe times."""
    return {t: (s.position.checkpoint, s.table_ids, s.parent, s.children) for t, s in tablets.items()}


def same_as_table(yb: YugabyteCdcStandIn, initial: dict, events: list[dict]) -> None:
    replayed = replay([*base_image(initial), *events], ["id"])
    with yb.connect() as conn:
        source = source_rows(conn, f"public.{TABLE}", ["id"])
    assert source == {k: {c: v[c] for c in COLUMNS} for k, v in replayed.items()}


def test_splits_mid_window_and_between_windows_lose_and_double_nothing(yb, tmp_path, calls) -> None:
    execute(yb, (f"CREATE TABLE {TABLE} (id int PRIMARY KEY, v text, n int)", ()))
    execute(yb, (f"INSERT INTO {TABLE} SELECT g, 'v' || g, g FROM generate_series(1, 5) g", ()))
    yb.wait_caught_up()
    stream = yb.create_stream(RECORD_TYPE, "EXPLICIT", tables=[TABLE])
    start = start_streaming(yb, stream, TABLE)
    parent, q, r = sorted(start)
    from_ht = yb.wait_caught_up() + 1
    with yb.connect() as conn:
        initial = source_rows(conn, f"public.{TABLE}", ["id"])
    keys = Keys(yb)
    k = keys.take(parent, 8)
    (q0, q1, q2, q3) = keys.take(q, 4)

    # -- (a) window 1: the parent splits while the job reads it ------------------------------------
    # before the split: single-row transactions on the parent (several pages at 4 records a page),
    # one on q, one spanning the parent and q
    execute(yb, *(insert(key, "before") for key in k[:6]))
    execute(yb, update(k[0], "before-2"), delete(k[1]), insert(q0, "q"))
    execute(yb, insert(k[6], "tx"), insert(q1, "tx"), transaction=True)
    yb.set(changes_page_size=4)
    after: dict[str, Any] = {}

    def split_now() -> None:
        """Between the parent's first and second page: split it, then change both halves."""
        after["before_ht"] = yb.wait_caught_up()  # every change before the split is committed by now
        lo, up = after["children"] = tuple(yb.split(parent))
        (a0, a1, a2, a3), (b0, b1, b2) = keys.take(lo, 4), keys.take(up, 3)
        after["keys"] = {"a": (a0, a1, a2, a3), "b": (b0, b1, b2)}
        execute(yb, insert(a0, "after"), insert(a1, "after"), insert(b0, "after"), insert(b1, "after"))
        execute(yb, update(k[2], "after"), delete(k[3]))  # rows of the parent, now on a child
        execute(yb, insert(a2, "child+q"), insert(q2, "child+q"), update(q0, "child+q"), transaction=True)
        execute(yb, insert(a3, "both"), insert(b2, "both"), transaction=True)
        yb.wait_caught_up()

    calls.after_first[parent] = split_now
    # The end lies ahead: the split and the changes after it happen while the job polls, and are
    # committed before the end the job waits for.
    end1 = yb.wait_caught_up() + 8 * HT_PER_SECOND
    try:
        spec1 = make_spec(yb, stream, TABLE, tmp_path / "run", 1, from_ht, end1 + 1, start, RECORD_TYPE)
        first = run_job(spec1, no_spark)
    finally:
        yb.set(changes_page_size=500)
    assert "children" in after, "the split did not happen during the window"
    lo, up = after["children"]
    a, b = after["keys"]["a"], after["keys"]["b"]
    parent_calls = calls.of(parent)
    # the split came between the parent's pages: a page with rows, then TABLET_SPLIT at once (after
    # at most the rest of a transaction the page stopped in); the children were read after it
    assert parent_calls[-1] == "split" and "split" not in parent_calls[:-1] and len(parent_calls) <= 3
    assert parent_calls[0] > 0
    first_child_call = next(i for i, (t, _) in enumerate(calls.seen) if t in (lo, up))
    assert first_child_call > calls.seen.index((parent, "split"))
    events1 = window_events(tmp_path / "run", 1, [])
    check_window(events1, from_ht, end1)
    assert Counter(e["op"] for e in events1) == {"c": 17, "u": 3, "d": 2}
    assert first.stats["changes"] == len(events1)
    assert {e["source"]["tablet_id"] for e in events1} == {parent, lo, up, q}
    by_tablet = Counter(e["source"]["tablet_id"] for e in events1)
    # 6 inserts, an update, a delete, the parent's part of the transaction with q: the parent sent
    # some, the children (from their copies of its log) the rest, none twice
    before = [e for e in events1 if e["source"]["commit_time"] <= after["before_ht"] and e["source"]["tablet_id"] != q]
    assert len(before) == 9 and 0 < by_tablet[parent] < 9
    assert {e["source"]["tablet_id"] for e in before} - {parent} <= {lo, up}
    tx, tablets = tablets_of_tx(events1, a[2])
    assert tablets == {lo, q}  # one transaction across a child and another tablet
    assert [e["transaction"]["total_order"] for e in events1 if e["transaction"]["id"] == tx] == [1, 2, 3]
    assert tablets_of_tx(events1, a[3])[1] == {lo, up}  # and one across both children
    parts = tablets_of_tx(events1, k[6])[1]
    assert q in parts and len(parts) == 2 and parts - {q} <= {parent, lo, up}
    same_as_table(yb, initial, events1)
    ends1 = TabletCheckpoints.from_json(first.stats["source_state"]["tablets"])
    assert first.stats["tablet_splits"] == [[parent, sorted(ends1[parent].children)]]
    assert ends1[parent].children == tuple(sorted((lo, up))) and ends1[parent].position == start[parent].position
    assert ends1[lo].parent == parent and ends1[up].parent == parent
    assert ends1[lo].table_ids == start[parent].table_ids
    assert set(ends1.polled()) == {lo, up, q, r}
    assert all(position.safe_hybrid_time >= end1 for position in ends1.polled().values())
    # the parent was only ever polled with the committed checkpoint: the server holds it there
    committed = start[parent].position.checkpoint
    assert yb.state(stream, parent)["checkpoint"] == [committed.term, committed.index]

    # -- (c) the same window again (a retry, into a sink of its own to compare): the parent answers
    # TABLET_SPLIT at once, from the window's start, and the children send all of its changes; the
    # same changes, only attributed to the children (source.tablet_id, single-shard transaction ids)
    calls.seen.clear()
    again = run_job(replace(spec1, sink_path=str(tmp_path / "retry")), no_spark)
    assert calls.of(parent) == ["split"]
    retried = topic(tmp_path / "retry", TABLE)
    check_window(retried, from_ht, end1)
    assert sorted(map(change_of, retried)) == sorted(map(change_of, events1))
    assert parent not in {e["source"]["tablet_id"] for e in retried}
    assert again.stats["changes"] == first.stats["changes"]
    ends1_again = TabletCheckpoints.from_json(again.stats["source_state"]["tablets"])
    assert lineage(ends1_again) == lineage(ends1)  # safe times differ: the last poll's
    assert all(position.safe_hybrid_time >= end1 for position in ends1_again.polled().values())

    # -- (b) window 2 reads the children only ----------------------------------------------------
    (a4,) = keys.take(lo)
    execute(yb, insert(a4, "w2"), update(b[0], "w2"), delete(q2))
    execute(yb, update(a[0], "w2"), delete(b[1]), transaction=True)
    end2 = yb.wait_caught_up()
    calls.seen.clear()
    second = run_job(
        make_spec(yb, stream, TABLE, tmp_path / "run", 2, end1 + 1, end2 + 1, ends1, None, first.last_commit_lsn),
        no_spark,
    )
    assert calls.tablets() == {lo, up, q, r}  # the split parent is not asked again
    events2 = window_events(tmp_path / "run", 2, events1)
    check_window(events2, end1 + 1, end2)
    assert Counter(e["op"] for e in events2) == {"c": 1, "u": 2, "d": 2}
    assert tablets_of_tx(events2, a[0])[1] == {lo, up}
    same_as_table(yb, initial, [*events1, *events2])
    ends2 = TabletCheckpoints.from_json(second.stats["source_state"]["tablets"])
    assert set(ends2.polled()) == {lo, up, q, r}

    # -- (d) splits between windows: found by window 3's first GetChanges -------------------------
    (a5,) = keys.take(lo)
    execute(yb, insert(a5, "w3-before"), update(a[1], "w3-before"), insert(q3, "w3"))
    lo_children = tuple(yb.split(lo))  # a child split again, after records of window 3
    r_children = tuple(yb.split(r))  # nothing on r since window 2: TABLET_SPLIT at once
    (l1,), (l2,) = keys.take(lo_children[0]), keys.take(lo_children[1])
    (r1,), (r2,) = keys.take(r_children[0]), keys.take(r_children[1])
    execute(yb, insert(l1, "w3-after"), insert(l2, "w3-after"), insert(r1, "w3-after"))
    execute(yb, update(a5, "grandchild+r"), insert(r2, "grandchild+r"), transaction=True)
    end3 = yb.wait_caught_up()
    calls.seen.clear()
    third = run_job(
        make_spec(yb, stream, TABLE, tmp_path / "run", 3, end2 + 1, end3 + 1, ends2, None, second.last_commit_lsn),
        no_spark,
    )
    assert calls.of(r) == ["split"]  # refused at the first request, with nothing before the split
    assert calls.of(lo) == ["split"]  # at once: its grandchildren send window 3's changes before the split
    events3 = window_events(tmp_path / "run", 3, [*events1, *events2])
    check_window(events3, end2 + 1, end3)
    assert Counter(e["op"] for e in events3) == {"c": 6, "u": 2}
    (home_of_a5,) = [c for c in lo_children if a5 in keys_per_tablet(yb, TABLE)[c]]
    assert tablets_of_tx(events3, r2)[1] == {home_of_a5, r_children[1]}  # a grandchild and a child
    same_as_table(yb, initial, [*events1, *events2, *events3])
    ends3 = TabletCheckpoints.from_json(third.stats["source_state"]["tablets"])
    assert ends3[lo].parent == parent and ends3[lo].children == tuple(sorted(lo_children))
    assert ends3[r].children == tuple(sorted(r_children))
    assert set(ends3.polled()) == {up, q, *lo_children, *r_children}


def small_capture(yb: YugabyteCdcStandIn, name: str) -> tuple[str, TabletCheckpoints, str, list[int], int, dict]:
    """A table of its own with a stream started on it: (stream, start, a tablet, its keys, from, rows)."""
    execute(yb, (f"CREATE TABLE {name} (id int PRIMARY KEY, v text, n int)", ()))
    yb.wait_caught_up()
    stream = yb.create_stream(RECORD_TYPE, "EXPLICIT", tables=[name])
    start = start_streaming(yb, stream, name)
    parent = sorted(start)[0]
    keys = keys_per_tablet(yb, name)[parent][:10]
    from_ht = yb.wait_caught_up() + 1
    with yb.connect() as conn:
        initial = source_rows(conn, f"public.{name}", ["id"])
    return stream, start, parent, keys, from_ht, initial


def write_keys(yb: YugabyteCdcStandIn, name: str, keys: list[int], v: str) -> None:
    execute(yb, *((f"INSERT INTO {name} VALUES (%s, %s, 0)", (key, v)) for key in keys))


def replay_equals(yb: YugabyteCdcStandIn, name: str, initial: dict, events: list[dict]) -> None:
    replayed = replay([*base_image(initial), *events], ["id"])
    with yb.connect() as conn:
        source = source_rows(conn, f"public.{name}", ["id"])
    assert source == {k: {c: v[c] for c in COLUMNS} for k, v in replayed.items()}


def test_invalid_request_on_a_split_parent_the_master_lists_children_of_is_a_split(yb, tmp_path, calls) -> None:
    """YB answers INVALID_REQUEST "Tablet ID … is not part of stream ID …" for a split parent it no
    longer finds for the stream (``CheckTabletValidForStream``); the connector reads INVALID_REQUEST
    as a split (CONN ``YugabyteDBStreamingChangeEventSource.java`` l.564). The product does so when
    the master lists children of the tablet, and the window is exact."""
    name = "t_split_invalid"
    stream, start, parent, keys, from_ht, initial = small_capture(yb, name)
    write_keys(yb, name, keys[:4], "before")
    children = yb.split(parent)
    write_keys(yb, name, keys[4:8], "after")
    end = yb.wait_caught_up()
    refusal = f"Tablet ID {parent} is not part of stream ID {stream}"
    yb.fail_next(
        "GetChanges", refusal, tablet_id=parent, service_code="INVALID_REQUEST", status_code="INVALID_ARGUMENT"
    )
    entry = run_job(make_spec(yb, stream, name, tmp_path / "run", 1, from_ht, end + 1, start, RECORD_TYPE), no_spark)
    assert calls.of(parent) == ["split"]
    assert entry.stats["tablet_splits"] == [[parent, sorted(children)]]
    events = topic(tmp_path / "run", name)
    assert len(events) == 8
    replay_equals(yb, name, initial, events)


def test_invalid_request_on_a_tablet_that_was_not_split_is_a_configuration_error(yb, tmp_path) -> None:
    """INVALID_REQUEST for a tablet no tablet names as its split parent stays a configuration error,
    saying what to check."""
    name = "t_split_not_in_stream"
    stream, start, parent, keys, from_ht, _ = small_capture(yb, name)
    write_keys(yb, name, keys[:2], "x")
    end = yb.wait_caught_up()
    refusal = f"Tablet ID {parent} is not part of stream ID {stream}"
    yb.fail_next(
        "GetChanges", refusal, tablet_id=parent, service_code="INVALID_REQUEST", status_code="INVALID_ARGUMENT"
    )
    spec = make_spec(yb, stream, name, tmp_path / "run", 1, from_ht, end + 1, start, RECORD_TYPE)
    with pytest.raises(InvalidRequestError, match="Check that the offset's tablets belong to this stream"):
        run_job(spec, no_spark)


def test_a_split_racing_its_apply_is_read_exactly_too(yb, tmp_path, calls) -> None:
    """While YB applies a split, the parent's read loop may still reach its SPLIT_OP and serve up to
    it before TABLET_SPLIT (``cdcsdk_producer.cc`` SPLIT_OP case; the stand-in's
    ``split_racing_apply``); the children then send nothing the parent sent: the window is exact,
    the parent's pre-split rows all from the parent."""
    name = "t_split_racing"
    stream, start, parent, keys, from_ht, initial = small_capture(yb, name)
    write_keys(yb, name, keys[:5], "before")
    yb.set(split_racing_apply=True)
    try:
        yb.split(parent)
        write_keys(yb, name, keys[5:9], "after")
        end = yb.wait_caught_up()
        run_job(make_spec(yb, stream, name, tmp_path / "run", 1, from_ht, end + 1, start, RECORD_TYPE), no_spark)
    finally:
        yb.set(split_racing_apply=False)
    events = topic(tmp_path / "run", name)
    assert calls.of(parent)[-1] == "split" and sum(n for n in calls.of(parent) if n != "split") == 5
    assert len(events) == 9 and Counter(e["source"]["tablet_id"] for e in events)[parent] == 5
    replay_equals(yb, name, initial, events)
