"""The YugabyteDB CDC-service stand-in (tests/support/yugabyte_cdc) behaves as YB's CDC service
does (docs/yugabytedb-cdc-standin.md), driven through the product's own RPC client over real
sockets, serving a real PostgreSQL 15 database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import errors, methods
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import RpcConnection
from tests.support.yugabyte_cdc import YugabyteCdcStandIn, standin_for
from tests.support.yugabyte_cdc.ids import HASH_SPACE, namespace_id, table_id

pytestmark = pytest.mark.pg

OP = pb.RowMessage
BOOTSTRAP = pb.CDCSDKCheckpointPB(term=-1, index=-1, key=b"", write_id=-1, snapshot_time=0)
NOT_CHANGES = (OP.DDL, OP.SAFEPOINT)  # schema records, and the safe point ending a response


@pytest.fixture(scope="module")
def yb(request, clusters) -> Iterator[YugabyteCdcStandIn]:
    """One stand-in for the module (each test uses its own tables and streams): 2 masters,
    3 tablet servers, 3 tablets per table, small snapshot pages."""
    yield from standin_for(request, clusters["pg15"], masters=2, snapshot_batch_size=4, rpc_heartbeat_interval=0.3)


@pytest.fixture
def client(yb) -> Iterator[Client]:
    connections = Client(yb)
    yield connections
    connections.close()


class Client:
    """The product's RpcConnection to the stand-in's masters and tablet servers."""

    def __init__(self, yb: YugabyteCdcStandIn) -> None:
        self.yb = yb
        self._connections: dict[tuple[str, int], RpcConnection] = {}

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()

    def call(self, address: tuple[str, int], method: methods.Method, request, *, check: bool = True):
        connection = self._connections.setdefault(address, RpcConnection(*address, connect_timeout=5, tls=None))
        response = connection.invoke(method, request, timeout=20)
        if check:
            errors.raise_for_service_error(response)
        return response

    def master(self, method: methods.Method, request, **kw):
        return self.call(self.yb.master_addresses[0], method, request, **kw)

    def tserver(self, number: int, method: methods.Method, request, **kw):
        return self.call(self.yb.tserver_addresses[number], method, request, **kw)

    def leader(self, tablet_id: str) -> int:
        """The tablet's leader, from the master's locations."""
        response = self.master(
            methods.MASTER_GET_TABLET_LOCATIONS, pb.GetTabletLocationsRequestPB(tablet_ids=[b(tablet_id)])
        )
        (location,) = response.tablet_locations
        (leader,) = [r for r in location.replicas if r.role == pb.LEADER]
        port = leader.ts_info.private_rpc_addresses[0].port
        return [p for _h, p in self.yb.tserver_addresses].index(port)

    def changes(self, stream: str, tablet_id: str, checkpoint=None, *, server: int | None = None, **fields):
        request = pb.GetChangesRequestPB(db_stream_id=b(stream), tablet_id=b(tablet_id), **fields)
        if checkpoint is not None:
            request.from_cdc_sdk_checkpoint.CopyFrom(checkpoint)
        return self.tserver(self.leader(tablet_id) if server is None else server, methods.GET_CHANGES, request)

    def set_checkpoint(self, stream: str, tablet_id: str, term: int, index: int, **fields):
        request = pb.SetCDCCheckpointRequestPB(stream_id=b(stream), tablet_id=b(tablet_id), **fields)
        request.checkpoint.op_id.term, request.checkpoint.op_id.index = term, index
        return self.tserver(self.leader(tablet_id), methods.SET_CDC_CHECKPOINT, request)

    def get_checkpoint(self, stream: str, tablet_id: str):
        request = pb.GetCheckpointRequestPB(stream_id=b(stream), tablet_id=b(tablet_id))
        return self.tserver(self.leader(tablet_id), methods.GET_CHECKPOINT, request)

    def tablets_to_poll(self, stream: str, table: str, parent: str | None = None):
        request = pb.GetTabletListToPollForCDCRequestPB(tablet_id=b(parent) if parent else None)
        request.table_info.stream_id, request.table_info.table_id = b(stream), b(table)
        return self.tserver(0, methods.GET_TABLET_LIST_TO_POLL, request).tablet_checkpoint_pairs

    def snapshot(self, stream: str, tablet_id: str) -> tuple[list[pb.CDCSDKProtoRecordPB], pb.CDCSDKCheckpointPB]:
        """The connector's snapshot of one tablet: mark active if never set, bootstrap, page, mark
        done. Returns the records and the streaming checkpoint."""
        checkpoint = self.get_checkpoint(stream, tablet_id)
        if (checkpoint.checkpoint.op_id.term, checkpoint.checkpoint.op_id.index) == (-1, -1):
            self.set_checkpoint(stream, tablet_id, 0, 0, initial_checkpoint=True)
        cp = self.changes(stream, tablet_id, BOOTSTRAP).cdc_sdk_checkpoint
        assert cp.term > 0 and cp.index > 0 and cp.write_id == -1 and cp.snapshot_time > 0
        records = []
        while True:
            response = self.changes(stream, tablet_id, cp, need_schema_info=not records)
            records.extend(response.cdc_sdk_proto_records)
            cp = response.cdc_sdk_checkpoint
            if not cp.key and cp.write_id == 0 and cp.snapshot_time == 0:  # isSnapshotCompleteMarker
                break
        done = pb.CDCSDKCheckpointPB(term=cp.term, index=cp.index, key=b"snapshot_done_key", write_id=0)
        return records, self.changes(stream, tablet_id, done).cdc_sdk_checkpoint

    def drain(self, stream: str, tablet_id: str, cp, **fields) -> tuple[list[pb.CDCSDKProtoRecordPB], object]:
        """Every record after ``cp`` (DDL records left out), and the final checkpoint."""
        out = []
        while True:
            response = self.changes(stream, tablet_id, cp, **fields)
            new = [r for r in response.cdc_sdk_proto_records if r.row_message.op not in NOT_CHANGES]
            out.extend(new)
            if _position(response.cdc_sdk_checkpoint) == _position(cp):
                return out, cp
            cp = response.cdc_sdk_checkpoint


def b(text: str) -> bytes:
    return text.encode()


def _position(cp) -> tuple:
    return (cp.term, cp.index, bytes(cp.key), cp.write_id)


def row(datums) -> dict:
    """A tuple as {column: value}: the datum set, or None for NULL."""
    out = {}
    for d in datums:
        kind = d.WhichOneof("datum")
        out[d.column_name] = getattr(d, kind) if kind else None
    return out


def op_id(record) -> tuple[int, int, int]:
    return (record.cdc_sdk_op_id.term, record.cdc_sdk_op_id.index, record.cdc_sdk_op_id.write_id)


def make_table(yb: YugabyteCdcStandIn, name: str, rows: int = 0) -> str:
    with yb.connect() as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text, n int)")
        if rows:
            conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g, g * 10 FROM generate_series(1, {rows}) g")
    return name


def keys_per_tablet(yb: YugabyteCdcStandIn, table: str, candidates=range(1000, 1200)) -> dict[str, list[int]]:
    tablets = [t for t in yb.tablets(table) if not t["children"]]
    out: dict[str, list[int]] = {t["tablet_id"]: [] for t in tablets}
    for key, code in zip(candidates, yb.hash_codes(list(candidates))):
        out[next(t["tablet_id"] for t in tablets if t["start"] <= code < t["end"])].append(key)
    return out


def start_streaming(client: Client, stream: str, tablet_ids) -> dict[str, object]:
    """Snapshot-less start (snapshot mode "never"): checkpoint each tablet at its latest op."""
    checkpoints = {}
    for tablet_id in tablet_ids:
        client.tserver(
            client.leader(tablet_id),
            methods.SET_CDC_CHECKPOINT,
            pb.SetCDCCheckpointRequestPB(stream_id=b(stream), tablet_id=b(tablet_id), bootstrap=True),
        )
        op = client.get_checkpoint(stream, tablet_id).checkpoint.op_id
        checkpoints[tablet_id] = pb.CDCSDKCheckpointPB(term=op.term, index=op.index, key=b"", write_id=0)
    return checkpoints


# --- discovery ---------------------------------------------------------------------------------


def test_master_and_tablet_servers_list_the_streams_tables_and_tablets(yb, client):
    table = make_table(yb, "disco", rows=3)
    stream = yb.create_stream()
    with yb.connect() as conn:
        db_oid, relid = conn.execute(
            "SELECT (SELECT oid::int FROM pg_database WHERE datname = current_database()), %s::regclass::oid::int",
            (table,),
        ).fetchone()
    info = client.master(
        methods.MASTER_GET_DB_STREAM_INFO, pb.MasterGetCDCDBStreamInfoRequestPB(db_stream_id=b(stream))
    )
    assert info.namespace_id.decode() == namespace_id(db_oid) == yb.namespace_id
    assert table_id(db_oid, relid).encode() in [t.table_id for t in info.table_info]
    options = client.master(methods.MASTER_GET_CDC_STREAM, pb.GetCDCStreamRequestPB(stream_id=b(stream))).stream.options
    assert {o.key: o.value.decode() for o in options}["record_type"] == "CHANGE"

    pairs = client.tablets_to_poll(stream, table_id(db_oid, relid))
    assert len(pairs) == 3
    ranges = sorted(
        (int.from_bytes(p.tablet_locations.partition.partition_key_start or b"\0\0", "big"), p) for p in pairs
    )
    assert [r[0] for r in ranges] == [0, HASH_SPACE // 3, 2 * HASH_SPACE // 3]
    addresses = {p for _h, p in yb.tserver_addresses}
    for pair in pairs:
        # a consistent-snapshot stream's rows: the snapshot's op id (the master's, at creation)
        assert pair.cdc_sdk_checkpoint.term > 0 and pair.cdc_sdk_checkpoint.index > 0
        (leader,) = [r for r in pair.tablet_locations.replicas if r.role == pb.LEADER]
        assert leader.ts_info.private_rpc_addresses[0].port in addresses
    locations = client.master(
        methods.MASTER_GET_TABLE_LOCATIONS,
        pb.GetTableLocationsRequestPB(table={"table_id": b(table_id(db_oid, relid))}),
    )
    assert sorted(t.tablet_id for t in locations.tablet_locations) == sorted(
        p.tablet_locations.tablet_id for p in pairs
    )


# --- snapshot and streaming --------------------------------------------------------------------


def test_snapshot_pages_across_tablets_equal_the_table_at_stream_creation(yb, client):
    table = make_table(yb, "snap", rows=30)
    stream = yb.create_stream()
    with yb.connect() as conn:  # after the stream's consistent snapshot: streamed, not snapshotted
        conn.execute("INSERT INTO snap VALUES (31, 'late', 310)")
        conn.execute("UPDATE snap SET v = 'changed' WHERE id = 1")
    seen = {}
    snapshot_times = set()
    for tablet in yb.tablets(table):
        records, streaming = client.snapshot(stream, tablet["tablet_id"])
        assert records[0].row_message.op == OP.DDL  # need_schema_info: the schema comes first
        assert [c.name for c in records[0].row_message.schema.column_info] == ["id", "v", "n"]
        reads = [r for r in records if r.row_message.op == OP.READ]
        assert not [r for r in records if r.row_message.op in (OP.BEGIN, OP.COMMIT)]
        for record in reads:
            values = row(record.row_message.new_tuple)
            assert tablet["start"] <= yb.hash_code(values["id"]) < tablet["end"]
            assert values["id"] not in seen
            seen[values["id"]] = values
            snapshot_times.add(record.row_message.commit_time)
        assert streaming.key == b"" and streaming.write_id == 0 and streaming.index > 0
        state = client.get_checkpoint(stream, tablet["tablet_id"])
        assert not state.HasField("snapshot_key")  # snapshot done
    assert seen == {i: {"id": i, "v": f"v{i}", "n": i * 10} for i in range(1, 31)}
    assert len(snapshot_times) == 1  # one consistent snapshot time for the whole stream


def test_a_snapshot_in_progress_resumes_from_the_acknowledged_key(yb, client):
    table = make_table(yb, "resume", rows=40)
    stream = yb.create_stream()
    tablet_id = yb.tablet_for(table, 1)
    client.set_checkpoint(stream, tablet_id, 0, 0, initial_checkpoint=True)
    boot = client.changes(stream, tablet_id, BOOTSTRAP).cdc_sdk_checkpoint
    first = client.changes(stream, tablet_id, boot, explicit_cdc_sdk_checkpoint=boot)
    page = first.cdc_sdk_checkpoint
    assert page.key and page.write_id == -1 and page.snapshot_time == boot.snapshot_time
    second = client.changes(stream, tablet_id, page, explicit_cdc_sdk_checkpoint=page)  # Kafka acked page 1
    stored = client.get_checkpoint(stream, tablet_id)
    assert (stored.checkpoint.op_id.term, stored.checkpoint.op_id.index) == (boot.term, boot.index)
    assert stored.snapshot_key == page.key and stored.snapshot_time == boot.snapshot_time
    resume = pb.CDCSDKCheckpointPB(
        term=boot.term, index=boot.index, key=stored.snapshot_key, write_id=-1, snapshot_time=stored.snapshot_time
    )
    again = client.changes(stream, tablet_id, resume)  # a restarted connector's getSnapshotStartLsn
    reads = [[op_id(r), r.row_message.primary_key] for r in again.cdc_sdk_proto_records if r.row_message.op == OP.READ]
    assert reads == [
        [op_id(r), r.row_message.primary_key] for r in second.cdc_sdk_proto_records if r.row_message.op == OP.READ
    ]


def test_changes_after_the_snapshot_arrive_per_tablet_between_begin_and_commit(yb, client):
    table = make_table(yb, "chg", rows=6)
    stream = yb.create_stream()
    checkpoints = {t["tablet_id"]: client.snapshot(stream, t["tablet_id"])[1] for t in yb.tablets(table)}
    with yb.connect() as conn:
        conn.execute("INSERT INTO chg VALUES (100, 'a', 1)")
        conn.execute("UPDATE chg SET v = 'b' WHERE id = 2")
        conn.execute("DELETE FROM chg WHERE id = 3")
    yb.wait_caught_up()
    changes = {}
    for tablet_id, cp in checkpoints.items():
        records, _ = client.drain(stream, tablet_id, cp)
        ids = [op_id(r) for r in records]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)  # OpIds increase
        times = []
        for record in records:  # transactions: BEGIN, rows, COMMIT
            message = record.row_message
            if message.op == OP.BEGIN:
                times.append(message.commit_time)
            elif message.op != OP.COMMIT:
                changes[message.op] = (row(message.new_tuple), row(message.old_tuple))
        assert times == sorted(times)
        assert [r.row_message.op for r in records].count(OP.BEGIN) == [r.row_message.op for r in records].count(
            OP.COMMIT
        )
        if records:
            assert records[0].row_message.op == OP.BEGIN and records[-1].row_message.op == OP.COMMIT
    assert changes[OP.INSERT] == ({"id": 100, "v": "a", "n": 1}, {})
    assert changes[OP.UPDATE] == ({"id": 2, "v": "b"}, {})  # CHANGE: key + modified columns
    assert changes[OP.DELETE] == ({}, {"id": 3})  # CHANGE: the key only


def test_a_transaction_on_several_tablets_has_one_commit_time_and_id_everywhere(yb, client):
    table = make_table(yb, "multi")
    keys = keys_per_tablet(yb, table)
    stream = yb.create_stream()
    checkpoints = start_streaming(client, stream, keys)
    with yb.connect() as conn:
        with conn.transaction():
            for tablet_keys in keys.values():
                conn.execute("INSERT INTO multi VALUES (%s, 'x', 0)", (tablet_keys[0],))
        conn.execute("INSERT INTO multi VALUES (%s, 'alone', 0)", (next(iter(keys.values()))[1],))
    yb.wait_caught_up()
    per_tablet = {t: client.drain(stream, t, cp)[0] for t, cp in checkpoints.items()}
    firsts = [records[:3] for records in per_tablet.values()]
    assert all([r.row_message.op for r in first] == [OP.BEGIN, OP.INSERT, OP.COMMIT] for first in firsts)
    assert len({r.row_message.commit_time for first in firsts for r in first}) == 1
    assert len({r.row_message.transaction_id for first in firsts for r in first}) == 1
    alone = next(records for records in per_tablet.values() if len(records) == 6)[3:]
    assert alone[0].row_message.commit_time > firsts[0][0].row_message.commit_time
    assert alone[0].row_message.transaction_id != firsts[0][0].row_message.transaction_id


def test_a_primary_key_change_is_a_delete_on_the_old_tablet_and_an_insert_on_the_new(yb, client):
    table = make_table(yb, "rekey")
    keys = keys_per_tablet(yb, table)
    (old_tablet, old_keys), (new_tablet, new_keys) = list(keys.items())[:2]
    with yb.connect() as conn:
        conn.execute("INSERT INTO rekey VALUES (%s, 'x', 1)", (old_keys[0],))
    stream = yb.create_stream()
    checkpoints = start_streaming(client, stream, [old_tablet, new_tablet])
    with yb.connect() as conn:
        conn.execute("UPDATE rekey SET id = %s WHERE id = %s", (new_keys[0], old_keys[0]))
    yb.wait_caught_up()
    gone, _ = client.drain(stream, old_tablet, checkpoints[old_tablet])
    came, _ = client.drain(stream, new_tablet, checkpoints[new_tablet])
    assert [(r.row_message.op, row(r.row_message.old_tuple)) for r in gone][1] == (OP.DELETE, {"id": old_keys[0]})
    assert [(r.row_message.op, row(r.row_message.new_tuple)) for r in came][1] == (
        OP.INSERT,
        {"id": new_keys[0], "v": "x", "n": 1},
    )
    assert gone[0].row_message.commit_time == came[0].row_message.commit_time


def test_reading_from_any_returned_checkpoint_never_repeats_a_record(yb, client):
    table = make_table(yb, "pages")
    keys = keys_per_tablet(yb, table)
    tablet_id, mine = max(keys.items(), key=lambda kv: len(kv[1]))
    stream = yb.create_stream()
    start = start_streaming(client, stream, [tablet_id])[tablet_id]
    with yb.connect() as conn:
        with conn.transaction():  # one op of 12 records: pages must cut inside it
            for key in mine[:10]:
                conn.execute("INSERT INTO pages VALUES (%s, 'a', 0)", (key,))
        for key in mine[:4]:
            conn.execute("UPDATE pages SET n = n + 1 WHERE id = %s", (key,))
    yb.wait_caught_up()
    whole, _ = client.drain(stream, tablet_id, start)
    assert len(whole) == 12 + 4 * 3
    paged, cp, checkpoints = [], start, []
    while True:
        response = client.changes(stream, tablet_id, cp, max_records=5)
        got = [r for r in response.cdc_sdk_proto_records if r.row_message.op not in NOT_CHANGES]
        assert len(got) <= 5
        if paged and got:
            assert op_id(got[0]) > op_id(paged[-1])  # nothing before the checkpoint comes back
        paged.extend(got)
        if _position(response.cdc_sdk_checkpoint) == _position(cp):
            break
        cp = response.cdc_sdk_checkpoint
        checkpoints.append((cp, len(paged)))
    assert [op_id(r) for r in paged] == [op_id(r) for r in whole]
    assert any(c.key for c, _n in checkpoints)  # some page ended inside the transaction
    for cp, seen in checkpoints:  # any checkpoint resumes exactly after what it covered
        rest, _ = client.drain(stream, tablet_id, cp)
        assert [op_id(r) for r in rest] == [op_id(r) for r in whole[seen:]]


def test_set_cdc_checkpoint_persists_and_releases_the_log_before_it(yb, client):
    table = make_table(yb, "ckpt")
    keys = keys_per_tablet(yb, table)
    tablet_id = next(iter(keys))
    stream = yb.create_stream()
    start = start_streaming(client, stream, [tablet_id])[tablet_id]
    with yb.connect() as conn:
        for key in keys[tablet_id][:3]:
            conn.execute("INSERT INTO ckpt VALUES (%s, 'a', 0)", (key,))
    yb.wait_caught_up()
    records, end = client.drain(stream, tablet_id, start)
    assert len(records) == 9
    client.set_checkpoint(stream, tablet_id, end.term, end.index)
    other = Client(yb)  # a new connection (a restarted client) sees what was stored
    try:
        stored = other.get_checkpoint(stream, tablet_id).checkpoint.op_id
        assert (stored.term, stored.index) == (end.term, end.index)
        pair = next(
            p
            for p in other.tablets_to_poll(stream, yb.tablets(table)[0]["table_id"])
            if p.tablet_locations.tablet_id == b(tablet_id)
        )
        assert (pair.cdc_sdk_checkpoint.term, pair.cdc_sdk_checkpoint.index) == (end.term, end.index)
    finally:
        other.close()
    assert yb.state(stream, tablet_id)["collected_through"] >= start.index + 1  # released: garbage-collected
    with pytest.raises(errors.CheckpointTooOld):
        client.changes(stream, tablet_id, start)
    assert client.drain(stream, tablet_id, end)[0] == []  # from the stored checkpoint: nothing lost
    # EXPLICIT: the acknowledged checkpoint sent along with GetChanges is what the server keeps
    with yb.connect() as conn:
        conn.execute("INSERT INTO ckpt VALUES (%s, 'b', 0)", (keys[tablet_id][3],))
    yb.wait_caught_up()
    response = client.changes(stream, tablet_id, end, explicit_cdc_sdk_checkpoint=end)
    assert len([r for r in response.cdc_sdk_proto_records if r.row_message.op not in NOT_CHANGES]) == 3
    assert yb.state(stream, tablet_id)["checkpoint"] == [end.term, end.index]


# --- faults ------------------------------------------------------------------------------------


def test_a_leader_move_answers_not_leader_then_the_new_leader_serves_the_same_log(yb, client):
    table = make_table(yb, "lead")
    keys = keys_per_tablet(yb, table)
    tablet_id = next(iter(keys))
    stream = yb.create_stream()
    start = start_streaming(client, stream, [tablet_id])[tablet_id]
    with yb.connect() as conn:
        conn.execute("INSERT INTO lead VALUES (%s, 'a', 0)", (keys[tablet_id][0],))
    yb.wait_caught_up()
    before, end = client.drain(stream, tablet_id, start)
    old = client.leader(tablet_id)
    new = yb.move_leader(tablet_id)
    assert new != old and client.leader(tablet_id) == new  # the master's locations changed
    with pytest.raises(errors.LeaderChanged) as refused:
        client.changes(stream, tablet_id, start, server=old)
    assert refused.value.code == pb.CDCErrorPB.TABLET_NOT_FOUND and "Not leader for" in refused.value.message
    again, _ = client.drain(stream, tablet_id, start)  # the new leader, same checkpoint, same records
    assert [op_id(r) for r in again] == [op_id(r) for r in before]
    with yb.connect() as conn:
        conn.execute("INSERT INTO lead VALUES (%s, 'b', 0)", (keys[tablet_id][1],))
    yb.wait_caught_up()
    after, _ = client.drain(stream, tablet_id, end)
    assert len(after) == 3 and after[0].cdc_sdk_op_id.term == end.term + 1  # a new term
    yb.set(proxy_to_leader=True)  # YB's default: any tablet server forwards with serve_as_proxy
    try:
        assert len(client.drain(stream, tablet_id, end, server=old)[0]) == 3
        with pytest.raises(errors.LeaderChanged):
            client.changes(stream, tablet_id, end, server=old, serve_as_proxy=False)
    finally:
        yb.set(proxy_to_leader=False)


def test_a_split_answers_tablet_split_and_the_children_continue_with_nothing_lost_or_doubled(yb, client):
    table = make_table(yb, "split")
    keys = keys_per_tablet(yb, table)
    parent, mine = next(iter(keys.items()))
    stream = yb.create_stream()
    start = start_streaming(client, stream, [parent])[parent]
    with yb.connect() as conn:
        for key in mine[:6]:
            conn.execute("INSERT INTO split VALUES (%s, 'before', 0)", (key,))
    children = yb.split(parent)
    with yb.connect() as conn:
        for key in mine[6:14]:
            conn.execute("INSERT INTO split VALUES (%s, 'after', 0)", (key,))
        conn.execute("UPDATE split SET v = 'moved' WHERE id = %s", (mine[0],))
    yb.wait_caught_up()
    records, cp = [], start
    # once the split is applied the parent answers TABLET_SPLIT at once (cdcsdk_producer.cc, "moving to
    # children tablets immediately"); the children's logs copy the parent's, so they serve all of it
    with pytest.raises(errors.TabletSplit):
        while True:
            response = client.changes(stream, parent, cp, max_records=4)
            records += [r for r in response.cdc_sdk_proto_records if r.row_message.op not in NOT_CHANGES]
            cp = response.cdc_sdk_checkpoint
    assert records == []
    table_uuid = yb.tablets(table)[0]["table_id"]
    pairs = client.tablets_to_poll(stream, table_uuid, parent=parent)
    assert sorted(p.tablet_locations.tablet_id.decode() for p in pairs) == sorted(children)
    for pair in pairs:
        assert pair.tablet_locations.split_parent_tablet_id == b(parent)
        cp = pb.CDCSDKCheckpointPB(term=pair.cdc_sdk_checkpoint.term, index=pair.cdc_sdk_checkpoint.index)
        records += client.drain(stream, pair.tablet_locations.tablet_id.decode(), cp, need_schema_info=True)[0]
    rows = [
        (r.row_message.op, row(r.row_message.new_tuple)["id"])
        for r in records
        if r.row_message.op in (OP.INSERT, OP.UPDATE)
    ]
    assert sorted(rows) == sorted([(OP.INSERT, k) for k in mine[:14]] + [(OP.UPDATE, mine[0])])
    listed = {p.tablet_locations.tablet_id.decode() for p in client.tablets_to_poll(stream, table_uuid)}
    assert set(children) <= listed and parent not in listed  # both children polled: the parent is done


def test_a_tablet_not_polled_within_the_retention_answers_stream_expired(yb, client):
    table = make_table(yb, "expiry")
    tablets = [t["tablet_id"] for t in yb.tablets(table)]
    stream = yb.create_stream()
    checkpoints = start_streaming(client, stream, tablets)
    yb.age(stream, 9 * 3600 * 1000, tablet_id=tablets[0])  # cdc_intent_retention_ms is 8 h
    with pytest.raises(errors.StreamExpired) as expired:
        client.changes(stream, tablets[0], checkpoints[tablets[0]])
    assert f"Stream ID {stream} is expired for Tablet ID {tablets[0]}" in str(expired.value)
    client.changes(stream, tablets[1], checkpoints[tablets[1]])  # the other tablets are fine
    # SetCDCCheckpoint checks no expiry and sets the active time again (cdc_service.cc)
    client.set_checkpoint(stream, tablets[0], checkpoints[tablets[0]].term, checkpoints[tablets[0]].index)
    client.changes(stream, tablets[0], checkpoints[tablets[0]])


def test_an_unknown_stream_and_a_stream_of_another_database_are_refused(yb, client):
    table = make_table(yb, "other_db", rows=2)
    tablet_id = yb.tablets(table)[0]["tablet_id"]
    unknown = uuid.uuid4().hex
    with pytest.raises(errors.StreamNotFound):
        client.master(methods.MASTER_GET_DB_STREAM_INFO, pb.MasterGetCDCDBStreamInfoRequestPB(db_stream_id=b(unknown)))
    with pytest.raises(errors.StreamNotFound):
        client.changes(unknown, tablet_id, BOOTSTRAP)
    with pytest.raises(errors.StreamNotFound):
        client.tablets_to_poll(unknown, yb.tablets(table)[0]["table_id"])
    other = yb.create_stream(database="postgres")
    info = client.master(methods.MASTER_GET_DB_STREAM_INFO, pb.MasterGetCDCDBStreamInfoRequestPB(db_stream_id=b(other)))
    assert info.namespace_id.decode() != yb.namespace_id
    with pytest.raises(errors.StreamNotFound):  # TABLE_NOT_FOUND: "Table ... not found under stream"
        client.tablets_to_poll(other, yb.tablets(table)[0]["table_id"])
    with pytest.raises(errors.InvalidServiceRequest, match="is not part of stream"):
        client.changes(other, tablet_id, BOOTSTRAP)


# --- record types, schema changes, the RPC layer -----------------------------------------------


@pytest.mark.parametrize(
    ("record_type", "update", "delete"),
    [
        ("ALL", ({"id": 1, "v": "new", "n": 10}, {"id": 1, "v": "v1", "n": 10}), ({}, {"id": 1, "v": "new", "n": 10})),
        ("FULL_ROW_NEW_IMAGE", ({"id": 1, "v": "new", "n": 10}, {}), ({}, {"id": 1, "v": "new", "n": 10})),
        ("MODIFIED_COLUMNS_OLD_AND_NEW_IMAGES", ({"id": 1, "v": "new"}, {"id": 1, "v": "v1"}), ({}, {"id": 1})),
    ],
)
def test_record_types_decide_the_before_and_after_images(yb, client, record_type, update, delete):
    table = make_table(yb, f"rt_{record_type.lower()}", rows=1)
    stream = yb.create_stream(record_type=record_type, tables=[table])
    tablet_id = yb.tablet_for(table, 1)
    start = start_streaming(client, stream, [tablet_id])[tablet_id]
    with yb.connect() as conn:
        conn.execute(f"UPDATE {table} SET v = 'new' WHERE id = 1")
        conn.execute(f"DELETE FROM {table} WHERE id = 1")
    yb.wait_caught_up()
    records, _ = client.drain(stream, tablet_id, start)
    images = {r.row_message.op: (row(r.row_message.new_tuple), row(r.row_message.old_tuple)) for r in records}
    assert images[OP.UPDATE] == update
    assert images[OP.DELETE] == delete


def test_a_column_change_arrives_as_a_ddl_record_before_the_rows_that_have_it(yb, client):
    table = make_table(yb, "ddl")
    stream = yb.create_stream()
    tablet_id = yb.tablet_for(table, 7)
    start = start_streaming(client, stream, [tablet_id])[tablet_id]
    with yb.connect() as conn:
        conn.execute("INSERT INTO ddl VALUES (7, 'a', 1)")
        conn.execute("ALTER TABLE ddl ADD COLUMN extra float8")
        conn.execute("UPDATE ddl SET extra = 2.5 WHERE id = 7")
    yb.wait_caught_up()
    records = client.changes(stream, tablet_id, start, need_schema_info=True).cdc_sdk_proto_records
    ops = [r.row_message.op for r in records]
    assert ops == [OP.DDL, OP.BEGIN, OP.INSERT, OP.COMMIT, OP.DDL, OP.BEGIN, OP.UPDATE, OP.COMMIT, OP.SAFEPOINT]
    first, second = records[0].row_message, records[4].row_message
    assert [c.name for c in first.schema.column_info] == ["id", "v", "n"]
    assert [c.name for c in second.schema.column_info] == ["id", "v", "n", "extra"]
    assert second.schema_version == first.schema_version + 1
    assert [(c.is_key, c.is_hash_key) for c in second.schema.column_info][:2] == [(True, True), (False, False)]
    assert row(records[6].row_message.new_tuple) == {"id": 7, "extra": 2.5}


def test_the_rpc_layer_refuses_unknown_methods_and_can_be_made_to_fail(yb, client):
    with pytest.raises(errors.NoSuchMethod):
        client.tserver(
            0,
            methods.Method(methods.CDC_SERVICE, "NoSuchCall", pb.GetChangesRequestPB, pb.GetChangesResponsePB),
            pb.GetChangesRequestPB(),
        )
    with pytest.raises(errors.NoSuchMethod):  # the CDC service does not live on masters
        client.master(methods.GET_CHANGES, pb.GetChangesRequestPB())
    request = pb.MasterGetCDCDBStreamInfoRequestPB(db_stream_id=b(yb.create_stream(tables=[])))
    assert yb.move_master_leader() == 1
    try:
        with pytest.raises(errors.LeaderChanged):  # NOT_THE_LEADER: try another master
            client.call(yb.master_addresses[0], methods.MASTER_GET_DB_STREAM_INFO, request)
        assert client.call(yb.master_addresses[1], methods.MASTER_GET_DB_STREAM_INFO, request).namespace_id
    finally:
        yb.move_master_leader(0)
    yb.fail_next("GetCDCDBStreamInfo", "Call rejected due to memory pressure", rpc_code="ERROR_SERVER_TOO_BUSY")
    with pytest.raises(errors.ServerTooBusy):
        client.master(methods.MASTER_GET_DB_STREAM_INFO, pb.MasterGetCDCDBStreamInfoRequestPB(db_stream_id=b"x"))
