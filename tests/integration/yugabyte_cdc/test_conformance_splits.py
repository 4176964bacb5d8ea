"""Conformance of the CDC-service source and its stand-in with YugabyteDB's tablet splits: cases
C1-C14 of docs/research/issue29/cdc-service.md §4, each from a YugabyteDB test or the Debezium
connector's (its docstring names the origin, file and test @ commit).

Keys: **SPLIT-T** = ``src/yb/integration-tests/cdcsdk_tablet_split-test.cc`` @
``009753634b42291e769de3aabff5f656995bbe31``; **CONN** = ``yugabyte/debezium-connector-yugabytedb`` @
``9607fea3cea1425f9df675dd77bea194b0ce98f1``.

How each runs: "P" cases through the product's public API (``run_job`` windows, as the other
integration tests drive them); "RPC" cases with the product's :class:`YbCdcClient` against the
stand-in's tablet servers; "S" cases assert server state only the stand-in shows (``yb.state``).
C11 (a split during a snapshot) is not here: see the report of issue 29.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.addresses import parse_addresses
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import Checkpoint, TabletCheckpoints, TabletPosition
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import YbCdcClient
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.jobs import run_job
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import TabletSplitError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import methods
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from tests.integration.yugabyte_cdc.test_stream import base_image, key_of, keys_per_tablet, make_spec, no_spark, topic
from tests.support.oracle import replay, source_rows
from tests.support.yugabyte_cdc import YugabyteCdcStandIn, standin_for
from tests.support.yugabyte_cdc.standin import StandInError
from tests.support.yugabyte_cdc.starts import start_streaming

pytestmark = pytest.mark.pg

COLUMNS = ("id", "v", "n")


@pytest.fixture(scope="module")
def yb(request, clusters) -> Iterator[YugabyteCdcStandIn]:
    yield from standin_for(request, clusters["pg15"], rpc_heartbeat_interval=0.3)


# -- helpers ---------------------------------------------------------------------------------------


def make_table(yb: YugabyteCdcStandIn, name: str) -> str:
    with yb.connect() as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text, n int)")
    yb.wait_caught_up()
    return yb.tablets(name)[0]["table_id"]


def write(yb: YugabyteCdcStandIn, name: str, keys: list[int], v: str) -> None:
    """One single-row transaction per key: insert it, or update it when it exists."""
    with yb.connect() as conn:
        for key in keys:
            upsert = f"INSERT INTO {name} VALUES (%s, %s, 0) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v"
            conn.execute(upsert + f", n = {name}.n + 1", (key, v))


def client_for(yb: YugabyteCdcStandIn, stream: str) -> YbCdcClient:
    return YbCdcClient(parse_addresses(yb.master_addresses_flag), stream, tls=None)


def poll_list(
    client: YbCdcClient, table_id: str, via: str, parent: str | None = None
) -> dict[str, pb.CDCSDKCheckpointPB]:
    """``GetTabletListToPollForCDC`` (with ``tablet_id = parent`` when given), sent to ``via``'s leader."""
    request = pb.GetTabletListToPollForCDCRequestPB(
        table_info=pb.TableInfo(stream_id=client.stream_id.encode(), table_id=table_id.encode())
    )
    if parent is not None:
        request.tablet_id = parent.encode()
    response = client.tablet_call(via, methods.GET_TABLET_LIST_TO_POLL, request, "GetTabletListToPollForCDC")
    return {p.tablet_locations.tablet_id.decode(): p.cdc_sdk_checkpoint for p in response.tablet_checkpoint_pairs}


def lineage_of(yb: YugabyteCdcStandIn, name: str, tablet: str) -> set[str]:
    """``tablet`` and every tablet split from it."""
    tablets = {t["tablet_id"]: t for t in yb.tablets(name)}
    found, todo = set(), [tablet]
    while todo:
        current = todo.pop()
        found.add(current)
        todo.extend(tablets[current]["children"] or [])
    return found


def drain_parent(client: YbCdcClient, parent: str, start: TabletPosition) -> None:
    """``GetChanges`` on the parent with its committed checkpoint as explicit, until TABLET_SPLIT."""
    position = start
    with pytest.raises(TabletSplitError):
        for _ in range(50):
            response = client.get_changes(parent, position, explicit=start.checkpoint)
            position = TabletPosition(Checkpoint.from_pb(response.cdc_sdk_checkpoint), response.safe_hybrid_time)


class Windows:
    """A capture's stream windows over one table, from a stream's snapshot-less start."""

    def __init__(self, yb: YugabyteCdcStandIn, name: str, stream: str, sink: Path, start: TabletCheckpoints):
        self.yb, self.name, self.stream, self.sink = yb, name, stream, sink
        self.tablets = start
        self.from_ht = yb.wait_caught_up() + 1
        self.seq, self.previous = 0, None
        with yb.connect() as conn:
            self.initial = source_rows(conn, f"public.{name}", ["id"])

    def run(self, *, to_ht: int | None = None):
        end = to_ht if to_ht is not None else self.yb.wait_caught_up()
        self.seq += 1
        spec = make_spec(
            self.yb,
            self.stream,
            self.name,
            self.sink,
            self.seq,
            self.from_ht,
            end + 1,
            self.tablets,
            "ALL",
            self.previous,
        )
        entry = run_job(spec, no_spark)
        self.tablets = TabletCheckpoints.from_json(entry.stats["source_state"]["tablets"])
        self.from_ht, self.previous = end + 1, entry.last_commit_lsn
        return entry

    def events(self) -> list[dict]:
        return topic(self.sink, self.name)

    def check(self) -> list[dict]:
        """Every change once, and the replay equals the table."""
        events = self.events()
        ids = [(e["op"], key_of(e), e["source"]["commit_time"]) for e in events]
        assert len(ids) == len(set(ids)), Counter(ids).most_common(3)
        replayed = replay([*base_image(self.initial), *events], ["id"])
        with self.yb.connect() as conn:
            source = source_rows(conn, f"public.{self.name}", ["id"])
        assert source == {k: {c: v[c] for c in COLUMNS} for k, v in replayed.items()}
        return events


def capture(yb: YugabyteCdcStandIn, name: str, sink: Path) -> tuple[str, Windows]:
    stream = yb.create_stream("ALL", "EXPLICIT", tables=[name])
    return stream, Windows(yb, name, stream, sink, start_streaming(yb, stream, name))


# -- S: server state -------------------------------------------------------------------------------


def test_c1_children_rows_start_at_min_op_id(yb):
    """C1, SPLIT-T ``TestCDCStateTableAfterTabletSplit``: after a split, ``cdc_state`` has three rows;
    "Both children should have the min OpId(0.0) as the checkpoint" (``ASSERT_EQ(checkpoint,
    OpId::Min())``)."""
    make_table(yb, "c1")
    stream = yb.create_stream("ALL", "EXPLICIT", tables=["c1"])
    start = start_streaming(yb, stream, "c1")
    parent = sorted(start)[0]
    children = yb.split(parent)
    assert yb.state(stream, parent)["checkpoint"] == [
        start[parent].position.checkpoint.term,
        start[parent].position.checkpoint.index,
    ]
    for child in children:
        assert yb.state(stream, child)["checkpoint"] == [0, 0]


def test_c12_the_parent_row_is_deleted_once_both_children_are_polled(yb):
    """C12, SPLIT-T ``TestCDCStateTableAfterTabletSplitReported`` (EXPLICIT): once the children have
    been polled, the parent's ``cdc_state`` row is gone and the children's remain. The parent then
    still answers TABLET_SPLIT (``CheckTabletValidForStream``: a listed tablet names it as its
    split parent, ``cdc_service.cc`` @4c48938b "Tablet Split detected on $0 : $1")."""
    make_table(yb, "c12")
    stream = yb.create_stream("ALL", "EXPLICIT", tables=["c12"])
    start = start_streaming(yb, stream, "c12")
    parent = sorted(start)[0]
    children = yb.split(parent)
    with client_for(yb, stream) as client:
        drain_parent(client, parent, start[parent].position)
        for child in children:
            at = TabletPosition(start[parent].position.checkpoint)
            client.get_changes(child, at, explicit=at.checkpoint)
        with pytest.raises(StandInError, match="KeyError"):
            yb.state(stream, parent)
        assert all(yb.state(stream, c)["checkpoint"][1] > 0 for c in children)
        with pytest.raises(TabletSplitError, match=f"Tablet Split detected on {parent} : "):
            client.get_changes(parent, start[parent].position, explicit=start[parent].position.checkpoint)
        # GetTabletListToPollForCDC{parent}: the children's own (valid) checkpoints
        table_id = yb.tablets("c12")[0]["table_id"]
        listed = poll_list(client, table_id, children[0], parent)
        assert sorted(listed) == sorted(children) and all(cp.index > 0 for cp in listed.values())
        # a child set back to 0.0, with the parent's row gone: 0.0 ("Did not find any row",
        # GetLastCheckpointFromCdcState, cdc_service.cc @4c48938b)
        request = pb.SetCDCCheckpointRequestPB(
            checkpoint=pb.CDCCheckpointPB(op_id=pb.OpIdPB(term=0, index=0)),
            stream_id=stream.encode(),
            tablet_id=children[0].encode(),
        )
        client.tablet_call(children[0], methods.SET_CDC_CHECKPOINT, request, "SetCDCCheckpoint")
        listed = poll_list(client, table_id, children[0], parent)
        assert (listed[children[0]].term, listed[children[0]].index) == (0, 0)


# -- RPC: GetTabletListToPollForCDC, SetCDCCheckpoint ----------------------------------------------


def test_c2_before_the_split_is_reported_only_the_parent_is_listed(yb):
    """C2, SPLIT-T ``TestGetTabletListToPollForCDCBeforeTabletSplitReported``: the parent polled,
    the split done but not reported: ``GetTabletListToPollForCDC`` without a tablet id lists the
    parent, not its children."""
    table_id = make_table(yb, "c2")
    stream = yb.create_stream("ALL", "EXPLICIT", tables=["c2"])
    start = start_streaming(yb, stream, "c2")
    parent = sorted(start)[0]
    with client_for(yb, stream) as client:
        client.get_changes(parent, start[parent].position, explicit=start[parent].position.checkpoint)
        children = yb.split(parent)
        listed = poll_list(client, table_id, sorted(start)[1])
    assert parent in listed and not set(children) & set(listed)


def test_c3_after_the_split_is_reported_the_parent_lists_its_two_children(yb):
    """C3, SPLIT-T ``TestGetTabletListToPollForCDCAfterTabletSplitReported``: after TABLET_SPLIT,
    the list for ``tablet_id = parent`` has two pairs, neither the parent, each a valid checkpoint
    (here the parent's stored one: the children's own rows are 0.0, ``cdc_service.cc`` @4c48938b
    ``GetTabletListToPollForCDC``); the product's ``split_children`` returns them."""
    table_id = make_table(yb, "c3")
    stream = yb.create_stream("ALL", "EXPLICIT", tables=["c3"])
    start = start_streaming(yb, stream, "c3")
    parent = sorted(start)[0]
    children = yb.split(parent)
    with client_for(yb, stream) as client:
        drain_parent(client, parent, start[parent].position)
        listed = poll_list(client, table_id, parent, parent)
        found = client.split_children(parent, [table_id])
    stored = start[parent].position.checkpoint
    assert sorted(listed) == sorted(children) and parent not in listed
    assert all((cp.term, cp.index) == (stored.term, stored.index) and cp.snapshot_time >= 0 for cp in listed.values())
    assert sorted(found) == sorted(children)


def test_c4_c5_a_stream_never_polled_lists_the_leaves(yb):
    """C4, SPLIT-T ``TestGetTabletListToPollForCDCBootstrapWithTabletSplit``: a stream never polled,
    then a split: the list has the two children only. C5,
    ``TestGetTabletListToPollForCDCBootstrapWithTwoTabletSplits``: a child split again: three."""
    table_id = make_table(yb, "c4")
    stream = yb.create_stream("ALL", "EXPLICIT", tables=["c4"])
    parent = yb.tablets("c4")[0]["tablet_id"]
    other = yb.tablets("c4")[1]["tablet_id"]
    children = yb.split(parent)
    with client_for(yb, stream) as client:
        assert set(poll_list(client, table_id, other)) & lineage_of(yb, "c4", parent) == set(children)
        grandchildren = yb.split(children[0])
        listed = set(poll_list(client, table_id, other)) & lineage_of(yb, "c4", parent)
    assert listed == {children[1], *grandchildren}


def test_c6_with_one_child_polled_only_the_parent_is_listed(yb):
    """C6, SPLIT-T ``TestGetTabletListToPollForCDCWithOnlyOnePolledChild``; CONN
    ``src/test/java/io/debezium/connector/yugabytedb/YugabyteDBTabletSplitTest.java:501-509``: the
    parent polled, one child polled and the other not: the list without a tablet id has the
    parent, not the children."""
    table_id = make_table(yb, "c6")
    stream = yb.create_stream("ALL", "EXPLICIT", tables=["c6"])
    start = start_streaming(yb, stream, "c6")
    parent = sorted(start)[0]
    children = yb.split(parent)
    with client_for(yb, stream) as client:
        drain_parent(client, parent, start[parent].position)
        client.get_changes(children[0], TabletPosition(start[parent].position.checkpoint))
        listed = poll_list(client, table_id, sorted(start)[1])
    assert parent in listed and not set(children) & set(listed)


def test_c13_set_cdc_checkpoint_on_each_child_after_a_split(yb):
    """C13, SPLIT-T ``TestSetCDCCheckpointAfterTabletSplit``: ``SetCDCCheckpoint(OpId::Min(),
    initial_checkpoint)`` on each child succeeds."""
    make_table(yb, "c13")
    stream = yb.create_stream("ALL", "EXPLICIT", tables=["c13"])
    start = start_streaming(yb, stream, "c13")
    children = yb.split(sorted(start)[0])
    with client_for(yb, stream) as client:
        for child in children:
            request = pb.SetCDCCheckpointRequestPB(
                checkpoint=pb.CDCCheckpointPB(op_id=pb.OpIdPB(term=0, index=0)),
                stream_id=stream.encode(),
                tablet_id=child.encode(),
                initial_checkpoint=True,
            )
            assert not client.tablet_call(child, methods.SET_CDC_CHECKPOINT, request, "SetCDCCheckpoint").HasField(
                "error"
            )


# -- P: stream windows through the product -----------------------------------------------------------


def test_c7_c9_windows_across_several_splits_read_every_row_once(yb, tmp_path):
    """C7, SPLIT-T ``TestGetChangesMultipleStreamsTabletSplit``'s sibling
    ``TestGetTabletListToPollForCDCWithTwoTabletSplits`` (two splits, every row once) and C9,
    ``TestRecordCountsAfterMultipleTabletSplits`` / ``TestSplitAfterSplit`` (four splits, the first
    poll after all of them: every row exactly once). The first window after the splits starts from
    the pre-split checkpoint: the parent answers TABLET_SPLIT at once and its descendants send the
    rows from their copies of its log."""
    make_table(yb, "c7")
    _, windows = capture(yb, "c7", tmp_path / "c7")
    parent = sorted(windows.tablets)[0]
    keys = keys_per_tablet(yb, "c7")[parent][:16]
    write(yb, "c7", keys, "w1")
    windows.run()  # the parent, before any split
    write(yb, "c7", keys[:8], "before")
    lo, up = yb.split(parent)
    write(yb, "c7", keys[8:], "between")
    lo_children = yb.split(lo)
    up_children = yb.split(up)
    yb.split(lo_children[0])  # four splits
    write(yb, "c7", keys, "after")
    entry = windows.run()
    windows.check()
    assert sorted(p for p, _ in entry.stats["tablet_splits"]) == sorted([parent, lo, up, lo_children[0]])
    assert Counter(e["source"]["tablet_id"] for e in windows.events()[16:])[parent] == 0
    leaves = {t["tablet_id"] for t in yb.tablets("c7") if not t["children"]} & lineage_of(yb, "c7", parent)
    assert len(leaves) == 5 and set(up_children) <= leaves <= set(windows.tablets.polled())


def test_c8_two_streams_at_different_positions_across_one_split(yb, tmp_path):
    """C8, SPLIT-T ``TestGetChangesMultipleStreamsTabletSplit``: two streams at different positions
    across one split each receive exactly their remaining rows: one had read the first rows before
    the split, the other reads everything after it (its children from the parent's copied log)."""
    make_table(yb, "c8")
    _, ahead = capture(yb, "c8", tmp_path / "ahead")
    _, behind = capture(yb, "c8", tmp_path / "behind")
    parent = sorted(ahead.tablets)[0]
    keys = keys_per_tablet(yb, "c8")[parent][:12]
    write(yb, "c8", keys[:6], "first")
    ahead.run()
    yb.split(parent)
    write(yb, "c8", keys[6:], "second")
    write(yb, "c8", keys[:3], "second")
    ahead.run()
    behind.run()
    assert len(ahead.check()) == 6 + 6 + 3
    assert len(behind.check()) == 6 + 6 + 3
    assert Counter(e["op"] for e in behind.events()) == {"c": 12, "u": 3}


def test_c10_a_transaction_open_across_the_split(yb, tmp_path):
    """C10, SPLIT-T ``TestTransactionCommitAfterTabletSplit``: a transaction open across the split
    and committed after it: all its rows, as one transaction."""
    make_table(yb, "c10")
    _, windows = capture(yb, "c10", tmp_path / "c10")
    parent = sorted(windows.tablets)[0]
    keys = keys_per_tablet(yb, "c10")[parent][:10]
    write(yb, "c10", keys[:2], "before")
    with yb.connect(autocommit=False) as conn:
        for key in keys[2:]:
            conn.execute("INSERT INTO c10 VALUES (%s, 'open', 0)", (key,))
        yb.split(parent)
        conn.commit()
    windows.run()
    events = windows.check()
    (tx,) = {e["transaction"]["id"] for e in events if e["after"]["v"] == "open"}
    assert [e["transaction"]["total_order"] for e in events if e["transaction"]["id"] == tx] == list(range(1, 9))


def test_c14_a_window_that_failed_after_one_child_is_retried_without_duplicates(yb, tmp_path):
    """C14, CONN ``src/test/java/io/debezium/connector/yugabytedb/YugabyteDBTabletSplitTest.java:375-551``
    ``shouldResumeChildFromAckedCheckpointNotSplitOp``: a restart with one child polled and the other
    not loses and doubles nothing. Here: the window fails at the second child's first
    ``GetChanges`` (after the parent's TABLET_SPLIT and the first child's reads); its retry is
    exact, and the server's parent checkpoint is still the committed one."""
    make_table(yb, "c14")
    _, windows = capture(yb, "c14", tmp_path / "c14")
    parent = sorted(windows.tablets)[0]
    keys = keys_per_tablet(yb, "c14")[parent][:12]
    write(yb, "c14", keys[:6], "before")
    _, up = yb.split(parent)
    write(yb, "c14", keys[6:], "after")
    end = yb.wait_caught_up()
    yb.fail_next(
        "GetChanges", "injected failure", tablet_id=up, service_code="INTERNAL_ERROR", status_code="RUNTIME_ERROR"
    )
    with pytest.raises(CdcConfigurationError, match="injected failure"):
        windows.run(to_ht=end)
    windows.seq -= 1
    stored = windows.tablets[parent].position.checkpoint
    assert yb.state(windows.stream, parent)["checkpoint"] == [stored.term, stored.index]
    windows.run(to_ht=end)
    assert len(windows.check()) == 12
