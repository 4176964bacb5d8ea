"""The source's RPC session against tiny in-test masters and tablet servers on real sockets."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    CdcTransientError,
    SlotMissingError,
    WalLostError,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.addresses import parse_addresses
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import (
    Checkpoint,
    TabletCheckpoints,
    TabletPosition,
    TabletState,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import RetryPolicy, YbCdcClient
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import TabletSplitError, poll_pages
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import framing
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import TlsOptions
from tests.unit.cdc.sources.yugabyte_cdc.test_client import TinyServer

STREAM = "d540f5e4890c4d3b812933cbfd703ed3"
CDC = pb.CDCErrorPB
MASTER = pb.MasterErrorPB


class Cluster:
    """Two masters (the second leads) and two tablet servers; tablet ``t1`` leads on ``leader``."""

    def __init__(self) -> None:
        self.leader = 0
        self.changes_errors: list[pb.CDCErrorPB] = []
        self.calls: list[tuple[str, str]] = []
        self.checkpoints: list[pb.SetCDCCheckpointRequestPB] = []
        self.changes_padding = 0  # bytes of one text datum added to every GetChanges response
        self.masters = [TinyServer(self._follower_master), TinyServer(self._master)]
        self.tservers = [TinyServer(self._tserver(i)) for i in range(2)]

    def close(self) -> None:
        for server in (*self.masters, *self.tservers):
            server.close()

    def client(self, attempts: int = 4) -> YbCdcClient:
        masters = [("127.0.0.1", s.port) for s in self.masters]
        retry = RetryPolicy(attempts=attempts, backoff_seconds=0)
        return YbCdcClient(masters, STREAM, retry=retry, timeout_seconds=5, tls=None)  # plaintext test servers

    def _follower_master(self, request: framing.Request) -> list[bytes]:
        self.calls.append(("master0", request.method))
        error = pb.MasterErrorPB(code=MASTER.NOT_THE_LEADER, status=pb.AppStatusPB(code=pb.AppStatusPB.ILLEGAL_STATE))
        return [framing.encode_response(request.call_id, pb.GetTabletLocationsResponsePB(error=error))]

    def _location(self, tablet_id: bytes) -> pb.TabletLocationsPB:
        location = pb.TabletLocationsPB(tablet_id=tablet_id)
        for i, server in enumerate(self.tservers):
            replica = location.replicas.add(role=pb.LEADER if i == self.leader else pb.FOLLOWER)
            replica.ts_info.private_rpc_addresses.add(host="127.0.0.1", port=server.port)
        return location

    def _master(self, request: framing.Request) -> list[bytes]:
        self.calls.append(("master1", request.method))
        if request.method == "GetTabletLocations":
            ask = pb.GetTabletLocationsRequestPB.FromString(request.body)
            body: pb.Message = pb.GetTabletLocationsResponsePB(
                tablet_locations=[self._location(t) for t in ask.tablet_ids]
            )
        elif request.method == "GetTableLocations":
            body = pb.GetTableLocationsResponsePB(tablet_locations=[self._location(b"t1"), self._location(b"t2")])
        elif request.method == "GetCDCDBStreamInfo":
            ask = pb.MasterGetCDCDBStreamInfoRequestPB.FromString(request.body)
            if ask.db_stream_id != STREAM.encode():
                error = pb.MasterErrorPB(
                    code=MASTER.OBJECT_NOT_FOUND, status=pb.AppStatusPB(message="Could not find CDC stream")
                )
                body = pb.MasterGetCDCDBStreamInfoResponsePB(error=error)
            else:
                body = pb.MasterGetCDCDBStreamInfoResponsePB(namespace_id=b"ns1")
                body.table_info.add(stream_id=STREAM.encode(), table_id=b"tb2")
                body.table_info.add(stream_id=STREAM.encode(), table_id=b"tb1")
        elif request.method == "GetCDCStream":
            body = pb.GetCDCStreamResponsePB()
            body.stream.options.add(key="record_type", value=b"ALL")
        else:
            raise AssertionError(request.method)
        return [framing.encode_response(request.call_id, body)]

    def _tserver(self, i: int) -> Callable[[framing.Request], list[bytes]]:
        def handle(request: framing.Request) -> list[bytes]:
            self.calls.append((f"ts{i}", request.method))
            if i != self.leader:
                error = CDC(
                    code=CDC.TABLET_NOT_FOUND,
                    status=pb.AppStatusPB(code=pb.AppStatusPB.NOT_FOUND, message="Not leader"),
                )
                return [framing.encode_response(request.call_id, pb.GetChangesResponsePB(error=error))]
            if request.method == "SetCDCCheckpoint":
                self.checkpoints.append(pb.SetCDCCheckpointRequestPB.FromString(request.body))
                return [framing.encode_response(request.call_id, pb.SetCDCCheckpointResponsePB())]
            if self.changes_errors:
                error = self.changes_errors.pop(0)
                return [framing.encode_response(request.call_id, pb.GetChangesResponsePB(error=error))]
            ask = pb.GetChangesRequestPB.FromString(request.body)
            index = ask.from_cdc_sdk_checkpoint.index
            response = pb.GetChangesResponsePB(safe_hybrid_time=ask.safe_hybrid_time + 100)
            response.cdc_sdk_checkpoint.term, response.cdc_sdk_checkpoint.index = 1, index + 1
            if self.changes_padding:
                row = response.cdc_sdk_proto_records.add().row_message
                row.op, row.table = pb.RowMessage.INSERT, "wide"
                row.new_tuple.add(column_name="doc", column_type=25, datum_string="x" * self.changes_padding)
            return [framing.encode_response(request.call_id, response)]

        return handle


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    cluster = Cluster()
    yield cluster
    cluster.close()


def test_stream_tables_and_tablets_through_the_leader_master(cluster: Cluster) -> None:
    with cluster.client() as client:
        assert client.stream_tables() == ("ns1", ("tb1", "tb2"))
        assert client.tablets(["tb1"]) == {"t1": ("tb1",), "t2": ("tb1",)}
        assert client.record_type() == pb.ALL
    # the follower master was asked once; the leader is remembered
    assert [c for c in cluster.calls if c[0] == "master0"] == [("master0", "GetCDCDBStreamInfo")]


def test_pages_follow_the_leader_when_it_moves(cluster: Cluster) -> None:
    with cluster.client() as client:
        client.tablets(["tb1"])
        start = TabletPosition(Checkpoint(1, 1), 1000)
        pages = poll_pages(client.fetcher("t1", explicit=Checkpoint(1, 1)), start, 1250)
        first = next(pages)
        cluster.leader = 1  # the next call reaches the old leader, which says "Not leader"
        rest = list(pages)
    assert [p.safe_hybrid_time for p in (first, *rest)] == [1100, 1200, 1300]
    assert rest[-1].checkpoint == Checkpoint(1, 4)
    assert ("ts0", "GetChanges") in cluster.calls and ("ts1", "GetChanges") in cluster.calls
    assert ("master1", "GetTabletLocations") in cluster.calls  # looked up again after the move


def test_not_ready_is_retried_then_gives_up_as_transient(cluster: Cluster) -> None:
    not_ready = CDC(code=CDC.LEADER_NOT_READY, status=pb.AppStatusPB(code=pb.AppStatusPB.LEADER_NOT_READY_TO_SERVE))
    cluster.changes_errors = [not_ready]
    with cluster.client() as client:
        assert client.get_changes("t1", TabletPosition(Checkpoint(1, 1))).cdc_sdk_checkpoint.index == 2
        cluster.changes_errors = [not_ready] * 4  # the client tries 4 times
        with pytest.raises(CdcTransientError, match="GetChanges of tablet t1"):
            client.get_changes("t1", TabletPosition(Checkpoint(1, 1)))


@pytest.mark.parametrize(
    ("code", "message", "expected"),
    [
        (CDC.CHECKPOINT_TOO_OLD, "The logs from index 3 have been garbage collected", WalLostError),
        (CDC.INTERNAL_ERROR, f"stream ID {STREAM} is expired for Tablet ID t1", WalLostError),
        (CDC.TABLET_SPLIT, "Tablet Split detected on t1", TabletSplitError),
        (CDC.INVALID_REQUEST, "Tablet ID t1 is not part of stream ID", CdcConfigurationError),
    ],
)
def test_terminal_errors_are_the_products(cluster: Cluster, code: int, message: str, expected: type) -> None:
    cluster.changes_errors = [CDC(code=code, status=pb.AppStatusPB(message=message))] * 8
    with cluster.client() as client, pytest.raises(expected):
        client.get_changes("t1", TabletPosition(Checkpoint(1, 1)))


def test_unknown_stream_is_a_missing_stream(cluster: Cluster) -> None:
    masters = [("127.0.0.1", s.port) for s in cluster.masters]
    with YbCdcClient(masters, "f" * 32, retry=RetryPolicy(attempts=2, backoff_seconds=0), tls=None) as client:
        with pytest.raises(SlotMissingError, match="Could not find CDC stream"):
            client.stream_tables()


def test_set_checkpoints_sends_each_polled_tablets_position(cluster: Cluster) -> None:
    checkpoints = TabletCheckpoints(
        {
            "t1": TabletState(TabletPosition(Checkpoint(2, 9, b"k", 3), 5000)),
            "t0": TabletState(TabletPosition(Checkpoint(1, 1)), children=("t1", "t2")),  # split: not polled
        }
    )
    with cluster.client() as client:
        client.set_checkpoints(checkpoints)
    (sent,) = cluster.checkpoints
    assert sent.tablet_id == b"t1" and sent.stream_id == STREAM.encode()
    assert (sent.checkpoint.op_id.term, sent.checkpoint.op_id.index) == (2, 9)
    assert Checkpoint.from_pb(sent.cdc_sdk_checkpoint) == Checkpoint(2, 9, b"k", 3)
    assert sent.cdc_sdk_safe_time == 5000


def test_addresses_and_repr_without_tls_details() -> None:
    assert parse_addresses("h1:7100, [::1]:7101") == (("h1", 7100), ("::1", 7101))
    with pytest.raises(CdcConfigurationError):
        parse_addresses("h1")
    client = YbCdcClient([("h1", 7100)], STREAM, tls=TlsOptions(key_file="/secret/client.key"))
    assert "secret" not in repr(client) and "tls=True" in repr(client)


def test_a_get_changes_response_above_the_cap_is_a_configuration_error_not_retried(cluster: Cluster) -> None:
    cluster.changes_padding = 2 * 1024 * 1024  # a 2 MiB response
    masters = [("127.0.0.1", s.port) for s in cluster.masters]
    small = YbCdcClient(
        masters, STREAM, retry=RetryPolicy(attempts=4, backoff_seconds=0), tls=None, get_changes_max_bytes=1024 * 1024
    )
    with small, pytest.raises(CdcConfigurationError) as caught:
        small.get_changes("t1", TabletPosition(Checkpoint(1, 1)))
    message = str(caught.value)
    assert "GetChanges of tablet t1" in message and "yb.cdc.CDCService.GetChanges" in message
    assert "cap of 1048576 bytes" in message and "rpc_get_changes_max_bytes" in message
    assert [c for c in cluster.calls if c[1] == "GetChanges"] == [("ts0", "GetChanges")]  # asked once
    # The default cap (64 MiB) reads the same response.
    with cluster.client() as client:
        response = client.get_changes("t1", TabletPosition(Checkpoint(1, 1)))
    assert len(response.cdc_sdk_proto_records[0].row_message.new_tuple[0].datum_string) == 2 * 1024 * 1024


def test_the_client_defaults_to_tls(cluster: Cluster) -> None:
    masters = [("127.0.0.1", s.port) for s in cluster.masters]
    client = YbCdcClient(masters, STREAM, retry=RetryPolicy(attempts=2, backoff_seconds=0))
    assert "tls=True" in repr(client)
    with client, pytest.raises(CdcConfigurationError, match=r"TLS with 127\.0\.0\.1"):
        client.stream_tables()  # the test masters speak plaintext: refused, not downgraded
    assert cluster.calls == []
