"""Tablet checkpoints, the stream's checkpoint set and the offset document of the CDC-service source."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import InvalidOffsetError
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.plan import offset_after_commit, restore_from_log
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn
from airflow_provider_cdc.cdc.sources.yugabyte.offset import YugabyteOffset
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import (
    Checkpoint,
    TabletCheckpoints,
    TabletPosition,
    TabletState,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.offset import OffsetIdentity, YbCdcOffset, source_state
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.position import commit_range, commit_ts_ms
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

INT64 = st.integers(-(2**63), 2**63 - 1)
checkpoints = st.builds(
    Checkpoint,
    term=INT64,
    index=INT64,
    key=st.binary(max_size=40),
    write_id=st.integers(-(2**31), 2**31 - 1),
    snapshot_time=st.integers(0, 2**64 - 1),
)
positions = st.builds(
    TabletPosition,
    checkpoint=checkpoints,
    safe_hybrid_time=INT64,
    wal_segment_index=st.integers(-(2**31), 2**31 - 1),
)
tablet_ids = st.text("0123456789abcdef", min_size=32, max_size=32)
states = st.builds(
    TabletState,
    position=positions,
    table_ids=st.lists(tablet_ids, max_size=3).map(tuple),
    parent=st.none() | tablet_ids,
    children=st.lists(tablet_ids, max_size=2).map(tuple),
)
tablet_sets = st.dictionaries(tablet_ids, states, max_size=5).map(TabletCheckpoints)

IDENTITY = OffsetIdentity(
    topic_prefix="shop", system_identifier="000033e8000030008000000000000000", database="yugabyte", slot_name=None
)


# -- Checkpoint ---------------------------------------------------------------------------------


def test_text_form_is_debeziums_opid() -> None:
    # The reference's example source.lsn, and a key: base64 of its bytes (OpId.toSerString).
    assert Checkpoint(1, 4).text() == "1:4::0:0"
    assert Checkpoint(3, 12, b"\x01\xff", 5, 77).text() == "3:12:Af8=:5:77"
    assert Checkpoint.parse("3:12:Af8=:5:77") == Checkpoint(3, 12, b"\x01\xff", 5, 77)
    assert Checkpoint.parse("-1:-1::-1:0").in_snapshot


@given(checkpoints)
def test_checkpoint_round_trips(checkpoint: Checkpoint) -> None:
    assert Checkpoint.parse(checkpoint.text()) == checkpoint
    assert Checkpoint.from_json(json.loads(json.dumps(checkpoint.to_json()))) == checkpoint
    wire = pb.CDCSDKCheckpointPB.FromString(checkpoint.to_pb().SerializeToString())
    assert Checkpoint.from_pb(wire) == checkpoint


@pytest.mark.parametrize(
    "text",
    ["1:4:0:0", "1:4::0:0:0", "a:4::0:0", "1:4:!!:0:0", "1:4::99999999999:0", "1:4::0:-1", ""],
)
def test_malformed_checkpoint_text_is_refused(text: str) -> None:
    with pytest.raises(InvalidOffsetError):
        Checkpoint.parse(text)


def test_checkpoint_fields_are_checked() -> None:
    with pytest.raises(InvalidOffsetError):
        Checkpoint(1, 2, "key")  # type: ignore[arg-type]
    with pytest.raises(InvalidOffsetError):
        Checkpoint.from_json({"term": 1, "index": "2"})
    with pytest.raises(InvalidOffsetError):
        Checkpoint.from_json({"index": 2})
    with pytest.raises(InvalidOffsetError):
        TabletPosition(Checkpoint(1, 2), safe_hybrid_time=2**64)


# -- TabletCheckpoints --------------------------------------------------------------------------


@given(tablet_sets)
def test_tablet_set_round_trips_through_json(tablets: TabletCheckpoints) -> None:
    assert TabletCheckpoints.from_json(json.loads(json.dumps(tablets.to_json()))) == tablets


def test_loader_takes_older_and_debezium_forms() -> None:
    loaded = TabletCheckpoints.from_json(
        {
            "t1": "2:10::0:0",  # Debezium's offsets: tablet -> OpId text
            "t2": {"checkpoint": {"term": 2, "index": 11, "key": "AQ=="}},  # an object, no safe time
            "t3": {"lsn": "2:12::0:0", "safe_hybrid_time": None, "unknown": 1},
        }
    )
    assert loaded["t1"] == TabletState(TabletPosition(Checkpoint(2, 10)))
    assert loaded["t2"].position == TabletPosition(Checkpoint(2, 11, b"\x01"), -1, 0)
    assert loaded["t3"].position.safe_hybrid_time == -1
    assert TabletCheckpoints.from_json(None) == TabletCheckpoints()


@pytest.mark.parametrize(
    "data",
    [[], {"t1": 5}, {"t1": {"safe_hybrid_time": 3}}, {"t1": {"lsn": "1:1::0:0", "children": "t2"}}],
)
def test_loader_refuses_malformed_entries(data: object) -> None:
    with pytest.raises(InvalidOffsetError):
        TabletCheckpoints.from_json(data)  # type: ignore[arg-type]


def test_split_replaces_the_parent_with_its_children() -> None:
    start = TabletPosition(Checkpoint(1, 5), 100)
    tablets = TabletCheckpoints({"p": TabletState(start, table_ids=("tbl",))})
    children = {"c2": TabletPosition(Checkpoint(1, 9), -1), "c1": TabletPosition(Checkpoint(1, 9), -1)}
    split = tablets.split("p", children)
    assert split["p"].children == ("c1", "c2") and split["p"].split
    assert split["c1"] == TabletState(children["c1"], table_ids=("tbl",), parent="p")
    assert list(split.polled()) == ["c1", "c2"]
    assert TabletCheckpoints.from_json(split.to_json()) == split
    with pytest.raises(ValueError, match="already split"):
        split.split("p", children)
    with pytest.raises(ValueError, match="unknown"):
        tablets.split("x", children)
    with pytest.raises(ValueError, match="two children"):
        tablets.split("p", {"c1": start})
    with pytest.raises(ValueError, match="already in the stream"):
        tablets.with_tablet("c1", TabletState(start)).split("p", children)


def test_advanced_moves_only_polled_tablets() -> None:
    a, b = TabletPosition(Checkpoint(1, 1)), TabletPosition(Checkpoint(1, 2), 50)
    tablets = TabletCheckpoints({"t1": TabletState(a), "t2": TabletState(a)})
    moved = tablets.advanced({"t2": b})
    assert moved.polled() == {"t1": a, "t2": b}
    assert tablets.polled() == {"t1": a, "t2": a}  # immutable
    with pytest.raises(ValueError, match="not in the stream"):
        tablets.advanced({"t3": b})
    split = tablets.split("t1", {"c1": a, "c2": a})
    with pytest.raises(ValueError, match="was split"):
        split.advanced({"t1": b})


# -- the offset ---------------------------------------------------------------------------------


@given(tablet_sets, st.integers(1, 2**63), st.none() | st.uuids().map(str))
@settings(max_examples=50)
def test_offset_round_trips(tablets: TabletCheckpoints, ht: int, txid: str | None) -> None:
    offset = YbCdcOffset(
        identity=IDENTITY,
        lsn=YbLsn(ht),
        lsn_commit=YbLsn(ht - 1),
        tx_id=txid,
        ts_usec=commit_ts_ms(ht - 1) * 1000,
        snapshot_completed=True,
        window_seq=3,
        pending=Window(4, "stream", YbLsn(ht), YbLsn(ht + 10), 1_700_000_000_000),
    ).with_tablets(tablets)
    loaded = YbCdcOffset.from_json(offset.to_json())
    assert loaded == offset
    assert loaded.tablets == tablets
    assert loaded.pending is not None and isinstance(loaded.pending.to_lsn, YbLsn)


def test_offset_keys_follow_debezium_and_pin_the_database_not_the_stream() -> None:
    tablets = TabletCheckpoints({"t1": TabletState(TabletPosition(Checkpoint(1, 4), 99))})
    offset = YbCdcOffset(identity=IDENTITY, lsn=YbLsn(100), lsn_commit=YbLsn(99), tx_id="tx")
    assert offset.stream_id is None
    offset = offset.with_tablets(tablets, "a" * 32)
    document = offset.to_dict()
    assert document["connector"] == "yugabytedb_grpc"
    assert "stream_id" not in document and document["namespace_id"] == IDENTITY.system_identifier
    assert document["next_commit_ht"] == 100 and document["commit_time"] == 99 and document["txId"] == "tx"
    assert document["extra"]["source_state"]["tablets"]["t1"]["lsn"] == "1:4::0:0"
    assert document["extra"]["source_state"]["stream_id"] == "a" * 32
    assert offset.stream_id == "a" * 32 and offset.last_commit_ht == 99
    # a replaced stream keeps the identity (the capture re-snapshots from it); another database does not
    offset.check_identity(IDENTITY)
    other_database = OffsetIdentity(IDENTITY.topic_prefix, "f" * 32, IDENTITY.database, None)
    with pytest.raises(InvalidOffsetError, match="namespace_id"):
        offset.check_identity(other_database)


def test_offset_of_another_connector_or_with_bad_tablets_is_refused() -> None:
    replication = YugabyteOffset(identity=IDENTITY, lsn=YbLsn(5)).to_json()
    with pytest.raises(InvalidOffsetError, match="connector"):
        YbCdcOffset.from_json(replication)
    document = YbCdcOffset(identity=IDENTITY).to_dict()
    document["extra"] = {"source_state": {"tablets": {"t1": "1:x"}}}
    with pytest.raises(InvalidOffsetError, match="state table"):
        YbCdcOffset.from_json(json.dumps(document), source="state table")


def test_tablets_travel_with_the_commit_log_entry() -> None:
    """The job returns the tablets' end positions as source state; the core's roll-forward and
    restore-from-log put them in the offset with the window that reached them."""
    window = Window(1, "stream", YbLsn(10), YbLsn(20), 1_700_000_000_000)
    tablets = TabletCheckpoints({"t1": TabletState(TabletPosition(Checkpoint(1, 7), 19))})
    entry = CommitEntry(
        topic_prefix="shop",
        window=window,
        attempt="a1",
        datasets=(),
        transactions=1,
        last_commit_lsn=15,
        last_tx_id=None,
        last_commit_ts_us=1,
        committed_at_ms=1,
        stats={"source_state": source_state(tablets, stream_id="a" * 32, last_read_ms=5)},
    )
    before = YbCdcOffset(identity=IDENTITY, lsn=YbLsn(10))
    after = offset_after_commit(before, entry, IDENTITY, offset_type=YbCdcOffset)
    assert after.tablets == tablets and after.lsn == YbLsn(20) and after.lsn_commit == YbLsn(15)
    entry.stats["offset"] = before.to_dict()
    assert restore_from_log(entry, IDENTITY, offset_type=YbCdcOffset) == after
    assert commit_range(window) == (10, 19)
