"""``yb.master.MasterService`` on the stand-in's masters: streams, tables and tablet locations.

Only the leader master answers; the others say ``NOT_THE_LEADER`` (the catalog manager's
``CheckIsLeaderAndReady``). Split parents are hidden tablets: listed only with
``include_inactive``, still found by ``GetTabletLocations``.
"""

from __future__ import annotations

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

from . import ids
from .cluster import Cluster
from .rpc_server import RpcFailure, parse_body
from .service_errors import MASTER, STATUS, ServiceError, stream_not_found

_PGSQL_TABLE_TYPE = 4  # yb.TableType

_REQUESTS = {
    "GetCDCDBStreamInfo": (pb.MasterGetCDCDBStreamInfoRequestPB, pb.MasterGetCDCDBStreamInfoResponsePB),
    "GetCDCStream": (pb.GetCDCStreamRequestPB, pb.GetCDCStreamResponsePB),
    "GetTableLocations": (pb.GetTableLocationsRequestPB, pb.GetTableLocationsResponsePB),
    "GetTabletLocations": (pb.GetTabletLocationsRequestPB, pb.GetTabletLocationsResponsePB),
}


class MasterService:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def handle(self, server: int, method: str, body: bytes):
        if method not in _REQUESTS:
            raise RpcFailure(pb.ErrorStatusPB.ERROR_NO_SUCH_METHOD, f"Bad request: invalid method name: {method}")
        request_cls, response_cls = _REQUESTS[method]
        request = parse_body(request_cls, body)
        response = response_cls()
        try:
            fault = self.cluster.fault_for(method, None, server)
            if fault is not None:
                if fault.rpc_code is not None:
                    raise RpcFailure(fault.rpc_code, fault.message)
                raise ServiceError(fault.service_code or MASTER.UNKNOWN_ERROR, fault.status_code or 0, fault.message)
            with self.cluster.lock:
                if server != self.cluster.master_leader:
                    uuid = self.cluster.masters[server].uuid
                    raise ServiceError(
                        MASTER.NOT_THE_LEADER, STATUS.ILLEGAL_STATE, f"Not the leader. Local UUID: {uuid}"
                    )
                getattr(self, "_" + method)(request, response)
        except ServiceError as error:
            response.Clear()
            error.fill(response.error)
        return response

    def _GetCDCDBStreamInfo(self, req, resp) -> None:
        stream_id = req.db_stream_id.decode()
        stream = self.cluster.streams.get(stream_id)
        if stream is None:
            raise stream_not_found(stream_id, MASTER.OBJECT_NOT_FOUND)
        resp.namespace_id = stream.namespace_id.encode()
        for table_id in stream.table_ids:
            resp.table_info.add(stream_id=stream_id.encode(), table_id=table_id.encode())

    def _GetCDCStream(self, req, resp) -> None:
        stream_id = req.stream_id.decode()
        stream = self.cluster.streams.get(stream_id)
        if stream is None:
            raise stream_not_found(stream_id, MASTER.OBJECT_NOT_FOUND)
        info = resp.stream
        info.stream_id = stream_id.encode()
        info.table_id.extend(t.encode() for t in stream.table_ids)
        info.options.extend(pb.CDCStreamOptionsPB(key=k, value=v.encode()) for k, v in stream.options())
        info.namespace_id = stream.namespace_id.encode()
        info.transactional = False
        info.cdcsdk_consistent_snapshot_time = stream.snapshot_ht
        info.cdcsdk_consistent_snapshot_option = pb.USE_SNAPSHOT
        info.stream_creation_time = stream.created_ht

    def _GetTableLocations(self, req, resp) -> None:
        table_id = req.table.table_id.decode()
        table = self.cluster.table_by_id(table_id)
        if table is None:
            raise ServiceError(MASTER.OBJECT_NOT_FOUND, STATUS.NOT_FOUND, f"Table with identifier {table_id} not found")
        low = _bound(req.partition_key_start, 0)
        high = _bound(req.partition_key_end, ids.HASH_SPACE)
        tablets = [
            t
            for t in self.cluster.tablets_of(table, include_inactive=req.include_inactive)
            if t.start < max(high, low + 1) and t.end > low
        ]
        for tablet in tablets[: req.max_returned_locations]:
            resp.tablet_locations.append(self.cluster.locations(tablet))
        resp.table_type = _PGSQL_TABLE_TYPE
        resp.partition_list_version = table.num_tablets - self.cluster.settings.tablets_per_table

    def _GetTabletLocations(self, req, resp) -> None:
        for raw in req.tablet_ids:
            tablet = self.cluster.tablets.get(raw.decode())
            if tablet is None:
                error = resp.errors.add(tablet_id=raw)
                error.status.code = STATUS.NOT_FOUND
                error.status.message = "Unknown tablet"
                continue
            resp.tablet_locations.append(self.cluster.locations(tablet))


def _bound(key: bytes, default: int) -> int:
    return int.from_bytes(key[:2].ljust(2, b"\0"), "big") if key else default
