"""Conformance of the CDC-service source and stand-in with YugabyteDB's own checkpoint and expiry
behaviour (docs/research/issue29/cdc-service.md §2-§4): each case names the YB or connector test
or code it comes from. "P" cases run through the product (``run_job``, :mod:`.admin`, the
:class:`YbCdcClient`), "S" cases assert the server state the stand-in models.

Sources, as the research note keys them: SVC ``src/yb/cdc/cdc_service.cc`` @ 4c48938b; PROD
``src/yb/cdc/cdcsdk_producer.cc`` @ 00010c2f; MCM ``src/yb/master/xrepl_catalog_manager.cc`` @ 00290f42;
YSQL-T ``src/yb/integration-tests/cdcsdk_ysql-test.cc``; CONN ``yugabyte/debezium-connector-yugabytedb``
@ 9607fea3 (``.../yugabytedb/`` = ``src/main/java/io/debezium/connector/yugabytedb/``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, WalLostError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.spec import CaptureOptions
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn
from airflow_provider_cdc.cdc.sources.yugabyte_cdc import admin
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.addresses import parse_addresses
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import (
    Checkpoint,
    TabletCheckpoints,
    TabletPosition,
    TabletState,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import RetryPolicy, YbCdcClient
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.jobs import run_job
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import methods
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import RpcConnection
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.service_errors import StreamExpiredError, StreamNotStartedError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.snapshot_pages import BOOTSTRAP
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.spec import YbCdcJobSpec
from tests.support.oracle import assert_same_state, events_of, replay, source_rows
from tests.support.yugabyte_cdc import YugabyteCdcStandIn, standin_for

pytestmark = pytest.mark.pg

PREFIX = "ybk"
OP = pb.RowMessage
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def yb(request, clusters) -> Iterator[YugabyteCdcStandIn]:
    yield from standin_for(request, clusters["pg15"], rpc_heartbeat_interval=0.3)


@pytest.fixture(scope="module")
def provider(spark):
    return lambda: spark


def no_spark():
    raise AssertionError("a stream window on a local sink must not start Spark")


def make_table(yb: YugabyteCdcStandIn, name: str, rows: int = 6) -> list[str]:
    """The table (``id``, ``v``) with ``rows`` rows; returns its tablet ids."""
    with yb.connect() as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
        if rows:
            conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, {rows}) g")
    yb.wait_caught_up()
    return sorted(t["tablet_id"] for t in yb.tablets(name))


def keys_on(yb: YugabyteCdcStandIn, table: str, tablet_id: str, count: int) -> list[int]:
    """``count`` key values whose rows live on ``tablet_id``."""
    (tablet,) = [t for t in yb.tablets(table) if t["tablet_id"] == tablet_id]
    candidates = list(range(1000, 1300))
    found = [k for k, code in zip(candidates, yb.hash_codes(candidates)) if tablet["start"] <= code < tablet["end"]]
    return found[:count]


def client_for(yb: YugabyteCdcStandIn, stream: str) -> YbCdcClient:
    return YbCdcClient(parse_addresses(yb.master_addresses_flag), stream, tls=None, retry=RetryPolicy(3, 0.05))


def make_spec(yb, stream: str, table: str, sink, window: Window, tablets=None) -> YbCdcJobSpec:
    return YbCdcJobSpec(
        topic_prefix=PREFIX,
        master_addresses=yb.master_addresses_flag,
        stream_id=stream,
        database=yb.database,
        tables=(TableRef("public", table),),
        window=window,
        sink_path=str(sink),
        tablets=tablets if tablets is not None else TabletCheckpoints(),
        options=CaptureOptions(idle_timeout_seconds=20),
        tls=None,  # the stand-in's RPC ports are plaintext
    )


def snapshot_window(seq: int = 1) -> Window:
    return Window(seq, "snapshot", None, None, 1_700_000_000_000 + seq)


def stream_window(seq: int, from_ht: int, to_ht: int) -> Window:
    return Window(seq, "stream", YbLsn(from_ht), YbLsn(to_ht), 1_700_000_000_000 + seq)


def changes(records) -> list:
    return [r for r in records if r.row_message.op not in (OP.DDL, OP.SAFEPOINT)]


def stream_from_latest(yb: YugabyteCdcStandIn, client: YbCdcClient, table: str) -> TabletCheckpoints:
    """``snapshot_mode='never'``'s start, through the product (:func:`admin.bootstrap_tablets`)."""
    table_id = yb.tablets(table)[0]["table_id"]
    return admin.bootstrap_tablets(client, admin.stream_tablets(client, [table_id]))


# --- a stream without a consistent snapshot: "expired" until SetCDCCheckpoint -------------------


def test_c19_a_never_started_tablet_answers_expired_until_set_cdc_checkpoint(yb):
    """C19. Origin: SVC ``InitNewTabletStreamEntry`` ("the initial checkpoint for each tablet will be
    maintained in cdc_state table as -1.-1", ``active_time = 0``) and MCM ``PopulateCDCStateTable``
    (the same row for a stream created without a consistent snapshot); SVC ``CheckStreamActive``
    ("Stream ID $0 is expired for Tablet ID $1", INTERNAL_ERROR); CONN
    ``.../yugabytedb/YugabyteDBSnapshotChangeEventSource.java:317-341`` (``makeStreamActive``: "A call
    to set the checkpoint is required first otherwise we will get ... Stream ID {} is expired").
    P: the product tells this apart from real expiry (retryable, nothing lost), then starts the
    tablet as the connector does and is served."""
    tablet = make_table(yb, "k_unstarted", rows=0)[0]
    stream = yb.create_stream(tables=["k_unstarted"], consistent_snapshot=False)
    with client_for(yb, stream) as client:
        stored = client.get_checkpoint(tablet)
        assert stored.never_set and stored.snapshot_key is None and stored.snapshot_time == 0
        with pytest.raises(StreamNotStartedError, match=f"Stream ID {stream} is expired for Tablet ID {tablet}"):
            client.get_changes(tablet, TabletPosition(Checkpoint(0, 0)), starting=True)
        # Outside a bootstrap every tablet was started by the capture: the same answer is expiry
        # (a missing cdc_state row also reads -1.-1, so the checkpoint cannot tell them apart there).
        with pytest.raises(StreamExpiredError):
            client.get_changes(tablet, TabletPosition(Checkpoint(0, 0)))
        client.start_tablet(tablet)  # SetCDCCheckpoint(0.0, initial_checkpoint): checks no expiry
        assert client.get_checkpoint(tablet).checkpoint == Checkpoint(0, 0)
        client.get_changes(tablet, TabletPosition(Checkpoint(0, 0)))  # served now
    assert yb.state(stream, tablet)["expired"] is False


def test_consistent_snapshot_streams_start_with_the_snapshot_row(yb):
    """Origin: MCM ``PopulateCDCStateTable`` / ``PopulateCDCStateTableWithCDCSDKSnapshotSafeOpIdDetails``
    (research §2.1 case 2): a stream created with USE_SNAPSHOT has every row at the snapshot's op id,
    ``snapshot_key`` "", ``cdc_sdk_safe_time`` the snapshot time and ``active_time`` the creation,
    so its first ``GetChanges`` needs no ``SetCDCCheckpoint``. S, through the product's client."""
    tablets = make_table(yb, "k_consistent", rows=3)
    stream = yb.create_stream(tables=["k_consistent"])
    with client_for(yb, stream) as client:
        stored = [client.get_checkpoint(t) for t in tablets]
        assert all(s.term > 0 and s.index > 0 and s.snapshot_key == b"" for s in stored)
        assert len({s.snapshot_time for s in stored}) == 1 and stored[0].snapshot_time > 0
        boot = client.get_changes(tablets[0], TabletPosition(BOOTSTRAP), need_schema_info=True)
    cp = boot.cdc_sdk_checkpoint
    assert (cp.term, cp.index, cp.write_id, cp.snapshot_time) == (
        stored[0].term,
        stored[0].index,
        -1,
        stored[0].snapshot_time,
    )


def test_a_snapshot_of_a_stream_without_consistent_snapshot_starts_its_tablets_and_is_no_wal_loss(
    yb, provider, tmp_path
):
    """Origin: CONN ``.../yugabytedb/YugabyteDBSnapshotChangeEventSource.java:317-341``
    (``isSnapshotRequired``: ``GetCheckpoint``, and ``makeStreamActive`` = ``SetCDCCheckpoint(0.0,
    initial_checkpoint)`` for an invalid op id, before the bootstrap ``GetChanges``); research §2.3.
    P: the snapshot starts every never-started tablet, and what fails then is the stream's lack of a
    consistent snapshot (a configuration error; the stand-in's refusal of that bootstrap is a guess),
    not "WAL lost"."""
    tablets = make_table(yb, "k_snap_plain", rows=4)
    stream = yb.create_stream(tables=["k_snap_plain"], consistent_snapshot=False)
    with pytest.raises(CdcConfigurationError, match="has no consistent snapshot") as failed:
        run_job(make_spec(yb, stream, "k_snap_plain", tmp_path, snapshot_window()), provider)
    assert not isinstance(failed.value, WalLostError)
    started = [yb.state(stream, t) for t in tablets]
    assert any(s["checkpoint"] == [0, 0] and not s["expired"] for s in started)


def test_snapshot_mode_never_starts_a_plain_stream_and_marks_no_snapshot_needed(yb):
    """Origin: CONN ``.../yugabytedb/YugabyteDBStreamingChangeEventSource.java:177-186, 278-311``
    (``bootstrapTablet``: ``SetCDCCheckpoint(bootstrap)``, then ``markNoSnapshotNeeded``, a
    ``GetChanges`` with key ``snapshot_done_key``, then ``GetCheckpoint``); SVC ``SetCDCCheckpoint``
    (bootstrap: the latest op, ``active_time`` now) and ``UpdateSnapshotDone``; research R5.
    P: ``admin.bootstrap_tablets`` on both kinds of stream; the rows are started and not left
    "snapshot in progress"."""
    make_table(yb, "k_never", rows=2)
    for consistent in (True, False):
        stream = yb.create_stream(tables=["k_never"], consistent_snapshot=consistent)
        with client_for(yb, stream) as client:
            tablets = stream_from_latest(yb, client, "k_never")
            for tablet_id, state in tablets.items():
                row = yb.state(stream, tablet_id)
                assert row["snapshot_key"] is None and not row["expired"]
                assert row["checkpoint"] == [state.position.checkpoint.term, state.position.checkpoint.index]
                client.get_changes(tablet_id, state.position)  # served


# --- the snapshot: marked done, resumable, rerun ------------------------------------------------


def test_a_finished_snapshot_is_marked_done_and_a_rerun_reads_every_row_again(yb, provider, tmp_path):
    """C16 and R7b. Origin: CONN ``.../yugabytedb/YugabyteDBSnapshotChangeEventSource.java:819-855``
    (``markSnapshotDoneOnServer``) and SVC ``UpdateSnapshotDone`` (the snapshot key goes,
    ``cdc_sdk_safe_time`` = the request's snapshot time); CONN
    ``src/test/.../YugabyteDBSnapshotResumeTest.java:140-207`` (a restart in the last batch loses
    nothing); PROD ``cdc_snapshot_records_threshold_size_bytes`` (R7c: newer YB cuts snapshot pages
    by bytes). P: after the snapshot every read tablet's row is done; the same snapshot window run
    again (a run that failed before its commit), with pages cut by bytes, reads every row again."""
    make_table(yb, "k_done", rows=9)
    stream = yb.create_stream(tables=["k_done"])
    first = run_job(make_spec(yb, stream, "k_done", tmp_path / "a", snapshot_window()), provider)
    ht = first.stats["snapshot_ht"]
    starts = TabletCheckpoints.from_json(first.stats["source_state"]["tablets"])
    for tablet_id, state in starts.items():
        row = yb.state(stream, tablet_id)
        assert row["snapshot_key"] is None and row["safe_time"] == ht
        assert row["checkpoint"] == [state.position.checkpoint.term, state.position.checkpoint.index]
    yb.set(snapshot_page_bytes=24, snapshot_batch_size=1000)  # a few rows a page
    try:
        again = run_job(make_spec(yb, stream, "k_done", tmp_path / "b", snapshot_window()), provider)
    finally:
        yb.set(snapshot_page_bytes=0, snapshot_batch_size=250)
    assert again.stats["rows"] == first.stats["rows"] == {f"{PREFIX}.public.k_done": 9}
    assert again.stats["snapshot_ht"] == ht
    with yb.connect() as conn:
        assert_same_state(
            replay(events_of(tmp_path / "b", PREFIX, "public.k_done"), ["id"]),
            source_rows(conn, "public.k_done", ["id"]),
        )


def test_c15_an_explicit_snapshot_checkpoint_is_what_get_checkpoint_reports(yb):
    """C15. Origin: CONN ``src/test/.../YugabyteDBSnapshotResumeTest.java:63-133``
    (``verifySnapshotIsResumedFromKey``: after a stop mid-snapshot ``GetCheckpoint`` has the last
    explicit (term, index) and its ``snapshot_key``, l.105-107) and SVC ``GetChanges`` (a snapshot
    request stores ``explicit.key`` as the row's snapshot key, @c.~69,300). S, through the client."""
    yb.set(snapshot_batch_size=2)
    try:
        make_table(yb, "k_resume", rows=12)
        stream = yb.create_stream(tables=["k_resume"])
        with client_for(yb, stream) as client:
            for tablet in (t["tablet_id"] for t in yb.tablets("k_resume")):
                boot = client.get_changes(tablet, TabletPosition(BOOTSTRAP)).cdc_sdk_checkpoint
                first = Checkpoint(boot.term, boot.index, b"", -1, boot.snapshot_time)
                page = client.get_changes(tablet, TabletPosition(first), explicit=first).cdc_sdk_checkpoint
                acked = Checkpoint(page.term, page.index, page.key, page.write_id, page.snapshot_time)
                if acked.key:  # more pages follow: a snapshot stopped mid-way
                    break
            client.get_changes(tablet, TabletPosition(acked), explicit=acked)  # the connector acks page 1
            stored = client.get_checkpoint(tablet)
        assert (stored.term, stored.index, stored.snapshot_key) == (acked.term, acked.index, acked.key)
    finally:
        yb.set(snapshot_batch_size=250)


# --- explicit checkpoints -----------------------------------------------------------------------


def test_c20_after_set_checkpoints_get_checkpoint_is_at_least_the_committed_one(yb, tmp_path):
    """C20 and R4. Origin: CONN ``src/test/.../YugabyteDBExplicitCheckpointingTest.java:71-136`` (after
    the commit callbacks, ``GetCheckpoint``'s (term, index) >= the committed checkpoint, l.135-136);
    SVC ``SetCDCCheckpoint`` (forces the ``cdc_state`` write: ``UpdateCheckpointAndActiveTime(...,
    force_update, is_snapshot = !bootstrap)``, so the row also gets ``snapshot_key`` ""). P: a
    window's end stored by ``set_checkpoints`` (what ``acknowledge`` calls) is what
    ``admin.server_checkpoints`` (``check_restored``'s read) reports, not lagging."""
    make_table(yb, "k_explicit", rows=0)
    stream = yb.create_stream(tables=["k_explicit"])
    with client_for(yb, stream) as client:
        starts = stream_from_latest(yb, client, "k_explicit")
        from_ht = yb.wait_caught_up() + 1
        with yb.connect() as conn:
            conn.execute("INSERT INTO k_explicit SELECT g, 'x' FROM generate_series(1, 20) g")
        end = yb.wait_caught_up()
        entry = run_job(
            make_spec(yb, stream, "k_explicit", tmp_path, stream_window(1, from_ht, end + 1), starts), no_spark
        )
        ends = TabletCheckpoints.from_json(entry.stats["source_state"]["tablets"])
        client.set_checkpoints(ends)
        stored = admin.server_checkpoints(client, list(ends.polled()))
    for tablet_id, position in ends.polled().items():
        ours, theirs = position.checkpoint, stored[tablet_id]
        assert (theirs.term, theirs.index) >= (ours.term, ours.index) > (0, 0)
        assert yb.state(stream, tablet_id)["snapshot_key"] == ""  # R4: SetCDCCheckpoint marks the row


# --- expiry ---------------------------------------------------------------------------------------


def test_c17_an_unpolled_stream_expires_the_other_stream_on_the_tablet_continues(yb):
    """C17. Origin: YSQL-T ``TestMultpleStreamOnSameTablet`` (``cdc_intent_retention_ms = 10000``: the
    stream not polled for that long fails ``GetChanges``, the other stream goes on). P: the product
    reports the started tablet's expiry as terminal (:class:`StreamExpiredError`, a WAL loss)."""
    tablet = make_table(yb, "k_two_streams", rows=0)[0]
    polled, idle = (yb.create_stream(tables=["k_two_streams"]) for _ in range(2))
    with client_for(yb, polled) as busy, client_for(yb, idle) as lazy:
        busy_start = stream_from_latest(yb, busy, "k_two_streams")[tablet].position
        idle_start = stream_from_latest(yb, lazy, "k_two_streams")[tablet].position
        yb.age(idle, 9 * HOUR_MS, tablet_id=tablet)  # past cdc_intent_retention_ms (8 h)
        with pytest.raises(StreamExpiredError, match=f"Stream ID {idle} is expired for Tablet ID {tablet}"):
            lazy.get_changes(tablet, idle_start)
        busy.get_changes(tablet, busy_start)


def test_set_cdc_checkpoint_revives_an_expired_tablet_without_its_released_log(yb):
    """Origin: SVC ``SetCDCCheckpoint`` (no ``CheckStreamActive``; ``UpdateCheckpointAndActiveTime``
    sets ``active_time`` now) and ``PopulateTabletCheckPointInfo`` (an expired stream's retention is
    released, ``OpId::Max``, @c.~99,000); research §2.3. S: after expiry ``SetCDCCheckpoint`` is
    accepted and the tablet is served again, but the log released meanwhile is gone: the old
    checkpoint answers CHECKPOINT_TOO_OLD. That is why the product keeps real expiry terminal."""
    tablet = make_table(yb, "k_revive", rows=0)[0]
    expiring, other = (yb.create_stream(tables=["k_revive"]) for _ in range(2))
    with client_for(yb, expiring) as client, client_for(yb, other) as bystander:
        start = stream_from_latest(yb, client, "k_revive")[tablet].position
        with yb.connect() as conn:
            for key in keys_on(yb, "k_revive", tablet, 3):  # an op each: the first fall below the bystander's
                conn.execute("INSERT INTO k_revive VALUES (%s, 'x')", (key,))
        yb.wait_caught_up()
        yb.age(expiring, 9 * HOUR_MS)
        with pytest.raises(StreamExpiredError):
            client.get_changes(tablet, start)
        latest = stream_from_latest(yb, bystander, "k_revive")[tablet].position  # a retention pass
        client.set_checkpoints(TabletCheckpoints({tablet: TabletState(start)}))  # accepted: no expiry check
        assert not yb.state(expiring, tablet)["expired"]
        client.get_changes(tablet, latest)  # served again
        with pytest.raises(WalLostError, match="CHECKPOINT_TOO_OLD"):
            client.get_changes(tablet, start)  # what the expired stream held was released


def test_c18_the_idle_streams_checkpoint_holds_the_log_until_it_expires(yb):
    """C18. Origin: YSQL-T ``TestActiveAndInActiveStreamOnSameTablet`` (the retention minimum on a
    tablet is the unpolled stream's ``SetCDCCheckpoint`` checkpoint until that stream expires) and
    SVC ``PopulateTabletCheckPointInfo`` (expired streams leave the minimum). S."""
    tablet = make_table(yb, "k_hold", rows=0)[0]
    active, idle = (yb.create_stream(tables=["k_hold"]) for _ in range(2))
    with client_for(yb, active) as busy, client_for(yb, idle) as lazy:
        held = stream_from_latest(yb, lazy, "k_hold")[tablet].position.checkpoint
        stream_from_latest(yb, busy, "k_hold")
        with yb.connect() as conn:
            for key in keys_on(yb, "k_hold", tablet, 2):
                conn.execute("INSERT INTO k_hold VALUES (%s, 'x')", (key,))
        yb.wait_caught_up()
        moved = stream_from_latest(yb, busy, "k_hold")[tablet].position.checkpoint
        assert moved.index > held.index
        assert yb.state(active, tablet)["collected_through"] < held.index  # the idle stream holds it
        yb.age(idle, 9 * HOUR_MS)
        stream_from_latest(yb, busy, "k_hold")  # the next retention pass drops the expired stream
        assert yb.state(active, tablet)["collected_through"] >= held.index


# --- RPC details ----------------------------------------------------------------------------------


def test_get_checkpoint_on_a_follower_is_leader_not_ready_and_the_client_follows_the_leader(yb):
    """R8b. Origin: SVC ``GetCheckpoint`` (@c.~121,500: a non-leader not proxying answers
    ``LEADER_NOT_READY`` "Not ready to serve"). P: the product's client looks the leader up again."""
    tablet = make_table(yb, "k_follower", rows=0)[0]
    stream = yb.create_stream(tables=["k_follower"])
    with client_for(yb, stream) as client:
        before = client.get_checkpoint(tablet)
        old = client.leader(tablet)
        yb.move_leader(tablet)
        request = pb.GetCheckpointRequestPB(stream_id=stream.encode(), tablet_id=tablet.encode())
        with RpcConnection(*old, connect_timeout=5, tls=None) as follower:
            response = follower.invoke(methods.GET_CHECKPOINT, request, timeout=10)
        assert response.error.code == pb.CDCErrorPB.LEADER_NOT_READY
        assert response.error.status.message == "Not ready to serve"
        assert client.get_checkpoint(tablet) == before  # the cached leader refused: it found the new one


def test_streaming_responses_end_with_a_safepoint_and_carry_from_op_id(yb):
    """R2c. Origin: PROD end of ``GetChangesForCDCSDK`` (``cdc_populate_safepoint_record``: a SAFEPOINT
    record with the response's safe time unless a transaction is pending or it is a snapshot
    request; then "Populate from_op_id in all cdcsdk records"); PROD ``PopulateCDCSDKSafepointOpRecord``.
    S, through the product's client; the product's windows read such pages (test_stream.py)."""
    tablet = make_table(yb, "k_safepoint", rows=0)[0]
    stream = yb.create_stream(tables=["k_safepoint"])
    with client_for(yb, stream) as client:
        start = stream_from_latest(yb, client, "k_safepoint")[tablet].position
        with yb.connect() as conn:
            conn.execute("INSERT INTO k_safepoint SELECT g, 'x' FROM generate_series(1, 30) g")
        yb.wait_caught_up()
        response = client.get_changes(tablet, start, need_schema_info=True)
    *body, last = response.cdc_sdk_proto_records
    assert last.row_message.op == OP.SAFEPOINT and last.row_message.commit_time == response.safe_hybrid_time
    assert last.row_message.table == "k_safepoint" and changes(body)
    cp = start.checkpoint
    assert all(
        (r.from_op_id.term, r.from_op_id.index, r.from_op_id.write_id) == (cp.term, cp.index, 0)
        for r in response.cdc_sdk_proto_records
    )
